"""Context parallelism: one rank's share of each sequence, its attention a ring over ``cp`` ranks.

``parallel={"cp": 2}`` (with ``fsdp``, ``replicate`` and ``tp`` as wanted) traces a rank the way
PyTorch's own ``context_parallel`` (``torch.distributed.tensor.experimental``, as torchtitan
uses it) runs it:

- the rank's inputs (every tensor argument of two or more dimensions, its second dimension the
  sequence, as token ids, labels and embeddings hold it) are sharded along the sequence in
  place, with PyTorch's head-tail load balancing (each rank a chunk from the front and one from
  the back, so causal attention costs each the same);
- ``scaled_dot_product_attention`` runs as PyTorch's ring attention: each rank's queries against
  every rank's keys and values, gathered over the ``cp`` ranks (PyTorch's default rotation, an
  all-gather), its partial outputs merged in float32, and the backward's gradients of the keys
  and values reduce-scattered back. The ring calls the CUDA attention kernels (flash,
  memory-efficient, cuDNN) on each block; the trace routes attention to the kernel a CUDA device
  picks (``trace.kernels``), whose meta kernels allocate what the real ones do, so the ring runs
  on the fake CPU mesh as it runs on GPUs;
- the parameters are sharded over the ``fsdp x cp`` ranks (FSDP2 on the flattened mesh, as
  torchtitan's ``dp_shard_cp``): the context-parallel ranks hold the same weights and
  reduce their gradients together.

Refused (``LayoutError``, before anything is traced): ``cp`` with a pipeline or with expert
parallelism (not traced yet), attention routed to the CPU's or the math kernel (``device="cpu"``
or ``"math"``: the ring runs only CUDA kernels), a sequence that does not split into ``2 x cp``
equal chunks, and inputs whose second dimensions disagree. A model whose attention never calls
``scaled_dot_product_attention`` (its own matmuls and softmax, transformers' ``"eager"``
attention) would attend within its own chunk only: such a trace is an error, not a number.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor._sharding_prop import ShardingPropagator
from torch.distributed.tensor.experimental import context_parallel
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_leaves

from ..options import LayoutError, Parallel
from ..trace.kernels import AttentionKernels

__all__ = [
    "RING_OPS",
    "check_context",
    "check_inputs",
    "check_ring_device",
    "check_ring_ran",
    "context_groups",
    "fsdp_mesh",
    "sharded_sequences",
]

#: the attention kernels PyTorch's ring attention runs on DTensors (torch 2.13,
#: ``_context_parallel/_attention.py``: its custom DTensor handlers), forward and backward: the
#: recorder lets DTensor run them (``Recorder.to_subclass``), so that each block's kernel, the
#: keys' and values' all-gather and the merge are recorded as they run
RING_OPS = frozenset(
    getattr(torch.ops.aten, f"_scaled_dot_product_{kind}_attention{part}").default
    for kind in ("flash", "efficient", "cudnn")
    for part in ("", "_backward")
)


def check_context(plan: Parallel) -> None:
    """Refuse the layouts a context-parallel trace cannot run (module docstring): part of
    ``parallel.check_world``, so a plan refuses them untraced too."""
    if plan.cp == 1:
        return
    if plan.pp > 1:
        raise LayoutError(
            f"parallel cp={plan.cp} with pp={plan.pp}: context parallelism inside a pipeline's "
            "stages is not traced yet. Trace the layout without pp (a stage's ranks run the "
            "same ring), or without cp."
        )
    if plan.ep > 1:
        raise LayoutError(
            f"parallel cp={plan.cp} with ep={plan.ep}: experts sharded over context-parallel "
            "ranks are not traced yet. Trace it without one of them."
        )


def check_ring_device(plan: Parallel, device: str) -> None:
    """Refuse ``cp`` where attention is routed to the CPU's or the math kernel
    (``analyze(device=...)``): the ring runs only the CUDA kernels."""
    if plan.cp > 1 and device != "cuda":
        raise LayoutError(
            f"parallel cp={plan.cp} with device={device!r}: PyTorch's context_parallel runs its "
            "ring attention on the CUDA attention kernels only (flash, memory-efficient, "
            "cuDNN), not on the CPU's or the math path. Leave device out (a CUDA GPU)."
        )


def check_inputs(plan: Parallel, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """The inputs a context-parallel rank shards: each tensor of two or more dimensions,
    along its second; they must agree on its length, which must split into ``2 x cp`` chunks
    (PyTorch's head-tail load balancing)."""
    if plan.cp == 1:
        return
    lengths = {tuple(t.shape): t.shape[1] for t in _sequences(args, kwargs)}
    if not lengths:
        raise LayoutError(
            f"parallel cp={plan.cp} shards the inputs' sequences, but no input has a sequence "
            "dimension (a tensor of two or more dimensions, the second the sequence). Give "
            "the model (batch, sequence) token ids or (batch, sequence, width) embeddings."
        )
    if len(set(lengths.values())) > 1:
        shapes = ", ".join(str(list(s)) for s in lengths)
        raise LayoutError(
            f"parallel cp={plan.cp} shards every input along its second dimension (the "
            f"sequence), but the inputs disagree on it: {shapes}. Give inputs whose second "
            "dimension is the sequence, or trace without cp."
        )
    length = next(iter(lengths.values()))
    if length % (2 * plan.cp):
        raise LayoutError(
            f"parallel cp={plan.cp}: a sequence of {length} tokens does not split into "
            f"{2 * plan.cp} equal chunks (PyTorch's load balancing gives each of the {plan.cp} "
            "ranks one chunk from the front and one from the back). Give a sequence length "
            f"that is a multiple of {2 * plan.cp}, or another cp."
        )


def _sequences(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    return [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor) and t.dim() >= 2]


def fsdp_mesh(mesh: DeviceMesh, plan: Parallel) -> DeviceMesh:
    """The mesh FSDP2 shards over: ``fsdp`` (``replicate x fsdp`` for HSDP), and with ``cp``
    the ``fsdp`` and ``cp`` dimensions flattened into one, ``"fsdp_cp"`` (the context-parallel
    ranks share their weights and their gradients' reduction, as torchtitan's
    ``dp_shard_cp``), joined to ``replicate`` for HSDP (the flattened mesh kept, not sliced
    again from the root: PyTorch deprecates that)."""
    if plan.cp == 1:
        return mesh["replicate", "fsdp"] if plan.replicate > 1 else mesh["fsdp"]
    flat = _flattened(mesh, plan)
    return DeviceMesh._concatenate([mesh["replicate"], flat]) if plan.replicate > 1 else flat


def _flattened(mesh: DeviceMesh, plan: Parallel) -> DeviceMesh:
    """``fsdp x cp`` as one dimension (made once a mesh: PyTorch keeps it by its name)."""
    return mesh[("fsdp", "cp") if plan.fsdp > 1 else ("cp",)]._flatten("fsdp_cp")


def context_groups(mesh: DeviceMesh, plan: Parallel) -> dict[str, tuple[str, int]]:
    """The flattened ``fsdp x cp`` group's name, as the time model reads it: an FSDP group of
    ``fsdp * cp`` ranks (``timing.model.mesh_strides``); none without ``cp``."""
    if plan.cp == 1:
        return {}
    return {str(_flattened(mesh, plan).get_group().group_name): ("fsdp", plan.fsdp * plan.cp)}


@contextmanager
def sharded_sequences(
    world: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Iterator[list[int]]:
    """While active: the rank's inputs (fake copies) sharded along the sequence and
    ``scaled_dot_product_attention`` run as PyTorch's ring attention, where ``world`` (a
    ``parallel.World``) has ``cp``. Yields a list whose one number counts the ring's attention
    calls (:func:`check_ring_ran` reads it)."""
    calls = [0]
    plan: Parallel | None = getattr(world, "plan", None)
    if plan is None or plan.cp == 1:
        yield calls
        return
    buffers = _sequences(args, kwargs)
    seen = AttentionKernels.ring_calls
    AttentionKernels.ring_calls = calls
    try:
        with (
            _propagated_unrecorded(world.fake),
            context_parallel(
                world.mesh["cp"], buffers=buffers, buffer_seq_dims=[1] * len(buffers),
                no_restore_buffers=set(buffers),
            ),
        ):  # fmt: skip
            yield calls
    finally:
        AttentionKernels.ring_calls = seen


def check_ring_ran(plan: Any, calls: list[int], failed: bool) -> None:
    """A context-parallel trace that ran (not ``failed``) without one ring attention call is
    refused: each rank would have attended within its own share of the sequence only."""
    if plan is not None and plan.cp > 1 and not failed and calls[0] == 0:
        raise LayoutError(
            f"parallel cp={plan.cp}: the model's attention never called "
            "scaled_dot_product_attention, so each rank would attend within its own share of "
            "the sequence only. Use an attention that calls it (transformers: "
            "attn_implementation='sdpa'), or trace without cp."
        )


@contextmanager
def _propagated_unrecorded(fake: FakeTensorMode) -> Iterator[None]:
    """While active, DTensor's sharding propagation runs its op on whole (global) fake tensors
    under ``fake`` alone, out of the recorder's sight. The ring's kernels reach the recorder
    through DTensor's dispatch (``Recorder.to_subclass``), and that dispatch runs each one
    once on the global shapes to learn the output's metadata: an op no GPU runs, which would
    otherwise be recorded (its FLOPs and its memory, a whole sequence's attention). Each
    op schema's answer is kept for the trace, as PyTorch's own cache keeps it outside a fake
    mode (``ShardingPropagator._propagate_tensor_meta_cached``): the metadata of an op's
    outputs is a function of its arguments' specs. So is the sharding DTensor decides for an
    op (``propagate_op_sharding_non_cached``, which PyTorch keeps by op schema outside a fake
    mode too, ``propagate_op_sharding``): the ring's handler asks for it at every call, for
    each layer's attention in both steps, and each answer weighs every strategy of the op over
    the mesh's dimensions; it is kept for the trace as well."""
    metadata = ShardingPropagator._propagate_tensor_meta_non_cached
    sharding = ShardingPropagator.propagate_op_sharding_non_cached
    known: dict[Any, Any] = {}  # by op schema, as PyTorch keeps them outside a fake mode
    decided: dict[Any, Any] = {}

    def propagate(self: ShardingPropagator, op_schema: Any) -> Any:
        found = known.get(op_schema, known)
        if found is known:
            with _disable_current_modes(), fake:
                found = known[op_schema] = metadata(self, op_schema)
        return found

    def decide(self: ShardingPropagator, op_schema: Any) -> Any:
        found = decided.get(op_schema, decided)
        if found is decided:
            found = decided[op_schema] = sharding(self, op_schema)
        return found

    try:  # an interrupt between the two leaves nothing: both are put back
        ShardingPropagator._propagate_tensor_meta_non_cached = propagate  # type: ignore[method-assign]
        ShardingPropagator.propagate_op_sharding_non_cached = decide  # type: ignore[method-assign]
        yield
    finally:
        ShardingPropagator._propagate_tensor_meta_non_cached = metadata  # type: ignore[method-assign]
        ShardingPropagator.propagate_op_sharding_non_cached = sharding  # type: ignore[method-assign]
