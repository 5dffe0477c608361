"""Pipeline parallelism traced per stage on PyTorch's own engine, ``torch.distributed.pipelining``.

``analyze(..., parallel={"pp": P, "schedule": "1F1B"})`` traces every pipeline rank, one after
another, each as rank ``r`` of a fake process group (the collectives and sends move no data):
the model is split by layer ranges (``meta_widget.distributed.stages``), the rank's stages
become PyTorch's ``PipelineStage`` (their input and output shapes given, as with static
shapes), and the schedule class of ``Parallel.schedule`` (``Schedule1F1B``,
``ScheduleInterleaved1F1B``, ``ScheduleGPipe``, ``ScheduleInterleavedZeroBubble``,
``ScheduleZBVZeroBubble``) runs its own action list for two training steps on fake tensors
under meta_widget's recorder: every micro-batch's activations held until its backward, the
receive buffers, the gradients sent back, the optimizer state of the rank's own layers are
allocated, and recorded, as they happen. With ``tp`` > 1 each stage takes its part of the
model's tensor-parallel plan (:func:`stage_tp_plan`), and with ``fsdp`` > 1 its layers, then the
stage, are ``fully_shard``-ed over the rank's FSDP group (torchtitan's order).

One departure from a real run: before its first step a schedule's stages vote by sending a
number along the pipeline whether their shapes are static. Under a fake process group no number
arrives, so the vote is settled as stages with given shapes settle it (static) without sending.

The result: ``a.stages``, one :class:`StageReport` per pipeline rank (its modules, peak, step
time with the schedule's bubble, bytes sent and received), and the analysis of the rank with
the highest peak (``a.peak_bytes`` is that rank's; ``a.stages`` says which). The bubble is
counted on the actions each rank's schedule ran (its forwards, backwards and weight gradients,
in its order), laid out in time slots (:func:`bubble_fractions`).
"""

from __future__ import annotations

import copy
import fnmatch
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed import pipelining as pp
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.pipelining import schedules as pp_schedules
from torch.distributed.pipelining.stage import InferenceMode
from torch.utils._pytree import tree_map_only

from ..choices import Phase
from ..options import MESH_DIMS, SCHEDULES, LayoutError, Options, Parallel
from ..timing.model import in_pipeline, stage_step_s
from ..trace.assume import MetaFixes
from ..trace.passes import default_loss
from ..trace.recorder import Recorder
from ..undo import Undo, without_grad
from .comms import CommRecord, CommWatcher
from .fake_copies import fake_like, on_fake
from .parallel import (
    TP_STYLES,
    ParallelError,
    RankTrace,
    World,
    parallelize_locally,
    tp_names,
    trace_rank,
)
from .stages import DecoderStage, RankStages, layer_ranges, rank_stages, stage_indices

__all__ = [
    "PipelineWorld",
    "StageReport",
    "bubble_fractions",
    "check_batch",
    "rank_of",
    "run_stages",
    "schedule_slots",
]


@dataclass(frozen=True)
class StageReport:
    """One pipeline rank: its ``stages`` (indices), the ``modules`` they hold (the model's
    paths), its ``peak_bytes`` (the steady step's), ``bubble`` (the share of the schedule's
    slots it waits: its action list's idle slots over the longest rank's), ``step_s`` (its
    compute stretched by the bubble, plus its optimizer step and exposed communication; None
    without ``gpu=``), the bytes it sends and receives per step, its whole ``analysis``, and the
    ``actions`` its schedule ran with the ``slots`` they take."""

    rank: int
    stages: tuple[int, ...]
    modules: tuple[str, ...]
    peak_bytes: int
    bubble: float
    step_s: float | None
    send_bytes: int
    recv_bytes: int
    analysis: Any
    #: the actions its schedule ran in its first step, in order, and the time slot of each
    #: (:func:`schedule_slots`): the widget's schedule view
    actions: tuple[Action, ...] = ()
    slots: tuple[int, ...] = ()


