"""The hook-based recorder: one forward pass on meta, one :class:`CallRecord` per module call.

Module pre/post hooks keep the call stack; one ``TorchDispatchMode`` sees every aten op and
credits its FLOPs and the storage it allocates to the innermost module call running. Records hold
summaries (shapes, dtypes, strides, byte counts, names), never tensors or modules.

Everything the recorder installs (hooks, the dispatch mode) is undone on exit, errors and
interrupts included: :class:`Undo` holds the undo steps of every change a trace makes, each
registered before its change and safe to run twice, and runs them all whatever is raised meanwhile
(``KeyboardInterrupt`` included). Hooks only record calls made by the thread that opened the
recorder.
"""

from __future__ import annotations

import _thread
import os
import sys
import threading
import time
import types
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NamedTuple

import torch
import torch.utils._python_dispatch as _python_dispatch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

from .assume import (
    DATA_DEPENDENT,
    META_FIXES,
    SCALAR_OPS,
    Assumption,
    MetaValueNeeded,
    Policy,
    caller_site,
    grid_value,
    has_mask,
    index_upper_bound,
    masked_select_upper_bound,
    nonzero_upper_bound,
)
from .flatten import TensorInfo, describe_inputs, named_tensors
from .kernels import EXTRA_FLOPS

_COMPOSITE = torch._C.DispatchKey.CompositeImplicitAutograd
#: FLOP formulas by overload packet: FlopCounterMode's registry, plus kernels it lacks
_FLOPS = {**flop_registry, **EXTRA_FLOPS}
# how an op runs: as is, under the assumption policy, or through a fixed meta kernel
_RUN, _ASSUME, _FIX = "run", "assume", "fix"
_PRIM_DEVICE = torch.ops.prim.device.default
#: the key of an autograd node's metadata that holds the index of the call that created it
_NODE_CALL = "meta_widget.call"
_NO_SEQUENCE = 2**63  # AccumulateGrad nodes (parameters' leaves) carry the largest number


@dataclass(slots=True)
class CallRecord:
    """One call of one module.

    ``flops`` counts the FLOPs of every aten op run during the call (sub-calls included), as
    ``torch.utils.flop_counter.FlopCounterMode`` counts them; ``self_flops`` and ``ops`` only the
    ops run in the module's own body, outside any sub-module call. ``alloc_bytes`` is the storage
    newly allocated by the call's own body; ``activation_bytes`` the bytes of new storage (allocated
    during this call) that its outputs hold: views and returned inputs allocate nothing.

    In a training step, ``backward_flops`` counts the FLOPs of the backward of everything this
    call computed (sub-calls included; ``backward_self_flops`` its own body only): each autograd
    node is credited to the innermost call that created it (see ``Recorder.tag_grad_nodes``).
    Under activation checkpointing, the forward that backward runs again is part of it too: a
    module called again inside backward is no new call, its work is the backward's of the
    forward call it repeats (``recompute_of``, on the stack only).
    """

    index: int
    path: str
    type: str
    module: int
    parent: int
    depth: int
    inputs: list[tuple[str, TensorInfo]]
    outputs: list[tuple[str, TensorInfo]] = field(default_factory=list)
    flops: int = 0
    self_flops: int = 0
    ops: dict[str, int] = field(default_factory=dict)
    alloc_bytes: int = 0
    activation_bytes: int = 0
    start_event: int = 0
    end_event: int = 0
    duration_s: float = 0.0
    error: bool = False
    phase: str = "forward"
    #: an assumption was taken during this call, or its outputs derive from an assumed shape
    assumed: bool = False
    backward_flops: int = 0
    backward_self_flops: int = 0
    #: the backward's FLOPs by aten op, own body only (like ``ops``)
    backward_ops: dict[str, int] = field(default_factory=dict)
    #: the autograd sequence number when the call started: nodes it created have one as high
    grad_seq: int = 0
    #: a module called inside backward (activation checkpointing recomputing it) is on the stack
    #: with index -1 and the forward call it repeats here (-1: none, e.g. never called forward)
    recompute_of: int = -1


