"""The outputs of DTensor ops, rebuilt from one trace's earlier calls instead of run again.

The recorder's op cache (``meta_widget.trace.opcache``) keys plain and fake tensors only: an op
on DTensors (tensor parallelism's parameters and activations) runs DTensor's dispatch on every
call: its sharding propagation, the op on the local fake tensors, the wrapping of the outputs.
That is 60 to 320 us an op (``mm`` the dearest), and a tensor-parallel layer runs about 1,100
of them a training step: a third of a ``fsdp=4 tp=2`` trace of the 16-layer Llama.

:class:`DTensorCache` keys such a call by the op, the kernel and FLOP formula the recorder runs
it with, each DTensor argument's spec (mesh, placements, global shape and stride) with its local
tensor's metadata, and every other argument as the op cache keys it; it keeps what the call gave:
each output's spec, and its local tensor as the op cache rebuilds a fake tensor (new storage of
the same size, or a view of the first argument's local tensor). A hit rebuilds the outputs as
DTensor's dispatch wraps them (``DTensor(local, spec, requires_grad=...)``).

What it does not cache, so that a hit is exactly the call it stands for: ops that write to an
argument, random ops (DTensor's RNG tracker advances), data-dependent ones, calls whose outputs
are not all DTensors over fake tensors, and outputs placed other than ``Shard``, ``Replicate``
or ``Partial`` (a ``MaskPartial`` carries the embedding's mask: state of its own). The entries
are this trace's only: a spec holds the trace's device mesh and its process groups, which must
not outlive the trace. Tested (``tests/test_dtensor_cache.py``): tensor-parallel layouts trace
the same with and without it, every record.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.placement_types import Partial, Replicate, Shard

from ..trace.opcache import (
    ARGUMENT_TYPE,
    NOT_META,
    OUTPUT,
    VIEW,
    CacheStats,
    call_key_parts,
    key_parts,
    rebuild_local,
)

__all__ = ["DTensorCache"]

#: placement types whose objects hold nothing but their parameters (dim, reduce op)
_PLAIN_PLACEMENTS = frozenset({Shard, Replicate, Partial})
_STRIDED = torch.strided
#: a DTensor argument's part of a key
_MARK = "dtensor"
#: ``DTensor(local, spec, requires_grad=...)`` less its ``__init__`` (``Tensor.__init__``, in
#: two decorators that cost more than the tensor: 10 us)
_NEW = DTensor.__new__


class DTensorCache:
    """One trace's cached DTensor calls (see the module docstring); counted in ``stats``, the
    trace's op cache statistics."""

    def __init__(self, stats: CacheStats) -> None:
        self.stats = stats
        self._entries: dict[Any, Any] = {}
        self._unkeyable: dict[Any, str | None] = {}

    @staticmethod
    def wants(first: Any) -> bool:
        """Whether a call whose first argument is ``first`` is this cache's to key."""
        return type(first) is DTensor

    def key(
        self,
        func: Any,
        kernel: Any,
        flops: Any,
        uncached: str | None,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """The key of one call (None: run it, the reason counted)."""
        reason = self._unkeyable.get(func, "")
        if reason == "":
            reason = self._unkeyable[func] = _never(func, uncached)
        if reason is not None:
            self.stats.bypass(reason)
            return None
        parts: list[Any] = [func, kernel, flops]
        reason = call_key_parts(args, kwargs, parts, _parts)
        if reason is not None:
            self.stats.bypass(reason)
            return None
        return tuple(parts)

    def lookup(self, key: Any, args: tuple[Any, ...]) -> tuple[Any, int, Any] | None:
        """The rebuilt outputs, FLOPs and cost of a cached call; None (counted) to run it."""
        entry: Any = self._entries.get(key)
        if not self.stats.found(entry):
            return None
        outputs, container, flops, cost = entry
        base = args[0]._local_tensor
        built = [
            _NEW(DTensor, rebuild_local(local, base), spec, requires_grad=grad)
            for local, spec, grad in outputs
        ]
        return (built[0] if container is None else container(built)), flops, cost

    def fill(
        self,
        key: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        out: Any,
        flops: int,
        cost: Any,
    ) -> None:
        """Keep what the call of ``key`` gave (or that it cannot be rebuilt)."""
        if isinstance(out, (tuple, list)):
            container: type | None = type(out)
            outs = list(out)
        else:
            container, outs = None, [out]
        outputs = _outputs(outs, args[0]._local_tensor, _local_storages(args, kwargs))
        self._entries[key] = OUTPUT if outputs is None else (tuple(outputs), container, flops, cost)


def _never(func: Any, uncached: str | None) -> str | None:
    """Why calls of ``func`` on DTensors are never cached (decided once an op), or None."""
    if uncached is not None and uncached is not VIEW:
        return uncached
    if func._schema.is_mutable or torch.Tag.nondeterministic_seeded in func.tags:
        return uncached or ARGUMENT_TYPE
    return None


def _parts(values: tuple[Any, ...], parts: list[Any]) -> str | None:
    for v in values:
        if type(v) is DTensor:
            local = v._local_tensor
            if type(local) is not FakeTensor or local.constant is not None:
                return NOT_META
            if local.layout is not _STRIDED:
                return NOT_META
            parts.append(
                (
                    _MARK,
                    v._spec,
                    v.requires_grad,
                    local.dtype,
                    local.shape,
                    local.stride(),
                    local.storage_offset(),
                    local.requires_grad,
                    local.fake_device,
                )
            )
            continue
        reason = key_parts((v,), parts)
        if reason is not None:
            return reason
    return None


def _local_storages(args: tuple[Any, ...], kwargs: dict[str, Any]) -> set[int]:
    """The storages of every argument's tensors (a DTensor's: its local tensor's)."""
    found: set[int] = set()
    todo: list[Any] = [*args, *kwargs.values()]
    while todo:
        v = todo.pop()
        if type(v) is DTensor:
            v = v._local_tensor
        if isinstance(v, torch.Tensor):
            found.add(v.untyped_storage()._cdata)
        elif isinstance(v, (tuple, list)):
            todo.extend(v)
    return found


def _outputs(outs: list[Any], base: FakeTensor, inputs: set[int]) -> list[tuple[Any, ...]] | None:
    """How to rebuild each output: (its local tensor's spec, its DTensor spec, requires_grad);
    None if one cannot be (a view of an argument other than the first, two outputs on one
    storage, a placement with state)."""
    first = base.untyped_storage()._cdata
    made_here: set[int] = set()
    found: list[tuple[Any, ...]] = []
    for o in outs:
        if type(o) is not DTensor or not _plain(o._spec.placements):
            return None
        local = o._local_tensor
        if (
            type(local) is not FakeTensor
            or local.constant is not None
            or local.fake_mode is not base.fake_mode
            or local.layout is not _STRIDED
        ):
            return None
        key = local.untyped_storage()._cdata
        if key == first:  # a view of the first argument's local tensor
            spec: tuple[Any, ...] = (
                "view",
                tuple(local.shape),
                local.stride(),
                local.storage_offset(),
                local.dtype,
                local.fake_device,
            )
        else:
            if key in inputs or key in made_here or local.storage_offset() != 0:
                return None
            made_here.add(key)
            spec = ("fake", tuple(local.shape), local.stride(), local.dtype, local.fake_device)
            nbytes = rebuild_local(spec, base).untyped_storage().nbytes()
            if nbytes != local.untyped_storage().nbytes():
                return None  # a view of a larger storage: a rebuilt one would be smaller
        found.append((spec, o._spec, o.requires_grad))
    return found


def _plain(placements: tuple[Any, ...]) -> bool:
    return all(type(p) in _PLAIN_PLACEMENTS for p in placements)
