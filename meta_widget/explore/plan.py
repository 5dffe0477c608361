"""``plan``: the fastest configuration of a model that fits an accelerator's memory.

Every candidate is a combination of

- a *layout* (``meta_widget.explore.candidates.Layout``): HSDP replicas x FSDP x TP x
  pipeline (PP, with its schedule, stages per rank and micro-batches) x context-parallel (CP)
  ranks whose product is ``devices`` (every device used), expert parallelism (EP) within FSDP.
  By default every ``replicate x fsdp x tp`` with ``tp`` at most the GPU's ``gpus_per_node``
  (tensor parallelism across nodes being what nobody runs), and beyond one node, given a
  transformers config, pipelines too: ``pp x fsdp x tp`` (1F1B, ``pp`` micro-batches) with
  ``pp`` dividing ``devices``, at most the model's layers; for a mixture of experts, each of
  those without ``tp`` again with ``ep`` (the most ranks within a node dividing its ``fsdp``
  and the routed experts). A layout ``analyze`` refuses
  (``LayoutError``, ``ParallelError``: tp not dividing the heads, fsdp past the rows of the
  largest parameter, pp past the layers, ep on a dense model, cp on the CPU mesh, a batch the
  pipeline's micro-batches do not divide) is found before any trace
  (``meta_widget.explore.plan_checks``), recorded with its reason and not traced;
- *activation checkpointing* (training only): off, or every block (``True``);
- *precision*: as given (the model's own dtype), ``autocast`` bf16, or ``param_dtype`` bf16;
- *micro-batches* (training only): 1, and 2 (the optimizer step and, under FSDP, the
  parameter gathers are shared by twice the tokens); a pipeline's layout brings its own (the
  schedule's micro-batches) instead.

The batch is one rank's (``input_size``: one micro-batch; with a pipeline, the whole step's,
which its schedule splits), or the whole job's: ``global_batch`` sequences of ``seq_len``
tokens an optimizer step, each candidate's rank then given ``global_batch / (replicate x
fsdp)`` of them, split over its micro-batches (a candidate where they do not divide is a row
with that reason).

``plan``'s ``layouts=``, ``activation_checkpointing=``, ``precisions=`` and
``micro_batches=`` narrow (or widen) each axis.

Each is traced with ``analyze(..., gpu=gpu, parallel=...)``: its ``peak_bytes`` is rank 0's
traced peak, never a formula, and its ``step_s``, ``mfu`` and ``tokens_per_s`` are
``Analysis.time``'s. For a transformers config whose decoder layers are all alike, each
candidate is traced at 3 and 4 layers and its full depth's numbers follow from the
per-layer rule those traces show and check (``meta_widget.explore.depth``: equal to the byte
to a full-depth trace; at 2 layers too where the caching allocator's steps need it); its
``analysis``, the full depth traced, is made when first asked for. Fewer traces where they
can say no more (``plan_trace.Learned``): a candidate whose parameters, gradients and
optimizer state are over the budget at full depth (exact from its 3- and 4-layer traces)
stops there, and the others of its layout and precision are not traced (they cannot fit). A
pipeline is traced at 3 and 4 layers a stage and each rank extended on its own where a stage
holds more than 7 layers (``explore.depth_stages``), else at full depth;
``full_depth=True`` traces every candidate at full depth. A pipeline's ``peak_bytes`` is its
worst stage's rank's and its ``step_s`` the pipeline's step, the bubble included.
The fastest candidate that fits is the one with the most tokens per second (samples per second
for inputs that are not tokens; the shortest step when neither is known).
"""

from __future__ import annotations

import difflib
import math
import pickle
from collections.abc import Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, overload

import pandas as pd

