"""How one candidate of ``plan`` is traced, in this process or in a worker of an executor.

:class:`Job` is what every process of a plan needs to trace a candidate: plain data that
pickles (the model's transformers config, the input size, the options, the GPU, the budget).
:func:`trace_run` is the task an executor runs: a run of candidate keys traced in a worker,
their numbers sent back (never an analysis). :func:`trace_candidate` fills in a candidate here.
"""

from __future__ import annotations

import gc
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from ..analysis import Analysis, analyze
from ..distributed.decisions import keeping_decisions
from ..distributed.parallel import ParallelError
from ..options import LayoutError, OptionError
from ..timing.gpus import GPU
from ..trace.checkpointing import KV_CACHE_NOTE
from ..trace.explain import GENERIC_TITLE, Explanation
from ..trace.kernels import RING_MATH_PATH
from ..trace.known_errors import FOREACH_MIXED_TITLE
from ..units import format_bytes
from .candidates import _NUMBERS, HELD_AS, Candidate, Layout
from .depth import (
    DEPTHS,
    Extended,
    Sample,
    extend,
    held_state,
    held_state_at,
    overheads,
    sample,
    with_layers,
)
from .depth_held import held_from_three
from .depth_stages import extend_stages, held_by_ranks, stage_layers

__all__ = ["Job", "Learned", "planning", "trace_run"]

#: one trace at a time in a process: a trace makes a process-wide fake process group and
#: installs process-wide hooks, so the threads of one worker (a Dask worker's, a thread pool's)
#: take turns
_ONE_AT_A_TIME = threading.RLock()
#: the switch interval of :func:`unpreempted`, in seconds (Python's default: 0.005)
_LONG_SWITCH_S = 1000.0


@dataclass(frozen=True)
class Job:
    """What a process needs to trace any candidate of a plan: ``analyze``'s model (a
    transformers config where it travels to other processes), input size or data, mode, GPU
    and other options; the decoder layers of the per-layer rule (None: full depth), the
    checkpointing settings that name modules unevenly over those layers (their candidates at
    full depth: ``plan_checks.uneven_checkpointing``) and the budget per device, in bytes."""

    model: Any
    input_size: Any
    input_data: Any
    mode: str
    gpu: GPU
    options: dict[str, Any] = field(default_factory=dict)
    layers: int | None = None
    budget: int = 0
    uneven: tuple[tuple[str, ...], ...] = ()


@dataclass
class Learned:
    """What one process's traces of a plan have shown, for the candidates it traces after:

    - ``refused``: a layout and input ``analyze`` refused, and why (not traced again);
    - ``over``: a layout and precision whose parameters, gradients and optimizer state alone
      (with the CUDA context) are over the budget on one rank, with the bytes and the row's
      reason: no candidate of them can fit, whatever its checkpointing or micro-batches (which
      change neither), and none is traced (the bound and its proof: ``depth.held_state``);
    - ``failed``: a layout and precision whose trace failed where they alone decide, and the
      row's reason: the optimizer's multi-tensor step over DTensors and plain tensors (tensor
      parallelism alone leaves the norms plain). Which parameters are DTensors is the
      wrapping's doing, before any step, and each precision gives them one dtype (one
      multi-tensor group); checkpointing and micro-batches touch no parameter: every candidate
      of them fails so, and none after the first is traced. Keyed as ``over`` (a run never
      splits such a group: the rows are the same whatever the executor).

    Keyed by ``HELD_AS``: autocast holds what the precision as given holds."""

    refused: dict[tuple[Any, ...], str] = field(default_factory=dict)
    over: dict[tuple[Layout, str], tuple[int, str]] = field(default_factory=dict)
    failed: dict[tuple[Layout, str], str] = field(default_factory=dict)
    #: a context-parallel layout and precision (exactly: autocast's attention is bf16) whose
    #: attention takes PyTorch's math path, which the ring does not run: the precision decides
    #: the attention's dtype and the model its heads, whatever the checkpointing or
    #: micro-batches, so every candidate of them fails so; the first traced says where
    math_attention: dict[tuple[Layout, str], str] = field(default_factory=dict)
    #: whether ``over`` may be learned from the 3-layer trace alone (``depth_held``): until a
    #: candidate traced at 3 and 4 layers gives another number than the two traces (never seen)
    from_three: bool = True


