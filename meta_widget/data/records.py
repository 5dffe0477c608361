"""What a trace records: one :class:`CallRecord` per module call, one :class:`Event` per allocation
or free, one :class:`Allocation` per storage. Plain data (summaries, never tensors or modules):
it pickles, serializes, and keeps no model alive.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .flatten import TensorInfo

__all__ = ["Allocation", "CallRecord", "Event", "Flow"]

#: one op of a call's own body, as the graph reads it (see ``CallRecord.flows``)
Flow = tuple[int, str, tuple[int, ...], tuple[int, ...]]


@dataclass(slots=True)
class CallRecord:
    """One call of one module.

    ``flops`` counts the FLOPs of every aten op run during the call (sub-calls included), as
    ``torch.utils.flop_counter.FlopCounterMode`` counts them; ``self_flops`` and ``ops`` only the
    ops run in the module's own body, outside any sub-module call. ``alloc_bytes`` is the storage
    newly allocated by the call's own body; ``activation_bytes`` the bytes of new storage (allocated
    during this call) that its outputs hold: views and returned inputs allocate nothing.

    In a training step, ``backward_flops`` counts the FLOPs of the backward of everything this
    call computed (sub-calls included; ``backward_self_flops`` its own body only): each autograd
    node is credited to the innermost call that created it (see ``Recorder.tag_grad_nodes``).
    Under activation checkpointing, the forward that backward runs again is part of it too: a
    module called again inside backward is no new call, its work is the backward's of the
    forward call it repeats (``recompute_of``, on the stack only).
    """

    index: int
    path: str
    type: str
    module: int
    parent: int
    depth: int
    inputs: list[tuple[str, TensorInfo]]
    outputs: list[tuple[str, TensorInfo]] = field(default_factory=list)
    flops: int = 0
    self_flops: int = 0
    ops: dict[str, int] = field(default_factory=dict)
    alloc_bytes: int = 0
    activation_bytes: int = 0
    start_event: int = 0
    end_event: int = 0
    duration_s: float = 0.0
    error: bool = False
    phase: str = "forward"
    #: an assumption was taken during this call, or its outputs derive from an assumed shape
    assumed: bool = False
    backward_flops: int = 0
    backward_self_flops: int = 0
    #: the backward's FLOPs by aten op, own body only (like ``ops``)
    backward_ops: dict[str, int] = field(default_factory=dict)
    #: the part of ``backward_self_flops`` that recomputes this call's forward under activation
    #: checkpointing (own body only): what hardware FLOPs utilisation counts and model FLOPs
    #: utilisation leaves out (``meta_widget.timing.model.StepTime``)
    recompute_self_flops: int = 0
    #: the autograd sequence number when the call started: nodes it created have one as high
    grad_seq: int = 0
    #: a module called inside backward (activation checkpointing recomputing it) is on the stack
    #: with index -1 and the forward call it repeats here (-1: none, e.g. never called forward)
    recompute_of: int = -1
    #: what the ops of the call's own body cost, for a time model (``meta_widget.trace.costs``):
    #: ``{(peak, executed FLOPs, bytes read and written): how many ops}``; views cost nothing
    costs: dict[tuple[str, int, int, tuple[Any, ...]], int] = field(default_factory=dict)
    #: the same for its backward (own body only, recomputation included, like ``backward_ops``)
    backward_costs: dict[tuple[str, int, int, tuple[Any, ...]], int] = field(default_factory=dict)
    #: the identity of each tensor in ``inputs`` and ``outputs``, in their order (equal for
    #: views of one storage, unique over the trace: ``StorageTracker.ident``): a producer call's
    #: output is a consumer call's input when the ids are equal (``Analysis.graph``)
    input_ids: tuple[int, ...] = ()
    output_ids: tuple[int, ...] = ()
    #: the data flow of the ops of the call's own body that make new tensors (forward only, for
    #: a module with sub-modules; None for a leaf): ``(calls started before the op, op name,
    #: the ids of its tensor arguments, the ids of its outputs)``
    flows: list[Flow] | None = None
    #: how many calls the model ran that this record stands for: 1, or a stretch of decode
    #: steps' summed record in ``mode="generate"`` (``meta_widget.trace.decode_steps``)
    repeats: int = 1


class Event(NamedTuple):
    """One allocation (``nbytes`` > 0) or free (``nbytes`` < 0) of storage during the trace."""

    nbytes: int
    live_bytes: int
    call: int
    op: str
    phase: str


@dataclass(slots=True)
class Allocation:
    """One storage allocated during the trace: when (event indices), by whom, and its fate.

    ``freed`` is the index of its free event, or -1 when it was still alive at the end; ``saved``
    says autograd saved it for the backward pass.
    """

    key: int
    nbytes: int
    event: int
    call: int
    phase: str
    freed: int = -1
    saved: bool = False
    #: the category a parallel trace knows it by ("unsharded parameters", "communication
    #: buffers"; see ``meta_widget.distributed.parallel``), or None: decided by ``memory.category``
    category: str | None = None
