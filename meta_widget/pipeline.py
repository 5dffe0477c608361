"""The pipeline of an analysis: check every option, build the meta model and inputs, trace
(one pass, or one rank of several devices), assemble the result.

:func:`run` is all of it, over frozen :class:`~meta_widget.options.Options`; ``analyze`` and
``Analysis.rerun`` call it with the class to build (``Analysis``, from the layer above: the
result is made once, when every field is known, and never changed after).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from . import heavy, warm
from .checkpoints import CheckpointDiff, checkpoint_diff, inspect_checkpoint
from .choices import WaitState
from .data.flatten import named_tensors
from .data.records import CallRecord
from .data.tree import ModuleNode, build_tree
from .data.walk import walk
from .memory.kv_cache import KVCache
from .memory.moe import BALANCED_NOTE, find_moe
from .memory.report import memory_report
from .options import EP_NOTE, OptionError, Options, check_buildable, check_listeners
from .sources.inputs import make_inputs
from .sources.models import MetaModel, check_tree, source_of, to_meta
from .sources.precision import cast_inputs, with_param_dtype
from .timing.gpus import GPU, resolve_gpu
from .timing.model import StepTime, generation_time, step_time, tokens_of
from .trace.assume import Assumption
from .trace.explain import Explanation, explain
from .trace.generate import check_generates
from .trace.passes import Trace, pause_gc, trace
from .undo import Undo
from .views import waiting

if TYPE_CHECKING:
    from .views.widget import MetaWidget

__all__ = ["run", "time_step"]

R = TypeVar("R")


def run(
    model: Any,
    options: Options,
    result: Callable[..., R],
    widget: bool | MetaWidget | None = None,
    listeners: Sequence[Callable[[CallRecord], None]] = (),
) -> R:
    """The pipeline of ``analyze`` over ``options`` (``Analysis.rerun`` runs it too): the
    fields of the result, given to ``result`` (``Analysis``) once, when all are known.

    The cyclic garbage collector is paused for all of it, as during the trace (see
    ``meta_widget.trace.passes``): building the tree and the report of a model of thousands of
    modules made it scan the heap again and again (half the time of a 2,000-block model).
    """
    undo = Undo()
    try:
        try:
            pause_gc(undo)
            return _pipeline(model, options, result, widget, listeners)
        finally:
            undo.run()
    finally:
        undo.run()  # what an interrupt inside the first run left undone


def _pipeline(
    model: Any,
    options: Options,
    make: Callable[..., R],
    widget: bool | MetaWidget | None,
    listeners: Sequence[Callable[[CallRecord], None]],
) -> R:
    options, given_notes = options.checked()  # every option, before anything is built
    gpu = resolve_gpu(options.gpu) if options.gpu is not None else None  # unknown: OptionError
    listeners = check_listeners(listeners)
    check_buildable(model)
    # the widget is shown now, before the model is built: it says what the analysis waits for
    # (meta_widget.views.waiting), then shows the module tree as soon as there is one
    view = _resolve_widget(widget, options)
    try:
        return _stages(model, options, given_notes, gpu, make, view, listeners)
    except BaseException as exc:
        if view is not None and view.last_done is None:  # no result reached the views
            view.fail(explain(exc))
        raise


def _stages(
    model: Any,
    options: Options,
    given_notes: list[str],
    gpu: GPU | None,
    make: Callable[..., R],
    view: Any,
    listeners: Sequence[Callable[[CallRecord], None]],
) -> R:
    """The pipeline after its checks: build, trace, assemble; ``view`` (a ``MetaWidget`` or
    None; it shows the ``R`` made here) told each state."""
    # the warm-up started by %load_ext (meta_widget.warm) is this analysis's first meta forward,
    # paid ahead: wait for it rather than import the same modules beside it
    if view is not None:
        warm.wait(lambda: view.waiting(WaitState.WARM_UP, waiting.WARM_UP_TEXT, warm.so_far()))
        view.waiting(WaitState.BUILD, waiting.build_text(source_of(model)))
    else:
        warm.wait()
    start = time.perf_counter()
    meta = source = _build(model)
    if options.param_dtype is not None:
        meta = with_param_dtype(meta, options.param_dtype)
    module = meta.module
    _check_against(module, options)  # the options that depend on the model, before tracing
    diff = (
        checkpoint_diff(module, inspect_checkpoint(options.checkpoint))
        if options.checkpoint is not None
        else None
    )
    inputs = make_inputs(module, options.input_size, options.input_data, options.dtypes)
    if options.param_dtype is not None and options.dtypes is None:
        inputs = cast_inputs(inputs, options.param_dtype)
    # what rerun() passes again: the meta inputs (no data), dtypes and sizes already applied
    kept = replace(
        options,
        input_size=None,
        input_data=None
        if inputs.empty
        else inputs.kwargs
        if inputs.kwargs and not inputs.args
        else inputs.args,
        dtypes=None,
        checkpoint=None,
        input_notes=(*options.input_notes, *inputs.notes),
    )
    # a re-run's meta model keeps its notes: each note once
    notes = list(dict.fromkeys([*meta.notes, *inputs.notes, *options.input_notes, *given_notes]))
    if options.parallel is not None and options.parallel.ep > 1:
        notes.append(EP_NOTE)
    if options.parallel is not None and options.parallel.pp > 1 and not inputs.empty:
        from .distributed import pipelining  # every pipeline rank traced in turn

        staged: R = pipelining.run_stages(
            meta,
            inputs,
            options,
            kept,
            notes,
            diff,
            gpu,
            make,
            listeners,
            start,
            _assemble,
            time_step,
        )
        if view is not None:  # its stages are traced one by one, without a stream
            view.analysis = staged
            view.show(staged)
            view.update_live_display()
        return staged
    tree = walk(module)  # one walk for the tree and the trace
    nodes = build_tree(module, tree)
    input_tensors = [t for _, t in named_tensors((inputs.args, inputs.kwargs))]
    if view is not None:  # its "done" says how long all of it took, the model's build included
        view.run_started = start
    stream = None
    result = None
    traced, comms = module, []
    parallel = options.parallel is not None or meta.wrapping is not None
    if parallel and inputs.empty:
        notes.append("parallel= needs inputs: without a forward pass nothing per rank is traced.")
    if not inputs.empty:
        if view is not None:
            stream = view.stream(
                nodes, title=type(module).__name__, source=meta.source, mode=options.mode
            )
            stream.waiting(WaitState.TRACE, waiting.TRACE_TEXT)
        spec = options.trace_spec()
        observers: dict[str, Any] = dict(
            listeners=[*listeners, stream.add] if stream is not None else list(listeners),
            on_phase=stream.phase if stream is not None else None,
        )
        if not parallel:
            result = trace(module, inputs.args, inputs.kwargs, spec, tree=tree, **observers)
        else:  # parallel=, or a model the user wrapped (FSDP2 / tensor parallelism) as it is
            from .distributed import parallel as ranks  # FSDP2 and DTensor: ~1 s
            from .distributed import wrapped

            world = wrapped.world_for(options.parallel, meta.wrapping)
            rank = ranks.trace_rank(world, module, inputs.args, inputs.kwargs, spec, **observers)
            result, traced, comms = rank.trace, rank.module, rank.comms
        if stream is not None:
            stream.waiting(
                WaitState.ANALYZE,
                waiting.analyze_text(gpu.name if gpu is not None else None, options.training),
            )
    fields = _assemble(meta, nodes, input_tensors, kept, notes, diff, result, traced)
    analysis = make(
        **fields,
        time=None
        if gpu is None or result is None
        else time_step(
            result.calls,
            result.orphan_costs,
            comms,
            gpu,
            input_tensors,
            options,
            fields["total_flops"],
        ),
        comm_records=comms,
        source_model=source,  # what rerun and materialize start from: the model as given
        seconds=time.perf_counter() - start,
    )
    if view is not None:
        view.analysis = analysis
        analysis._views["widget"] = view  # type: ignore[attr-defined]
        if stream is not None:
            stream.finish(analysis)
        else:
            view.show(analysis)
        view.update_live_display()  # widget=True: its output gets the static view too
    return analysis


def _build(model: Any) -> MetaModel:
    """The meta model of what the user gave: one already wrapped by FSDP2 / tensor parallelism
    (which needs DTensor loaded, so never without it) read as it stands, else ``to_meta``."""
    if isinstance(model, torch.nn.Module) and "torch.distributed.tensor" in sys.modules:
        from .distributed import wrapping  # loads FSDP2: only for a process that has DTensor

        if wrapping.is_wrapped(model):
            check_tree(model)
            return wrapping.unwrapped_meta(model)
    return to_meta(model)


def _check_against(module: torch.nn.Module, options: Options) -> None:
    """The options checked against the (meta) model before anything is traced or started:
    the modules ``activation_checkpointing`` names, and ``parallel=``'s degrees
    (``meta_widget.distributed.parallel.check_world``); a mismatch is an ``OptionError``."""
    _check_checkpointed(module, options.activation_checkpointing)
    if options.generating:
        check_generates(module)
        if options.parallel is not None:
            raise OptionError("mode='generate' traces one device: parallel= is not supported.")
    plan = options.parallel
    if plan is not None and plan.pp > 1 and (not options.training or options.micro_batches > 1):
        raise OptionError(
            f"parallel pp={plan.pp} traces a training step run by a pipeline schedule, whose "
            f"micro-batches are parallel's microbatches={plan.microbatches}: give "
            "mode='training', and leave micro_batches out."
        )
    if options.parallel is not None:
        from .distributed import context, parallel  # FSDP2 and DTensor: ~1 s, for parallel=

        parallel.check_world(options.parallel, module)
        context.check_ring_device(options.parallel, options.device)


def _assemble(
    meta: MetaModel,
    nodes: list[ModuleNode],
    input_tensors: list[torch.Tensor],
    options: Options,
    notes: list[str],
    diff: CheckpointDiff | None,
    result: Trace | None,
    traced: torch.nn.Module | None = None,
) -> dict[str, Any]:
    """The fields of the analysis of a trace (``result``), or of the structure alone (None);
    ``traced`` is the module the trace ran, when not ``meta.module`` (one rank's, wrapped)."""
    module = meta.module
    if result is None:
        report = memory_report(module, input_tensors)
        notes = [*notes, "No inputs given: structural analysis only (no forward pass)."]
    else:
        for rec in result.calls:
            if rec.module >= 0:
                nodes[rec.module].calls.append(rec)
        report = memory_report(
            traced if traced is not None else module,
            input_tensors,
            result.calls,
            result,
            options.training,
        )
        notes = [*notes, *result.notes]
        if result.kv_cache is not None:  # the peak's phase: prefill or decode
            report.peak_phase = _peak_phase(report)
    moe = find_moe(module)
    if moe is not None:
        notes = [*notes, BALANCED_NOTE]
    return dict(
        moe=moe,
        title=type(module).__name__,
        source=meta.source,
        mode=options.mode,
        modules=nodes,
        calls=result.calls if result is not None else [],
        memory=report,
        total_flops=_total_flops(result),
        error=_explained(result),
        notes=notes,
        traced=result is not None,
        orphan_ops=result.orphan_ops if result is not None else {},
        orphan_costs=result.orphan_costs if result is not None else {},
        assumptions=result.assumptions if result is not None else [],
        checkpoint_diff=diff,
        fast_path=result.fast_path if result is not None else None,
        options=options,
        kv_cache=KVCache.of(result.kv_cache, report.param_bytes + report.buffer_bytes)
        if result is not None and result.kv_cache is not None
        else None,
    )


def _peak_phase(report: Any) -> str | None:
    """The phase of the timeline's peak (its first point at the peak's bytes)."""
    peak = report.peak_bytes
    for i, (live, _, _) in enumerate(report.timeline):
        if live == peak:
            return report.timeline_phases()[i]  # type: ignore[no-any-return]
    return report.peak_phase  # type: ignore[no-any-return]


def time_step(
    calls: Sequence[CallRecord],
    outside: dict[str, dict[tuple[str, int, int, tuple[Any, ...]], int]],
    comms: Sequence[Any],
    gpu: GPU,
    inputs: list[torch.Tensor],
    options: Options,
    flops: int,
) -> StepTime:
    """A trace's step timed on ``gpu`` from its records (``meta_widget.timing.model``): its
    ``calls``, the costs of ops ``outside`` calls by phase, its collectives ``comms``, the
    meta ``inputs`` (tokens per step) and the ``flops`` MFU counts."""
    tokens, samples = tokens_of(inputs, options.micro_batches if options.training else 1)
    fsdp = (  # the ranks processing other data: FSDP's (a wrapped model's: its groups')
        options.parallel.data_parallel if options.parallel is not None else _data_parallel(comms)
    )
    launch = options.launch or ("graphs" if options.generating else "eager")
    step = step_time(
        calls, outside, comms, gpu, flops, tokens, samples, data_parallel=fsdp, launch=launch
    )
    if options.generating and samples:  # prefill, each decode step, tokens made per second
        return generation_time(step, calls, samples, _new_tokens(options, inputs))
    return step


def _new_tokens(options: Options, inputs: list[torch.Tensor]) -> int:
    """The tokens ``generate()`` made per sequence (``new_tokens``, or from ``max_length``)."""
    if options.new_tokens is not None:
        return options.new_tokens
    prompt = next((int(t.shape[1]) for t in inputs if t.dim() == 2), 0)
    return max(1, (options.max_length or 0) - prompt)


def _data_parallel(comms: Sequence[Any]) -> int:
    """The ranks processing other data in a wrapped model's trace: its FSDP group's times its
    replica group's (HSDP), from the groups its collectives ran on."""
    sizes = {c.group: c.group_size for c in comms}
    return sizes.get("fsdp", 1) * sizes.get("replicate", 1)


def _total_flops(result: Trace | None) -> int:
    """Every op's FLOPs once: each call's own body, forward and backward, plus ops outside calls."""
    if result is None:
        return 0
    return result.orphan_flops + sum(c.self_flops + c.backward_self_flops for c in result.calls)


def _explained(result: Trace | None) -> Explanation | None:
    """The trace's exception explained at its module and op, naming assumptions it may follow."""
    if result is None or result.exception is None:
        return None
    call = result.error_call
    error = explain(
        result.exception,
        module=result.calls[call].path if call is not None else None,
        call=call,
        op=result.failed_op,
    )
    if call is not None:
        error = replace(error, module_type=result.calls[call].type)
    return _blame_assumptions(error, result.assumptions)


def _check_checkpointed(module: torch.nn.Module, which: bool | str | Sequence[str]) -> None:
    """Each module path or class name ``activation_checkpointing`` gives picks a module."""
    if isinstance(which, (bool, str)) or not which:
        return
    names = set(which)
    if not any(p in names or type(m).__name__ in names for p, m in module.named_modules()):
        raise OptionError(
            f"activation_checkpointing={sorted(names)} matches no module path or class name of "
            f"{type(module).__name__}; use paths from a.to_dataframe()['module'] or class names."
        )


def _blame_assumptions(error: Explanation, assumptions: Sequence[Assumption]) -> Explanation:
    """Name the assumptions a failure may follow from, and how to override them.

    Only a truth value can be decided differently through ``assume=`` (upper-bound shapes are
    switched off with ``assume_nonzero=False``, not per site): the ``assume=`` suggested is
    that of the latest truth assumption, and none is suggested when there is none.
    """
    if not assumptions:
        return error
    last = assumptions[-1]
    note = (
        f" The trace had assumed values it could not know ({len(assumptions)} site(s); the "
        f"latest: {last}); this error may follow from one of them."
    )
    truths = [a for a in assumptions if a.kind == "truth"]
    fix = " strict=True turns assumptions off."
    if truths:
        flip = "False" if truths[-1].value == "True" else "True"
        fix = (
            f" To decide that condition differently: assume={{{truths[-1].site!r}: {flip}}};" + fix
        )
    return replace(error, explanation=error.explanation + note, fix=error.fix + fix)


def _resolve_widget(widget: Any, options: Options) -> Any:
    if widget is None or widget is False:
        return None
    from .views.widget import MetaWidget  # anywidget: ~0.5 s, only for a widget

    if widget is True:
        view = MetaWidget()
        view.live_display = heavy.display(view, updatable=True)
    elif isinstance(widget, MetaWidget):
        view = widget
    else:
        raise TypeError(
            f"widget must be True, False, None or a MetaWidget, not {type(widget).__name__}"
        )
    if options.depth is not None:
        view.depth = options.depth
    return view
