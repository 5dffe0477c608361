"""DTensor's sharding decisions under a ``parallel=`` world: kept, shared, and forgotten.

DTensor decides, for each op on DTensors, how its inputs and outputs shard (its sharding
propagation), and caches the decision by the op's schema: the op, and each argument's mesh,
placements and metadata. A trace of a 70B decoder under FSDP x TP spends much of its time
deciding, so a world asks for less of it in two ways:

- **Kept across worlds** (:func:`keeping_decisions`): ``plan`` traces many candidates of a few
  mesh shapes, each in its own world; the decisions made in one are kept for the next world of
  the same shape instead of being made again.
- **Shared between alike parameters** (from :func:`world_started` to :func:`world_ended`):
  the multi-tensor optimizer's ops (``_foreach_add_`` over every parameter's state) miss
  DTensor's cache as a whole whenever the list differs (each depth of ``plan``'s per-layer
  rule, each precision) and are decided element by element, each a search over every
  placement on every mesh dimension (3 ms an element on a 2 x 2 x 2 mesh). The elements of
  alike layers have equal schemas, so the element's answer (``expand_to_full_mesh_op_strategy``,
  a function of its arguments' values) is kept by value while a world runs: a 2 x 2 x 2 plan's
  layout took 27 % less time, its numbers unchanged.

A decision holds the meshes of the world that made it, and a mesh compares by value. A later
world of the same shape makes the same process groups in the same order, under the same names,
so those meshes resolve to its groups. A world of another shape does not (its ``tp`` sub-mesh
may equal the last one's, under another group's name: "Could not resolve the process group"),
so all of it is forgotten (:func:`forget_meshes`) when the shape changes, and when the last
world or kept block ends. The user's own process group is never made while a world exists
(``World`` refuses to run beside one), so it never meets them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.tensor import DTensor

try:  # where DTensor looks up the element search at each call (see _element_decider)
    from torch.distributed.tensor._ops import utils as _strategy_utils
except ImportError:  # pragma: no cover - another PyTorch
    _strategy_utils = None  # type: ignore[assignment]

__all__ = ["forget_meshes", "keeping_decisions", "world_ended", "world_started"]

#: at most this many element decisions are kept (emptied past it; a 70B plan makes ~200)
MAX_SHARED = 20_000


@dataclass
class _Kept:
    """What :func:`keeping_decisions` keeps: a token per block running (a token, not a count:
    an interrupt lands before or after ``append``, never between a count and its ``try``), and
    the mesh shape of the world whose decisions DTensor holds."""

    blocks: list[object] = dataclasses.field(default_factory=list)
    shape: tuple[int, ...] | None = None


_kept = _Kept()
#: the element decisions shared while a world runs, by their arguments' values
_shared: dict[Any, Any] = {}


@contextmanager
def keeping_decisions() -> Iterator[None]:
    """Worlds of one mesh shape made one after another inside keep DTensor's sharding
    decisions (see the module's docstring): one candidate of the 70B under FSDP-4 x TP-2,
    traced at 2, 3 and 4 layers, took 3.0 s deciding afresh in each world, 1.3 s keeping
    the decisions."""
    token = object()
    try:
        _kept.blocks.append(token)
        yield
    finally:
        if token in _kept.blocks:
            _kept.blocks.remove(token)
        if not _kept.blocks:
            _kept.shape = None
            forget_meshes()


def world_started(shape: tuple[int, ...]) -> None:
    """A world of mesh ``shape`` (``options.MESH_DIMS``, then this process's rank) starts: the
    decisions of another shape are forgotten, and element decisions are shared until
    :func:`world_ended`. The rank is part of the shape: the ranks of a pipeline are traced one
    after another, and rank 1's ``tp`` sub-mesh equals rank 0's by value under other groups
    (kept, rank 0's decisions sent rank 1's tensor-parallel collectives to rank 0's groups:
    its schedule never ended)."""
    if _kept.blocks and _kept.shape != shape:  # decisions of another shape's groups
        forget_meshes()
    _kept.shape = shape
    original = _element_decider()
    if original is not None and not _is_ours(original):
        _strategy_utils.expand_to_full_mesh_op_strategy = _shared_decision(original)


def world_ended() -> None:
    """The world ends (on every path): DTensor decides elements as before, and its decisions
    are forgotten unless a :func:`keeping_decisions` block runs. Idempotent."""
    try:
        current = _element_decider()
        if _is_ours(current):
            _strategy_utils.expand_to_full_mesh_op_strategy = current._shared_from  # type: ignore[union-attr]
    finally:
        if not _kept.blocks:
            forget_meshes()


def forget_meshes() -> None:
    """Empty DTensor's caches of sharding decisions, and the shared element decisions, after
    a world is destroyed.

    The caches are keyed by device meshes compared by value (shape, ranks, dimension names: not
    the process groups nor this process's rank), and their answers hold the meshes themselves.
    A later process group of the same shape — the user's, wrapping their own model — would get
    DTensors on this world's dead meshes (their groups gone: "Could not resolve the process
    group"). Emptying them costs only recomputing the decisions.
    """
    _shared.clear()
    native = getattr(torch._C, "_clear_DTensor_sharding_propagator_cache", None)
    if native is not None:  # the C++ dispatch fast path's cache
        native()
    propagator = getattr(DTensor._op_dispatcher, "sharding_propagator", None)
    cached = getattr(propagator, "propagate_op_sharding", None)
    if cached is not None and hasattr(cached, "cache_clear"):
        cached.cache_clear()


def _element_decider() -> Callable[..., Any] | None:
    """``expand_to_full_mesh_op_strategy``, which decides one element of a multi-tensor op
    (DTensor looks it up in its module at each call); None where this PyTorch has none
    (nothing is shared then)."""
    found = getattr(_strategy_utils, "expand_to_full_mesh_op_strategy", None)
    return found if callable(found) else None


def _is_ours(decider: Any) -> bool:
    return hasattr(decider, "_shared_from")


def _shared_decision(original: Callable[..., Any]) -> Callable[..., Any]:
    """``original`` answered from :data:`_shared` by its arguments' values; called where they
    do not hash (symbolic sizes) or hold a callback (compared by identity, never shared)."""

    def decide(mesh: Any, op_schema: Any, strategies: Any, **kwargs: Any) -> Any:
        key = _key(mesh, op_schema, strategies, kwargs)
        if key is None:
            return original(mesh, op_schema, strategies, **kwargs)
        found = _shared.get(key)
        if found is None:
            found = original(mesh, op_schema, strategies, **kwargs)
            if len(_shared) >= MAX_SHARED:
                _shared.clear()
            _shared[key] = found
        return found

    decide._shared_from = original  # type: ignore[attr-defined]
    return decide


def _key(mesh: Any, op_schema: Any, strategies: Any, kwargs: dict[str, Any]) -> Any:
    if kwargs.get("is_valid_strategy_cb") is not None:
        return None
    try:
        key = (
            mesh,
            op_schema,
            tuple(tuple(s) for s in strategies),
            tuple(
                sorted((name, tuple(v) if isinstance(v, list) else v) for name, v in kwargs.items())
            ),
        )
        hash(key)
    except TypeError:
        return None
    return key