class Event(NamedTuple):
    """One allocation (``nbytes`` > 0) or free (``nbytes`` < 0) of storage during the trace."""

    nbytes: int
    live_bytes: int
    call: int
    op: str
    phase: str


@dataclass(slots=True)
class Allocation:
    """One storage allocated during the trace: when (event indices), by whom, and its fate.

    ``freed`` is the index of its free event, or -1 when it was still alive at the end; ``saved``
    says autograd saved it for the backward pass.
    """

    key: int
    nbytes: int
    event: int
    call: int
    phase: str
    freed: int = -1
    saved: bool = False


# ---------------------------------------------------------------------------------------------
# undoing changes, whatever interrupts it


class Undo:
    """The undo steps of the changes a trace makes to global or user state.

    Each change registers its step *before* it is made (a step must then also be right when its
    change never happened), and every step is idempotent: it restores a saved state rather than
    reversing an action, so running it again is harmless. :meth:`run` runs the steps, the last
    added first, and removes each only once it has run: an interrupt that lands inside ``run``
    leaves the steps not yet done in place for a second ``run``. Callers therefore run it twice,
    from two nested ``finally`` blocks, each starting with the call (see ``passes.trace``)::

        undo = Undo()
        try:
            try:
                ...  # undo.add(step) before each change, then the change
            finally:
                undo.run()
        finally:
            undo.run()  # the rest, if an interrupt broke the first run off
    """

    def __init__(self) -> None:
        self.steps: list[Callable[[], object]] = []

    def add(self, step: Callable[[], object]) -> None:
        """Register ``step``; make the change it undoes after this returns."""
        self.steps.append(step)

    def run(self) -> None:
        """Run every step, the last added first. Whatever a step raises (``KeyboardInterrupt``
        included) waits until every other step has run; then the first is raised.

        A step that fails with an ``Exception`` is not tried again; one that is interrupted is
        (the interrupt may have come before it even started), up to :attr:`RETRIES` times.
        """
        steps = self.steps
        first: BaseException | None = None
        interrupts = 0
        while steps:
            try:
                steps[-1]()
            except Exception as exc:  # a failing step must not stop the others
                if first is None:
                    first = exc
            except BaseException as exc:  # an interrupt: the same step again
                if first is None:
                    first = exc
                interrupts += 1
                if interrupts <= self.RETRIES:
                    continue
            steps.pop()
        if first is not None:
            raise first

    #: how many interrupts one run of the steps absorbs (retrying the interrupted step)
    RETRIES = 10


class DispatchModes:
    """The dispatch-mode state of this thread, saved to be restored exactly (see :meth:`restore`).

    Besides its stack, ``TorchDispatchMode.__enter__`` sets three module flags of
    ``torch.utils._python_dispatch`` (and one in C): ``__exit__`` pops them back, which is not
    safe to run twice nor to break off halfway, so the saved values are written back instead.
    """

    _FLAGS = (
        "_is_in_torch_dispatch_mode",
        "_is_in_non_infra_torch_dispatch_mode",
        "_is_in_any_mode_without_ignore_compile_internals",
    )

    def __init__(self) -> None:
        self.depth = torch._C._len_torch_dispatch_stack()
        self.flags = tuple(getattr(_python_dispatch, name) for name in self._FLAGS)

    def restore(self, mode: TorchDispatchMode) -> None:
        """Pop every mode pushed since (``mode`` and any left by an interrupted body), and put
        the flags back. Idempotent."""
        while torch._C._len_torch_dispatch_stack() > self.depth:
            torch._C._pop_torch_dispatch_stack(None)
        for name, value in zip(self._FLAGS, self.flags, strict=True):
            setattr(_python_dispatch, name, value)
        _python_dispatch.set_is_in_mode_without_ignore_compile_internals(self.flags[2])
        for stack in ("old_dispatch_mode_flags", "old_non_infra_dispatch_mode_flags"):
            getattr(mode, stack, []).clear()
        getattr(mode, "old_without_ignore_compile_internals_dispatch_mode_flags", []).clear()