class Counts:
    """The traces a process ran for a plan, the model's title (``Analysis.title``) and the
    notes of its traces the plan repeats (``plan_notes``)."""

    def __init__(self) -> None:
        self.runs = 0
        self.title = ""
        self.notes: dict[str, None] = {}  # in the order found, each once

    def found(self, a: Analysis) -> None:
        """Keep what a trace says of the model as given: its checkpointed layers writing a KV
        cache (``trace.checkpointing.kv_cache_note``)."""
        self.title = a.title
        self.notes.update(dict.fromkeys(n for n in a.notes if KV_CACHE_NOTE in n))


@contextmanager
def planning() -> Iterator[None]:
    """What a process of a plan runs its candidates in (this one: the whole plan; a worker:
    each run).

    The candidates' worlds keep DTensor's sharding decisions (``keeping_decisions``), and the
    heap the process held before is left out of the cyclic collector's scans (``gc.freeze``;
    unless the program froze its own): it collects after each trace, and its full collections
    went through all of torch and transformers each time (6 % of a plan's time went to the
    collector, 3 % with the heap frozen). Nothing is kept from being freed: reference counting
    frees as before, and what the collector would have freed of the frozen heap is freed after.
    """
    freeze = gc.get_freeze_count() == 0
    if freeze:
        gc.freeze()
    try:
        with keeping_decisions():
            yield
    finally:
        if freeze:
            gc.unfreeze()


