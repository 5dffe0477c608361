"""DTensor's sharding decisions under a ``parallel=`` world, and the world itself: kept across
worlds of one shape, then forgotten.

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

Inside the same block the world itself is kept for the next world of its shape
(:func:`kept_world`, :func:`keep_world`): its fake process group and device mesh, and the
sub-meshes made of it (``submeshes``). The next world then runs on the very same meshes, and
every decision it finds compares its meshes by identity, where a new world's compared them by
value: one number per rank, 16,384 of them on the 405B's mesh, whose process groups alone took
7 % of a default plan's time to make again for each trace. The kept world is destroyed when a
world of another shape starts and when the last block ends, on every path.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._collective_utils import MeshTopoInfo

from .submeshes import own_submeshes

__all__ = [
    "drop_world",
    "forget_meshes",
    "keep_world",
    "keeping_decisions",
    "kept_elsewhere",
    "kept_world",
    "let_world_go",
    "world_ended",
    "world_started",
]


@dataclass
class _Kept:
    """What :func:`keeping_decisions` keeps: a token per block running (a token, not a count:
    an interrupt lands before or after ``append``, never between a count and its ``try``), and
    the mesh shape of the world whose decisions DTensor holds."""

    blocks: list[tuple[object, int]] = dataclasses.field(default_factory=list)
    shape: tuple[int, ...] | None = None
    #: the mesh of the world kept for the next world of ``world_shape`` (its process group the
    #: default one), or None
    mesh: DeviceMesh | None = None
    world_shape: tuple[int, ...] | None = None
    owner: int | None = None  # the thread that kept it


_kept = _Kept()


@contextmanager
def keeping_decisions() -> Iterator[None]:
    """Worlds of one mesh shape made one after another inside keep DTensor's sharding
    decisions (see the module's docstring): one candidate of the 70B under FSDP-4 x TP-2,
    traced at 2, 3 and 4 layers, took 3.0 s deciding afresh in each world, 1.3 s keeping
    the decisions. The block's thread's worlds are kept too (:func:`keep_world`), and the last
    one destroyed when the last block ends."""
    token = (object(), threading.get_ident())  # the thread's: only its worlds are kept
    try:
        _kept.blocks.append(token)
        yield
    finally:
        if token in _kept.blocks:
            _kept.blocks.remove(token)
        here = token[1]
        try:
            if _kept.owner == here and all(thread != here for _, thread in _kept.blocks):
                drop_world()  # the world this thread kept, its last block over
        finally:
            if not _kept.blocks:
                _kept.shape = None
                try:
                    drop_world()
                finally:
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


def kept_world(shape: tuple[int, ...]) -> DeviceMesh | None:
    """The mesh of the world this thread kept for a world of ``shape`` (:func:`world_started`'s),
    whose process group is the default one; None where none is kept for ``shape`` (a world this
    thread kept for another is destroyed first). A world another thread kept is never handed
    out: a world in this thread then finds a process group it does not own, and refuses to
    run, as beside any other. The world stays recorded while in use, so that the block's end
    destroys it whatever is interrupted."""
    if _kept.mesh is None or _kept.owner != threading.get_ident():
        return None
    if _kept.world_shape != shape or not dist.is_initialized():
        drop_world()
        return None
    return _kept.mesh


def kept_elsewhere() -> bool:
    """Whether the default process group is a world another thread's plan keeps."""
    return _kept.mesh is not None and _kept.owner != threading.get_ident()


def keep_world(shape: tuple[int, ...], mesh: DeviceMesh | None) -> bool:
    """Keep this thread's world of ``shape`` whose root mesh is ``mesh`` for its next world of
    that shape, if a :func:`keeping_decisions` block of this thread runs (True); else nothing
    is kept (False: the caller destroys it, and :func:`let_world_go`)."""
    here = threading.get_ident()
    if mesh is None or not any(thread == here for _, thread in _kept.blocks):
        return False
    _kept.mesh, _kept.world_shape, _kept.owner = mesh, shape, here
    return True


def let_world_go(mesh: DeviceMesh | None) -> None:
    """Forget the kept world whose mesh is ``mesh``, its caller having destroyed it."""
    if mesh is not None and _kept.mesh is mesh:
        _kept.mesh = _kept.world_shape = _kept.owner = None


def drop_world() -> None:
    """Destroy the kept world, if any: its process group and the sub-meshes made of it."""
    if _kept.mesh is None:
        return
    _kept.mesh = _kept.world_shape = _kept.owner = None
    try:
        if dist.is_initialized():
            dist.destroy_process_group()
    finally:
        own_submeshes()


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
    topology = getattr(MeshTopoInfo.build_from_mesh, "cache_clear", None)
    if topology is not None:  # the cost of redistributing, kept by mesh: it holds the mesh
        topology()
