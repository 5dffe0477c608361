"""Past one device: trace one rank of FSDP2, tensor and context parallelism, on PyTorch's engine.

``analyze(..., parallel={"fsdp": 8})`` (or ``{"tp": 2}``, or ``{"fsdp": 4, "tp": 2}``) traces the
model as one rank of that many devices would run it. Nothing is estimated: PyTorch's own
``fully_shard`` and ``parallelize_module`` wrap a copy of the meta stand-in (never the user's
module) on a fake process group of that size (``torch.testing._internal.distributed.fake_pg``,
backend ``"fake"``, rank 0: collectives move no data), and the step runs on fake tensors
(``FakeTensorMode``: each tensor is meta data standing for a CPU tensor), the way PyTorch's own
``FSDPMemTracker`` runs FSDP2. So every shard, unsharded parameter, all-gather output and
reduce-scatter buffer that FSDP2 allocates on a rank is allocated, and recorded, as it happens.

Why fake CPU tensors rather than meta: FSDP2 refuses parameters on the meta device before it
runs (they "should be materialized from meta device"), and its buffers live on the device of its
mesh. Fake tensors on a CPU mesh meet that check honestly: FSDP2 runs unchanged, and what it
allocates is exactly what it would allocate on a CPU rank. What a CUDA rank does differently
(separate streams, whose frees the caching allocator delays) is not modelled.

:class:`World` owns the process group for the length of one trace and destroys it after (a
plan keeps it for its next world of the same shape, ``decisions.keep_world``); it refuses to
run where a default process group already exists (it would be clobbered). A model
the user wrapped under their own fake process group is traced on that group, as wrapped, by
``meta_widget.distributed.wrapped.AsWrapped`` (the same :func:`trace_rank`, another
:class:`RankWorld`).
"""

from __future__ import annotations

import copy
import fnmatch
import inspect
import logging
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    parallelize_module,
)
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.utils._pytree import tree_map_only

from ..errors import MetaWidgetError
from ..options import MESH_DIMS, LayoutError, Parallel, TraceSpec
from ..trace.callstack import Listener
from ..trace.opcache import FakeOpCache
from ..trace.passes import Trace, trace
from ..trace.recorder import Recorder
from ..undo import Undo
from .comms import CommRecord, CommWatcher
from .context import (
    RING_OPS,
    check_context,
    check_inputs,
    check_ring_ran,
    context_groups,
    fsdp_mesh,
    sharded_sequences,
)
from .decisions import (
    keep_world,
    kept_elsewhere,
    kept_world,
    let_world_go,
    world_ended,
    world_started,
)
from .experts_tp import MOE_STYLES
from .fake_copies import fake_like, on_fake
from .fsdp_chunks import cut_every_chunk, cut_on_demand
from .sequence import SEQUENCE_STYLES, sequence_parallel_names
from .stand_ins import SeenAsReal
from .submeshes import own_submeshes, same_submeshes

#: the logger of ``torch._subclasses.fake_tensor`` (its meta kernel failures)
_FAKE_LOG = logging.getLogger("torch._subclasses.fake_tensor")

__all__ = [
    "ParallelError",
    "RankTrace",
    "World",
    "check_world",
    "fsdp_blocks",
    "tp_names",
    "tp_plan",
    "trace_rank",
]

#: transformers' tensor-parallel style names -> the ``torch.distributed`` style they stand for
TP_STYLES: dict[str, Callable[[], ParallelStyle]] = {
    "colwise": ColwiseParallel,
    "rowwise": RowwiseParallel,
    "embedding_rowwise": lambda: RowwiseParallel(input_layouts=Replicate()),
    "colwise_gather_output": lambda: ColwiseParallel(output_layouts=Replicate()),
    "rowwise_rep": lambda: RowwiseParallel(input_layouts=Replicate()),
    **SEQUENCE_STYLES,
    **MOE_STYLES,
}


class ParallelError(MetaWidgetError, RuntimeError):
    """A parallel trace cannot be set up (a process group exists, no plan for TP, ...)."""


