"""``plan``: the fastest configuration of a model that fits an accelerator's memory.

Every candidate is a combination of

- a *layout*: HSDP replicas x FSDP degree x TP degree whose product is ``devices`` (every
  device used; by default every such layout with ``tp`` at most the GPU's ``gpus_per_node``,
  tensor parallelism across nodes being what nobody runs). A layout ``analyze`` refuses up
  front (``LayoutError``, ``ParallelError``: tp not dividing the heads, fsdp past the rows of
  the largest parameter) is recorded with its reason and not traced;
- *activation checkpointing* (training only): off, or every block (``True``);
- *precision*: as given (the model's own dtype), ``autocast`` bf16, or ``param_dtype`` bf16;
- *micro-batches* (training only): 1, and 2 (the optimizer step and, under FSDP, the
  parameter gathers are shared by twice the tokens).

``plan``'s ``layouts=``, ``activation_checkpointing=``, ``precisions=`` and
``micro_batches=`` narrow (or widen) each axis.

Each is traced with ``analyze(..., gpu=gpu, parallel=...)``: its ``peak_bytes`` is rank 0's
traced peak, never a formula, and its ``step_s``, ``mfu`` and ``tokens_per_s`` are
``Analysis.time``'s. For a transformers config whose decoder layers are all alike, each
candidate is traced at 2, 3 and 4 layers and its full depth's numbers follow from the
per-layer rule those traces show and check (``meta_widget.explore.depth``: equal to the byte
to a full-depth trace); its ``analysis``, the full depth traced, is made when first asked
for. ``full_depth=True`` traces every candidate at full depth.
The fastest candidate that fits is the one with the most tokens per second (samples per second
for inputs that are not tokens; the shortest step when neither is known).
"""

from __future__ import annotations

import gc
import pickle
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pandas as pd

from ..analysis import Analysis, analyze
from ..distributed.decisions import keeping_decisions
from ..distributed.parallel import ParallelError
from ..options import LayoutError, OptionError, OptionTypeError, check_budget
from ..sources.models import is_transformers_config
from ..timing.gpus import GPU, resolve_gpu
from ..trace.explain import GENERIC_TITLE, Explanation
from ..units import format_bytes
from .candidates import (
    _NUMBERS,
    COLUMNS,
    Candidate,
    Space,
)
from .depth import DEPTHS, Sample, depth_of, extend, sample, with_layers
from .fit import NothingFitsError
from .sweeps import ProgressFn, check_analyze_options, progress_function
from .workers import cores, default_workers, share

__all__ = ["Candidate", "Plan", "plan"]

#: options ``plan`` sets itself
_OWN_OPTIONS = ("parallel", "autocast", "param_dtype", "widget", "gpu")
#: options of ``analyze`` that name or watch the full model's modules: with any of them, every
#: candidate is traced at full depth
_NAMES_MODULES = ("checkpoint", "assume", "listeners")
_MODES = ("training", "inference")


@dataclass
class Plan:
    """The answer of :func:`plan`: every candidate traced, and the fastest that fits.

    Attributes
    ----------
    candidates
        Every :class:`Candidate`, in the order tried.
    budget
        The memory budget per device, in bytes.
    gpu
        The accelerator the times are for.
    devices
        The number of devices.
    mode
        ``"training"`` or ``"inference"``.
    traces
        How many times ``analyze`` ran (each depth of the per-layer rule counted).
    title
        The model's class name (``Analysis.title``).
    """

    candidates: list[Candidate]
    budget: int
    gpu: GPU
    devices: int
    mode: str
    traces: int = 0
    title: str = "model"

    @property
    def best(self) -> Candidate:
        """The fastest candidate that fits: the most ``tokens_per_s`` (``samples_per_s`` for
        inputs that are not tokens; else the least ``step_s``), the first of equals. A
        ``Candidate`` (``meta_widget.explore.plan``): the columns of ``to_dataframe()`` as
        attributes, and ``analysis``, the candidate traced.

        Raises
        ------
        NothingFitsError
            When no candidate fits the budget.
        """
        fitting = [c for c in self.candidates if c.fits]
        if not fitting:
            raise _nothing_fits(self)
        return max(fitting, key=_speed)

    def to_dataframe(self) -> pd.DataFrame:
        """One row per candidate: ``replicate``, ``fsdp``, ``tp``, ``activation_checkpointing``,
        ``precision``, ``micro_batches``, ``peak_bytes``, ``device_bytes`` (what the GPU
        holds, held against the budget), ``fits``, ``step_s``, ``mfu``,
        ``tokens_per_s``, ``samples_per_s``, ``error``."""
        return pd.DataFrame([c.row() for c in self.candidates], columns=list(COLUMNS))

    def widget(self) -> Any:
        """The plan view (``meta_widget.explore.plan_view``): step time against peak per
        candidate, the budget line, the best marked; clicking a candidate opens its analysis."""
        from .plan_view import plan_widget  # anywidget: ~0.5 s, loaded on first use

        return plan_widget(self)

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget()._repr_mimebundle_(**kwargs)

    def __repr__(self) -> str:
        fits = sum(c.fits for c in self.candidates)
        head = (
            f"<Plan {len(self.candidates)} candidates on {self.devices} x {self.gpu.name}, "
            f"{fits} fit {format_bytes(self.budget)}"
        )
        if not fits:
            return head + ">"
        b = self.best
        return (
            f"{head}; best {_label(b)}: {format_bytes(b.device_bytes or 0)} on the GPU (peak "
            f"{format_bytes(b.peak_bytes or 0)}), step {b.step_s:.4g} s>"
        )