def trace_run(job: Job, keys: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    """The task of an executor's worker: trace the candidates ``keys`` (``Candidate.key``,
    consecutive ones of a layout) of ``job``, one at a time in this process, and answer their
    numbers (``_NUMBERS`` and ``openable``), each with the traces it ran and the model's title.
    A layout ``analyze`` refuses is traced once per run.

    The traces run in a thread of their own, which the worker did not start: a worker's
    sampling profiler (a Dask worker's reads the frames of the threads running its tasks every
    10 ms) holds each frame it reads for a moment, and with it the tensors of a function that
    returns meanwhile; their frees then land where the profiler lets go, two traces of one
    candidate differ, and the per-layer rule failed at random (one candidate in four, on a
    Dask worker). A thread the worker does not know of is not walked, but the profile still
    takes every thread's frame for a moment (``sys._current_frames``), and a traced function
    returning in that moment moved frees too (one CI run in many): the traces also run
    :func:`unpreempted`, so that this moment never falls while one of them runs."""
    with ThreadPoolExecutor(1, thread_name_prefix="meta_widget-plan") as own:
        return own.submit(_trace_run, job, keys).result()


@contextmanager
def unpreempted() -> Iterator[None]:
    """Run the body with the interpreter's switch interval (``sys.setswitchinterval``) so long
    that no other thread takes the GIL from this one by force; restored after, on any path.

    Another thread then runs only where this one lets go of the GIL on its own (inside
    torch's operators, many times a millisecond): a worker's event loop still answers, but a
    thread that holds every thread's frames (a Dask worker's profile, every millisecond in
    the tests) lets them go before this one runs again. Taken mid-hold, it kept a returning
    function's tensors alive, moving their frees; with a thread holding the frames for 10 ms at
    a time, 6 of 6 traces of one candidate differed from its trace alone, and 0 of 9 run
    unpreempted (beside the last 3, the other thread held the frames 1,386 times)."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(_LONG_SWITCH_S)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def _trace_run(job: Job, keys: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    """:func:`trace_run`'s traces, in the thread they run in."""
    learned = Learned()
    answers = []
    with _ONE_AT_A_TIME, planning(), unpreempted():
        for key in keys:
            counts = Counts()
            c = Candidate(*key)  # layout, checkpointing, precision, micro-batches, input size
            trace_candidate(c, job, counts, learned)
            numbers = {name: getattr(c, name) for name in _NUMBERS}
            answers.append(
                {
                    **numbers,
                    "openable": c.openable,
                    "runs": counts.runs,
                    "title": counts.title,
                    "notes": list(counts.notes),
                }
            )
    return answers


def trace_candidate(c: Candidate, job: Job, counts: Counts, learned: Learned) -> None:
    """Fill in ``c`` by tracing it here (one trace of this process at a time)."""

    def run(options: dict[str, Any], depth: int | None = None) -> Analysis:
        return run_analyze(job, counts, options, depth, c.input_size)

    layers = None if c.activation_checkpointing in job.uneven else job.layers
    with _ONE_AT_A_TIME:
        _trace(c, learned, job.budget, run, layers, job.gpu)


def run_analyze(
    job: Job,
    counts: Counts,
    options: dict[str, Any],
    depth: int | None = None,
    input_size: Any = None,
) -> Analysis:
    """``analyze`` of ``job``'s model (at ``depth`` decoder layers, or whole) with a
    candidate's ``options`` (over the job's: a candidate that is not ``"selective"`` leaves out
    its ``checkpoint_policy``) and ``input_size`` (None: the job's), counted in ``counts``."""
    counts.runs += 1  # a refused layout is a run too
    a = analyze(
        job.model if depth is None else with_layers(job.model, depth),
        job.input_size if input_size is None else input_size,
        input_data=job.input_data,
        mode=job.mode,
        gpu=job.gpu,
        **{**job.options, **options},
    )
    counts.found(a)
    return a


def take(c: Candidate, numbers: dict[str, Any], job: Job, counts: Counts) -> None:
    """Fill in ``c`` with the numbers a worker traced; its analysis is traced here when asked
    for (never for a refused layout: there is nothing to open)."""
    for name in _NUMBERS:
        setattr(c, name, numbers[name])
    if numbers["openable"]:
        options, size = c.options(), c.input_size
        c._trace_full = lambda: run_analyze(job, counts, options, None, size)


def _trace(
    c: Candidate,
    learned: Learned,
    budget: int,
    run: Callable[..., Analysis],
    layers: int | None,
    gpu: GPU,
) -> None:
    """Fill in ``c``'s numbers: by the per-layer rule when ``layers`` is given and the traces
    follow it (peak, step time and what the GPU holds, or that it cannot fit), else from a
    full-depth trace; or record why its layout was refused, or why no candidate of its layout
    and precision can fit (what ``learned`` holds already is not traced again, in this process
    or in a worker). A pipeline's ranks are extended each on its own (``depth_stages``)."""
    shape = (c.layout, c.input_size)
    if shape in learned.refused:
        c.error = learned.refused[shape]
        return
    group = (c.layout, HELD_AS[c.precision])
    if group in learned.over:
        c.device_bytes, c.error = learned.over[group]
        return
    if group in learned.failed:
        c.error = learned.failed[group]
        return
    if (c.layout, c.precision) in learned.math_attention:
        c.error = learned.math_attention[c.layout, c.precision]
        return
    try:
        if layers is not None and (
            _by_rule(c, run, layers, gpu, budget, learned)
            if c.layout.pp == 1
            else _stages_by_rule(c, run, layers, gpu, budget, learned)
        ):
            return
        c._analysis = run(c.options())
    except (OptionError, ParallelError) as e:
        if not _is_layout(e):
            raise
        learned.refused[shape] = c.error = f"{type(e).__name__}: {e}"
        return
    a = c._analysis
    if a.error is not None:
        c.error = failure_reason(a.error)
        _learn_failed(c, a.error, learned)
        return
    c.peak_bytes, c.device_bytes = int(a.peak_bytes), int(a.footprint_bytes)
    c.fits = c.device_bytes <= budget
    if a.time is not None:
        _set_time(c, a.time)
    held = min(held_state(a), int(a.peak_bytes))  # the peak holds them (never less, as traced)
    _learn_over(c, learned, held + overheads(a), budget, "at full depth")


def _learn_over(c: Candidate, learned: Learned, held: int, budget: int, traced: str) -> bool:
    """Whether ``held`` (what ``c``'s parameters, buffers, gradients, optimizer state and the
    CUDA context hold on one GPU) is over ``budget``; if so, ``learned`` keeps it, and why, for
    the other candidates of ``c``'s layout and precision."""
    if held <= budget:
        return False
    learned.over[c.layout, HELD_AS[c.precision]] = (
        held,
        (
            f"Cannot fit: its parameters, gradients and optimizer state alone, with the CUDA "
            f"context, hold {format_bytes(held)} on a GPU ({held:,} bytes), over the budget of "
            f"{format_bytes(budget)}, whatever its checkpointing, micro-batches or autocast "
            f"(traced {traced}: "
            f"{c.layout.label()}, {c.precision}). Give more devices to shard them over, or a "
            "precision that holds less."
        ),
    )
    return True


def _by_rule(
    c: Candidate,
    run: Callable[..., Analysis],
    layers: int,
    gpu: GPU,
    budget: int,
    learned: Learned,
) -> bool:
    """Fill in ``c``'s numbers from its traces at ``DEPTHS`` layers and the per-layer rule;
    False when a trace failed or the traces do not follow the rule (then a full-depth trace
    says what happened), or when the allocator's steps do not, even with the 2-layer trace
    (:func:`_with_two`, traced where they do not without it: what the GPU holds is then exact
    for a candidate that cannot fit too), and the least the candidate holds on the GPU is
    within ``budget`` (it may fit: the full-depth trace's reserve decides).
    When the 3- and 4-layer traces put its parameters, gradients and optimizer state alone over
    the budget (``held_state_at``: exact), it cannot fit and nor can the others of its layout
    and precision (``learned.over``)."""
    samples: list[Sample] = []
    options = c.options()
    one: int | None = None
    for d in DEPTHS:
        a = run(options, d)
        if a.error is not None:
            _take_failure(c, a.error, d, lambda: run(options), learned)
            return True
        if a.time is None:
            return False
        if d == DEPTHS[0] and learned.from_three:  # one trace's bound (depth_held)
            one = held_from_three(a, layers)
            if one is not None and _learn_over(
                c, learned, one + overheads(a), budget, "at 3 layers"
            ):
                _take_over(c, learned, lambda: run(options), (d,))
                return True
        samples.append(sample(a, d))
    three, four = samples
    held = held_state_at(three, four, layers)
    if one is not None and one != held:  # the two traces' number: the bound's check
        learned.from_three = False
    if _learn_over(c, learned, held + overheads(four), budget, "at 3 and 4 layers"):
        _take_over(c, learned, lambda: run(options))
        return True
    full = extend(samples, layers, gpu, c.layout.data_parallel)
    if full is None or full.device_bytes is not None:
        return _take_extended(c, full, budget, lambda: run(options))
    two = _with_two(run, options, 2)
    if two is None:
        return False
    full = extend(samples, layers, gpu, c.layout.data_parallel, two=sample(two, 2))
    return _take_extended(c, full, budget, lambda: run(options), (2, *DEPTHS))


def _with_two(
    run: Callable[..., Analysis], options: dict[str, Any], layers: int
) -> Analysis | None:
    """The candidate of ``options`` traced at 2 layers (a stage: ``layers``), for a third
    rank of the allocator's frees outside the layers' runs (``depth_reserve.Reserve``'s
    ``earlier``); None where the trace failed (the full depth then says how)."""
    a = run(options, layers)
    return None if a.error is not None or a.time is None else a


def _stages_by_rule(
    c: Candidate,
    run: Callable[..., Analysis],
    layers: int,
    gpu: GPU,
    budget: int,
    learned: Learned,
) -> bool:
    """:func:`_by_rule` for a pipeline: its traces at ``DEPTHS`` layers a stage, each rank
    extended on its own (``depth_stages``); False where the stages do not allow it or the
    traces do not follow the rule. Where a rank's parameters, gradients and optimizer state
    alone put it over the budget at the full depth (``held_by_ranks``: exact), no candidate of
    the layout and precision fits."""
    plan = c.layout.parallel()
    sizes = None if plan is None else stage_layers(plan, layers)
    if plan is None or sizes is None:
        return False
    options = c.options()
    analyses: list[Analysis] = []
    for d in DEPTHS:
        a = run(options, d * plan.stages)
        if a.error is not None:
            _take_failure(c, a.error, d, lambda: run(options), learned)
            return True
        if a.time is None:
            return False
        analyses.append(a)
    held = held_by_ranks(analyses[0], analyses[1], sizes)
    if held is not None and _learn_over(c, learned, held, budget, "at 3 and 4 layers a stage"):
        _take_over(c, learned, lambda: run(options))
        return True
    full = extend_stages(analyses, sizes, gpu, plan.data_parallel)
    if full is None or full.device_bytes is not None:
        return _take_extended(c, full, budget, lambda: run(options))
    two = _with_two(run, options, 2 * plan.stages)
    if two is None:
        return False
    full = extend_stages(analyses, sizes, gpu, plan.data_parallel, two)
    return _take_extended(c, full, budget, lambda: run(options), (2, *DEPTHS))


def _take_over(
    c: Candidate,
    learned: Learned,
    trace_full: Callable[[], Analysis],
    depths: tuple[int, ...] = DEPTHS,
) -> None:
    """``c`` cannot fit: its traces at ``depths`` layers put what it holds besides activations
    over the budget (``learned.over``, for its layout and precision)."""
    c.device_bytes, c.error = learned.over[c.layout, HELD_AS[c.precision]]
    c.traced_layers, c._trace_full = depths, trace_full


def _take_failure(
    c: Candidate,
    error: Explanation,
    depth: int,
    trace_full: Callable[[], Analysis],
    learned: Learned,
) -> None:
    """``c`` failed in its trace at ``depth`` layers (a stage): the full depth fails the same
    way, and is traced only when its analysis is asked for."""
    c.error, c.traced_layers = failure_reason(error), (depth,)
    c._trace_full = trace_full
    _learn_failed(c, error, learned)


def _learn_failed(c: Candidate, error: Explanation, learned: Learned) -> None:
    """Keep in ``learned.failed`` a failure of ``c``'s trace that its layout alone decides (see
    :class:`Learned`), for the other candidates of the layout."""
    if c.layout.cp > 1 and RING_MATH_PATH in error.message:
        learned.math_attention[c.layout, c.precision] = (
            f"{c.error} Not traced: every candidate of {c.layout.label()} with precision "
            f"{c.precision!r} fails so, whatever its checkpointing or micro-batches (the "
            "precision decides the attention's dtype); the first one traced did, and its "
            "analysis says where."
        )
    if error.title == FOREACH_MIXED_TITLE:
        held = HELD_AS[c.precision]
        learned.failed[c.layout, held] = (
            f"{c.error} Not traced: every candidate of {c.layout.label()} whose parameters are "
            f"held as in {held!r} (autocast holds them as given) fails so, whatever its "
            "checkpointing or micro-batches (which parameters are DTensors is the layout's "
            "doing); the first one traced did, and its analysis says where."
        )


def _take_extended(
    c: Candidate,
    full: Extended | None,
    budget: int,
    trace_full: Callable[[], Analysis],
    depths: tuple[int, ...] = DEPTHS,
) -> bool:
    """Fill in ``c``'s numbers from ``full``, its numbers by the rule from its traces at
    ``depths`` layers; False (nothing filled in) where there are none, or where the
    allocator's steps follow no rule and the least the candidate holds on the GPU is within
    ``budget`` (it may fit: the full depth decides)."""
    if full is None or (full.device_bytes is None and full.least_device_bytes <= budget):
        return False
    c.peak_bytes = full.peak_bytes
    c.device_bytes = full.least_device_bytes if full.device_bytes is None else full.device_bytes
    c.fits = c.device_bytes <= budget
    c.traced_layers = depths
    c._trace_full = trace_full
    _set_time(c, full.time)
    return True


def failure_reason(error: Explanation) -> str:
    """Why a candidate's trace failed, in words: the explanation's title and fix when the
    error is one the explanations know (tensor parallelism alone: "A multi-tensor optimizer
    step over DTensors and plain tensors. Pass foreach=False ..."), else the error's type and
    first line. The whole error stays in the candidate's ``analysis.error``."""
    if error.title != GENERIC_TITLE:
        return f"{error.title}. {error.fix}"
    first = error.message.strip().splitlines()[0] if error.message.strip() else ""
    return f"{error.type}: {first}" if error.type else first


def _set_time(c: Candidate, time: Any) -> None:
    c.step_s, c.mfu = float(time.step_s), float(time.mfu)
    c.tokens_per_s, c.samples_per_s = time.tokens_per_s, time.samples_per_s


def _is_layout(error: Exception) -> bool:
    """Whether ``analyze`` refused the parallel layout (not another option)."""
    return isinstance(error, (ParallelError, LayoutError))