class World:
    """A fake process group of ``plan.world`` ranks, this process rank 0, for one trace.

    >>> with World(plan) as world:
    ...     module, args, kwargs = world.prepare(meta_module, args, kwargs)
    ...     result = trace(module, args, kwargs, attach=world.attach)
    >>> world.comms  # the collectives the rank ran

    ``prepare`` copies the meta module onto fake CPU tensors and wraps the copy; ``attach``
    hands the recorder what a parallel trace adds (collectives, storage resizes, per-rank
    FLOPs). On exit the process group is destroyed; nothing of it stays (inside a plan it is
    kept for the next world of its shape, and destroyed with the plan: ``decisions``).
    """

    #: the device the fake tensors stand for (the device of the mesh)
    device = "cpu"

    def __init__(self, plan: Parallel) -> None:
        self.plan = plan
        self.fake = FakeTensorMode()
        self.mesh: DeviceMesh | None = None
        self.watcher: CommWatcher | None = None
        self._hook = sys.excepthook

    # -- the process group --------------------------------------------------------------------

    #: this process's rank in the fake group (a pipeline rank's world says another)
    rank = 0

    def __enter__(self) -> World:
        plan = self.plan
        shape = self._shape()
        kept = kept_world(shape)  # a plan's last world of this shape, kept for this one
        if kept is None and kept_elsewhere():
            raise ParallelError(
                "parallel=... needs its own fake process group, but a plan running in another "
                "thread of this process holds one between its traces (mw.plan keeps its world "
                "for the next candidate of the same layout). Analyze once the plan has ended, "
                "or in another process."
            )
        if kept is None and dist.is_available() and dist.is_initialized():
            raise ParallelError(
                "parallel=... needs its own fake process group, but this process already has a "
                f"default process group ({dist.get_backend()}, world size "
                f"{dist.get_world_size()}), which meta_widget will not replace. Analyze in a "
                "process without one (e.g. before init_process_group), or wrap the model "
                "yourself and analyze it without parallel=."
            )
        self._hook = sys.excepthook  # init_process_group installs its own ("[rank0]:" lines)
        try:
            world_started(shape)  # __exit__ ends it, on any path
            cut_on_demand()  # FSDP2 cuts this rank's shard only (fsdp_chunks); __exit__ undoes it
            if kept is not None:
                self.mesh = kept
                return self
            same_submeshes()  # a sub-mesh made once, not per parameter (submeshes); likewise
            dist.init_process_group(
                "fake", rank=self.rank, world_size=plan.world, store=FakeStore()
            )
            self.mesh = plan.mesh("cpu")
        except BaseException:
            self.__exit__(*sys.exc_info())  # a group registered before the failure is destroyed
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        """Destroy the process group (if one was made) and undo what making it changed: the
        exception hook, FSDP2's chunking, the sub-meshes kept, DTensor's cache of this world's
        meshes; on every path. Inside a plan (``decisions.keeping_decisions``) the group and
        its meshes are kept for the next world of this shape instead, and destroyed with the
        plan's end or the next world of another shape."""
        try:
            if not (exc and exc[0] is not None) and keep_world(self._shape(), self.mesh):
                return
            if dist.is_initialized():
                dist.destroy_process_group()
            let_world_go(self.mesh)
            own_submeshes()
        finally:
            sys.excepthook = self._hook
            cut_every_chunk()
            world_ended()

    def _shape(self) -> tuple[int, ...]:
        """The mesh's sizes and this process's rank: a pipeline rank's groups differ from
        another's."""
        return (*self.plan.sizes, self.rank)

    def tracing(self) -> FakeTensorMode:
        """The mode the trace runs under (fake tensors standing for CPU tensors)."""
        return self.fake

    # -- the wrapped stand-in ------------------------------------------------------------------

    def prepare(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[nn.Module, tuple[Any, ...], dict[str, Any]]:
        """A copy of ``module`` on fake CPU tensors, wrapped as ``plan`` says, and the inputs
        on fake CPU tensors (the same shapes, dtypes and strides)."""
        assert self.mesh is not None, "prepare() runs inside `with World(plan)`"
        copied = copy.deepcopy(module)
        with self.fake:
            on_fake(copied)
            memo: dict[int, torch.Tensor] = {}
            args, kwargs = tree_map_only(torch.Tensor, lambda t: fake_like(t, memo), (args, kwargs))
        # wrapped outside the mode: the device mesh computes with real (small) tensors, and
        # every op on a fake parameter runs under the parameter's own fake mode anyway
        self._wrap(copied)
        return copied, args, kwargs

    def _wrap(self, copied: nn.Module) -> None:
        assert self.mesh is not None
        if self.plan.tp > 1:
            parallelize_locally(copied, self.mesh["tp"], tp_plan(copied, self.plan))
        mp = self.plan.mp  # FSDP2's own mixed precision, as the user's fully_shard takes it
        policy = MixedPrecisionPolicy(**vars(mp)) if mp is not None else MixedPrecisionPolicy()
        experts: set[nn.Parameter] = set()
        extra: dict[str, tuple[str, int]] = {}
        if self.plan.ep > 1:  # each rank its experts, reached by all-to-all
            from .experts import wrap_experts

            experts, extra = wrap_experts(copied, self.plan, self.mesh, policy)
        if self.plan.fsdp > 1 or self.plan.replicate > 1 or self.plan.cp > 1:
            # HSDP: a 2-D mesh, replicated over its first dimension, sharded over its second;
            # with cp, sharded over fsdp x cp (``context.fsdp_mesh``)
            mesh = fsdp_mesh(self.mesh, self.plan)
            ignored = experts or None
            for block in fsdp_blocks(copied, self.plan.blocks):
                fully_shard(block, mesh=mesh, mp_policy=policy, ignored_params=ignored)
            fully_shard(copied, mesh=mesh, mp_policy=policy, ignored_params=ignored)
        groups = {
            str(self.mesh[name].get_group().group_name): (name, size)
            for name, size in zip(MESH_DIMS, self.plan.sizes, strict=True)
            if size > 1
        }
        flat = context_groups(self.mesh, self.plan)  # fsdp x cp: FSDP2's; without fsdp, cp's
        unlabeled = {name: groups[name] for name in flat if name in groups}
        self.watcher = CommWatcher({**extra, **groups, **flat}, unlabeled)

    def attach(self, recorder: Recorder, undo: Undo) -> None:
        """Give ``recorder`` what a parallel trace adds (see ``passes.trace``'s ``attach``)."""
        assert self.watcher is not None, "attach() follows prepare()"
        self.watcher.attach(recorder, undo)
        if self.plan.cp > 1:  # the ring attention's own ops recorded, not its DTensor call
            recorder.to_subclass = RING_OPS

    @property
    def comms(self) -> list[CommRecord]:
        """The collectives of the trace, in order."""
        return self.watcher.records if self.watcher is not None else []


@dataclass
class RankTrace:
    """What :func:`trace_rank` returns: the trace of rank 0, the wrapped module it ran (its
    parameters are this rank's shards) and the collectives it ran."""

    trace: Trace
    module: nn.Module
    comms: list[CommRecord]


class RankWorld(Protocol):
    """Where one rank's trace runs: :class:`World` (``parallel=``) or the user's own wrapping
    (``meta_widget.distributed.wrapped.AsWrapped``)."""

    device: str

    def __enter__(self) -> RankWorld: ...
    def __exit__(self, *exc: Any) -> None: ...
    def tracing(self) -> FakeTensorMode: ...
    def prepare(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[nn.Module, tuple[Any, ...], dict[str, Any]]: ...
    def attach(self, recorder: Recorder, undo: Undo) -> None: ...
    @property
    def comms(self) -> list[CommRecord]: ...


class _MetaFailure(logging.Filter):
    """Drops ``FakeTensorMode``'s log of a meta kernel that raised (a traceback of ~20 lines,
    ``[rank0]:E``-prefixed under a process group): the error itself reaches the trace, which
    records and explains it."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("failed while attempting to run meta")


@contextmanager
def quiet_meta_failures() -> Iterator[None]:
    """While tracing a rank, ``FakeTensorMode`` logs nothing of the errors it raises (they are
    explained once, in ``Analysis.error``); its other messages pass."""
    quiet = _MetaFailure()
    _FAKE_LOG.addFilter(quiet)
    try:
        yield
    finally:
        _FAKE_LOG.removeFilter(quiet)


def trace_rank(
    world: RankWorld,
    module: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    spec: TraceSpec,
    *,
    listeners: Sequence[Listener] = (),
    on_phase: Callable[[str], None] | None = None,
    drive: Callable[[tuple[Any, ...], dict[str, Any]], Callable[[Any, list[Any]], None]]
    | None = None,
) -> RankTrace:
    """``passes.trace`` of one rank of ``world``: ``module`` (meta) copied, wrapped and run on
    fake tensors under a fake process group (a :class:`World`'s is destroyed afterwards), as
    ``spec`` says (its activation checkpointing picks modules of the wrapped copy). Libraries
    that take another path for a fake tensor see the rank's tensors as real ones
    (``meta_widget.distributed.stand_ins``), as they see a single-device trace's meta tensors.
    ``drive(args, kwargs)``, given the prepared inputs, returns the forward and backward passes
    of a training step run another way (``passes.trace``'s ``drive``: a pipeline schedule)."""
    fake_ops = FakeOpCache() if spec.fast else nullcontext()  # the op cache below the recorder
    with world, quiet_meta_failures():
        with fake_ops:
            wrapped, args, kwargs = world.prepare(module, args, kwargs)
        plan = getattr(world, "plan", None)
        if plan is not None:
            check_inputs(plan, args, kwargs)
        mode = world.tracing()
        with (
            mode,
            fake_ops,
            SeenAsReal(mode),  # the model's code sees a rank's real tensors
            sharded_sequences(world, args, kwargs) as ring_calls,  # cp: a share, the ring
        ):
            result = trace(
                wrapped,
                args,
                kwargs,
                spec,
                listeners=listeners,
                on_phase=on_phase,
                attach=world.attach,
                default_device=world.device,  # device-less tensors: fake tensors, as the others
                drive=drive(args, kwargs) if drive is not None else None,
            )
        check_ring_ran(plan, ring_calls, result.exception is not None)
        return RankTrace(result, wrapped, world.comms)


# ---------------------------------------------------------------------------------------------
# the degrees, against the model (before any process group is made)

#: the config fields whose counts tensor parallelism splits over ``tp`` ranks (transformers'
#: plans shard attention by heads: q/k/v column-wise, each rank ``heads / tp`` of them)
HEAD_FIELDS = ("num_attention_heads", "num_key_value_heads")


def check_world(plan: Parallel, module: nn.Module) -> None:
    """Refuse degrees that ``module`` cannot be split into, before anything is started.

    - ``tp`` must divide the model's attention heads and key/value heads, where its
      (transformers) config gives them and its plan is the config's: that plan splits q, k and v
      column-wise, each rank computing ``heads / tp`` whole heads (a ``tp_plan`` given is the
      caller's to judge).
    - ``fsdp`` may not exceed the rows of the model's largest parameter: FSDP2 shards every
      parameter's first dimension, so past that count a rank's shards stop shrinking and the
      extra ranks hold padding only (the all-gathers grow with them).
    - ``cp`` neither with ``pp`` nor with ``ep`` (``context.check_context``).

    The tensor-parallel plan and ``blocks`` are resolved here too (``ParallelError`` when they
    cannot be), so that every mistake is found before the process group is made.

    Raises ``LayoutError``, an ``OptionError`` (the sizes themselves are bounded by
    ``options.check_parallel``).
    """
    name = type(module).__name__
    check_context(plan)
    if plan.ep > 1:
        from .experts import check_experts

        check_experts(plan, module)
    elif plan.sequence_parallel and plan.tp_plan is None:
        from .experts import expert_modules

        if expert_modules(module):
            raise LayoutError(
                f"parallel tp={plan.tp} with sequence_parallel=True: {name} is a mixture of "
                "experts whose tensor-parallel plan (transformers') leaves each MoE block whole, "
                "and its router cannot take the sequence the block's norm gathers. Give ep as "
                f"torchtitan does (e.g. ep={plan.tp}: the experts spread over the tp ranks, each "
                "routing its share of the tokens), or leave sequence_parallel out."
            )
    if plan.pp > 1:
        from .stages import layer_ranges

        layer_ranges(plan, module)  # a transformers decoder, with a layer for every stage
    if plan.tp > 1:
        tp_plan(module, plan)
        for field, heads in _head_counts(module) if plan.tp_plan is None else ():
            if heads % plan.tp:
                raise LayoutError(
                    f"parallel tp={plan.tp} does not divide the {heads} heads of {name} "
                    f"(config.{field}): tensor parallelism gives each rank heads / tp whole "
                    f"heads. Give a tp that divides {heads}, e.g. tp={_divisor(heads, plan.tp)}."
                )
    if plan.fsdp > 1 or plan.replicate > 1:
        fsdp_blocks(module, plan.blocks)
        rows = max((p.shape[0] for p in module.parameters() if p.ndim), default=0)
        if rows and plan.fsdp > rows:
            raise LayoutError(
                f"parallel fsdp={plan.fsdp} is more ranks than the {rows} rows of the largest "
                f"parameter of {name}: FSDP2 shards each parameter's first dimension, so "
                f"past {rows} ranks every rank holds one row at most and the others only "
                f"padding. Give fsdp <= {rows}."
            )


def _head_counts(module: nn.Module) -> list[tuple[str, int]]:
    """(config field, count) of the attention heads the model's config names, if any."""
    config = getattr(module, "config", None)
    found: list[tuple[str, int]] = []
    for cfg in (config, getattr(config, "text_config", None)):
        for field in HEAD_FIELDS:
            value = getattr(cfg, field, None) if cfg is not None else None
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                found.append((field, value))
    return found


def _divisor(n: int, below: int) -> int:
    """The largest divisor of ``n`` below ``below`` (1 at least)."""
    return max(d for d in range(1, min(n, below) + 1) if n % d == 0)


# ---------------------------------------------------------------------------------------------
# what gets wrapped


def fsdp_blocks(module: nn.Module, names: tuple[str, ...] | None) -> list[nn.Module]:
    """The modules ``fully_shard`` wraps before the root: each child of the outermost
    ``ModuleList``s (a transformer's layers), or the modules ``names`` picks by path or class."""
    if names is None:
        found: list[nn.Module] = []
        inside: set[int] = set()
        for m in module.modules():
            if id(m) in inside:
                continue
            if isinstance(m, nn.ModuleList):
                found.extend(m.children())
                inside.update(id(x) for x in m.modules())
        return found
    chosen = [
        m for p, m in module.named_modules() if p and (p in names or type(m).__name__ in names)
    ]
    if not chosen:
        raise ParallelError(
            f"parallel blocks={list(names)} match no module path or class name of "
            f"{type(module).__name__}; use paths from a.to_dataframe()['module'] or class names."
        )
    return chosen


#: whether ``parallelize_module`` takes ``src_data_rank`` (PyTorch 2.7 and later)
_LOCAL_SHARDS = "src_data_rank" in inspect.signature(parallelize_module).parameters


def parallelize_locally(
    module: nn.Module, mesh: DeviceMesh, styles: dict[str, ParallelStyle]
) -> None:
    """``parallelize_module(module, mesh, styles)``, each rank's shard of a parameter cut from
    its own copy (``src_data_rank=None``) where PyTorch takes that: by default each parameter
    is scattered from rank 0 (a broadcast where replicated), one collective a parameter over the
    fake process group, which moves no data and cost 0.3 ms each (4 % of a tensor-parallel
    trace); the shards are the same either way (new tensors of the chunk's shape), and the
    trace has not begun (no collective of the set-up is recorded)."""
    if _LOCAL_SHARDS:
        parallelize_module(module, mesh, styles, src_data_rank=None)
    else:  # pragma: no cover - PyTorch before 2.7
        parallelize_module(module, mesh, styles)


def tp_plan(module: nn.Module, plan: Parallel) -> dict[str, ParallelStyle]:
    """The tensor-parallel plan of :func:`tp_names`, each style name turned into PyTorch's
    style (``ColwiseParallel``, ``RowwiseParallel``...), each path checked against the model."""
    names = tp_names(module, plan)
    paths = [p for p, _ in module.named_modules()]
    styles: dict[str, ParallelStyle] = {}
    for pattern, style in names.items():
        if style not in TP_STYLES:
            raise ParallelError(
                f"tensor-parallel style {style!r} (for {pattern!r}) is not one meta_widget "
                f"knows; use one of {sorted(TP_STYLES)}."
            )
        if not any(fnmatch.fnmatchcase(p, pattern) for p in paths):
            raise ParallelError(
                f"tensor-parallel plan path {pattern!r} matches no module of "
                f"{type(module).__name__}; use paths from a.to_dataframe()['module']."
            )
        styles[pattern] = TP_STYLES[style]()
    return styles


def tp_names(module: nn.Module, plan: Parallel) -> dict[str, str]:
    """The tensor-parallel plan as style names by module path pattern: ``plan.tp_plan`` if
    given, else transformers' plan of the model's config (``base_model_tp_plan``, paths under
    the base model, and the model class's ``_tp_plan``); in its sequence-parallel form with
    ``sequence_parallel``; with ``ep``, the MoE blocks' styles (``experts_tp``)."""
    names = dict(plan.tp_plan) if plan.tp_plan is not None else transformers_plan(module)
    if not names:
        raise ParallelError(
            f"parallel tp={plan.tp} needs a tensor-parallel plan, and {type(module).__name__} "
            "has none (transformers models carry one in their config). Give one: "
            'parallel={"tp": 2, "tp_plan": {"layers.*.up": "colwise", "layers.*.down": '
            '"rowwise"}} (module paths, * for any name; styles: '
            f"{', '.join(sorted(TP_STYLES))})."
        )
    if plan.sequence_parallel:
        names = sequence_parallel_names(module, names)
    if plan.ep > 1:  # the MoE blocks' tokens split over the ranks that ep borrows
        from .experts import expert_modules
        from .experts_tp import moe_names

        experts = [path for path, _ in expert_modules(module)]
        moe = moe_names(module, experts, plan.sequence_parallel)
        placed = [
            p for p in _named_paths(module, moe) if any(fnmatch.fnmatchcase(p, n) for n in names)
        ]
        if placed:
            raise LayoutError(
                f"parallel ep={plan.ep} with tp={plan.tp} places each MoE block and its router "
                f"itself (torchtitan's way), and the tensor-parallel plan names "
                f"{placed[0]!r} too: leave the MoE blocks out of tp_plan."
            )
        names.update(moe)
    return names


def _named_paths(module: nn.Module, plan: dict[str, str]) -> list[str]:
    """The paths of ``module``'s modules that a pattern of ``plan`` names (``*`` for any
    name)."""
    paths = [p for p, _ in module.named_modules()]
    return [p for p in paths if any(fnmatch.fnmatchcase(p, pattern) for pattern in plan)]


def transformers_plan(module: nn.Module) -> dict[str, str]:
    """transformers' tensor-parallel plan of ``module`` (style names by module path)."""
    config = getattr(module, "config", None)
    base = getattr(config, "base_model_tp_plan", None) or {}
    prefix = getattr(module, "base_model_prefix", "")
    under = f"{prefix}." if prefix and isinstance(getattr(module, prefix, None), nn.Module) else ""
    names = {f"{under}{k}": v for k, v in base.items()}
    names.update(getattr(module, "_tp_plan", None) or {})
    return names
