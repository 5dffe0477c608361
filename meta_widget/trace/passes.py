"""What one analysis runs on meta: a forward pass, or a whole training step, under a Recorder.

Inference: ``eval()``, ``torch.no_grad()``, one forward pass. Training: ``train()``, then two
steps of a training loop, each a forward pass, the loss (``loss(output)``, or the sum of every
floating output), ``backward()`` and an optimizer step, recorded as phases of the live-bytes
timeline (``forward``, ``backward``, ``optimizer``). The second step starts with ``zero_grad``
and runs on top of what the first left (the optimizer state; the gradients, zeroed, where
``set_to_none=False``): from then on every step is the same, so it is the steady state. Its calls,
FLOPs and costs are not counted again: the records are the first step's. Generate
(``mode="generate"``): ``eval()``, ``no_grad()``, transformers' ``generate()``
(``meta_widget.trace.generate``), its prefill and decode steps marked on the timeline.
Everything is undone afterwards, whatever interrupts it: hooks, modes, grad
mode, ``training`` flags, patched forwards, gradients and the garbage collector switch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

# PyTorch imports torch._dynamo the first time some of its functions run. Were that first time
# mid-trace, the import would keep the frames then running alive (an exception stored during it
# holds their traceback), and with them the tensors of the model's calls: the first analysis of
# a process would show activations that are never freed. So it is imported before any trace.
import torch._dynamo

from ..choices import MemoryCategory, Phase
from ..data.flatten import named_tensors
from ..data.records import Allocation, CallRecord, Event
from ..data.walk import ModuleWalk
from ..options import TraceSpec
from ..options.selective import SavePolicy
from ..undo import FunctionModes, Undo, interrupt_behind, set_grad_enabled
from .assume import Assumption, Policy
from .autocast import Autocast
from .callstack import Listener
from .checkpointing import SavedOps, patch_forwards
from .decode_skip import Stretch
from .factories import DeviceLessFactories
from .fake_tensors import detached
from .fastpath import patch_fast_paths
from .generate import CacheSummary, Generation, StopChecks
from .kernels import WORKSPACES, AttentionKernels
from .opcache import CacheStats
from .optimizers import OPTIMIZERS, foreach_for
from .recorder import Recorder
from .replay import Tapes
from .shard_foreach import ShardLocalForeach
from .storage import local, storage_key
from .trace_changes import (  # noqa: F401 (_claims, _GcPause: read by the hostile tests)
    ConcurrentTraceError,
    _claim,
    _claims,
    _GcPause,
    _keep_state,
    _SavedTensorsHooks,
    pause_gc,
    set_training,
)


@dataclass
class Trace:
    """What one recorded pass produced (records, events and allocations; no tensors)."""

    calls: list[CallRecord]
    events: list[Event]
    allocations: list[Allocation]
    orphan_flops: int
    orphan_ops: dict[str, int]
    exception: BaseException | None
    failed_op: str | None
    error_call: int | None
    seconds: float
    assumptions: list[Assumption] = field(default_factory=list)
    #: event index where each phase begins (its first run: with micro-batches, the first
    #: micro-batch's)
    phase_starts: dict[str, int] = field(default_factory=dict)
    #: (event index, phase) where each run of a phase begins, in order: with micro-batches, a
    #: forward and a backward per micro-batch; each event's phase is that of the last run
    #: begun at or before it
    phase_runs: list[tuple[int, str]] = field(default_factory=list)
    #: storage keys of the gradients and optimizer state alive at the end of a training step,
    #: each -> the name of its parameter in ``named_parameters()`` (its first owner: tied once);
    #: a gradient's -> each parameter whose gradient it holds, with the bytes of its view (FSDP2
    #: reduce-scatters a group's gradients into one storage, each a view of it)
    grad_keys: dict[int, list[tuple[str, int]]] = field(default_factory=dict)
    state_keys: dict[int, str] = field(default_factory=dict)
    #: optimizer state kept off the meta device (e.g. AdamW's step counters, on the CPU)
    state_other_bytes: int = 0
    #: what the op cache did (``meta_widget.trace.opcache``); None when the fast path was off
    fast_path: CacheStats | None = None
    #: what the analysis should tell (tensors made without a device, see ``factories``)
    notes: list[str] = field(default_factory=list)
    #: the costs of ops outside any module call, by phase (``meta_widget.trace.costs``)
    orphan_costs: dict[str, dict[tuple[str, int, int, tuple[Any, ...]], int]] = field(
        default_factory=dict
    )
    #: ``mode="generate"``: the cache ``generate()`` returned (``meta_widget.trace.generate``)
    kv_cache: CacheSummary | None = None
    #: ``mode="generate"``: the stretches of decode steps given by the per-step rule, not
    #: traced one by one (``meta_widget.trace.decode_skip.Stretch``)
    stretches: list[Stretch] = field(default_factory=list)
    #: the event index where each training step begins: ``[0, k]``, the first step and the
    #: second (steady) one; ``[0]`` for a single pass (see :func:`trace`)
    step_starts: list[int] = field(default_factory=lambda: [0])


def default_loss(output: Any) -> torch.Tensor:
    """The sum of every floating-point output that requires grad (KV caches left out)."""
    terms = [
        t.sum()
        for _, t in named_tensors(output, caches=False)
        if t.is_floating_point() and t.requires_grad
    ]
    if not terms:
        raise ValueError(
            "mode='training' needs an output that requires grad to back-propagate from; the "
            "model returned none. Pass loss=lambda output: ... to say what to differentiate."
        )
    total = terms[0]
    for t in terms[1:]:
        total = total + t
    return total


#: a forward pass in inference, the defaults of ``analyze``
_DEFAULT_SPEC = TraceSpec()


def trace(
    module: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    spec: TraceSpec = _DEFAULT_SPEC,
    *,
    listeners: Sequence[Listener] = (),
    on_phase: Callable[[str], None] | None = None,
    attach: Callable[[Recorder, Undo], None] | None = None,
    default_device: str = "meta",
    tree: ModuleWalk | None = None,
    every_step: bool = False,
    drive: Callable[[Any, list[torch.nn.Parameter]], None] | None = None,
) -> Trace:
    """Run the pass once under a :class:`Recorder` and return what it saw.

    An exception raised by the model is caught and returned in ``Trace.exception`` with the
    records made before it. ``spec`` says what runs (:class:`~meta_widget.options.TraceSpec`:
    a forward pass or a training step, the device whose attention kernel is accounted, autocast,
    micro-batches, the modules run under activation checkpointing, the op cache).
    ``listeners`` are called with each call's record as it completes; ``on_phase(name)`` is told
    when a training step enters ``backward`` and ``optimizer``.
    ``attach(recorder, undo)`` is called once the recorder is open, to add to it (a parallel
    trace watches collectives and storage resizes); ``undo`` takes the steps undoing that.
    ``default_device``: where tensors the model makes without a device land (``factories``;
    a parallel trace's fake tensors stand for CPU tensors: ``"cpu"``). ``tree``: ``module``'s
    walk (``meta_widget.data.walk``), if the caller made it already. ``every_step``: trace
    every decode step of ``mode="generate"`` (so does ``fast=False``), none given by the rule
    of ``meta_widget.trace.decode_skip`` (where it did not hold, the trace is made again so).
    ``drive(run, params)``: a training step's forward and backward passes run by the caller
    instead (a pipeline schedule, ``meta_widget.distributed.pipelining``), marking its phases
    with ``run.phase``, its forward passes inside ``run.forward_pass()``, and its gradients with
    ``run.mark_grads(params)``; the optimizer step follows as usual.

    Every change made to global or user state is undone before returning, on every path, and
    an interrupt (``KeyboardInterrupt``, raised to the caller) arriving at any point, cleanup
    included, leaves none behind: hooks, dispatch and function modes, grad mode, saved-tensor
    hooks, ``training`` flags, patched ``forward`` attributes, parameters' ``.grad`` and the
    cyclic garbage collector (see :mod:`meta_widget.undo`).

    Threads: traces of different models may run in parallel threads. A module (or a sub-module
    shared with another model) is traced by one thread at a time: a second trace of it while the
    first runs raises :class:`ConcurrentTraceError` at once, as its ``training`` flags and
    ``.grad`` cannot be changed for one thread only.
    """
    training, optimizer, device = spec.training, spec.optimizer, spec.device
    autocast = spec.autocast
    if training and optimizer is not None and optimizer not in OPTIMIZERS:
        raise ValueError(
            f"optimizer must be one of {sorted(OPTIMIZERS)} or None, not {optimizer!r}"
        )
    skipping = spec.fast and not every_step  # decode steps the per-step rule gives
    generation = Generation(spec, skipping=skipping) if spec.generating else None
    recorder = Recorder(
        module,
        listeners,
        [t for _, t in named_tensors((args, kwargs))],
        policy=Policy.of(spec.strict, spec.assume, spec.assume_nonzero)
        if generation is None
        else StopChecks.of_spec(spec, generation),
        tag_grad_nodes=training,
        fast=spec.fast,
        workspaces=WORKSPACES.get(device),
        tree=tree,
    )
    run = _Run(
        recorder,
        (lambda: Autocast(device, autocast)) if autocast is not None else None,
        default_device,
    )
    run.micro_batches = spec.micro_batches
    run.drive = drive
    run.set_to_none = spec.set_to_none
    run.foreach = foreach_for(device, spec.foreach)
    run.save_policy = spec.save_policy  # selective checkpointing: what it saves
    run.generation = generation
    checkpointed = spec.checkpointed(module) if training else []
    start = time.perf_counter()
    tree = recorder.walk
    params = [p for _, p in tree.parameters if p.requires_grad]
    run.param_names = {id(p): name for name, p in tree.parameters}

    def step(saved: _SavedTensorsHooks) -> None:
        run.step(module, args, kwargs, training, optimizer, spec.loss, params, on_phase, saved)

    undo = Undo()
    # Two nested finally blocks each begin with undo.run(): an interrupt that breaks off the
    # first (or lands before it) leaves the rest to the second. Their bodies hold only calls:
    # CPython leaves the entry of a nested ``try`` outside the enclosing handler.
    try:
        try:
            _claim(tree, undo)
            _keep_state(tree.modules, params, undo)
            run.exception = _setup_and_run(run, undo, training, checkpointed, device, step, attach)
        finally:
            undo.run()
    finally:
        undo.run()  # what an interrupt inside the first run left undone
    exception = run.exception
    run.output = run.opt = None  # freed after the trace: the timeline ends as a loop would
    stack, storage = recorder.callstack, recorder.storage
    if exception is not None and stack.error_call is None and stack.calls:
        stack.error_call = _deepest_unfinished(stack.calls)
    if generation is not None:  # the timeline marked: prefill, then each decode step
        run.phase_runs = list(generation.runs)
        run.phase_starts = {}
        for at, name in generation.runs:
            run.phase_starts.setdefault(name, at)
    redo = generation.redo(exception) if generation is not None else None
    if redo is not None:  # the per-step rule did not hold: every decode step traced
        again = trace(
            module, args, kwargs, spec, listeners=listeners, on_phase=on_phase, attach=attach,
            default_device=default_device, tree=tree, every_step=True,
        )  # fmt: skip
        again.notes.append(redo)
        return again
    return Trace(
        calls=stack.calls,
        events=storage.events,
        allocations=storage.allocations,
        orphan_flops=recorder.orphan_flops,
        orphan_ops=recorder.orphan_ops,
        exception=exception,
        failed_op=recorder.failed_op,
        error_call=stack.error_call,
        seconds=time.perf_counter() - start,
        assumptions=list(recorder.assumptions.recorded.values()),
        phase_starts=run.phase_starts,
        phase_runs=run.phase_runs,
        grad_keys=run.grad_keys,
        state_keys=run.state_keys,
        state_other_bytes=run.state_other,
        fast_path=recorder.cache.stats if recorder.cache is not None else None,
        notes=run.factories.notes() + run.saved_ops.notes(run.save_policy, len(run.step_starts)),
        orphan_costs=recorder.orphan_costs,
        kv_cache=generation.cache if generation is not None else None,
        stretches=generation.stretches if generation is not None else [],
        step_starts=run.step_starts,
    )


def _setup_and_run(
    run: _Run,
    undo: Undo,
    training: bool,
    checkpointed: Sequence[torch.nn.Module],
    device: str,
    step: Callable[[_SavedTensorsHooks], None],
    attach: Callable[[Recorder, Undo], None] | None = None,
) -> Exception | None:
    """Make the trace's changes (each undo step registered first) and run ``step``; return the
    exception the model raised, if any (interrupts go through)."""
    try:
        set_training(run.recorder.root, training)
        patch_forwards(
            checkpointed, run.autocast, undo, run.recorder.recomputation, run.save_policy,
            run.saved_ops,
        )  # fmt: skip
        if not training and device != "math":  # the fused inference kernels a device runs
            patch_fast_paths(run.recorder.walk.modules, device, undo)
        undo.add(FunctionModes().restore)
        if device != "math":  # routed by the factories' mode: one mode, not two
            run.factories.kernels = AttentionKernels(device)
            if not training and run.autocast is None and run.recorder.cache is not None:
                run.factories.kernels.tapes = Tapes(run.recorder)
        run.factories.enter(undo)  # device-less tensors of the model's code land on meta
        set_grad_enabled(training, undo)
        saved = _SavedTensorsHooks(undo)
        run.undo = undo
        run.recorder.open(undo)
        if attach is not None:
            attach(run.recorder, undo)
        pause_gc(undo)  # last: its undo runs first
        step(saved)
    except Exception as exc:
        interrupt = interrupt_behind(exc)
        if interrupt is not None:
            raise interrupt from None
        return exc
    return None


class _Run:
    """What the body of one trace produces, kept outside its frame so the trace can return it
    (and drop the outputs) after the cleanup."""

    def __init__(
        self,
        recorder: Recorder,
        autocast: Callable[[], Autocast] | None,
        default_device: str = "meta",
    ) -> None:
        self.recorder = recorder
        self.autocast = autocast
        self.micro_batches = 1
        self.phase_starts: dict[str, int] = {Phase.FORWARD: 0}
        self.phase_runs: list[tuple[int, str]] = [(0, Phase.FORWARD)]
        self.grad_keys: dict[int, list[tuple[str, int]]] = {}
        self.state_keys: dict[int, str] = {}
        self.param_names: dict[int, str] = {}  # id of each parameter -> its name
        self.state_other = 0
        self.exception: BaseException | None = None
        self.output: Any = None  # outlives the recorder: the timeline ends with the outputs
        self.opt: Any = None
        self.factories = DeviceLessFactories(default_device)
        self.generation: Generation | None = None  # mode="generate": its generate()
        self.foreach: bool | None = None  # the optimizer's implementation (``FOREACH``)
        self.save_policy: SavePolicy | None = None  # selective checkpointing: its policy,
        self.saved_ops = SavedOps()  # and what it decided
        self.set_to_none = True  # how ``zero_grad`` clears the gradients between steps
        self.step_starts: list[int] = [0]
        self.undo: Undo | None = None  # the trace's, for what the second step sets up again
        #: forward and backward passes run by the caller (see :func:`trace`'s ``drive``)
        self.drive: Callable[[Any, list[torch.nn.Parameter]], None] | None = None
        self._saved: _SavedTensorsHooks | None = None

    def step(
        self,
        module: torch.nn.Module,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        training: bool,
        optimizer: str | None,
        loss: Callable[[Any], torch.Tensor] | None,
        params: list[torch.nn.Parameter],
        on_phase: Callable[[str], None] | None,
        saved: _SavedTensorsHooks,
    ) -> None:
        """One forward pass; or two training steps (forward, loss, backward and optimizer step:
        a method each), the second after ``zero_grad``, its calls and costs set aside."""
        if not training:
            with self._autocast():
                if self.generation is not None:
                    self.output = self.generation.run(self.recorder, module, args, kwargs)
                else:
                    self.output = module(*args, **kwargs)
            return
        self._training_step(module, args, kwargs, optimizer, loss, params, on_phase, saved)
        self.output = None  # the step's output dies with it, as a loop's step function returns
        self.step_starts.append(len(self.recorder.storage.events))
        made = dict(self.factories.made)
        restore = self.recorder.set_aside()
        try:
            self._phase(Phase.FORWARD, None)
            if self.opt is not None:
                self.opt.zero_grad(set_to_none=self.set_to_none)
            else:
                module.zero_grad(set_to_none=self.set_to_none)
            assert self.undo is not None
            self.factories.enter(self.undo)  # left for the first step's optimizer
            self._training_step(module, args, kwargs, optimizer, loss, params, None, saved)
        finally:
            restore()
            self.factories.made = made

    def _training_step(
        self,
        module: torch.nn.Module,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        optimizer: str | None,
        loss: Callable[[Any], torch.Tensor] | None,
        params: list[torch.nn.Parameter],
        on_phase: Callable[[str], None] | None,
        saved: _SavedTensorsHooks,
    ) -> None:
        if self.drive is not None:  # a pipeline schedule: its own forwards and backwards
            self._saved = saved
            self.drive(self, params)
            self._saved = None
            self.recorder.callstack.sum_backward()
            return self._after_backward(optimizer, params, on_phase)
        for i in range(self.micro_batches):  # gradient accumulation: forward, backward, again
            if i:
                self._phase(Phase.FORWARD, None)  # listeners hear of backward and optimizer
            # the loss goes straight into backward: no frame here keeps it alive after backward
            self._backward(self._forward(module, args, kwargs, loss, saved), params, on_phase)
        self._after_backward(optimizer, params, on_phase)

    def _after_backward(
        self,
        optimizer: str | None,
        params: list[torch.nn.Parameter],
        on_phase: Callable[[str], None] | None,
    ) -> None:
        if optimizer is not None:
            self.factories.leave()  # the optimizer's device-less state stays on the host
            self._optimizer_step(optimizer, params, on_phase)

    # -- what a ``drive`` calls ----------------------------------------------------------------

    def phase(self, name: str) -> None:
        """Begin a run of phase ``name`` (``Phase.FORWARD``, ``Phase.BACKWARD``)."""
        self._phase(name, None)

    @contextmanager
    def forward_pass(self) -> Iterator[None]:
        """A forward pass of a drive, until the block ends: autograd's saved tensors marked,
        under the trace's autocast (as :meth:`_forward` runs one; without it a pipeline's
        forward ran in the parameters' dtype, and its checkpointed layers recomputed under
        autocast failed on the saved tensors' dtypes)."""
        assert self._saved is not None, "forward_pass() is for a drive"
        self._saved.push(_pack(self.recorder), _unpack)
        try:
            with self._autocast():
                yield
        finally:
            self._saved.restore()

    def mark_grads(self, params: list[torch.nn.Parameter]) -> None:
        """The gradients of ``params`` known for what they are (after the backward passes)."""
        storage = self.recorder.storage
        self.grad_keys = {}
        for p in params:
            if p.grad is not None:
                grad = local(p.grad)
                self.grad_keys.setdefault(storage_key(grad), []).append(
                    (self.param_names.get(id(p), ""), grad.numel() * grad.element_size())
                )
                storage.set_category(grad, MemoryCategory.GRADIENTS)  # also once freed

    def _forward(
        self,
        module: torch.nn.Module,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        loss: Callable[[Any], torch.Tensor] | None,
        saved: _SavedTensorsHooks,
    ) -> torch.Tensor:
        """The forward pass and the loss, with autograd's saved tensors marked."""
        saved.push(_pack(self.recorder), _unpack)
        try:
            with self._autocast():
                self.output = module(*args, **kwargs)
                value = (loss or default_loss)(self.output)
            return value / self.micro_batches if self.micro_batches > 1 else value
        finally:
            saved.restore()  # also run by the trace's undo, should an interrupt land here

    def _backward(
        self,
        value: torch.Tensor,
        params: list[torch.nn.Parameter],
        on_phase: Callable[[str], None] | None,
    ) -> None:
        self._phase(Phase.BACKWARD, on_phase)
        value.backward()
        del value
        self.recorder.callstack.sum_backward()
        self.mark_grads(params)

    def _optimizer_step(
        self,
        optimizer: str,
        params: list[torch.nn.Parameter],
        on_phase: Callable[[str], None] | None,
    ) -> None:
        self._phase(Phase.OPTIMIZER, on_phase)
        if self.opt is None:  # made once, as a loop makes it: the second step reuses its state
            self.opt = OPTIMIZERS[optimizer](params, self.foreach)
        with ShardLocalForeach():  # DTensors' multi-tensor ops in linear time (its docstring)
            self.opt.step()
        self.state_keys, self.state_other = {}, 0
        for p, state in self.opt.state.items():
            for v in state.values():
                if isinstance(v, torch.Tensor):
                    v = local(v)
                    if self.recorder.storage.tracks(v):
                        self.state_keys[storage_key(v)] = self.param_names.get(id(p), "")
                    else:
                        self.state_other += v.numel() * v.element_size()

    def _autocast(self) -> AbstractContextManager[Any]:
        return self.autocast() if self.autocast is not None else nullcontext()

    def _phase(self, name: str, on_phase: Callable[[str], None] | None) -> None:
        """Begin a run of phase ``name`` (a micro-batch's forward or backward, or the step)."""
        self.recorder.phase = name
        at = len(self.recorder.storage.events)
        self.phase_runs.append((at, name))  # every run: each micro-batch has its own
        self.phase_starts.setdefault(name, at)  # the first run of each phase
        if on_phase is not None:
            on_phase(name)


def _pack(recorder: Recorder) -> Callable[[torch.Tensor], torch.Tensor]:
    """The pack hook: mark ``t`` saved, and keep it detached. Kept as itself, a saved output
    would hold its own autograd node (``t.grad_fn``), the node holding it: a reference cycle,
    which keeps a branch dropped in the forward pass alive until the collector runs (it is
    paused while tracing), where a real run frees it at once, as autograd's own saved outputs
    hold no node."""

    def pack(t: torch.Tensor) -> torch.Tensor:
        recorder.storage.mark_saved(t)
        return detached(t)

    return pack


def _unpack(t: torch.Tensor) -> torch.Tensor:
    return t


def _deepest_unfinished(calls: list[CallRecord]) -> int | None:
    failed = [c for c in calls if c.error]
    return max(failed, key=lambda c: c.depth).index if failed else None
