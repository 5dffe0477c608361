"""The memory model of one recorded pass.

Definitions (the README repeats them):

- **parameter bytes**: ``numel * element_size`` summed over the model's parameters, each tensor
  counted once (tied weights once).
- **buffer bytes**: the same over buffers.
- **input bytes**: the distinct storages of the input tensors, each counted once and whole (real
  inputs sharing a storage, ``x`` and ``x[1]``, get meta stand-ins sharing one: ``inputs.py``).
- **activation bytes** (total): every byte of storage allocated during the pass, whether freed
  later or not; per call, the bytes of *new* storage its outputs hold (views allocate nothing).
- **live bytes** after an event: parameters + buffers + inputs + the storage allocated during the
  pass and not yet freed; **peak** is their maximum over the recorded timeline, with the module
  call, the aten op that allocated at that moment and the phase (forward, backward, optimizer).
  In training the timeline holds two steps (``meta_widget.trace.passes``): the peak is the
  second, steady step's (every later step repeats it: the optimizer state, and the gradients
  where ``zero_grad`` keeps them, live from its start), or the first's where that is higher;
  ``first_step_peak_bytes`` is the first step's alone.
- **categories** of the bytes live at the peak: parameters, buffers, inputs, gradients (the
  ``.grad`` of each trainable parameter after backward), optimizer state (what ``step()`` keeps,
  e.g. AdamW's two moments, plus its step counters kept on the CPU), activations (in inference
  everything the forward pass allocated; in training what autograd saved for backward and the
  outputs still alive when the forward pass ends), temporaries (everything else). With
  micro-batches, each allocation is judged within its own micro-batch: by the end of the forward
  pass that made it.
- **timeline by category**: the same split after every event, so that at each event the
  categories add up to the live bytes and at the peak they equal the categories above.
- **reserved bytes**: the peak of what PyTorch's CUDA caching allocator reserves for the same
  allocations (``allocator.replay``: its rounding, pools, segments and reuse, cuBLAS workspaces
  included); **device bytes**: reserved + the CUDA context + NCCL's buffers (``device.py``).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import TYPE_CHECKING

from ..choices import MemoryCategory, Phase
from ..data.walk import walk
from ..trace.storage import local
from ..units import DTYPE_BYTES
from .allocator import run, step_table, steps_of
from .device import cublas_workspace_bytes, device_bytes, workspaces
from .modules import ModuleMemory, module_memory, tensor_sizes

if TYPE_CHECKING:
    import torch

    from ..data.records import Allocation, CallRecord, Event
    from ..data.walk import ModuleWalk
    from ..trace.passes import Trace


@dataclass
class MemoryReport:
    """Bytes by category and the live-bytes timeline of one pass (see the module docstring)."""

    param_bytes: int
    buffer_bytes: int
    input_bytes: int
    activation_bytes: int
    params_by_dtype: dict[str, int]
    buffers_by_dtype: dict[str, int]
    float_params: int
    #: (live bytes, call index or -1, op) after each allocation or free, baseline included
    timeline: list[tuple[int, int, str]] = field(default_factory=list)
    peak_bytes: int = 0
    peak_call: int | None = None
    peak_module: str | None = None
    peak_op: str | None = None
    peak_phase: str | None = None
    #: bytes live at the peak, by category (see the module docstring)
    categories: dict[str, int] = field(default_factory=dict)
    #: timeline index where each phase begins (its first run)
    phases: dict[str, int] = field(default_factory=dict)
    #: (timeline index, phase) where each run of a phase begins, in order: with micro-batches,
    #: a forward and a backward per micro-batch (``Trace.phase_runs``)
    phase_runs: list[tuple[int, str]] = field(default_factory=list)
    mode: str = "inference"
    #: optimizer state kept in host memory, not on the device (AdamW's step counters)
    optimizer_host_bytes: int = 0
    #: after a training step: the gradients (``.grad`` of trainable parameters) and the
    #: optimizer state on the device, whether or not they are live at the peak
    gradient_bytes: int = 0
    optimizer_state_bytes: int = 0
    #: category -> bytes of it live after each timeline event (see the module docstring); the
    #: categories add up to the timeline's live bytes at every event
    timeline_categories: dict[str, list[int]] = field(default_factory=dict)
    #: the parameters, gradients and optimizer state each module owns (``module_memory``)
    by_module: ModuleMemory | None = None
    #: training: the timeline index where each step begins (``[0, k]``: the first step, then
    #: the steady one); ``[0]`` for one pass
    steps: list[int] = field(default_factory=lambda: [0])
    #: the peak of the first step alone (equal to ``peak_bytes`` for one pass)
    first_step_peak_bytes: int = 0
    #: training: the step the peak is in, 1 or 2 (2: the steady state); None for one pass
    peak_step: int | None = None
    #: the peak of the bytes PyTorch's CUDA caching allocator would reserve for this pass
    #: (``torch.cuda.max_memory_reserved()``): parameters, buffers and inputs, then the
    #: trace's allocations and frees, replayed through the allocator's rounding, pools, segments
    #: and reuse with its default settings, plus the cuBLAS workspaces it allocates
    #: (``meta_widget.memory.allocator``); never below ``peak_bytes``
    reserved_bytes: int = 0
    #: the part of ``reserved_bytes`` that is cuBLAS's workspaces (one per thread running GEMMs)
    workspace_bytes: int = 0
    #: what the process holds on the GPU at that peak, as ``nvidia-smi`` shows it:
    #: ``reserved_bytes`` + the CUDA context + NCCL's buffers in a parallel trace
    #: (``meta_widget.memory.device.OVERHEADS``, each figure with its source)
    device_bytes: int = 0
    #: the steps the caching allocator replayed for ``reserved_bytes``, one row a step
    #: (``memory.allocator.step_table``, its bytes: ``allocator.read_table`` reads them back):
    #: what ``plan``'s per-layer rule extends to full depth
    allocator_steps: bytes = field(default=b"", repr=False)

    @property
    def baseline_bytes(self) -> int:
        """Bytes live before the first op: parameters, buffers and inputs."""
        return self.param_bytes + self.buffer_bytes + self.input_bytes

    @property
    def peak_owner(self) -> str | None:
        """Whose the peak is, in words: a module path ("" is the root), "the backward of" one,
        "the optimizer step" or "outside any module"; None when nothing was traced."""
        if self.peak_phase is None:
            return None
        if self.peak_module is None:
            return (
                "the optimizer step" if self.peak_phase == Phase.OPTIMIZER else "outside any module"
            )
        whose = "the backward of " if self.peak_phase == Phase.BACKWARD else ""
        return f"{whose}{self.peak_module or 'the root module'}"

    def param_bytes_at(self, dtype: str) -> int:
        """Parameter bytes if every floating-point parameter were stored as ``dtype``.

        Non-floating parameters keep their recorded size. ``dtype`` is one of ``DTYPE_BYTES``.
        """
        if dtype not in DTYPE_BYTES:
            raise ValueError(f"dtype must be one of {sorted(DTYPE_BYTES)}, not {dtype!r}")
        float_bytes = sum(b for d, b in self.params_by_dtype.items() if _is_float(d))
        return int(self.param_bytes - float_bytes + self.float_params * DTYPE_BYTES[dtype])

    def timeline_phases(self) -> list[str]:
        """The phase of each timeline point: that of the last phase run begun at or before it
        (each micro-batch's forward and backward are runs of their own)."""
        starts = self.phase_runs or sorted((i, name) for name, i in self.phases.items())
        out: list[str] = []
        current = starts[0][1] if starts else Phase.FORWARD
        k = 0
        for i in range(len(self.timeline)):
            while k < len(starts) and starts[k][0] <= i:
                current = starts[k][1]
                k += 1
            out.append(current)
        return out

    def by_category(self) -> dict[str, int]:
        """Bytes live at the peak, by category; they add up to ``peak_bytes``."""
        return dict(self.categories)


def _peak_index(events: Sequence[Event], steps: Sequence[int]) -> int:
    """The event at the peak: the steady step's highest (its first, if several), unless the
    first step rises higher."""
    start = steps[-1] if steps[-1] < len(events) else 0
    i = max(range(start, len(events)), key=lambda k: events[k].live_bytes)
    if start:
        j = max(range(start), key=lambda k: events[k].live_bytes)
        if events[j].live_bytes > events[i].live_bytes:
            return j
    return i


def _is_float(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat", "complex")) or dtype.startswith("float8")


def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def unique_bytes(tensors: Sequence[torch.Tensor]) -> dict[str, int]:
    """Bytes by dtype of ``tensors``, each tensor object counted once; a DTensor counts the
    storage of its local shard on this device (FSDP's padding included)."""
    out: dict[str, int] = {}
    for t, n in tensor_sizes(tensors):
        name = _dtype_name(t)
        out[name] = out.get(name, 0) + n
    return out


def storage_bytes(tensors: Sequence[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors``."""
    return sum(storage_sizes(tensors))


def storage_sizes(tensors: Sequence[torch.Tensor]) -> list[int]:
    """Bytes of each distinct storage behind ``tensors``, in order of first use."""
    seen: dict[int, int] = {}
    for t in tensors:
        st = t.untyped_storage()
        seen[st._cdata] = st.nbytes()
    return list(seen.values())


#: the memory categories, in the order the widget stacks them (``choices.MemoryCategory``)
CATEGORIES = tuple(c.value for c in MemoryCategory)


def category(a: Allocation, trace: Trace, training: bool) -> str:
    """The category of one allocation (see the module docstring)."""
    if a.freed < 0 and a.key in trace.grad_keys:
        return "gradients"
    if a.freed < 0 and a.key in trace.state_keys:
        return "optimizer state"
    if a.category is not None:
        return a.category
    if a.phase != Phase.FORWARD:
        return "temporaries"
    if not training:
        return "activations"
    end = forward_end(trace.phase_runs, a.event, len(trace.events))
    return "activations" if a.saved or a.freed < 0 or a.freed >= end else "temporaries"


def forward_end(runs: Sequence[tuple[int, str]], event: int, n: int) -> int:
    """The event index where the forward pass holding ``event`` ends: the start of the first
    run of another phase after it (its micro-batch's backward), or ``n`` (the trace's end).

    ``runs`` is ``Trace.phase_runs``: with micro-batches each forward pass is its own, so an
    allocation of the second micro-batch is judged by the end of the second forward pass.
    """
    for start, name in runs[bisect_right(runs, event, key=_run_start) :]:
        if name != Phase.FORWARD:
            return start
    return n


def _run_start(run: tuple[int, str]) -> int:
    return run[0]


def category_timeline(trace: Trace, training: bool, static: dict[str, int]) -> dict[str, list[int]]:
    """Bytes live after each event of ``trace``, by category: ``static`` (parameters, buffers,
    inputs: constant) plus each allocation's bytes, in its :func:`category`, from the event
    that allocated it to the one before the event that freed it."""
    n = len(trace.events)
    deltas: dict[str, list[int]] = {c: [0] * n for c in CATEGORIES}
    for a in trace.allocations:
        c = category(a, trace, training)
        d = deltas.get(c)
        if d is None:  # not setdefault: its default, a list of n, was built for every allocation
            d = deltas[c] = [0] * n
        if 0 <= a.event < n:
            d[a.event] += a.nbytes
        if 0 <= a.freed < n:
            d[a.freed] -= a.nbytes
    return {
        name: list(accumulate(d, initial=static.get(name, 0)))[1:] for name, d in deltas.items()
    }


def memory_report(
    module: torch.nn.Module,
    inputs: Sequence[torch.Tensor],
    calls: Sequence[CallRecord] = (),
    trace: Trace | None = None,
    training: bool = False,
) -> MemoryReport:
    """Build the :class:`MemoryReport` of ``module`` run on ``inputs`` (``trace`` may be None)."""
    tree = walk(module)
    params = [p for _, p in tree.parameters]
    params_by_dtype = unique_bytes(params)
    buffers_by_dtype = unique_bytes([b for _, b in tree.buffers])
    events = trace.events if trace is not None else []
    steps = list(trace.step_starts) if trace is not None else [0]
    first = events[: steps[1]] if len(steps) > 1 else events  # a step's bytes, not two steps'
    report = MemoryReport(
        param_bytes=sum(params_by_dtype.values()),
        buffer_bytes=sum(buffers_by_dtype.values()),
        input_bytes=storage_bytes(inputs),
        activation_bytes=sum(e.nbytes for e in first if e.nbytes > 0 and e.phase == Phase.FORWARD),
        params_by_dtype=params_by_dtype,
        buffers_by_dtype=buffers_by_dtype,
        float_params=sum(local(p).numel() for p in params if p.is_floating_point()),
        mode="training" if training else "inference",
    )
    base = report.baseline_bytes
    other_state = trace.state_other_bytes if trace is not None else 0
    report.timeline = [(base + e.live_bytes, e.call, e.op) for e in events]
    report.phases = dict(trace.phase_starts) if trace is not None else {}
    report.phase_runs = list(trace.phase_runs) if trace is not None else []
    static = {
        "parameters": report.param_bytes,
        "buffers": report.buffer_bytes,
        "inputs": report.input_bytes,
    }
    report.peak_bytes = report.first_step_peak_bytes = base
    report.steps = steps
    report.categories = {c: static.get(c, 0) for c in CATEGORIES}
    report.by_module = module_memory(tree, trace)
    if not events or trace is None:
        return device_memory(report, tree, inputs, trace)
    i = _peak_index(events, steps)
    peak = events[i]
    report.peak_bytes = base + peak.live_bytes
    report.peak_step = (2 if i >= steps[-1] else 1) if len(steps) > 1 else None
    report.first_step_peak_bytes = base + max(e.live_bytes for e in first) if first else base
    report.peak_call = peak.call if peak.call >= 0 else None
    report.peak_op = peak.op
    report.peak_phase = peak.phase
    if report.peak_call is not None and report.peak_call < len(calls):
        report.peak_module = calls[report.peak_call].path
    for a in trace.allocations:
        if a.event <= i and (a.freed < 0 or a.freed > i):
            name = category(a, trace, training)  # a parallel trace adds two (comms.py)
            report.categories[name] = report.categories.get(name, 0) + a.nbytes
    report.timeline_categories = category_timeline(trace, training, static)
    report.optimizer_host_bytes = other_state
    alive = [a for a in trace.allocations if a.freed < 0]
    report.gradient_bytes = sum(a.nbytes for a in alive if a.key in trace.grad_keys)
    report.optimizer_state_bytes = sum(a.nbytes for a in alive if a.key in trace.state_keys)
    return device_memory(report, tree, inputs, trace)


def device_memory(
    report: MemoryReport, tree: ModuleWalk, inputs: Sequence[torch.Tensor], trace: Trace | None
) -> MemoryReport:
    """Fill ``report.reserved_bytes`` and ``device_bytes`` (see :class:`MemoryReport`): the
    caching allocator replayed over the parameters and buffers in the order ``module.to("cuda")``
    moves them, then the inputs (each its own tensor), then ``trace``'s allocations, with a
    cuBLAS workspace of today's training GPUs (Hopper, Blackwell: 32 MiB) before the first GEMM
    of each thread."""
    initial = [n for _, n in tensor_sizes(moved_order(tree.modules[0]))] if tree.modules else []
    initial += storage_sizes(inputs)
    allocations = trace.allocations if trace is not None else []
    extra = workspaces(trace.events, cublas_workspace_bytes()) if trace is not None else []
    steps, where = steps_of(allocations, initial, extra)
    report.reserved_bytes = run(steps).peak_bytes
    report.allocator_steps = step_table(steps, where).tobytes()
    report.workspace_bytes = sum(n for _, n in extra)
    report.device_bytes = device_bytes(report.reserved_bytes, communicators(tree, allocations))
    return report


def communicators(tree: ModuleWalk, allocations: Sequence[Allocation]) -> int:
    """NCCL communicators a rank of this trace holds: one per dimension of the device mesh of
    its DTensor parameters (FSDP2, tensor parallelism, both), one when only FSDP2's buffers
    say the trace is parallel, 0 on one device."""
    dims = [
        int(getattr(p, "device_mesh").ndim)  # noqa: B009 (a DTensor's, unknown to Parameter)
        for _, p in tree.parameters
        if type(p).__name__ == "DTensor"
    ]
    if dims:
        return max(dims)
    return int(any(a.category in _PARALLEL_CATEGORIES for a in allocations))


#: categories only a parallel trace gives allocations (``meta_widget.distributed.comms``)
_PARALLEL_CATEGORIES = frozenset({"communication buffers", "unsharded parameters"})


def moved_order(root: torch.nn.Module) -> list[torch.Tensor]:
    """The parameters and buffers in the order ``root.to(device)`` moves them
    (``Module._apply``): each module's children first, then its own parameters, then its own
    buffers; a module or tensor met again is moved already."""
    out: list[torch.Tensor] = []
    seen: set[int] = set()
    todo: list[tuple[torch.nn.Module, bool]] = [(root, False)]
    while todo:
        m, children_done = todo.pop()
        if children_done:
            out += [t for t in (*m._parameters.values(), *m._buffers.values()) if t is not None]
        elif id(m) not in seen:
            seen.add(id(m))
            todo.append((m, True))
            todo += [(c, False) for c in reversed(m._modules.values()) if c is not None]
    return out