from ..options import OptionError, OptionTypeError, Parallel, check_budget
from ..sources.models import is_transformers_config
from ..timing.gpus import GPU, resolve_gpu
from ..units import format_bytes
from .candidates import COLUMNS, HELD_AS, Candidate, Space
from .checkpointing import PlanError
from .depth import depth_of
from .fit import NothingFitsError
from .layouts import MESH, decoder_layers, routed_experts
from .plan_checks import (
    check_global_batch,
    experts_where_taken,
    on_meta,
    refuse,
    sequence_length,
    sequence_parallel_where_taken,
    set_inputs,
)
from .plan_front import check_tokens, front, gpu_hours, speed
from .plan_trace import Counts, Job, Learned, planning, take, trace_candidate, trace_run
from .sweeps import ProgressFn, check_analyze_options, progress_function
from .workers import cores, default_workers, local_pool, not_starting, share

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
    tokens
        The tokens the ``gpu_hours`` column prices (``for_tokens``, ``pareto(tokens=)``);
        None: not priced.

    A plan sorts and filters like a DataFrame, each answer a ``Plan`` of the same GPU, budget
    and devices: ``p.sort("step_s")``, ``p.query("fits and tp == 1")`` (pandas' ``query``
    over ``to_dataframe()``'s columns), ``p[p.fits]`` (a mask per candidate), ``p[:5]``;
    ``p[0]`` is a ``Candidate``. ``p.pareto()`` keeps the Pareto front of the fitting rows.
    """

    candidates: list[Candidate]
    budget: int
    gpu: GPU
    devices: int
    mode: str
    traces: int = 0
    title: str = "model"
    tokens: float | None = None

    def __len__(self) -> int:
        return len(self.candidates)

    @overload
    def __getitem__(self, rows: int) -> Candidate: ...
    @overload
    def __getitem__(self, rows: slice | Sequence[bool] | pd.Series) -> Plan: ...
    def __getitem__(self, rows: Any) -> Candidate | Plan:
        """``p[i]``: a candidate; ``p[a:b]``, or ``p[mask]`` with a bool per candidate (a list,
        or a Series such as ``p.to_dataframe()["fits"]``): a ``Plan`` of those rows."""
        if isinstance(rows, int) and not isinstance(rows, bool):
            return self.candidates[rows]
        if isinstance(rows, slice):
            return self._with(self.candidates[rows])
        mask = list(rows)
        if len(mask) != len(self.candidates) or not all(isinstance(m, bool) for m in mask):
            raise OptionTypeError(
                f"plan[...]: give an index, a slice or one bool per candidate "
                f"({len(self.candidates)}), e.g. p[p.fits]; not {type(rows).__name__} of "
                f"{len(mask)}."
            )
        return self._with([c for c, keep in zip(self.candidates, mask, strict=True) if keep])

    @property
    def fits(self) -> list[bool]:
        """Per candidate, whether it fits the budget (a mask: ``p[p.fits]``)."""
        return [c.fits for c in self.candidates]

    def sort(self, by: str | list[str], *, descending: bool = False) -> Plan:
        """The candidates ordered by a column (or columns) of ``to_dataframe()``, stable, rows
        with no value last: ``p.sort("step_s")``, ``p.sort("tokens_per_s", descending=True)``."""
        table = self.to_dataframe()
        names = [by] if isinstance(by, str) else list(by)
        _columns(names, table)
        order = table.sort_values(
            names, ascending=not descending, na_position="last", kind="stable"
        ).index
        return self._with([self.candidates[i] for i in order])

    def query(self, expression: str) -> Plan:
        """The candidates whose row of ``to_dataframe()`` meets ``expression``
        (``pandas.DataFrame.query``): ``p.query("fits and mfu > 0.4")``."""
        kept = self.to_dataframe().query(expression).index
        return self._with([self.candidates[i] for i in kept])

    def for_tokens(self, tokens: float) -> Plan:
        """The same rows, ``gpu_hours`` priced for ``tokens`` tokens."""
        return replace(self, candidates=list(self.candidates), tokens=check_tokens(tokens))

    def pareto(self, tokens: float | None = None) -> Plan:
        """The Pareto front of the fitting candidates, fastest first: those no other fitting
        candidate beats on both speed (``best``'s: tokens per second) and per-GPU memory
        (``device_bytes``); priced for ``tokens`` when given (``gpu_hours``)."""
        on = front(self.candidates)
        rows = sorted((c for c, keep in zip(self.candidates, on, strict=True) if keep), key=speed)
        p = self._with(rows[::-1])
        return p if tokens is None else p.for_tokens(tokens)

    def _with(self, candidates: list[Candidate]) -> Plan:
        return replace(self, candidates=candidates)

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
        return max(fitting, key=speed)

    def to_dataframe(self) -> pd.DataFrame:
        """One row per candidate: ``replicate``, ``fsdp``, ``tp``, ``pp``, ``cp``, ``ep``,
        ``sequence_parallel``, ``schedule`` (None without a pipeline), ``virtual_stages``,
        ``activation_checkpointing``, ``precision``, ``micro_batches`` (a pipeline's: its
        schedule's), ``peak_bytes``, ``device_bytes`` (what the GPU
        holds, held against the budget), ``fits``, ``step_s``, ``mfu``,
        ``tokens_per_s``, ``samples_per_s``, ``error``, ``traced_layers``; ``pareto`` (on
        the Pareto front of this plan's fitting rows: ``pareto()``) and ``gpu_hours`` (the
        GPU-hours of ``tokens`` tokens, None unpriced: ``for_tokens``)."""
        on = front(self.candidates)
        rows = [
            {**c.row(), "pareto": keep, "gpu_hours": gpu_hours(c, self.devices, self.tokens)}
            for c, keep in zip(self.candidates, on, strict=True)
        ]
        return pd.DataFrame(rows, columns=[*COLUMNS, "pareto", "gpu_hours"])

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
    layouts: Sequence[Mapping[str, Any] | Parallel] | None = None,
    activation_checkpointing: Sequence[bool] | None = None,
    precisions: Sequence[str] | None = None,
    micro_batches: Sequence[int] | None = None,
    global_batch: int | None = None,
    seq_len: int | None = None,
    progress: bool | ProgressFn = False,
    full_depth: bool = False,
    workers: int | None = None,
    executor: Executor | None = None,
    **analyze_options: Any,
) -> Plan:
    """The fastest configuration of ``model`` that fits ``budget`` on ``devices`` GPUs, every
    candidate traced.

    The candidates and how they are compared: the docstring of ``meta_widget.explore.plan``.

    Parameters
    ----------
    model, input_size, input_data
        As for ``analyze``; the batch given is the batch of one rank: of one micro-batch, or
        with a pipeline (``pp > 1``) of the whole step, which its schedule splits into its
        micro-batches (a multiple of them). Or ``global_batch`` and ``seq_len`` instead.
    gpu
        A name of ``mw.gpus()`` or an ``mw.GPU(...)``: the times, and the default budget.
    devices
        How many GPUs: each layout's ``replicate * fsdp * tp * pp * cp`` is ``devices``.
    budget
        Bytes per device (an int) or a size with a unit (``"80GiB"``, ``"80GB"``); default the
        GPU's ``memory_bytes``.
    mode
        ``"training"`` (default) or ``"inference"`` (no checkpointing or micro-batch
        candidates).
    layouts
        The layouts to try, each a dict of ``replicate``, ``fsdp``, ``tp``, ``pp``, ``cp``,
        ``ep`` (missing ones 1), and with ``pp`` the pipeline's ``schedule``,
        ``virtual_stages`` and ``microbatches``, or a ``mw.Parallel`` of those, using
        ``devices`` devices: e.g. ``[{"fsdp": 8}, {"pp": 4, "fsdp": 2, "schedule": "1F1B"},
        mw.Parallel(pp=2, tp=4)]``. Default every ``replicate x fsdp x tp`` with ``tp <=
        gpu.gpus_per_node``; with more devices than a node and a transformers config, also
        every ``pp x fsdp x tp`` (1F1B) with ``pp`` at most its layers (training only); for
        a mixture of experts' config, those without ``tp`` again with ``ep``. A default
        layout with ``tp`` shards the sequence too (``sequence_parallel``) where the model
        takes it and ``tp`` divides the sequence.
    activation_checkpointing
        The settings to try (training): default ``(False, True)``.
    precisions
        Names of ``meta_widget.explore.candidates.PRECISIONS`` to try: default all three.
    micro_batches
        Micro-batch counts to try (training): default ``(1, 2)``. A pipeline's layout is
        tried once, with its schedule's micro-batches.
    global_batch, seq_len
        Instead of ``input_size``: the sequences of one optimizer step over every rank, and
        their length in tokens (token ids, as practitioners give them: ``global_batch=512,
        seq_len=8192``). Each candidate's rank is given ``global_batch / (replicate * fsdp)``
        sequences split over its micro-batches (``Candidate.input_size``); its
        ``tokens_per_s`` is then ``global_batch * seq_len / step_s``.
    progress
        ``True``: a text line per candidate on standard error; or a function
        ``(done, total, text)``.
    full_depth
        Trace every candidate at the model's full depth. By default a transformers config
        whose decoder layers are all alike is traced at 3 and 4 layers per candidate and
        extended by the per-layer rule those traces check (``meta_widget.explore.depth``), ~10x
        faster for an 80-layer model; a candidate whose traces break the rule is traced at full
        depth.
    workers
        Processes that trace candidates at once when no ``executor`` is given: this one and
        ``workers - 1`` children of a local ``ProcessPoolExecutor`` (spawned;
        ``meta_widget.explore.workers``). Default: one per core this process may use (at most
        8) for a transformers config and at least 16 candidates, else 1; a number given is
        capped at the candidates and at the cores this process may use. Children rebuild the
        model from its config, so ``workers > 1`` needs ``model`` to be a transformers config,
        no ``input_data``, and options that pickle.
    executor
        Any ``concurrent.futures.Executor`` to trace the candidates on instead, e.g. a
        ``dask.distributed.Client(...).get_executor()`` for a cluster; it is sent runs of
        candidate keys with the job (plain data: the config, the options) and answers their
        numbers. The same needs as ``workers > 1``; the executor stays the caller's (not shut
        down). The plan is the same, row for row: a run that fails there is traced here.
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
    PlanError
        In a worker process that runs the script's unguarded top level as it starts.
    """
    not_starting(PlanError)
    accelerator = resolve_gpu(gpu)
    limit = accelerator.memory_bytes if budget is None else check_budget(budget)
    _check(devices, mode, analyze_options)
    whole = check_global_batch(global_batch, seq_len, input_size, input_data)
    experts = routed_experts(model)
    space = Space.checked(
        devices,
        mode,
        accelerator,
        layouts,
        activation_checkpointing,
        precisions,
        micro_batches,
        decoder_layers(model),
        experts,
    )
    checks = on_meta(model, space.layouts)
    if layouts is None:
        sequence = sequence_length(input_size, whole)
        node = max(1, accelerator.gpus_per_node)
        found = experts_where_taken(space.layouts, checks, experts, node)
        space = replace(space, layouts=sequence_parallel_where_taken(found, checks, sequence))
    report = progress_function(progress, "plan")
    todo = space.candidates()
    if not isinstance(full_depth, bool):
        raise OptionTypeError(f"plan: full_depth must be True or False, not {full_depth!r}.")
    if whole is not None:
        set_inputs(todo, *whole)
    refuse(todo, checks, input_size)  # what the model or the batch cannot take: no trace
    traced = [c for c in todo if c.error is None]
    by_name = set(analyze_options) & set(_NAMES_MODULES)  # options that name the full model's
    layers = None if full_depth or by_name else depth_of(model)
    job = Job(model, input_size, input_data, mode, accelerator, analyze_options, layers, limit)
    count = _processes(workers, executor, len(traced), job)
    counts = Counts()
    learned = Learned()  # layouts analyze refused; layouts and precisions that cannot fit
    by_key = {c.key: c for c in traced}
    finished = len(todo) - len(traced)

    def here(key: tuple[Any, ...]) -> None:
        trace_candidate(by_key[key], job, counts, learned)

    def on_done(key: tuple[Any, ...], result: Any, remote: bool) -> None:
        nonlocal finished
        c = by_key[key]
        if remote:
            counts.runs += result["runs"]
            counts.title = result["title"] or counts.title
            take(c, result, job, counts)
        finished += 1
        if report is not None:
            report(finished, len(todo), _label(c))

    if report is not None and traced:
        where = "the executor" if executor is not None else f"{count} processes"
        first = where if executor is not None or count > 1 else _label(traced[0])
        report(finished, len(todo), first)
    task = partial(trace_run, job)
    with planning():
        if executor is not None:
            runs = _runs(traced, math.ceil(len(traced) / (2 * _width(executor))))
            share(runs, here, task, executor, on_done, helping=False)
        elif count > 1:  # this process and count - 1 children
            with local_pool(count - 1) as pool:
                # a group a run (not a layout's groups merged): the last run anywhere
                # is what this process may wait for at the end (10 % of a 2-process plan)
                runs = _runs(traced, 1)
                share(runs, here, task, pool, on_done, window=count - 1)
        else:
            share([list(by_key)], here, task, None, on_done)
    if report is not None:
        report(len(todo), len(todo), f"{counts.runs} traced")
    title = counts.title or "model"
    return Plan(list(todo), limit, accelerator, devices, mode, counts.runs, title)


def _runs(candidates: list[Candidate], size: int) -> list[list[tuple[Any, ...]]]:
    """The keys of ``candidates`` cut into runs of one layout each, at most ``size`` keys each
    where that splits no group: a worker takes a run whole and warms its layout up once.

    A group is the candidates of one layout that hold the same parameters, gradients and
    optimizer state (``HELD_AS``), in the plan's order: what one of them shows over the budget
    prunes the rest (``plan_trace.Learned``), so a group is never split between workers, and
    the rows are the same whatever the executor's width (the first of a group is traced).

    The longest runs come first (the plan's order among runs as long): a process that runs
    out of runs waits for the others' last ones, which are then the shortest. In the default
    plan of a 16-layer Llama on 2 processes, one process waited 7 s of 67 for an 8-candidate
    run that another took last, where the runs alternated 8 and 4 candidates."""
    groups: dict[tuple[Any, ...], list[tuple[Any, ...]]] = {}
    for c in candidates:
        groups.setdefault((c.layout, HELD_AS[c.precision]), []).append(c.key)
    runs: list[list[tuple[Any, ...]]] = []
    for (layout, _), keys in groups.items():
        if runs and by_layout(runs[-1][-1]) == layout and len(runs[-1]) + len(keys) <= size:
            runs[-1].extend(keys)
        else:
            runs.append(list(keys))
    return sorted(runs, key=len, reverse=True)


def by_layout(key: tuple[Any, ...]) -> Any:
    """The layout of a candidate's key (``Candidate.key``)."""
    return key[0]


def _width(executor: Executor) -> int:
    """How many tasks ``executor`` runs at once, as far as it says (a pool's ``_max_workers``,
    a Dask client's threads); else the cores here."""
    known = getattr(executor, "_max_workers", None)
    if isinstance(known, int) and known > 0:
        return known
    client = getattr(executor, "_client", None)  # dask.distributed's ClientExecutor
    try:
        threads = sum(client.nthreads().values()) if client is not None else 0
    except Exception:  # a client that cannot say: the default below
        threads = 0
    return threads if threads > 0 else cores()


def _processes(given: Any, executor: Any, candidates: int, job: Job) -> int:
    """The processes to use, this one included (0 with an executor): ``workers`` checked, or
    the default (``default_workers``) where other processes can rebuild the job (a
    transformers config, no input data, options that pickle)."""
    if executor is not None:
        if given is not None:
            raise OptionError(
                f"plan: give workers= or executor=, not both (workers={given} sizes the local "
                "pool plan makes when no executor is given)."
            )
        if not isinstance(executor, Executor):
            raise OptionTypeError(
                f"plan: executor must be a concurrent.futures.Executor (a ProcessPoolExecutor, "
                f"a dask.distributed Client's get_executor()), not {type(executor).__name__}."
            )
        why = _cannot_travel(job)
        if why is not None:
            raise OptionError(f"plan: executor= cannot be used: {why}; leave executor out.")
        return 0
    if given is not None and (isinstance(given, bool) or not isinstance(given, int) or given < 1):
        raise OptionTypeError(f"plan: workers must be a whole number >= 1, not {given!r}.")
    # never more processes than candidates, nor than cores: a process per core at most
    count = (
        default_workers(candidates) if given is None else min(given, max(1, candidates), cores())
    )
    if count <= 1:
        return 1
    why = _cannot_travel(job)
    if why is None:
        return count
    if given is None:
        return 1
    raise OptionError(f"plan: workers={given} cannot be used: {why}; pass workers=1.")


def _cannot_travel(job: Job) -> str | None:
    """Why ``job`` cannot be traced in other processes (None when it can)."""
    if not is_transformers_config(job.model):
        return "model is not a transformers config (workers rebuild the model from its config)"
    if job.input_data is not None:
        return "input_data is given (workers are never sent tensors)"
    try:
        pickle.dumps(job)
    except Exception as e:
        return f"the model or options do not pickle ({type(e).__name__}: {e})"
    return None


def _columns(names: list[str], table: pd.DataFrame) -> None:
    unknown = [n for n in names if n not in table.columns]
    if unknown:
        close = [m for u in unknown for m in difflib.get_close_matches(u, table.columns, n=1)]
        hint = f"did you mean {', '.join(map(repr, close))}? " if close else ""
        raise OptionError(
            f"Plan.sort: {', '.join(map(repr, unknown))} is no column of to_dataframe(); "
            f"{hint}columns: {', '.join(table.columns)}."
        )


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
        f"{c.layout.label()} checkpointing={c.activation_checkpointing} {c.precision} "
        f"micro_batches={c.micro_batches}"
    )


def _nothing_fits(p: Plan) -> NothingFitsError:
    held = [c for c in p.candidates if c.device_bytes is not None]
    least = min(held, key=lambda c: c.device_bytes or 0) if held else None
    if least is None:
        smallest = "no candidate could be traced (see Plan.to_dataframe()['error'])"
    else:
        n = least.device_bytes or 0
        what = (
            f"a peak of {format_bytes(least.peak_bytes)}, the caching allocator's reserve "
            "around it, the CUDA context"
            if least.peak_bytes is not None
            else "its parameters, gradients and optimizer state alone, and the CUDA context"
        )
        smallest = f"the least any holds on the GPU is {format_bytes(n)} ({n:,} bytes: {what})"
    return NothingFitsError(
        f"plan: none of the {len(p.candidates)} candidates on {p.devices} x {p.gpu.name} fits "
        f"the budget of {format_bytes(p.budget)} ({p.budget:,} bytes) per device; {smallest}. "
        f"Try {_sequence_parallel_hint(p)}more devices, a smaller batch or sequence, or a "
        "larger budget."
    )


def _sequence_parallel_hint(p: Plan) -> str:
    """Where tensor-parallel layouts were tried without sequence parallelism and none with
    it: the first such layout with it, as ``layouts=`` takes it (it shards the activations
    the TP ranks otherwise each hold whole: the 405B fits no layout without it)."""
    layouts = [c.layout for c in p.candidates if c.layout is not None]
    plain = [x for x in layouts if x.tp > 1 and not x.sequence_parallel]
    if not plain or any(x.sequence_parallel for x in layouts):
        return ""
    given: dict[str, Any] = {k: getattr(plain[0], k) for k in MESH if getattr(plain[0], k) != 1}
    given["sequence_parallel"] = True
    return f"sequence parallelism (layouts=[{given}]), "
