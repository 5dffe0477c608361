"""The recorder: one pass on meta, one :class:`~meta_widget.data.records.CallRecord` per module
call.

It composes three parts, each with one job, the way PyTorch splits its trackers (``ModTracker``
beside ``FlopCounterMode`` and ``MemTracker``):

- :class:`~meta_widget.trace.callstack.CallStack`: module pre/post hooks, the running call, autograd
  nodes credited to calls for backward, recomputations under activation checkpointing;
- :class:`~meta_widget.trace.storage.StorageTracker`: every storage allocated and freed, the
  live-bytes timeline;
- :class:`~meta_widget.trace.assume.Assumptions`: the assumption policy at work.

One ``TorchDispatchMode`` hands every aten op to :meth:`Recorder.on_op`, a short pipeline over a
plan decided once per op (:mod:`meta_widget.trace.op_plans`): run it, follow assumptions, credit
its FLOPs and its cost (:mod:`meta_widget.trace.costs`: what a time model needs) to the call that
owns it, track the storage it returns. Records hold summaries (shapes, dtypes, strides, byte
counts, names), never tensors or modules.

Everything the recorder installs (hooks, the dispatch mode) is undone on exit, errors and
interrupts included (see :mod:`meta_widget.undo`). Hooks only record calls made by the thread
that opened the recorder.
"""

from __future__ import annotations

import threading
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.nn.modules import module as module_globals
from torch.nn.modules.module import register_module_forward_hook
from torch.utils._python_dispatch import TorchDispatchMode

from ..data.records import CallRecord
from ..data.walk import ModuleWalk, walk
from ..undo import DispatchModes, Undo
from .assume import Assumptions, Policy
from .callstack import CallStack, Listener
from .costs import Cost, OpCost, foreach_costs, op_cost
from .op_plans import PRIM_DEVICE, OpPlan, plan_op
from .opcache import DECOMPOSED, VIEW, OpCache
from .storage import StorageTracker
from .trace_changes import remove_module_hooks

__all__ = ["Listener", "Recorder"]

#: PyTorch's tables of global forward hooks (``register_module_forward_hook``)
_GLOBAL_FORWARD_HOOKS = module_globals._global_forward_hooks
_GLOBAL_ALWAYS_CALLED = module_globals._global_forward_hooks_always_called


class _OpMode(TorchDispatchMode):
    """The dispatch mode of a :class:`Recorder`: hands every aten op to it."""

    def __init__(self, recorder: Recorder) -> None:
        super().__init__()
        self.recorder = recorder

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # PyTorch wraps a mode's ``__torch_dispatch__`` in ``torch._dynamo.disable`` unless this
        # says no: 20 us per op, and a first import of ``torch._dynamo`` (a second) mid-trace.
        # Nothing here is ever compiled.
        return False

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        if func is PRIM_DEVICE and type(args[0]) is FakeTensor:
            # a fake tensor's ``.device`` (autograd asks it of every gradient): what the fake
            # mode below answers outside its kernels, without the trip through both modes
            return args[0].fake_device
        if func in self.recorder.to_subclass and any(t is not FakeTensor for t in types):
            return NotImplemented  # the subclass (DTensor) runs it: its own ops come back here
        return self.recorder.on_op(self, func, args, kwargs or {})


