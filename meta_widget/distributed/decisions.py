"""DTensor's sharding decisions under a ``parallel=`` world: kept across worlds, then forgotten.

DTensor decides, for each op on DTensors, how its inputs and outputs shard (its sharding
propagation), and caches the decision by the op's schema: the op, and each argument's mesh,
placements and metadata. ``plan`` traces many candidates of a few mesh shapes, each in its own
world; :func:`keeping_decisions` keeps the decisions made in one for the next world of the same
shape instead of making them again. (The optimizer's multi-tensor ops, which DTensor decided
element by element, no longer reach it: ``meta_widget.trace.shard_foreach`` runs them on the
shards.)

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
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch.distributed.tensor import DTensor

__all__ = ["forget_meshes", "keeping_decisions", "world_ended", "world_started"]


@dataclass
class _Kept:
    """What :func:`keeping_decisions` keeps: a token per block running (a token, not a count:
    an interrupt lands before or after ``append``, never between a count and its ``try``), and
    the mesh shape of the world whose decisions DTensor holds."""

    blocks: list[object] = dataclasses.field(default_factory=list)
    shape: tuple[int, ...] | None = None


_kept = _Kept()


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
    decisions of another shape are forgotten. The rank is part of the shape: the ranks of a
    pipeline are traced one after another, and rank 1's ``tp`` sub-mesh equals rank 0's by
    value under other groups (kept, rank 0's decisions sent rank 1's tensor-parallel
    collectives to rank 0's groups: its schedule never ended)."""
    if _kept.blocks and _kept.shape != shape:  # decisions of another shape's groups
        forget_meshes()
    _kept.shape = shape


def world_ended() -> None:
    """The world ends (on every path): its decisions are forgotten unless a
    :func:`keeping_decisions` block runs. Idempotent."""
    if not _kept.blocks:
        forget_meshes()


def forget_meshes() -> None:
    """Empty DTensor's caches of sharding decisions after a world is destroyed.

    The caches are keyed by device meshes compared by value (shape, ranks, dimension names: not
    the process groups nor this process's rank), and their answers hold the meshes themselves.
    A later process group of the same shape — the user's, wrapping their own model — would get
    DTensors on this world's dead meshes (their groups gone: "Could not resolve the process
    group"). Emptying them costs only recomputing the decisions.
    """
    native = getattr(torch._C, "_clear_DTensor_sharding_propagator_cache", None)
    if native is not None:  # the C++ dispatch fast path's cache
        native()
    propagator = getattr(DTensor._op_dispatcher, "sharding_propagator", None)
    cached = getattr(propagator, "propagate_op_sharding", None)
    if cached is not None and hasattr(cached, "cache_clear"):
        cached.cache_clear()
