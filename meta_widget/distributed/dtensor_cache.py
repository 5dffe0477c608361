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
are not all DTensors over fake tensors, outputs placed other than ``Shard``, ``Replicate``
or ``Partial`` (a ``MaskPartial`` carries the embedding's mask: state of its own), and outputs
on another mesh than the first argument's.

The entries are the process's, as the op cache's are: the next trace of a layout (a plan's
next candidate, at 4 layers after 3) runs none of DTensor's dispatch that an earlier one ran.
A spec holds its trace's device mesh and process groups, which must not outlive the trace, so
no entry holds one: a key names a mesh by what an op's outputs follow from (its ranks, their
layout, the dimensions' names, this rank's place), and an output's spec is kept as its
placements, shard order and global metadata, and built again on the first argument's mesh
(once a trace for each). With each trace's own entries, its first training step ran
DTensor's dispatch for each op it had not seen in the trace, sharding propagation uncached
under a fake mode: on the 405B's 16,384-rank meshes the plan's candidates take 0.92 to 0.95
of that time now (``benchmarks/results/plan.md``). Tested
(``tests/test_dtensor_cache.py``): tensor-parallel layouts trace the same with and without it,
every record, a second trace answered from the first's entries; no mesh outlives its trace.
"""

from __future__ import annotations

from itertools import count
from typing import Any, ClassVar

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._dtensor_spec import DTensorSpec
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
    """One trace's view of the process's cached DTensor calls (see the module docstring);
    counted in ``stats``, the trace's op cache statistics."""

    #: every trace's entries, by key; emptied when it holds ``limit`` of them
    entries: ClassVar[dict[Any, Any]] = {}
    limit: ClassVar[int] = 50_000
    #: why an op's calls are never cached (None: they are), decided once an op
    _unkeyable: ClassVar[dict[Any, str | None]] = {}
    #: a number for each mesh seen (:meth:`_mesh`) and each spec (its mesh's number and what
    #: :func:`_kept` keeps), which a key holds: never given twice, also after the entries are
    #: emptied
    _numbers: ClassVar[dict[tuple[Any, ...], int]] = {}
    _next: ClassVar[Any] = count()

    def __init__(self, stats: CacheStats) -> None:
        self.stats = stats
        self._entries = self.entries
        # this trace's by id, each with the object (held: its id stays its own): each spec's
        # number, each mesh's name, each output spec built on a mesh (by the ids of both)
        self._numbered: dict[int, tuple[DTensorSpec, int]] = {}
        self._meshes: dict[int, tuple[Any, int]] = {}
        self._specs: dict[tuple[int, int], tuple[Any, DTensorSpec]] = {}

    @classmethod
    def cache_clear(cls) -> None:
        """Empty the process's DTensor entries (the next traces run DTensor's dispatch)."""
        cls.entries.clear()
        cls._numbers.clear()

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
        reason = call_key_parts(args, kwargs, parts, self._parts)
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
        first = args[0]
        base, mesh = first._local_tensor, first._spec.mesh
        built = [
            _NEW(DTensor, rebuild_local(local, base), self._spec(kept, mesh), requires_grad=grad)
            for local, kept, grad in outputs
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
        first = args[0]
        outputs = _outputs(outs, first._local_tensor, _local_storages(args, kwargs))
        if outputs is not None and any(s.mesh is not first._spec.mesh for _, s, _ in outputs):
            outputs = None  # rebuilt on the first argument's mesh only
        if len(self._entries) >= self.limit:
            self.cache_clear()
        self._entries[key] = (
            OUTPUT
            if outputs is None
            else (
                tuple((local, _kept(s), grad) for local, s, grad in outputs),
                container,
                flops,
                cost,
            )
        )

    def _parts(self, values: tuple[Any, ...], parts: list[Any]) -> str | None:
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
                        self._number(v._spec),
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

    def _number(self, spec: DTensorSpec) -> int:
        """The number a key names ``spec`` by (the same for the same mesh name and
        :func:`_kept` in every trace)."""
        known = self._numbered.get(id(spec))
        if known is None:
            named = (self._mesh(spec.mesh), _kept(spec))
            known = self._numbered[id(spec)] = (spec, self._number_of(named))
        return known[1]

    def _mesh(self, mesh: Any) -> int:
        """The number a key names ``mesh`` by: the same for the same device type, ranks and
        their layout, dimensions' names and this rank's place (what a DTensor op's outputs
        follow from; not its process groups, which are the trace's). A number, not the
        16,384 ranks of a 405B's mesh, hashed on every spec."""
        known = self._meshes.get(id(mesh))
        if known is None:
            with torch._C._DisableTorchDispatch():  # the ranks: a CPU tensor, past the modes
                ranks = mesh.mesh
                named = (
                    "mesh",
                    mesh.device_type,
                    tuple(ranks.shape),
                    tuple(ranks.flatten().tolist()),
                    mesh.mesh_dim_names,
                    tuple(mesh.get_coordinate() or ()),
                )
            known = self._meshes[id(mesh)] = (mesh, self._number_of(named))
        return known[1]

    @classmethod
    def _number_of(cls, named: tuple[Any, ...]) -> int:
        number = cls._numbers.get(named)
        if number is None:
            if len(cls._numbers) >= cls.limit:
                cls.cache_clear()  # a number names one thing for good: the entries may go
            number = cls._numbers[named] = next(cls._next)
        return number

    def _spec(self, kept: tuple[Any, ...], mesh: Any) -> DTensorSpec:
        """The spec ``kept`` on ``mesh`` (built once a trace)."""
        at = (id(kept), id(mesh))
        known = self._specs.get(at)
        if known is None:
            placements, meta, order, strided = kept
            spec = DTensorSpec(
                mesh,
                placements,
                tensor_meta=meta,
                shard_order=order,
                use_strided_shard_as_shard_order=strided,
            )
            known = self._specs[at] = (kept, spec)
        return known[1]


def _kept(spec: DTensorSpec) -> tuple[Any, ...]:
    """A spec less its mesh: what an entry keeps of an output's spec, and what a key names an
    argument's by (with the mesh's name, :meth:`DTensorCache._number`)."""
    order = None if spec.use_strided_shard_as_shard_order else spec.shard_order
    return (spec.placements, spec.tensor_meta, order, spec.use_strided_shard_as_shard_order)


def _never(func: Any, uncached: str | None) -> str | None:
    """Why calls of ``func`` on DTensors are never cached (decided once an op), or None."""
    if uncached is not None and uncached is not VIEW:
        return uncached
    if func._schema.is_mutable or torch.Tag.nondeterministic_seeded in func.tags:
        return uncached or ARGUMENT_TYPE
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