def rank_of(plan: Parallel, pp_rank: int) -> int:
    """The global rank traced for pipeline rank ``pp_rank``: its first rank along every other
    dimension (``pp`` is the mesh's outermost)."""
    return pp_rank * (plan.world // plan.pp)


class PipelineWorld(World):
    """A fake process group of ``plan.world`` ranks, this process rank :func:`rank_of`
    ``pp_rank``, for one pipeline rank's trace (``parallel.World``'s group, made and undone
    as it makes and undoes its own)."""

    device = "cpu"

    def __init__(
        self,
        plan: Parallel,
        pp_rank: int,
        shapes: list[tuple[Any, Any]],
        tp_styles: dict[str, str] | None = None,
    ) -> None:
        self.plan, self.pp_rank, self.shapes = plan, pp_rank, shapes
        self.rank = rank_of(plan, pp_rank)
        self.mesh = None
        #: the model's tensor-parallel plan (style names by module path), for ``tp`` > 1
        self.tp_styles = tp_styles or {}
        self.batch = int(shapes[0][0][0].shape[0]) * int(plan.microbatches or 1)
        self.fake = FakeTensorMode()
        self.watcher: CommWatcher | None = None
        self.schedule: Any = None
        #: the actions the rank's schedule ran in its first step, in order
        self.ran: list[Action] = []
        self.first = self.last = False
        #: the loss of the last stage's output (``analyze``'s ``loss=``, or the sum)
        self.loss: Callable[[Any], torch.Tensor] = default_loss
        self._hook = sys.excepthook

    def prepare(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[nn.Module, tuple[Any, ...], dict[str, Any]]:
        """A copy of the rank's stages (``module``, a :class:`RankStages` on meta) on fake CPU
        tensors, FSDP2-wrapped where ``fsdp`` > 1, and its schedule; the inputs (the first
        rank's token ids) on fake tensors."""
        assert self.mesh is not None, "prepare() runs inside `with PipelineWorld(...)`"
        full = self.mesh
        plan = self.plan
        copied = copy.deepcopy(module)
        with self.fake:
            on_fake(copied)
            memo: dict[int, torch.Tensor] = {}
            args, kwargs = tree_map_only(torch.Tensor, lambda t: fake_like(t, memo), (args, kwargs))
        if plan.tp > 1:  # each stage's part of the model's plan (paths under the stage)
            for stage in copied.children():
                styles = stage_tp_plan(stage, self.tp_styles)
                if styles:
                    parallelize_locally(stage, full["tp"], styles)
                if plan.sequence_parallel:
                    assert isinstance(stage, DecoderStage)
                    stage.sequence_mesh = full["tp"]
        mp = plan.mp
        policy = MixedPrecisionPolicy(**vars(mp)) if mp is not None else MixedPrecisionPolicy()
        experts: set[nn.Parameter] = set()
        extra: dict[str, tuple[str, int]] = {}
        if plan.ep > 1:  # the stages' experts, as a rank without stages holds them
            from .experts import wrap_experts

            experts, extra = wrap_experts(copied, plan, full, policy)
        if plan.fsdp > 1 or plan.replicate > 1:
            mesh = full["replicate", "fsdp"] if plan.replicate > 1 else full["fsdp"]
            ignored = experts or None
            for stage in copied.children():
                assert isinstance(stage, DecoderStage)
                for layer in stage.layers:
                    fully_shard(layer, mesh=mesh, mp_policy=policy, ignored_params=ignored)
                fully_shard(stage, mesh=mesh, mp_policy=policy, ignored_params=ignored)
        group = full["pp"].get_group()
        stages = []
        for index, stage in zip(stage_indices(plan, self.pp_rank), copied.children(), strict=True):
            with self.fake:
                given, made = (  # a floating tensor between stages carries a gradient back
                    tuple(
                        torch.empty(t.shape, dtype=t.dtype, device="cpu").requires_grad_(
                            t.is_floating_point()
                        )
                        for t in shape
                    )
                    for shape in self.shapes[index]
                )
            stages.append(
                pp.PipelineStage(
                    stage, index, plan.stages, torch.device("cpu"), given, made, group=group
                )
            )
        self.first = any(s.is_first for s in stages)
        self.last = any(s.is_last for s in stages)
        cls = getattr(pp_schedules, SCHEDULES[str(plan.schedule)][0])
        self.schedule = cls(
            stages if SCHEDULES[str(plan.schedule)][1] != 1 else stages[0],
            n_microbatches=plan.microbatches,
            loss_fn=lambda out, target: self.loss(out),
        )
        self.schedule._warmup_p2p = _settled_vote  # see the module docstring
        self.stages = stages
        groups = {
            str(full[name].get_group().group_name): (name, size)
            for name, size in zip(MESH_DIMS, plan.sizes, strict=True)
            if size > 1
        }
        self.watcher = CommWatcher({**groups, **extra})
        return copied, args, kwargs

    def attach(self, recorder: Recorder, undo: Undo) -> None:
        assert self.watcher is not None
        self.watcher.attach(recorder, undo)

    @property
    def comms(self) -> list[CommRecord]:
        return self.watcher.records if self.watcher is not None else []

    def drive(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Callable[[Any, list[Any]], None]:
        """The step a trace runs in place of a forward and backward (``trace``'s ``drive``):
        the schedule's ``step`` over the rank's inputs, each action marking its phase."""

        def step(run: Any, params: list[Any]) -> None:
            ran: list[Action] = []
            for stage in self.stages:
                _mark_phases(stage, run, ran)  # this step's: the trace's second step too
            if not self.ran:
                self.ran = ran  # the first step's actions
            with self.fake:
                target = torch.empty(self.batch, 0)  # the loss reads no target: no bytes
            self.schedule.step(
                *(args if self.first else ()),
                target=target if self.last else None,
                return_outputs=False,
            )
            run.mark_grads(params)

        return step


def stage_tp_plan(stage: nn.Module, styles: dict[str, str]) -> dict[str, Any]:
    """The model's tensor-parallel plan for one stage: each path made relative to the stage
    (``model.layers.*.mlp.up_proj`` -> ``layers.*.mlp.up_proj``, ``model.embed_tokens`` ->
    ``embed_tokens``), kept where it names a module of the stage."""
    paths = [p for p, _ in stage.named_modules()]
    found: dict[str, Any] = {}
    for pattern, style in styles.items():
        local = pattern.removeprefix("model.")
        if any(fnmatch.fnmatchcase(p, local) for p in paths):
            found[local] = TP_STYLES[style]()
    return found


def _settled_vote(stages: list[Any], has_backward: bool, p2p_done: bool) -> None:
    for stage in stages:
        stage._inference_mode = InferenceMode.STATIC


def _mark_phases(stage: Any, run: Any, ran: list[Action]) -> None:
    """``stage``'s forward and backward actions begin their phases and are added to ``ran``
    (this trace's own stage objects: instance attributes)."""
    cls = type(stage)
    forward = cls.forward_one_chunk.__get__(stage)
    backward = cls.backward_one_chunk.__get__(stage)
    weight = cls.backward_weight_one_chunk.__get__(stage)
    index = stage.stage_index

    def forward_one_chunk(chunk: int, *args: Any, **kwargs: Any) -> Any:
        run.phase(Phase.FORWARD)
        ran.append(("F", index, chunk))
        with run.forward_pass():
            return forward(chunk, *args, **kwargs)

    def backward_one_chunk(chunk: int, *args: Any, **kwargs: Any) -> Any:
        run.phase(Phase.BACKWARD)
        ran.append(("B", index, chunk))
        return backward(chunk, *args, **kwargs)

    def backward_weight_one_chunk(chunk: int, *args: Any, **kwargs: Any) -> Any:
        run.phase(Phase.BACKWARD)
        ran.append(("W", index, chunk))
        return weight(chunk, *args, **kwargs)

    stage.forward_one_chunk = forward_one_chunk
    stage.backward_one_chunk = backward_one_chunk
    stage.backward_weight_one_chunk = backward_weight_one_chunk


#: one action a rank ran: ("F" forward, "B" backward (input, or full), "W" weight gradient),
#: stage index, micro-batch index
Action = tuple[str, int, int]


def bubble_fractions(ran: dict[int, list[Action]]) -> dict[int, float]:
    """Each rank's share of the pipeline's time spent waiting, from the actions each rank's
    schedule ran, in its order (``ran``: rank -> its actions), laid out in time slots
    (:func:`schedule_slots`). A rank's bubble: its slots without work over all the slots."""
    _, slots = schedule_slots(ran)
    busy = dict.fromkeys(ran, 0)
    for acts in ran.values():
        for _, stage, _ in acts:
            busy[_owner(ran, stage)] += 1
    return {r: 1 - busy[r] / slots for r in ran}


def schedule_slots(ran: dict[int, list[Action]]) -> tuple[dict[int, list[int]], int]:
    """The time slot of each action each rank ran (rank -> one slot per action, in its order),
    and the number of slots.

    The actions are laid out in time slots, every action one slot and a send taking none: each
    slot, every rank runs its next action if what it needs ran in an earlier slot (a forward:
    the previous stage's forward of that micro-batch; a backward: the next stage's backward of
    it, or its own forward on the last stage; a weight gradient: its input gradient), else it
    waits."""
    todo = {r: list(acts) for r, acts in ran.items()}
    last = max(s for acts in todo.values() for _, s, _ in acts)
    done: set[Action] = set()
    at: dict[int, list[int]] = {r: [] for r in todo}
    slots = 0
    while any(todo.values()):
        now = [(r, acts.pop(0)) for r, acts in todo.items() if acts and _ready(acts[0], done, last)]
        if not now:
            raise ParallelError(f"the pipeline schedule's actions never end: {ran}")
        for r, _ in now:
            at[r].append(slots)
        done.update(action for _, action in now)
        slots += 1
    return at, slots


def _owner(ran: dict[int, list[Action]], stage: int) -> int:
    return next(r for r, acts in ran.items() if any(s == stage for _, s, _ in acts))


def _ready(action: Action, done: set[Action], last: int) -> bool:
    kind, s, m = action
    if kind == "F":
        return s == 0 or ("F", s - 1, m) in done
    if kind == "W":
        return ("B", s, m) in done
    return ("F", s, m) in done and (s == last or ("B", s + 1, m) in done)


# ---------------------------------------------------------------------------------------------
# every rank traced, its analysis assembled


def check_batch(plan: Parallel, batch: int) -> None:
    """Refuse a ``batch`` that the pipeline's micro-batches do not divide (``LayoutError``)."""
    if batch % (plan.microbatches or 1):
        raise LayoutError(
            f"parallel microbatches={plan.microbatches} do not divide the batch of "
            f"{batch}: give a batch that is a multiple of it, or microbatches= that "
            "divides it."
        )


def stage_shapes(plan: Parallel, module: nn.Module, args: tuple[Any, ...]) -> list[tuple[Any, Any]]:
    """Each stage's (input, output) tensors of one micro-batch, on meta: the stages run in turn
    on a meta micro-batch (``args[0]`` split along its first dimension)."""
    x = args[0] if args and isinstance(args[0], torch.Tensor) else None
    if x is None or x.dim() < 2:
        raise LayoutError(
            f"parallel pp={plan.pp} splits token ids (batch x sequence) into micro-batches; "
            "give input_data or input_size of the token ids."
        )
    check_batch(plan, int(x.shape[0]))
    m = plan.microbatches or 1
    ranges = layer_ranges(plan, module)
    last = plan.stages - 1
    h = torch.empty((x.shape[0] // m, *x.shape[1:]), dtype=x.dtype, device="meta")
    shapes = []

    def run_stages() -> None:
        nonlocal h
        with MetaFixes():
            for i, (lo, hi) in enumerate(ranges):
                out = DecoderStage(module, lo, hi, i == 0, i == last)(h)
                shapes.append(((h,), (out,)))
                h = out

    without_grad(run_stages)
    if plan.sequence_parallel:  # between stages, each rank's shard of the sequence
        shapes = [
            (
                _sequence_shard(given, plan) if i > 0 else given,
                _sequence_shard(made, plan) if i < last else made,
            )
            for i, (given, made) in enumerate(shapes)
        ]
    return shapes


def _sequence_shard(tensors: tuple[torch.Tensor, ...], plan: Parallel) -> tuple[Any, ...]:
    """``tensors`` (batch x sequence x ...) as one tensor-parallel rank holds them under
    sequence parallelism: ``sequence / tp`` of the positions."""
    out = []
    for t in tensors:
        if t.shape[1] % plan.tp:
            raise LayoutError(
                f"parallel sequence_parallel=True with pp={plan.pp} sends each rank's "
                f"{t.shape[1]} / tp={plan.tp} positions between stages, and {plan.tp} does not "
                f"divide {t.shape[1]}: give a sequence length that is a multiple of {plan.tp}."
            )
        shape = (t.shape[0], t.shape[1] // plan.tp, *t.shape[2:])
        out.append(torch.empty(shape, dtype=t.dtype, device="meta"))
    return tuple(out)


def stage_modules(root: RankStages) -> tuple[str, ...]:
    """The model's module paths a rank's stages hold (``model.layers.3``, ``lm_head``)."""
    paths: list[str] = []
    for stage in root.children():
        assert isinstance(stage, DecoderStage)
        if stage.first:
            paths.append("model.embed_tokens")
        paths.extend(f"model.layers.{i}" for i, _ in stage.layers.named_children())
        if stage.last:
            paths.extend(["model.norm", "lm_head"])
    return tuple(paths)


def run_stages(
    meta: Any,
    inputs: Any,
    options: Options,
    kept: Options,
    notes: list[str],
    diff: Any,
    gpu: Any,
    make: Callable[..., Any],
    listeners: Sequence[Any],
    start: float,
    assemble: Callable[..., dict[str, Any]],
    time_step: Callable[..., Any],
) -> Any:
    """Every pipeline rank of ``options.parallel`` traced (see the module docstring): the
    analysis of the rank with the highest peak, with ``stages`` for all. ``assemble`` and
    ``time_step`` are the pipeline's own (``meta_widget.pipeline``, a layer above)."""
    from ..data.tree import build_tree
    from ..data.walk import walk

    plan = options.parallel
    assert plan is not None
    module = meta.module
    shapes = stage_shapes(plan, module, inputs.args)
    tp_styles = tp_names(module, plan) if plan.tp > 1 else {}
    spec = options.trace_spec()
    ranks: list[tuple[Any, RankTrace, Any]] = []
    ran: dict[int, list[Action]] = {}
    for r in range(plan.pp):
        root = rank_stages(plan, module, r)
        world = PipelineWorld(plan, r, shapes, tp_styles)
        if spec.loss is not None:
            world.loss = spec.loss
        args = inputs.args if r == 0 else ()
        rank = trace_rank(world, root, args, {}, spec, listeners=listeners, drive=world.drive)
        ran[r] = world.ran
        ranks.append((root, rank, world))
    bubbles = bubble_fractions(ran)
    slots, _ = schedule_slots(ran)
    reports, analyses = [], []
    for r, (root, rank, _) in enumerate(ranks):
        rank_meta = replace(meta, module=root)
        nodes = build_tree(root, walk(root))
        tensors = [t for t in (inputs.args if r == 0 else ()) if isinstance(t, torch.Tensor)]
        fields = assemble(rank_meta, nodes, tensors, kept, notes, diff, rank.trace, rank.module)
        timed = None
        if gpu is not None and rank.trace is not None:
            # every rank steps the pipeline's whole batch (each micro-batch passes every stage):
            # its tokens and samples are the step's, rank 0's input, for the worst rank too
            step_inputs = [t for t in inputs.args if isinstance(t, torch.Tensor)]
            timed = time_step(
                rank.trace.calls, rank.trace.orphan_costs, rank.comms, gpu, step_inputs,
                options, fields["total_flops"],
            )  # fmt: skip
        analysis = make(
            **fields, time=timed, comm_records=rank.comms, source_model=meta,
            seconds=time.perf_counter() - start,
        )  # fmt: skip
        analyses.append(analysis)
        sent = sum(c.bytes for c in rank.comms if c.collective == "send")
        got = sum(c.bytes for c in rank.comms if c.collective == "recv")
        step_s = None
        if timed is not None:
            step_s = stage_step_s(timed, bubbles[r])
        reports.append(
            StageReport(
                rank=r,
                stages=tuple(stage_indices(plan, r)),
                modules=stage_modules(root),
                peak_bytes=analysis.peak_bytes,
                bubble=bubbles[r],
                step_s=step_s,
                send_bytes=sent,
                recv_bytes=got,
                analysis=analysis,
                actions=tuple(ran[r]),
                slots=tuple(slots[r]),
            )
        )
    worst = max(range(plan.pp), key=lambda r: reports[r].peak_bytes)
    note = (
        f"Pipeline rank {worst} (stages {list(reports[worst].stages)}) has the highest peak of "
        f"the {plan.pp} ranks: this analysis is its; a.stages has every rank's."
    )
    shown = analyses[worst]
    steps = [s.step_s for s in reports if s.step_s is not None]
    timed = shown.time
    if timed is not None and steps:  # the ranks step together: the pipeline's step is theirs
        timed = in_pipeline(timed, max(steps))
    return replace(shown, stages=reports, notes=[*shown.notes, note], time=timed)