class FunctionModes:
    """This thread's ``TorchFunctionMode`` stack, saved to be restored exactly.

    Restoring empties the stack and pushes the saved modes back, so it is idempotent and also
    repairs a stack an interrupted ``torch.device(...)`` context left reordered.
    """

    def __init__(self) -> None:
        self.modes = _function_stack()

    def restore(self) -> None:
        """Put the saved stack back (nothing to do when it is already there). Idempotent."""
        if [id(m) for m in _function_stack()] == [id(m) for m in self.modes]:
            return
        while torch._C._len_torch_function_stack():
            torch._C._pop_torch_function_stack()
        for mode in self.modes:
            torch._C._push_on_torch_function_stack(mode)


def _function_stack() -> list[Any]:
    return [torch._C._get_function_stack_at(i) for i in range(torch._C._len_torch_function_stack())]


# ---------------------------------------------------------------------------------------------
# the recorder


Listener = Callable[[CallRecord], None]


class _OpMode(TorchDispatchMode):
    """The dispatch mode of a :class:`Recorder`: hands every aten op to it."""

    def __init__(self, recorder: Recorder) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        return self.recorder.on_op(self, func, args, kwargs or {})


class Recorder:
    """Records every module call and aten op of ``module`` while active (a context manager).

    >>> with Recorder(model) as rec:
    ...     model(*args)
    >>> rec.calls  # one CallRecord per module call, in start order

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
    ) -> None:
        self.root = module
        self.policy = policy
        #: credit autograd nodes to the calls that create them, for the backward pass
        self.tag_grad_nodes = tag_grad_nodes
        self.assumptions: dict[tuple[Any, ...], Assumption] = {}
        self._tainted: set[int] = set()  # storages whose shape came from an assumption
        # values known despite meta: storage -> mask shape of an upper-bound nonzero (its
        # values are the index grid), or a Python number for a 0-dim result computed from them
        self._known: dict[int, Any] = {}
        self._mode = _OpMode(self)
        self.listeners = list(listeners)
        self.calls: list[CallRecord] = []
        self.events: list[Event] = []
        self.live_bytes = 0
        self.orphan_flops = 0
        self.orphan_ops: dict[str, int] = {}
        self.failed_op: str | None = None
        self.error_call: int | None = None
        self._stack: list[CallRecord] = []
        self._stack_ids: list[int] = []
        self.allocations: list[Allocation] = []
        self.phase = "forward"
        # storage key -> (its Allocation, the weak reference that reports its free)
        self._live: dict[int, tuple[Allocation, weakref.ref[Any]]] = {}
        # storage that existed before the trace (parameters, buffers, inputs): never "new"
        self._existing = {
            t.untyped_storage()._cdata
            for t in [*module.parameters(), *module.buffers(), *existing]
            if t.is_meta
        }
        self._active = False
        self._thread = threading.get_ident()
        self._modes: DispatchModes | None = None  # saved by open(), restored by close()
        self._undo = Undo()
        self._op_names: dict[Any, str] = {}
        # per aten op: (decompose it?, how to run it, its FLOP formula, its name)
        self._ops: dict[Any, tuple[bool, str, Any, str]] = {}
        rows: dict[int, int] = {}
        for i, m in enumerate(module.modules()):
            rows[id(m)] = i
        self._rows = rows
        # activation checkpointing: forward calls by module row, and recomputations seen so far
        self._forward_calls: dict[int, list[int]] = {}
        self._recomputed: dict[int, int] = {}
        paths: dict[int, list[str]] = {}
        for name, m in module.named_modules(remove_duplicate=False):
            paths.setdefault(id(m), []).append(name)
        self._paths = paths
        self._types = {id(m): type(m).__name__ for m in module.modules()}

    # -- context manager ----------------------------------------------------------------------

    def open(self, undo: Undo) -> None:
        """Install the hooks and the dispatch mode; ``undo`` first gets the step removing them.

        Calls are recorded from the calling thread only: hooks ignore calls from other threads
        (dispatch modes are per thread already).
        """
        self._thread = threading.get_ident()
        self._modes = DispatchModes()
        undo.add(self.close)
        self._active = True
        for m in self.root.modules():
            m.register_forward_pre_hook(self._pre, with_kwargs=True)
            m.register_forward_hook(self._post, with_kwargs=True, always_call=True)
        self._mode.__enter__()

    def close(self) -> None:
        """Remove what :meth:`open` installed, however far it got. Idempotent."""
        self._active = False
        if self._modes is not None:
            self._modes.restore(self._mode)
        self._remove_hooks()

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
        """Remove this recorder's hooks from every module: found by owner, not by handle, so a
        hook whose handle was never kept (an interrupt inside ``register_*``) goes too."""
        for m in self.root.modules():
            for hooks, extras in (
                (m._forward_pre_hooks, (m._forward_pre_hooks_with_kwargs,)),
                (m._forward_hooks, (m._forward_hooks_with_kwargs, m._forward_hooks_always_called)),
            ):
                mine = [
                    k
                    for k, h in hooks.items()
                    if type(h) is types.MethodType and h.__self__ is self
                ]
                for k in mine:
                    for extra in extras:
                        extra.pop(k, None)
                    hooks.pop(k, None)

    # -- module hooks -------------------------------------------------------------------------

    def _path_for(self, mod: torch.nn.Module) -> str:
        candidates = self._paths.get(id(mod))
        if not candidates:
            return type(mod).__name__
        if len(candidates) > 1 and self._stack:
            parent = self._stack[-1].path
            for p in candidates:
                if not parent or p.startswith(parent + "."):
                    return p
        return candidates[0]

    def _pre(self, mod: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if threading.get_ident() != self._thread:
            return  # another thread running the same module: not this trace's call
        stack = self._stack
        if self.phase == "backward":
            stack.append(self._recomputation(mod))
            self._stack_ids.append(id(mod))
            return
        rec = CallRecord(
            index=len(self.calls),
            path=self._path_for(mod),
            type=self._types.get(id(mod)) or type(mod).__name__,
            module=self._rows.get(id(mod), -1),
            parent=stack[-1].index if stack else -1,
            depth=len(stack),
            inputs=describe_inputs(args, kwargs, caches=not stack),
            start_event=len(self.events),
            phase=self.phase,
        )
        if self.tag_grad_nodes:
            rec.grad_seq = _sequence_nr()
        rec.duration_s = time.perf_counter()
        self.calls.append(rec)
        stack.append(rec)
        self._stack_ids.append(id(mod))

    def _post(
        self, mod: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
    ) -> None:
        if threading.get_ident() != self._thread:
            return
        stack, ids = self._stack, self._stack_ids
        if not ids or id(mod) not in ids:
            return  # a call we did not see start (e.g. hooks added mid-call)
        while ids[-1] != id(mod):  # unwind calls whose post hook never ran
            ids.pop()
            stack.pop().error = True
        ids.pop()
        rec = stack.pop()
        if rec.index < 0:
            return  # a recomputation inside backward: not a call of its own
        rec.duration_s = time.perf_counter() - rec.duration_s
        rec.end_event = len(self.events)
        if output is None and sys.exc_info()[1] is not None:
            rec.error = True
            if self.error_call is None:
                self.error_call = rec.index
        else:
            named = (
                [("output", output)]
                if isinstance(output, torch.Tensor)
                else list(named_tensors(output, caches=not stack))
            )
            rec.outputs = [(name, TensorInfo.of(t)) for name, t in named]
            keys = {t.untyped_storage()._cdata for _, t in named if t.is_meta}
            rec.activation_bytes = self._new_bytes(keys, rec.start_event)
            if self._tainted and not keys.isdisjoint(self._tainted):
                rec.assumed = True
            if self.tag_grad_nodes and rec.phase == "forward":
                self._tag_nodes([t.grad_fn for _, t in named], rec)
        if stack:
            stack[-1].flops += rec.flops
        for listener in self.listeners:
            listener(rec)

    def _recomputation(self, mod: torch.nn.Module) -> CallRecord:
        """A module called again inside backward: activation checkpointing recomputing its forward.

        The stack record points at the forward call it repeats (the k-th recomputation of a
        module, at its k-th forward call), whose backward then holds the work.
        """
        row = self._rows.get(id(mod), -1)
        forward = self._forward_calls.get(row)
        if forward is None:
            forward = self._forward_calls[row] = [
                c.index for c in self.calls if c.module == row and c.phase == "forward"
            ]
        k = self._recomputed.get(row, 0)
        self._recomputed[row] = k + 1
        target = forward[k % len(forward)] if forward else -1
        return CallRecord(
            index=-1,
            path=self._path_for(mod),
            type=type(mod).__name__,
            module=row,
            parent=-1,
            depth=len(self._stack),
            inputs=[],
            phase="backward",
            recompute_of=target,
        )

    def _owner(self) -> tuple[CallRecord | None, bool]:
        """The call an op (or a free) belongs to now, and whether as part of its backward.

        The innermost call running; inside backward, the call that created the autograd node
        running, or the forward call a recomputation repeats.
        """
        if self._stack:
            top = self._stack[-1]
            if top.index >= 0:
                return top, False
            if top.recompute_of >= 0:
                return self.calls[top.recompute_of], True
        if self.phase == "backward":
            owner = self._backward_owner()
            return owner, owner is not None
        return None, False

    def _tag_nodes(self, roots: list[Any], rec: CallRecord) -> None:
        """Credit to ``rec`` the autograd nodes behind its outputs that it created.

        Walking back from the outputs, a node made before the call started (a lower sequence
        number) ends the walk; nodes already credited (to sub-calls, whose post hooks ran first)
        keep their call, and the walk goes on behind them, to this call's own earlier nodes.
        """
        index, start = rec.index, rec.grad_seq
        todo = [n for n in roots if n is not None]
        seen: set[Any] = set()
        while todo:
            node = todo.pop()
            if node in seen:
                continue
            seen.add(node)
            seq = node._sequence_nr()
            if seq < start or seq >= _NO_SEQUENCE:
                continue
            meta = node.metadata
            if _NODE_CALL not in meta:
                meta[_NODE_CALL] = index
            todo.extend(n for n, _ in node.next_functions if n is not None)

    def _backward_owner(self) -> CallRecord | None:
        """In the backward pass, the call that created the autograd node running now."""
        node: Any = _current_node()  # its stub types `metadata` as a method; it is a dict
        if node is None:
            return None
        index = node.metadata.get(_NODE_CALL)
        return None if index is None else self.calls[index]

    def sum_backward(self) -> None:
        """Add each call's backward FLOPs to the calls enclosing it (after the backward pass)."""
        calls = self.calls
        for rec in reversed(calls):  # a sub-call starts after its parent: children come first
            rec.backward_flops += rec.backward_self_flops
            if rec.parent >= 0:
                calls[rec.parent].backward_flops += rec.backward_flops

    def _new_bytes(self, keys: set[int], start: int) -> int:
        """Bytes of the storages ``keys`` that were allocated since event ``start``."""
        total = 0
        for key in keys:
            entry = self._live.get(key)
            if entry is not None and entry[0].event >= start:
                total += entry[0].nbytes
        return total

    # -- the dispatch mode --------------------------------------------------------------------

    def on_op(self, mode: _OpMode, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run one aten op; credit its FLOPs and new storage to the innermost module call."""
        # FlopCounterMode decomposes composite ops to count the matmuls inside; so do we, but only
        # where the decomposition holds counted ops: elsewhere (silu_backward...) the fused
        # kernel runs, as on a real device, without the decomposition's temporaries.
        info = self._ops.get(func)
        if info is None:  # what to do with this op, decided once per op
            info = self._ops[func] = (
                _decomposition_counts(func, args, kwargs),
                _ASSUME
                if func in DATA_DEPENDENT and self.policy is not None
                else _FIX
                if func in META_FIXES
                else _RUN,
                _FLOPS.get(func._overloadpacket),
                self._op_name(func),
            )
        decomposable, how, count, name = info
        if decomposable:
            with mode:
                r = func.decompose(*args, **kwargs)
            if r is not NotImplemented:
                return r
        try:
            if how is _RUN:
                out = func(*args, **kwargs)
            elif how is _ASSUME:
                out = self._assume(func, args, kwargs)
            else:
                out = META_FIXES[func](*args, **kwargs)
        except Exception:
            if self.failed_op is None:
                self.failed_op = name
            raise
        if self._tainted and _any_in(args, self._tainted):
            self._taint(out)
        if self._known and func in SCALAR_OPS:
            self._fold_scalar(func, args, out)
        stack = self._stack
        if stack and stack[-1].index >= 0:  # the common case, kept inline: a forward call
            owner: CallRecord | None = stack[-1]
            backward = False
        else:
            owner, backward = self._owner()
        if count is not None:
            n = count(*args, **kwargs, out_val=out)
            if n:
                if backward:
                    assert owner is not None
                    owner.backward_self_flops += n
                    owner.backward_ops[name] = owner.backward_ops.get(name, 0) + n
                elif owner is not None:
                    owner.flops += n
                    owner.self_flops += n
                    owner.ops[name] = owner.ops.get(name, 0) + n
                else:
                    self.orphan_flops += n
                    self.orphan_ops[name] = self.orphan_ops.get(name, 0) + n
        if isinstance(out, torch.Tensor):
            self._track(out, name, owner, backward)
        elif isinstance(out, (tuple, list)):
            for o in out:
                if isinstance(o, torch.Tensor):
                    self._track(o, name, owner, backward)
        return out

    # -- assumptions ---------------------------------------------------------------------------

    def _assume(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Answer a data-dependent op under the policy, recording what was assumed."""
        policy = self.policy
        assert policy is not None
        first = args[0] if args else None
        if not isinstance(first, torch.Tensor) or not first.is_meta:
            return func(*args, **kwargs)
        if func is torch.ops.aten._local_scalar_dense.default:
            known = self._known_value(first)
            if known is not None:
                return known
            file, line, code = caller_site()
            path = self._stack[-1].path if self._stack else ""
            found, value = policy.lookup(file, line, path)
            if first.dtype == torch.bool and (found or policy.truth):
                answer = bool(value) if found else True
                self._record("truth", "bool(tensor)", answer, file, line, code)
                return answer
            if not found:
                site = f"{os.path.basename(file)}:{line}" if file else path
                raise MetaValueNeeded(
                    "Tensor.item() cannot be called on meta tensors: the code needs a number "
                    f"from a {first.dtype} tensor here. Pass it with assume={{{site!r}: value}}."
                )
            number = float(value) if first.dtype.is_floating_point else int(value)
            self._record("value", "item()", number, file, line, code)
            return number
        if not policy.nonzero:
            return func(*args, **kwargs)
        if func is torch.ops.aten.nonzero.default:
            out = nonzero_upper_bound(first)
            self._known[out.untyped_storage()._cdata] = tuple(first.shape)
            op = "nonzero"
        elif func is torch.ops.aten.masked_select.default:
            out = masked_select_upper_bound(first, args[1])
            op = "masked_select"
        elif has_mask(args[1] if len(args) > 1 else None):
            out = index_upper_bound(func, args, kwargs)
            op = "x[mask]" if func is torch.ops.aten.index.Tensor else "x[mask] = v"
            if func is not torch.ops.aten.index.Tensor:  # in place: the shape of x is unchanged
                file, line, code = caller_site()
                self._record("nonzero", op, "every element selected", file, line, code)
                return out
        else:
            return func(*args, **kwargs)
        file, line, code = caller_site()
        self._record("nonzero", op, "every element selected", file, line, code)
        self._taint(out)
        return out

    def _known_value(self, t: torch.Tensor) -> Any:
        """The value of a one-element tensor read from a known storage, else None."""
        entry = self._known.get(t.untyped_storage()._cdata)
        if entry is None or t.numel() != 1:
            return None
        if isinstance(entry, tuple):
            return grid_value(entry, int(t.storage_offset()))
        return entry

    def _fold_scalar(self, func: Any, args: tuple[Any, ...], out: Any) -> None:
        """Compute a 0-dim result whose inputs are all known values."""
        if not isinstance(out, torch.Tensor) or out.numel() != 1 or len(args) < 2:
            return
        values = []
        for a in args[:2]:
            if isinstance(a, torch.Tensor):
                a = self._known_value(a)
                if a is None:
                    return
            values.append(a)
        self._known[out.untyped_storage()._cdata] = SCALAR_OPS[func](values[0], values[1])

    def _record(
        self, kind: str, op: str, value: Any, file: str | None, line: int | None, code: str | None
    ) -> None:
        path = self._stack[-1].path if self._stack else ""
        key = (kind, op, str(value), file, line, path)
        found = self.assumptions.get(key)
        if found is not None:
            found.count += 1
        else:
            call = self._stack[-1].index if self._stack else -1
            self.assumptions[key] = Assumption(kind, op, str(value), path, call, file, line, code)
        for rec in self._stack:
            rec.assumed = True

    def _taint(self, out: Any) -> None:
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.is_meta:
                self._tainted.add(t.untyped_storage()._cdata)

    def _op_name(self, func: Any) -> str:
        name = self._op_names.get(func)
        if name is None:
            name = self._op_names[func] = str(func._overloadpacket)
        return name

    def _track(
        self, t: torch.Tensor, op: str, call: CallRecord | None, backward: bool = False
    ) -> None:
        """Note new storage of an op's output, allocated for ``call`` (a backward one: for its
        backward, which the forward's ``alloc_bytes`` leaves out)."""
        if not t.is_meta:
            return
        st = t.untyped_storage()
        key = st._cdata
        if key in self._live or key in self._existing:
            return
        n = st.nbytes()
        if not n:
            return
        index = call.index if call is not None else -1
        alloc = Allocation(key, n, len(self.events), index, self.phase)
        self.allocations.append(alloc)
        self._live[key] = (alloc, weakref.ref(st, partial(self._free, key)))
        self.live_bytes += n
        if call is not None and not backward:
            call.alloc_bytes += n
        self.events.append(Event(n, self.live_bytes, index, op, self.phase))

    def _free(self, key: int, _ref: Any) -> None:
        # a weak reference's callback: Python prints and drops what it raises, a Ctrl-C too;
        # hand the interrupt on to the code running when the storage died
        try:
            self._note_free(key)
        except KeyboardInterrupt:
            _thread.interrupt_main()

    def _note_free(self, key: int) -> None:
        entry = self._live.pop(key, None)
        if entry is None or not self._active:
            return
        alloc = entry[0]
        alloc.freed = len(self.events)
        self.live_bytes -= alloc.nbytes
        owner = self._owner()[0]
        call = owner.index if owner is not None else -1
        self.events.append(Event(-alloc.nbytes, self.live_bytes, call, "free", self.phase))

    def mark_saved(self, t: torch.Tensor) -> None:
        """Note that autograd saved ``t`` for the backward pass (a saved-tensors pack hook)."""
        if t.is_meta:
            entry = self._live.get(t.untyped_storage()._cdata)
            if entry is not None:
                entry[0].saved = True


_sequence_nr = torch._C._autograd._get_sequence_nr
_current_node = torch._C._current_autograd_node


class _FlopProbe(TorchDispatchMode):
    """Sees whether any op with a FLOP formula runs (used once per composite op)."""

    found = False

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        if func._overloadpacket in _FLOPS:
            self.found = True
        return func(*args, **(kwargs or {}))


def _decomposition_counts(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether ``func`` has a composite decomposition holding ops that count FLOPs."""
    if func is _PRIM_DEVICE or not (
        _COMPOSITE in func.py_kernels
        or torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), _COMPOSITE)
    ):
        return False
    if func._schema.is_mutable:
        return True  # never run twice; decompose as FlopCounterMode does
    probe = _FlopProbe()
    try:
        with probe:
            func.decompose(*args, **kwargs)
    except Exception:
        return True
    return probe.found


def _any_in(args: tuple[Any, ...], keys: set[int]) -> bool:
    """Whether a tensor among ``args`` (or in a list argument) has its storage in ``keys``."""
    for a in args:
        if isinstance(a, torch.Tensor):
            if a.is_meta and a.untyped_storage()._cdata in keys:
                return True
        elif isinstance(a, (list, tuple)):
            for b in a:
                if isinstance(b, torch.Tensor) and b.is_meta and b.untyped_storage()._cdata in keys:
                    return True
    return False
