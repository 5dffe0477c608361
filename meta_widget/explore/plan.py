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
- *activation checkpointing* (training only): off, or every block (``True``); or on request
  every block selectively (``"selective"``: the ops of ``checkpoint_policy=`` saved,
  torchtitan's op list by default), or the modules a list of paths or class names picks;
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

import math
import pickle
import warnings
from collections.abc import Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import replace
from functools import partial
from typing import Any

from ..options import OptionError, OptionTypeError, Parallel, check_budget
from ..sources.models import is_transformers_config
from ..timing.gpus import GPU, resolve_gpu
from .candidates import HELD_AS, Candidate, Space
from .checkpointing import PlanError
from .depth import depth_of
from .layouts import decoder_layers, routed_experts
from .plan_checks import (
    check_global_batch,
    check_selective,
    experts_where_taken,
    on_meta,
    refuse,
    sequence_length,
    sequence_parallel_where_taken,
    set_inputs,
    uneven_checkpointing,
)
from .plan_result import Plan, label
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
    activation_checkpointing: Sequence[bool | str | Sequence[str]] | None = None,
    precisions: Sequence[str] | None = None,
    micro_batches: Sequence[int] | None = None,
    global_batch: int | None = None,
    seq_len: int | None = None,
    progress: bool | ProgressFn = True,
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
        The settings to try (training), each ``analyze``'s: ``False`` (none), ``True`` (every
        block, recomputed whole), ``"selective"`` (every block, the outputs of the ops of
        ``checkpoint_policy=`` saved: torchtitan's op list when not given; only these
        candidates take the policy), or a list of module paths or class names (those modules,
        each recomputed whole: ``["LlamaMLP"]``; names that pick other modules in one decoder
        layer than in another are traced at full depth). Default ``(False, True)``.
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
        ``True`` (the default): a line of progress, rewritten as each candidate is done (on
        standard error; in a notebook, the cell's output, left as one line that says how many
        traces it took); ``False``: none; or a function ``(done, total, text)``.
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
    check_selective(model, space.checkpointing)
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
    named = [setting for setting in space.checkpointing if isinstance(setting, tuple)]
    uneven = uneven_checkpointing(checks.built(model), named, layers) if named else ()
    job = Job(
        model, input_size, input_data, mode, accelerator, analyze_options, layers, limit, uneven
    )
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
            counts.notes.update(dict.fromkeys(result["notes"]))
            take(c, result, job, counts)
        finished += 1
        if report is not None and finished < len(todo):  # the last: the line below says it
            report(finished, len(todo), label(c))

    if report is not None and traced:
        where = "the executor" if executor is not None else f"{count} processes"
        first = where if executor is not None or count > 1 else label(traced[0])
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
        report(len(todo), len(todo), f"done, {counts.runs} traces")
    title = counts.title or "model"
    notes = tuple(f"plan: the candidates' traces say: {note}" for note in counts.notes)
    for note in notes:  # the plan's rows hold what it says, which a user should know of
        warnings.warn(note, UserWarning, stacklevel=2)
    return Plan(list(todo), limit, accelerator, devices, mode, counts.runs, title, notes=notes)


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