class Recorder:
    """Records every module call and aten op of ``module`` while active (a context manager).

    >>> with Recorder(model) as rec:
    ...     model(*args)
    >>> rec.callstack.calls  # one CallRecord per module call, in start order

    As a context manager it is as safe as ``with`` lets it be (an interrupt landing as
    ``__exit__`` starts escapes it); ``passes.trace`` calls :meth:`open` with its :class:`Undo`
    instead, which nothing can break off. Calls from other threads are not recorded.
    """

    def __init__(
        self,
        module: torch.nn.Module,
        listeners: Sequence[Listener] = (),
        existing: Sequence[torch.Tensor] = (),
        policy: Policy | None = None,
        tag_grad_nodes: bool = False,
        fast: bool = True,
        workspaces: Mapping[Any, Callable[..., int]] | None = None,
        tree: ModuleWalk | None = None,
    ) -> None:
        self.root = module
        #: the module tree as it is when the recorder is made (hooks go on these modules;
        #: ``tree``, if the caller walked it already)
        self.walk = tree if tree is not None else walk(module)
        self.workspaces = workspaces or {}
        # storage that existed before the trace (parameters, buffers, inputs) is never new
        self.storage = StorageTracker(
            [
                *(p for _, p in self.walk.parameters),
                *(b for _, b in self.walk.buffers),
                *existing,
            ],
            self._free_owner,
        )
        tainted: set[int] = set()
        self.callstack = CallStack(self.walk, self.storage, tainted, listeners, tag_grad_nodes)
        self.assumptions = Assumptions(policy, self.callstack.stack, tainted, self.callstack.owner)
        self.storage.on_free = self._forget
        self.orphan_flops = 0
        self.orphan_ops: dict[str, int] = {}
        #: the costs of ops outside any call, by phase (the loss, the optimizer step)
        self.orphan_costs: dict[str, dict[Cost, int]] = {}
        self.failed_op: str | None = None
        #: the cache of DTensor calls (``meta_widget.distributed.dtensor_cache``) a parallel
        #: trace sets, with its ``wants``, ``key``, ``lookup`` and ``fill``; None: none
        self.dtensors: Any = None
        #: ops a tensor subclass's own dispatch runs, not this recorder, when one of the
        #: arguments is of the subclass: each op it runs inside is recorded as it happens
        #: (context parallelism's ring attention, ``distributed.context``)
        self.to_subclass: frozenset[Any] = frozenset()
        self._plans: dict[Any, OpPlan] = {}
        #: the op cache (``fast``), or None: every kernel runs
        self.cache = OpCache() if fast else None
        #: told of every op after it ran (``observer(func, args, out, owner)``), and FLOPs
        #: counted on the local tensors of tensor subclasses (DTensor): a parallel trace sets
        #: both before the first op (``meta_widget.distributed.parallel``)
        self.observer: Callable[[Any, tuple[Any, ...], Any, CallRecord | None], None] | None = None
        self.local_flops = False
        #: kernels this trace runs instead of some ops (a parallel trace's, ``comms.py``)
        self.kernels: dict[Any, Callable[..., Any]] = {}
        #: > 0 while activation checkpointing recomputes a forward inside backward
        self.recomputing = 0
        #: called by :meth:`set_aside`, each returning the function that puts back what it set
        #: aside (a parallel trace's collectives, ``meta_widget.distributed.comms``)
        self.asides: list[Callable[[], Callable[[], None]]] = []
        self._mode: _OpMode | None = None  # made by open(), dropped by close()
        self._modes: DispatchModes | None = None  # saved by open(), restored by close()
        self._undo = Undo()

    def set_aside(self) -> Callable[[], None]:
        """Count nothing from now on where the trace's results are read: calls
        (:meth:`CallStack.set_aside`), FLOPs and costs outside calls, and what each function of
        ``asides`` sets aside (a parallel trace's collectives); storage events go on. Returns
        the function that puts it all back (a training trace's second step, ``passes``)."""
        kept = (self.orphan_flops, self.orphan_ops, self.orphan_costs)
        self.orphan_flops, self.orphan_ops, self.orphan_costs = 0, {}, {}
        restores = [self.callstack.set_aside(), *(aside() for aside in self.asides)]

        def restore() -> None:
            self.orphan_flops, self.orphan_ops, self.orphan_costs = kept
            for each in restores:
                each()

        return restore

    @property
    def phase(self) -> str:
        """``forward``, ``backward`` or ``optimizer``: what the events and calls are part of."""
        return self.callstack.phase

    @phase.setter
    def phase(self, name: str) -> None:
        self.callstack.phase = self.storage.phase = name

    @contextmanager
    def recomputation(self) -> Iterator[None]:
        """Around a recomputation of activation checkpointing (``trace.checkpointing`` enters
        it): the FLOPs counted meanwhile are also the owners' ``recompute_self_flops``."""
        self.recomputing += 1
        try:
            yield
        finally:
            self.recomputing -= 1

    # -- installing and removing ----------------------------------------------------------------

    def open(self, undo: Undo) -> None:
        """Install the hooks and the dispatch mode; ``undo`` first gets the step removing them.

        Calls are recorded from the calling thread only: hooks ignore calls from other threads
        (dispatch modes are per thread already).
        """
        self.callstack.thread = threading.get_ident()
        self._mode = _OpMode(self)
        self._modes = DispatchModes()
        undo.add(self.close)
        self.storage.active = True
        hooks = self.callstack
        for m in self.walk.modules:
            m.register_forward_pre_hook(hooks.pre, with_kwargs=True)
            if m._forward_hooks:  # ours runs after the module's own (FSDP2's, the user's)
                hooks.own_hooks.add(id(m))
                m.register_forward_hook(hooks.post, always_call=True)
        register_module_forward_hook(hooks.post_global, always_call=True)
        self._mode.__enter__()

    def close(self) -> None:
        """Remove what :meth:`open` installed, however far it got. Idempotent.

        Then nothing refers back to the recorder (its dispatch mode, the storage tracker's
        callbacks and a parallel trace's observer did): it is no reference cycle, and is freed,
        with its walk of the modules and its events, as soon as its trace drops it, not at the
        collector's next pass.
        """
        self.storage.active = False
        if self._modes is not None and self._mode is not None:
            self._modes.restore(self._mode)
        self._remove_hooks()
        self._mode = self.observer = None
        self.storage.detach()

    def __enter__(self) -> Recorder:
        undo = self._undo = Undo()
        try:
            self.open(undo)
        except BaseException:
            try:
                undo.run()
            finally:
                undo.run()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self._undo.run()
        finally:
            self._undo.run()

    def _remove_hooks(self) -> None:
        """Remove this recorder's hooks from every module and the global one: found by owner,
        not by handle, so a hook whose handle was never kept (an interrupt inside
        ``register_*``) goes too; the hook tables it leaves empty give their memory back."""
        mine = [k for k, h in _GLOBAL_FORWARD_HOOKS.items() if self._owns(h)]
        for k in mine:
            _GLOBAL_ALWAYS_CALLED.pop(k, None)
            _GLOBAL_FORWARD_HOOKS.pop(k, None)
        remove_module_hooks(self.walk.modules, self._owns)

    def _owns(self, hook: Any) -> bool:
        return type(hook) is types.MethodType and hook.__self__ is self.callstack

    # -- one aten op ----------------------------------------------------------------------------

    def on_op(self, mode: _OpMode, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run one aten op (or rebuild its outputs from the op cache); credit its FLOPs and new
        storage to the call that owns it."""
        plan = self._plans.get(func)
        if plan is None:
            plan = self._plans[func] = self._plan(func, args, kwargs)
        cache = self.cache
        if plan.decompose:
            with mode:
                out = func.decompose(*args, **kwargs)
            if out is not NotImplemented:
                if cache is not None:
                    cache.stats.bypass(DECOMPOSED)
                return out
        workspace = self._workspace(plan, args, kwargs) if plan.workspace is not None else None
        key, hit, dtensors = self._lookup(plan, func, args, kwargs)
        if hit is not None:
            out, n, cost = hit
        else:
            out = self._run(plan, args, kwargs)
            n = plan.flops(*args, **kwargs, out_val=out) if plan.flops is not None else 0
            cost = self._measure(plan, args, kwargs, out, n)
            if key is not None:
                if dtensors is not None:
                    dtensors.fill(key, args, kwargs, out, n, cost)
                else:
                    cache.fill(key, args, out, n, cost, plan.uncached is VIEW)  # type: ignore[union-attr]
        assumptions = self.assumptions
        if assumptions.tainted or assumptions.known:  # most traces assume nothing: skip the call
            assumptions.follow(func, args, out)
        stack = self.callstack.stack
        if stack and stack[-1].index >= 0:  # the common case, kept inline: a forward call
            owner: CallRecord | None = stack[-1]
            backward = False
            flows = owner.flows  # type: ignore[union-attr]
        else:
            owner, backward = self.callstack.owner()
            flows = None
        self._count(plan, n, owner, backward)  # returns at once for 0
        if cost is not None:
            self._cost(cost, plan.foreach, owner, backward)
        self.storage.track_output(out, plan.name, owner, backward)
        if flows is not None:  # a forward call whose body the graph follows
            self._flow(plan, args, kwargs, out, owner)  # type: ignore[arg-type]
        del workspace  # freed after the output is made, as inside the kernel
        if self.observer is not None:
            self.observer(func, args, out, owner)
        return out

    def _lookup(
        self, plan: OpPlan, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[Any, tuple[Any, int, Any] | None, Any]:
        """The call's cache key (None: not cached), its outputs, FLOPs and cost if cached (else
        None), and the DTensor cache that keyed it (None: the op cache did)."""
        dtensors = self.dtensors
        if dtensors is not None and args and dtensors.wants(args[0]):
            key = dtensors.key(func, plan.run, plan.flops, plan.uncached, args, kwargs)
            return key, (dtensors.lookup(key, args) if key is not None else None), dtensors
        cache = self.cache
        if cache is None:
            return None, None, None
        key = cache.key(func, plan.run, plan.flops, args, kwargs, plan.uncached)
        if key is None:
            return None, None, None
        hit = cache.lookup(key)
        return key, (None if hit is None else (hit[0](args), hit[1], hit[2])), None

    def _flow(
        self,
        plan: OpPlan,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        out: Any,
        owner: CallRecord,
    ) -> None:
        """:meth:`note_flow` for an op that computes (views and metadata ops keep the storage:
        the graph follows them by it)."""
        if not plan.free:
            self.note_flow(plan.name, args, kwargs, out, owner)

    def note_flow(
        self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, owner: CallRecord
    ) -> None:
        """Note in ``owner.flows`` an op of its own body that made new tensors: which tensors
        (``StorageTracker.ident``) it read and made, for the graph (``Analysis.graph``)."""
        ident = self.storage.ident
        if isinstance(out, torch.Tensor):
            made: tuple[int, ...] = (ident(out),)
        elif isinstance(out, (tuple, list)):
            made = tuple(ident(o) for o in out if isinstance(o, torch.Tensor))
            if not made:
                return
        else:
            return
        owner.flows.append(  # type: ignore[union-attr]
            (len(self.callstack.calls), name, self.read_ids(args, kwargs), made)
        )

    def read_ids(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int, ...]:
        """The ids (``StorageTracker.ident``) of an op's tensor arguments, lists of them too."""
        ident = self.storage.ident
        read: list[int] = []
        for a in (*args, *kwargs.values()):
            if isinstance(a, torch.Tensor):
                read.append(ident(a))
            elif isinstance(a, (tuple, list)):
                read.extend(ident(x) for x in a if isinstance(x, torch.Tensor))
        return tuple(read)

    def _run(self, plan: OpPlan, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        try:
            return plan.run(*args, **kwargs)
        except Exception:
            if self.failed_op is None:
                self.failed_op = plan.name
            raise

    def _workspace(
        self, plan: OpPlan, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> torch.Tensor | None:
        """The scratch memory ``plan``'s kernel allocates on the target device (cuBLAS copies of
        operands it cannot stride through, ``_safe_softmax``'s masks), as one tracked meta
        tensor that lives until the op's output exists; None for none."""
        assert plan.workspace is not None
        n = plan.workspace(*args, **kwargs)
        if not n:
            return None
        with torch._C.DisableTorchFunction(), torch._C._DisableTorchDispatch():
            scratch = torch.empty((n,), dtype=torch.uint8, device="meta")  # past every mode
        owner, backward = self.callstack.owner()
        self.storage.track(scratch, f"{plan.name} (workspace)", owner, backward)
        return scratch

    def _plan(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> OpPlan:
        answer = self.assumptions.answer if self.assumptions.policy is not None else None
        return plan_op(func, args, kwargs, answer, self.kernels, self.workspaces, self.local_flops)

    def _count(self, plan: OpPlan, n: int, owner: CallRecord | None, backward: bool) -> None:
        """Credit ``n`` FLOPs of ``plan``'s op to ``owner`` (its backward, or ops outside calls)."""
        if not n:
            return
        name = plan.name
        if backward:
            assert owner is not None
            owner.backward_self_flops += n
            owner.backward_ops[name] = owner.backward_ops.get(name, 0) + n
            if self.recomputing:
                owner.recompute_self_flops += n
        elif owner is not None:
            owner.flops += n
            owner.self_flops += n
            owner.ops[name] = owner.ops.get(name, 0) + n
        else:
            self.orphan_flops += n
            self.orphan_ops[name] = self.orphan_ops.get(name, 0) + n

    def _measure(
        self, plan: OpPlan, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, n: int
    ) -> OpCost | None:
        """The cost of one op that ran (``meta_widget.trace.costs``), None for a free one."""
        if plan.free:
            return None
        if plan.foreach:
            return foreach_costs(args, kwargs, out, self.local_flops)
        return op_cost(
            args,
            kwargs,
            out,
            n,
            plan.causal,
            plan.convolution,
            self.local_flops,
            plan.gather,
            plan.shape,
        )

    def _cost(self, cost: OpCost, many: bool, owner: CallRecord | None, backward: bool) -> None:
        """Credit one op of ``cost`` (``many``: a cost per tensor of a multi-tensor op) to
        ``owner``'s backward, or to the ops outside calls of the running phase."""
        if owner is not None and not backward:  # the common case first
            table = owner.costs
        elif backward:
            assert owner is not None
            table = owner.backward_costs
        else:
            table = self.orphan_costs.setdefault(str(self.callstack.phase), {})
        if not many:  # the hot path: one cost
            table[cost] = table.get(cost, 0) + 1  # type: ignore[index,arg-type]
            return
        for each in cost:
            table[each] = table.get(each, 0) + 1  # type: ignore[index,arg-type]

    def _forget(self, key: int) -> None:
        """A storage died: what the assumptions knew of it (an assumed shape, known values)
        must not pass to the next storage given its key (the allocator reuses addresses)."""
        assumptions = self.assumptions
        if assumptions.known:
            assumptions.known.pop(key, None)
        assumptions.tainted.discard(key)

    def _free_owner(self) -> CallRecord | None:
        return self.callstack.owner()[0]