def plan(
    model: Any,
    input_size: Any = None,
    *,
    gpu: str | GPU,
    devices: int = 1,
    budget: int | str | None = None,
    mode: str = "training",
    input_data: Any = None,
    layouts: Sequence[Mapping[str, int]] | None = None,
    activation_checkpointing: Sequence[bool] | None = None,
    precisions: Sequence[str] | None = None,
    micro_batches: Sequence[int] | None = None,
    progress: bool | ProgressFn = False,
    full_depth: bool = False,
    workers: int | None = None,
    **analyze_options: Any,
) -> Plan:
    """The fastest configuration of ``model`` that fits ``budget`` on ``devices`` GPUs, every
    candidate traced.

    The candidates and how they are compared: the docstring of ``meta_widget.explore.plan``.

    Parameters
    ----------
    model, input_size, input_data
        As for ``analyze``; the batch given is the batch of one rank (of one micro-batch).
    gpu
        A name of ``mw.gpus()`` or an ``mw.GPU(...)``: the times, and the default budget.
    devices
        How many GPUs: each layout's ``replicate * fsdp * tp`` is ``devices``.
    budget
        Bytes per device (an int) or a size with a unit (``"80GiB"``, ``"80GB"``); default the
        GPU's ``memory_bytes``.
    mode
        ``"training"`` (default) or ``"inference"`` (no checkpointing or micro-batch
        candidates).
    layouts
        The layouts to try, each a dict of ``replicate``, ``fsdp`` and ``tp`` (missing ones
        1) whose product is ``devices``, e.g. ``[{"fsdp": 8}, {"replicate": 2, "fsdp": 4}]``;
        default every such layout with ``tp <= gpu.gpus_per_node``.
    activation_checkpointing
        The settings to try (training): default ``(False, True)``.
    precisions
        Names of ``meta_widget.explore.candidates.PRECISIONS`` to try: default all three.
    micro_batches
        Micro-batch counts to try (training): default ``(1, 2)``.
    progress
        ``True``: a text line per candidate on standard error; or a function
        ``(done, total, text)``.
    full_depth
        Trace every candidate at the model's full depth. By default a transformers config
        whose decoder layers are all alike is traced at 2, 3 and 4 layers per candidate and
        extended by the per-layer rule those traces check (``meta_widget.explore.depth``), ~10x
        faster for an 80-layer model; a candidate whose traces break the rule is traced at full
        depth.
    workers
        Processes that trace candidates at once (this one and ``workers - 1`` children;
        ``meta_widget.explore.workers``). Default: one per core this process may use (at most
        8) for a transformers config and at least 16 candidates, else 1; a number given is
        capped at the candidates and at the cores this process may use. Children rebuild the
        model from its config, so ``workers > 1`` needs ``model`` to be a transformers config,
        no ``input_data``, and options that pickle.
    **analyze_options
        Other options of ``analyze`` (``optimizer``, ``device``, ``dtypes``...); ``plan`` sets
        ``parallel``, ``autocast`` and ``param_dtype`` itself.

    Returns
    -------
    Plan
        ``to_dataframe()`` has a row per candidate; ``best`` the fastest that fits, with its
        ``analysis``.

    Raises
    ------
    OptionError
        For a gpu, devices, budget, mode, axis or options that cannot be used.
    NothingFitsError
        From ``Plan.best``, when no candidate fits (``plan`` itself returns every row).
    """
    accelerator = resolve_gpu(gpu)
    limit = accelerator.memory_bytes if budget is None else check_budget(budget)
    _check(devices, mode, analyze_options)
    space = Space.checked(
        devices, mode, accelerator, layouts, activation_checkpointing, precisions, micro_batches
    )
    report = progress_function(progress, "plan")
    todo = space.candidates()
    refused: dict[tuple[int, int, int], str] = {}  # layouts analyze refused, and why
    done: list[Candidate] = []
    if not isinstance(full_depth, bool):
        raise OptionTypeError(f"plan: full_depth must be True or False, not {full_depth!r}.")
    by_name = set(analyze_options) & set(_NAMES_MODULES)  # options that name the full model's
    layers = None if full_depth or by_name else depth_of(model)
    job = {
        "run": trace_in_child,
        "model": model,
        "input_size": input_size,
        "input_data": input_data,
        "mode": mode,
        "gpu": accelerator,
        "options": analyze_options,
        "layers": layers,
        "budget": limit,
        "session": planning,  # what each process runs its candidates in
    }
    counts: dict[str, Any] = {"runs": 0, "title": "model"}

    def run(options: dict[str, Any], depth: int | None = None) -> Analysis:
        return _analyze(job, counts, options, depth)

    def here(key: tuple[Any, ...]) -> Candidate:
        c = by_key[key]
        _trace(c, refused, limit, run, layers, accelerator)
        return c

    def on_done(i: int, result: Any, remote: bool) -> None:
        c = todo[i]
        if remote:
            counts["runs"] += result.pop("runs")
            counts["title"] = result.pop("title") or counts["title"]
            _take(c, result, run)
        done.append(c)
        if report is not None:
            report(len(done), len(todo), _label(c))

    count = _workers(workers, len(todo), job, model, input_data)
    if report is not None:
        report(0, len(todo), f"{count} processes" if count > 1 else _label(todo[0]))
    by_key = {c.key: c for c in todo}
    with job["session"]():
        share(list(by_key), here, job, count, on_done)
    if report is not None:
        report(len(todo), len(todo), f"{counts['runs']} traced")
    return Plan(list(todo), limit, accelerator, devices, mode, counts["runs"], counts["title"])


