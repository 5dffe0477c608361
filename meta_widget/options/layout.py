"""``mw.Parallel``: one typed description of a parallel layout, checked when it is made.

A layout is the degrees of each dimension of the device mesh (``replicate`` x ``pp`` x ``fsdp``
x ``cp`` x ``tp``, ``ep`` within ``fsdp`` x ``cp``), the pipeline's schedule, and how FSDP2,
tensor parallelism and the pipeline split the model. ``Parallel(...)`` checks itself: a
degree that is not a whole number, a world past ``MAX_RANKS``, a schedule that cannot run with
its ``virtual_stages``, a ``mp`` without FSDP2... each is one ``OptionError`` line before any
process group exists (what the model cannot take, a ``LayoutError``, is checked against the
model by ``meta_widget.distributed.parallel.check_world``). It builds the device mesh in one
place (:meth:`Parallel.mesh`), as torchtitan's ``ParallelDims`` does. ``parallel=`` takes a
``Parallel`` or a dict of its fields (:func:`check_parallel`).
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from .errors import MAX_MICRO_BATCHES, MAX_RANKS, OptionError, OptionTypeError, show
from .parallel import MixedPrecision, mixed_precision

__all__ = ["EP_NOTE", "MESH_DIMS", "SCHEDULES", "Parallel", "ParallelPlan", "check_parallel"]

#: the assumption of an ``ep`` trace (``meta_widget.distributed.experts``)
EP_NOTE = (
    "Expert parallelism assumes balanced routing: every expert receives tokens x top_k / "
    "experts token copies, and every rank sends each rank an equal share."
)

_EXAMPLE = (
    'e.g. parallel={"fsdp": 8}, {"tp": 2}, {"fsdp": 4, "tp": 2}, {"replicate": 2, "fsdp": 4} '
    '(HSDP), {"pp": 4, "schedule": "1F1B"}, or mw.Parallel(fsdp=4, pp=2), with optional '
    '"blocks" (module paths or class names fully_shard wraps) and "tp_plan" ({path: '
    '"colwise"}) and "mp" (FSDP2\'s mixed precision: {"param_dtype": "bfloat16", '
    '"reduce_dtype": "float32"})'
)
#: the dimensions of the device mesh, outermost first (torchtitan's order): pipeline stages,
#: replicas (HSDP), FSDP shards, context (sequence) shards, tensor parallelism (innermost: its
#: ranks are neighbours, on one node)
MESH_DIMS = ("pp", "replicate", "fsdp", "cp", "tp")
#: the degrees, in the order ``Parallel`` takes them
DEGREES = ("replicate", "fsdp", "tp", "pp", "cp", "ep")

#: pipeline schedule name -> (``torch.distributed.pipelining`` class, stages per rank: 1, or
#: None: ``virtual_stages`` of them (2 at least), or a fixed count); PyTorch's own names
#: (``get_schedule_class``'s) are accepted too, in any case
SCHEDULES: dict[str, tuple[str, int | None]] = {
    "1F1B": ("Schedule1F1B", 1),
    "gpipe": ("ScheduleGPipe", 1),
    "interleaved-1F1B": ("ScheduleInterleaved1F1B", None),
    "zero-bubble": ("ScheduleInterleavedZeroBubble", None),
    "ZBV-zero-bubble": ("ScheduleZBVZeroBubble", 2),
}
_ALIASES = {
    **{name.lower(): name for name in SCHEDULES},
    "interleaved1f1b": "interleaved-1F1B",
    "interleavedzerobubble": "zero-bubble",
    "zbvzerobubble": "ZBV-zero-bubble",
}


@dataclass(frozen=True)
class Parallel:
    """A parallel layout: how many ranks along each dimension, and how the model is split.

    >>> mw.analyze(model, input_data=x, mode="training", parallel=mw.Parallel(fsdp=8, tp=2))

    ``replicate`` x ``fsdp`` x ``tp`` x ``pp`` x ``cp`` ranks in all (``world``); ``ep``
    (expert parallelism: each rank holds ``experts / ep`` of every MoE layer's experts) borrows
    its ranks from ``fsdp`` x ``cp``, as in torchtitan, so it must divide them; with ``tp``
    every tensor-parallel rank too (``ep`` a multiple of ``tp``).

    Parameters
    ----------
    replicate, fsdp : HSDP's replicas and FSDP2's shards (``fully_shard`` on a 1-D or 2-D mesh)
    tp : tensor parallelism (``parallelize_module`` with ``tp_plan``, or the transformers
        config's plan)
    pp : pipeline stages' ranks (``torch.distributed.pipelining``)
    cp : context parallelism (ring attention over the sequence)
    ep : expert parallelism (within ``fsdp`` x ``cp``, and ``tp`` where there is one)
    schedule : the pipeline schedule (see ``SCHEDULES``): ``"1F1B"`` by default, or
        ``"interleaved-1F1B"`` when ``virtual_stages`` > 1
    virtual_stages : stages per pipeline rank (interleaved schedules)
    microbatches : the pipeline's micro-batches per step (default ``pp * virtual_stages``);
        the batch is split into that many
    stage_boundaries : the layer index at which each stage after the first begins (``pp *
        virtual_stages - 1`` of them, rising); default: layers split evenly
    capacity_factor : with ``ep``, each expert's buffer holds ``capacity_factor`` times its
        balanced share of token copies (GShard's and Megatron's padded dispatch): the
        all-to-alls and the experts' matmuls run on the padded buffers; default None, no
        padding (dropless)
    mp : FSDP2's ``MixedPrecisionPolicy`` (a dict of its arguments, or one)
    blocks : the modules ``fully_shard`` wraps (module paths or class names)
    tp_plan : ``{module path: style}`` for tensor parallelism
    sequence_parallel : with ``tp``, Megatron's sequence parallelism (PyTorch's
        ``SequenceParallel``, torchtitan's Llama plan): the norms and the residual stream
        between the tensor-parallel blocks hold ``sequence / tp`` tokens on each rank; each
        block all-gathers its input and reduce-scatters its output instead of all-reducing it
    """

    replicate: int = 1
    fsdp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    schedule: str | None = None
    virtual_stages: int = 1
    microbatches: int | None = None
    stage_boundaries: tuple[int, ...] | None = None
    capacity_factor: float | None = None
    mp: MixedPrecision | None = None
    blocks: tuple[str, ...] | None = None
    tp_plan: tuple[tuple[str, str], ...] | None = None
    sequence_parallel: bool = False

    def __post_init__(self) -> None:
        for key in DEGREES:
            _set(self, key, _degree(key, getattr(self, key)))
        self._check_expert_ranks()
        self._check_capacity()
        world = self.world
        if world < 2:
            raise OptionError(
                f"parallel={self._given()} is one device: give replicate, fsdp, tp, pp or cp > 1 "
                f"({_EXAMPLE}), or leave parallel out."
            )
        if world > MAX_RANKS:
            raise OptionError(
                f"parallel={self._given()} is {world:,} ranks (replicate x fsdp x tp x pp x cp), "
                f"more than {MAX_RANKS}, the most a parallel= trace stands for: lower a degree."
            )
        self._check_pipeline()
        self._check_sequence_parallel()
        _set(self, "blocks", _blocks(self.blocks))
        _set(self, "tp_plan", _tp_plan(self.tp_plan))
        _set(self, "mp", mixed_precision(self.mp))
        if self.mp is not None and self.fsdp == self.replicate == 1:
            raise OptionError(
                f"parallel['mp'] is FSDP2's mixed precision, and parallel={self._given()} "
                'shards nothing with FSDP2: give "fsdp" (e.g. {"fsdp": 8, "mp": {...}}), or leave '
                '"mp" out (for compute in bfloat16 on one device, analyze(..., autocast=...))."'
            )

    def _check_expert_ranks(self) -> None:
        """``ep`` borrows its ranks as torchtitan's (expert tensor parallelism 1): from ``fsdp``
        x ``cp``, and with ``tp`` every tensor-parallel rank too (``ep`` a multiple of ``tp``
        dividing ``fsdp x cp x tp``)."""
        if self.ep == 1:
            return
        if self.tp == 1 and (self.fsdp * self.cp) % self.ep:
            raise OptionError(
                f"parallel ep={self.ep} must divide fsdp x cp = {self.fsdp * self.cp}: expert "
                "parallelism borrows its ranks from the FSDP and context-parallel ones (as "
                f"torchtitan's); give fsdp={self.ep} (or a multiple) with ep={self.ep}."
            )
        ranks = self.fsdp * self.cp * self.tp
        if self.tp > 1 and (self.ep % (self.tp * self.cp) or ranks % self.ep):
            raise OptionError(
                f"parallel ep={self.ep} with tp={self.tp} must be a multiple of tp x cp = "
                f"{self.tp * self.cp} dividing fsdp x cp x tp = {ranks}: expert parallelism "
                "borrows every tensor-parallel rank and some FSDP ones (torchtitan's expert "
                f"tensor parallelism 1); give e.g. ep={self.tp * self.cp}."
            )

    def _check_capacity(self) -> None:
        """``capacity_factor``: a number >= 1 (up to 64), and only with ``ep`` > 1."""
        cf = self.capacity_factor
        if cf is None:
            return
        if isinstance(cf, bool) or not isinstance(cf, numbers.Real) or not 1 <= float(cf) <= 64:
            raise OptionError(
                f"parallel capacity_factor={show(cf)} must be a number from 1 to 64 (each "
                "expert's buffer, in balanced shares of token copies), e.g. 1.25."
            )
        if self.ep == 1:
            raise OptionError(
                f"parallel capacity_factor={show(cf)} pads expert parallelism's buffers, and "
                'ep=1 is none: give ep > 1 (e.g. {"fsdp": 4, "ep": 4, "capacity_factor": '
                "1.25}) or leave capacity_factor out."
            )
        _set(self, "capacity_factor", float(cf))

    def _check_sequence_parallel(self) -> None:
        """``sequence_parallel``: a bool, and only with ``tp`` > 1 (it shards the sequence
        over the tensor-parallel ranks)."""
        sp = self.sequence_parallel
        if not isinstance(sp, bool):
            raise OptionTypeError(
                f"parallel sequence_parallel must be True or False, not {show(sp)}."
            )
        if sp and self.tp == 1:
            raise OptionError(
                "parallel sequence_parallel=True shards the sequence over the tensor-parallel "
                "ranks, and tp=1 has none: give tp > 1 (e.g. {'tp': 8, "
                "'sequence_parallel': True}) or leave sequence_parallel out."
            )

    def _check_pipeline(self) -> None:
        """``schedule``, ``virtual_stages``, ``microbatches`` and ``stage_boundaries``: only
        with ``pp`` > 1, the schedule one of ``SCHEDULES`` that runs with ``virtual_stages``."""
        pipeline = {k: getattr(self, k) for k in ("schedule", "microbatches", "stage_boundaries")}
        given = [k for k, v in pipeline.items() if v is not None]
        if self.virtual_stages != 1:
            given.append("virtual_stages")
        if self.pp == 1:
            if given:
                raise OptionError(
                    f"parallel {', '.join(given)}: pipeline settings, and pp=1 is no pipeline: "
                    'give pp > 1 (e.g. {"pp": 4, "schedule": "1F1B"}) or leave them out.'
                )
            return
        v = _degree("virtual_stages", self.virtual_stages, "stages per pipeline rank")
        _set(self, "virtual_stages", v)
        name = self.schedule if self.schedule is not None else "1F1B" if v == 1 else None
        name = "interleaved-1F1B" if name is None else name
        if not isinstance(name, str) or name.lower() not in _ALIASES:
            raise OptionError(
                f"parallel schedule={show(self.schedule)} is not a pipeline schedule meta_widget "
                f"traces: use one of {', '.join(SCHEDULES)}."
            )
        name = _ALIASES[name.lower()]
        _set(self, "schedule", name)
        per_rank = SCHEDULES[name][1]
        if per_rank == 1 and v > 1:
            raise OptionError(
                f"parallel schedule={name!r} runs one stage per rank, not virtual_stages={v}: use "
                '"interleaved-1F1B" or "zero-bubble" for several, or leave virtual_stages out.'
            )
        if (per_rank is None and v < 2) or (per_rank not in (None, 1) and v != per_rank):
            want = "2 or more" if per_rank is None else str(per_rank)
            raise OptionError(
                f"parallel schedule={name!r} runs {want} stages per rank: give "
                f"virtual_stages={2 if per_rank is None else per_rank}, or schedule='1F1B'."
            )
        n = self.microbatches if self.microbatches is not None else self.pp * v
        n = _degree("microbatches", n, "micro-batches", MAX_MICRO_BATCHES)
        if name == "gpipe" or name == "1F1B":
            if n < self.stages:
                raise OptionError(
                    f"parallel microbatches={n} is fewer than the {self.stages} stages: "
                    f"PyTorch's {SCHEDULES[name][0]} needs one micro-batch per stage at least."
                )
        elif n % max(1, n // self.pp):
            rounds = max(1, n // self.pp)
            raise OptionError(
                f"parallel microbatches={n} is not a multiple of the schedule's {rounds} rounds "
                f"(microbatches // pp): PyTorch's {SCHEDULES[name][0]} needs one; give "
                f"microbatches={rounds * self.pp}."
            )
        _set(self, "microbatches", n)
        bounds = self.stage_boundaries
        if bounds is not None:
            if (
                isinstance(bounds, (str, bytes))
                or not isinstance(bounds, Sequence)
                or not all(isinstance(b, int) and not isinstance(b, bool) for b in bounds)
                or len(bounds) != self.stages - 1
                or list(bounds) != sorted(set(bounds))
                or bounds[0] < 1
            ):
                raise OptionError(
                    f"parallel stage_boundaries={show(bounds)} must be {self.stages - 1} rising "
                    "layer indices >= 1 (where each stage after the first begins), e.g. "
                    f"{tuple(range(1, self.stages))} for one layer a stage."
                )
            _set(self, "stage_boundaries", tuple(bounds))

    # -- what the layout is ---------------------------------------------------------------------

    @property
    def world(self) -> int:
        """The ranks of the layout: ``replicate * fsdp * tp * pp * cp``."""
        return self.replicate * self.fsdp * self.tp * self.pp * self.cp

    @property
    def stages(self) -> int:
        """The pipeline's stages: ``pp * virtual_stages``."""
        return self.pp * self.virtual_stages

    @property
    def data_parallel(self) -> int:
        """The ranks that process other data: every replica's shard group (a context-parallel
        rank processes another part of the same sequences)."""
        return self.replicate * self.fsdp

    @property
    def sizes(self) -> tuple[int, ...]:
        """The device mesh's shape, in ``MESH_DIMS`` order."""
        return tuple(getattr(self, name) for name in MESH_DIMS)

    def label(self) -> str:
        """The layout in a few words: ``"fsdp 4 × tp 2 · mp bfloat16 param"``."""
        sizes = [f"{k} {getattr(self, k)}" for k in DEGREES if getattr(self, k) > 1]
        if self.sequence_parallel:
            sizes[sizes.index(f"tp {self.tp}")] += " (sequence parallel)"
        pipeline = ""
        if self.pp > 1:
            v = f", {self.virtual_stages} stages a rank" if self.virtual_stages > 1 else ""
            pipeline = f" · {self.schedule}{v}, {self.microbatches} micro-batches"
        mp = f" · {self.mp.label()}" if self.mp is not None else ""
        cf = f" · capacity {self.capacity_factor:g}" if self.capacity_factor is not None else ""
        return " × ".join(sizes) + pipeline + cf + mp

    @property
    def mesh_dims(self) -> tuple[str, ...]:
        """The dimensions of the device mesh: those of ``MESH_DIMS`` the layout uses (a degree
        above 1; ``fsdp`` too with ``replicate``, HSDP's 2-D mesh), outermost first."""
        return tuple(
            name
            for name in MESH_DIMS
            if getattr(self, name) > 1 or (name == "fsdp" and self.replicate > 1)
        )

    def mesh(self, device: str = "cpu") -> DeviceMesh:
        """The device mesh of the layout, its dimensions :attr:`mesh_dims`, on the default
        process group, which must be ``world`` ranks.

        A dimension of size 1 is left out: PyTorch makes every process group of every
        dimension on each rank (``new_group`` for each, members or not), so a size-1 dimension
        of a 16,384-rank world is 16,384 groups (2.2 s for Llama 3 405B's layout, pp 16 x fsdp
        128 x tp 8, where its three dimensions take 0.1 s)."""
        names = self.mesh_dims
        return init_device_mesh(
            device, tuple(getattr(self, n) for n in names), mesh_dim_names=names
        )

    def _given(self) -> str:
        """The fields away from their defaults, as a dict's text (for messages)."""
        given = {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if getattr(self, f.name) != f.default
        }
        return show(given)


#: the name the checked layout had before ``Parallel``
ParallelPlan = Parallel


def check_parallel(parallel: Any) -> Parallel | None:
    """``parallel``: None, a :class:`Parallel`, or a dict of its fields (which becomes one)."""
    if parallel is None or isinstance(parallel, Parallel):
        return parallel
    if not isinstance(parallel, Mapping):
        raise OptionTypeError(
            f"parallel must be a dict or mw.Parallel, not {type(parallel).__name__}: {_EXAMPLE}."
        )
    known = {f.name for f in fields(Parallel)}
    unknown = sorted(set(map(str, parallel)) - known)
    if unknown:
        raise OptionError(f"parallel has unknown keys {unknown}: {_EXAMPLE}.")
    return Parallel(**parallel)


def _set(layout: Parallel, key: str, value: Any) -> None:
    object.__setattr__(layout, key, value)  # a frozen dataclass, normalized as it is made


def _degree(key: str, value: Any, what: str = "devices", most: int = MAX_RANKS) -> int:
    """A whole number of ``what`` from 1 to ``most``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) < 1:
        raise OptionError(
            f"parallel[{key!r}] must be a whole number of {what} >= 1, not {show(value)}: "
            f"{_EXAMPLE}."
        )
    if int(value) > most:
        raise OptionError(
            f"parallel[{key!r}]={show(value)} is more than {most} {what}, the most a "
            "parallel= trace stands for (the largest published training jobs): give the "
            f"degree of one job, {_EXAMPLE}."
        )
    return int(value)


def _blocks(blocks: Any) -> tuple[str, ...] | None:
    if blocks is None:
        return None
    blocks = (blocks,) if isinstance(blocks, str) else blocks
    if not isinstance(blocks, Sequence) or not all(isinstance(b, str) for b in blocks):
        raise OptionTypeError(
            f"parallel['blocks'] must be module paths or class names, not {show(blocks)}."
        )
    return tuple(blocks)


def _tp_plan(plan: Any) -> tuple[tuple[str, str], ...] | None:
    if plan is None:
        return None
    if isinstance(plan, tuple) and all(isinstance(p, tuple) and len(p) == 2 for p in plan):
        plan = dict(plan)  # already normalized (a Parallel made from another's fields)
    if not isinstance(plan, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in plan.items()
    ):
        raise OptionTypeError(
            f"parallel['tp_plan'] must map module paths to style names, not {show(plan)}: "
            'e.g. {"layers.*.up": "colwise", "layers.*.down": "rowwise"}.'
        )
    return tuple(plan.items())