@contextmanager
def planning() -> Iterator[None]:
    """What each process of a plan runs its candidates in (a child: its whole life).

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


def trace_in_child(job: dict[str, Any], key: tuple[Any, ...]) -> dict[str, Any]:
    """A child of ``plan(workers=N)`` traces the candidate ``key`` (``Candidate.key``) of
    ``job`` (``plan``'s model, input size, mode, GPU, options, layers and budget): its numbers,
    the traces it ran and the model's title."""
    counts: dict[str, Any] = {"runs": 0, "title": ""}

    def run(options: dict[str, Any], depth: int | None = None) -> Analysis:
        return _analyze(job, counts, options, depth)

    replicate, fsdp, tp, checkpointing, precision, micro = key
    c = Candidate(fsdp, tp, checkpointing, precision, micro, replicate=replicate)
    _trace(c, job.setdefault("refused", {}), job["budget"], run, job["layers"], job["gpu"])
    return {**{name: getattr(c, name) for name in _NUMBERS}, "openable": c.openable, **counts}


def _analyze(
    job: dict[str, Any], counts: dict[str, Any], options: dict[str, Any], depth: int | None
) -> Analysis:
    """``analyze`` of ``job``'s model (at ``depth`` decoder layers, or whole) with a
    candidate's ``options``, counted in ``counts``."""
    model = job["model"]
    counts["runs"] += 1  # a refused layout is a run too
    a = analyze(
        model if depth is None else with_layers(model, depth),
        job["input_size"],
        input_data=job["input_data"],
        mode=job["mode"],
        gpu=job["gpu"],
        **options,
        **job["options"],
    )
    counts["title"] = a.title
    return a


def _take(c: Candidate, numbers: dict[str, Any], run: Callable[..., Analysis]) -> None:
    """Fill in ``c`` with the numbers a child traced; its analysis is traced here when asked
    for (never for a refused layout: there is nothing to open)."""
    for name in _NUMBERS:
        setattr(c, name, numbers[name])
    if numbers["openable"]:
        options = c.options()
        c._trace_full = lambda: run(options)


def _workers(given: Any, candidates: int, job: dict[str, Any], model: Any, data: Any) -> int:
    """The processes to use: ``given``, checked, or the default (``default_workers``) where
    children can rebuild the job (a transformers config, no input data, options that pickle)."""
    if given is not None and (isinstance(given, bool) or not isinstance(given, int) or given < 1):
        raise OptionTypeError(f"plan: workers must be a whole number >= 1, not {given!r}.")
    # never more processes than candidates, nor than cores: a process per core at most
    count = (
        default_workers(candidates) if given is None else min(given, max(1, candidates), cores())
    )
    if count <= 1:
        return 1
    why = None
    if not is_transformers_config(model):
        why = "model is not a transformers config (children rebuild the model from its config)"
    elif data is not None:
        why = "input_data is given (children are never sent tensors)"
    else:
        try:
            pickle.dumps(job)
        except Exception as e:
            why = f"the model or options do not pickle ({type(e).__name__}: {e})"
    if why is None:
        return count
    if given is None:
        return 1
    raise OptionError(f"plan: workers={given} cannot be used: {why}; pass workers=1.")


def _trace(
    c: Candidate,
    refused: dict[tuple[int, int, int], str],
    budget: int,
    run: Callable[..., Analysis],
    layers: int | None,
    gpu: GPU,
) -> None:
    """Fill in ``c``'s numbers: by the per-layer rule when ``layers`` is given, the traces
    follow it and the least the candidate holds on the GPU is over ``budget`` (it cannot fit),
    else from a full-depth trace (whose caching allocator's reserve decides whether it fits);
    or record why its layout was refused (a layout ``refused`` already is not traced again, in
    this process or in a child)."""
    if c.layout in refused:
        c.error = refused[c.layout]
        return
    try:
        if layers is not None and _by_rule(c, run, layers, gpu):
            if c.error is not None or (c.device_bytes or 0) > budget:
                return  # failed, or cannot fit: its least bytes on the GPU are over the budget
            # it may fit: the caching allocator's reserve decides, replayed at full depth
            c.traced_layers, c._trace_full = (), None
        c._analysis = run(c.options())
    except (OptionError, ParallelError) as e:
        if not _is_layout(e):
            raise
        refused[c.layout] = c.error = f"{type(e).__name__}: {e}"
        return
    a = c._analysis
    if a.error is not None:
        c.error = failure_reason(a.error)
        return
    c.peak_bytes, c.device_bytes = int(a.peak_bytes), int(a.footprint_bytes)
    c.fits = c.device_bytes <= budget
    if a.time is not None:
        _set_time(c, a.time)


def _by_rule(c: Candidate, run: Callable[..., Analysis], layers: int, gpu: GPU) -> bool:
    """Fill in ``c``'s numbers from its traces at ``DEPTHS`` layers and the per-layer rule;
    False when a trace failed or the traces do not follow the rule (then a full-depth trace
    says what happened)."""
    samples: list[Sample] = []
    options = c.options()
    for d in DEPTHS:
        a = run(options, d)
        if a.error is not None:  # the full depth fails the same way: not traced for nothing
            c.error, c.traced_layers = failure_reason(a.error), (d,)
            c._trace_full = lambda: run(options)
            return True
        if a.time is None:
            return False
        samples.append(sample(a, d))
    full = extend(samples, layers, gpu, c.replicate * c.fsdp)
    if full is None:
        return False
    c.peak_bytes, c.device_bytes = full.peak_bytes, full.least_device_bytes
    c.traced_layers = DEPTHS
    c._trace_full = lambda: run(options)
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


def _speed(c: Candidate) -> tuple[int, float]:
    """Larger is faster: tokens per second, else samples per second, else minus the step."""
    if c.tokens_per_s is not None:
        return (2, c.tokens_per_s)
    if c.samples_per_s is not None:
        return (1, c.samples_per_s)
    return (0, -(c.step_s if c.step_s is not None else float("inf")))


def _check(devices: Any, mode: Any, options: dict[str, Any]) -> None:
    """``devices`` a positive int, ``mode`` known, options all ``analyze``'s and none of those
    ``plan`` sets."""
    check_analyze_options(options, "plan")
    if isinstance(devices, bool) or not isinstance(devices, int):
        raise OptionTypeError(f"devices must be an int (how many GPUs), not {devices!r}")
    if not 1 <= devices <= 16_384:
        raise OptionError(f"devices={devices} must be between 1 and 16,384.")
    if mode not in _MODES:
        raise OptionError(f"plan: mode={mode!r} must be one of {', '.join(_MODES)}.")
    given = sorted(set(options) & set(_OWN_OPTIONS))
    if given:
        raise OptionError(
            f"plan chooses {given} itself; leave them out (the layouts, precisions, "
            "activation_checkpointing and micro_batches to try are plan's own arguments)."
        )


def _label(c: Candidate) -> str:
    return (
        f"replicate={c.replicate} fsdp={c.fsdp} tp={c.tp} "
        f"checkpointing={c.activation_checkpointing} {c.precision} micro_batches={c.micro_batches}"
    )


def _nothing_fits(p: Plan) -> NothingFitsError:
    held = [(c.device_bytes, c.peak_bytes) for c in p.candidates if c.device_bytes is not None]
    least, peak = min(held) if held else (0, 0)
    smallest = (
        f"the least any holds on the GPU is {format_bytes(least)} ({least:,} bytes: a peak of "
        f"{format_bytes(peak or 0)}, the caching allocator's reserve around it, the CUDA context)"
        if held
        else "no candidate could be traced (see Plan.to_dataframe()['error'])"
    )
    return NothingFitsError(
        f"plan: none of the {len(p.candidates)} candidates on {p.devices} x {p.gpu.name} fits "
        f"the budget of {format_bytes(p.budget)} ({p.budget:,} bytes) per device; {smallest}. "
        "Try more devices, a smaller batch or sequence, or a larger budget."
    )
