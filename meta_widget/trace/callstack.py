"""The call stack of a trace: module pre/post hooks make one :class:`CallRecord` per call.

It knows which call is running (the innermost on the stack), and inside backward which call an
autograd node belongs to: each forward call tags the nodes it created (their sequence number is
at least the one its start saw), and the running node's tag names the call whose backward runs.
A module called again inside backward (activation checkpointing recomputing it) is no new call:
its stack entry points at the forward call it repeats.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..choices import Phase
from ..data.flatten import TensorInfo, describe_inputs, named_tensors
from ..data.records import CallRecord
from ..data.walk import ModuleWalk
from .storage import StorageTracker, inner_tensors, storage_key

__all__ = ["CallStack", "Listener"]

Listener = Callable[[CallRecord], None]
Ids = tuple[int, ...]

#: the key of an autograd node's metadata that holds the index of the call that created it
_NODE_CALL = "meta_widget.call"
_NO_SEQUENCE = 2**63  # AccumulateGrad nodes (parameters' leaves) carry the largest number
_sequence_nr = torch._C._autograd._get_sequence_nr
_current_node = torch._C._current_autograd_node
#: the hooks only record: the trace's function modes (attention kernels, autocast) are for the
#: model's code, and each tensor method call they see in a hook costs 5 us more
_no_function_modes = torch._C.DisableTorchFunction


class CallStack:
    """The calls of the walked modules, as the hooks see them start and end.

    ``calls`` holds every call in start order; ``stack`` the ones running (innermost last).
    ``tainted`` (the assumptions' set of storages with assumed shapes) marks outputs derived
    from an assumption. ``tag_grad_nodes`` credits autograd nodes to calls, for backward.
    """

    def __init__(
        self,
        modules: ModuleWalk,
        storage: StorageTracker,
        tainted: set[int],
        listeners: Sequence[Listener] = (),
        tag_grad_nodes: bool = False,
    ) -> None:
        self.calls: list[CallRecord] = []
        self.stack: list[CallRecord] = []
        self.phase: str = Phase.FORWARD
        self.error_call: int | None = None
        self.listeners = list(listeners)
        self.tag_grad_nodes = tag_grad_nodes
        self._ids: list[int] = []  # id() of the module of each stack entry
        #: calls are recorded from this thread only (the one that opened the recorder)
        self.thread = threading.get_ident()
        self._storage = storage
        self._tainted = tainted
        self._rows = {id(m): i for i, m in enumerate(modules.modules)}
        self._types = {id(m): type(m).__name__ for m in modules.modules}
        #: ``id`` of the modules with sub-modules: their calls record their body's data flow
        self._inner = {id(m) for m in modules.modules if m._modules}
        self._paths = modules.paths
        #: ``id`` of the modules whose end :meth:`post` sees, not :meth:`post_global`
        self.own_hooks: set[int] = set()
        #: no call is recorded while set (``mode="generate"``'s decode steps that the per-step
        #: rule gives, ``meta_widget.trace.decode_skip``); a call not seen to start is not seen
        #: to end either
        self.paused = False
        # activation checkpointing: forward calls by module row, and recomputations seen so far
        self._forward_calls: dict[int, list[int]] = {}
        self._recomputed: dict[int, int] = {}

    def set_aside(self) -> Callable[[], None]:
        """Record the calls from now on in a list of their own, numbered from 0 again, heard by
        no listener; return the function that puts back the calls recorded so far.

        A training trace's second step runs the model's calls again (``passes``): numbered
        afresh, its k-th call is the first step's k-th, so its events name the first step's
        records, and nothing is counted twice (FLOPs, costs, the calls a view shows).
        """
        kept = (self.calls, self.listeners, self.error_call, self._forward_calls, self._recomputed)
        self.calls, self.listeners, self._forward_calls, self._recomputed = [], [], {}, {}

        def restore() -> None:
            error = self.error_call
            self.calls, self.listeners, self.error_call = kept[0], kept[1], kept[2]
            self._forward_calls, self._recomputed = kept[3], kept[4]
            if self.error_call is None and error is not None and error < len(self.calls):
                self.error_call = error  # the second step failed where the first did not

        return restore

    # -- hooks ---------------------------------------------------------------------------------

    def pre(self, mod: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """A forward pre-hook: a call of ``mod`` starts."""
        if threading.get_ident() != self.thread or self.paused:
            return  # another thread running the same module: not this trace's call
        with _no_function_modes():
            self._pre(mod, args, kwargs)

    def _pre(self, mod: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        stack = self.stack
        if self.phase == Phase.BACKWARD:
            stack.append(self._recomputation(mod))
            self._ids.append(id(mod))
            return
        rec = CallRecord(
            index=len(self.calls),
            path=self._path_for(mod),
            type=self._types.get(id(mod)) or type(mod).__name__,
            module=self._rows.get(id(mod), -1),
            parent=stack[-1].index if stack else -1,
            depth=len(stack),
            inputs=describe_inputs(args, kwargs, caches=not stack),
            start_event=len(self._storage.events),
            phase=self.phase,
        )
        rec.input_ids = self._input_ids(args, kwargs, not stack)
        if id(mod) in self._inner and self.phase == Phase.FORWARD:
            rec.flows = []
        if self.tag_grad_nodes:
            rec.grad_seq = _sequence_nr()
        rec.duration_s = time.perf_counter()
        self.calls.append(rec)
        stack.append(rec)
        self._ids.append(id(mod))

    def post(self, mod: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
        """A forward hook (``always_call``): a call of ``mod`` ends, with ``output`` or an error.

        Registered on each module that has forward hooks of its own (it runs after them, as the
        module's own last hook); :meth:`post_global` serves the other modules.
        """
        if threading.get_ident() != self.thread:
            return
        with _no_function_modes():
            self._post(mod, output)

    def post_global(self, mod: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
        """The global forward hook (``always_call``): :meth:`post` for every module without
        hooks of its own (``own_hooks``), one registration instead of three hook tables per
        module (~800 bytes each, kept by the module once grown)."""
        if threading.get_ident() != self.thread or id(mod) in self.own_hooks:
            return
        with _no_function_modes():
            self._post(mod, output)

    def _post(self, mod: torch.nn.Module, output: Any) -> None:
        stack, ids = self.stack, self._ids
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
        rec.end_event = len(self._storage.events)
        if output is None and sys.exc_info()[1] is not None:
            rec.error = True
            if self.error_call is None:
                self.error_call = rec.index
        else:
            self._describe_output(rec, output)
        if stack:
            stack[-1].flops += rec.flops
        for listener in self.listeners:
            listener(rec)

    def _describe_output(self, rec: CallRecord, output: Any) -> None:
        named = (
            [("output", output)]
            if isinstance(output, torch.Tensor)
            else list(named_tensors(output, caches=not self.stack))
        )
        rec.outputs = [TensorInfo.named(name, t) for name, t in named]
        ident = self._storage.ident
        rec.output_ids = tuple(ident(t) for _, t in named)
        keys = {
            storage_key(x) for _, t in named for x in inner_tensors(t) if self._storage.tracks(x)
        }
        rec.activation_bytes = self._storage.new_bytes(keys, rec.start_event)
        if self._tainted and not keys.isdisjoint(self._tainted):
            rec.assumed = True
        if self.tag_grad_nodes and rec.phase == Phase.FORWARD:
            self._tag_nodes([t.grad_fn for _, t in named], rec)

    def _input_ids(self, args: tuple[Any, ...], kwargs: dict[str, Any], caches: bool) -> Ids:
        """The ids of a call's input tensors (``StorageTracker.ident``), in ``describe_inputs``'s
        order."""
        ident = self._storage.ident
        if len(args) == 1 and not kwargs and isinstance(args[0], torch.Tensor):
            return (ident(args[0]),)
        found = [ident(t) for _, t in named_tensors(args, "args", 0, caches)] if args else []
        if kwargs:
            found.extend(ident(t) for _, t in named_tensors(kwargs, "", 0, caches))
        return tuple(found)

    def _path_for(self, mod: torch.nn.Module) -> str:
        candidates = self._paths.get(id(mod))
        if not candidates:
            return type(mod).__name__
        if len(candidates) > 1 and self.stack:
            parent = self.stack[-1].path
            for p in candidates:
                if not parent or p.startswith(parent + "."):
                    return p
        return candidates[0]

    def _recomputation(self, mod: torch.nn.Module) -> CallRecord:
        """A module called again inside backward: activation checkpointing recomputing its forward.

        The stack record points at the forward call it repeats (the k-th recomputation of a
        module, at its k-th forward call), whose backward then holds the work.
        """
        row = self._rows.get(id(mod), -1)
        forward = self._forward_calls.get(row)
        if forward is None:
            forward = self._forward_calls[row] = [
                c.index for c in self.calls if c.module == row and c.phase == Phase.FORWARD
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
            depth=len(self.stack),
            inputs=[],
            phase=Phase.BACKWARD,
            recompute_of=target,
        )

    # -- who owns an op ------------------------------------------------------------------------

    def owner(self) -> tuple[CallRecord | None, bool]:
        """The call an op (or a free) belongs to now, and whether as part of its backward.

        The innermost call running; inside backward, the call that created the autograd node
        running, or the forward call a recomputation repeats.
        """
        if self.stack:
            top = self.stack[-1]
            if top.index >= 0:
                return top, False
            if top.recompute_of >= 0:
                return self.calls[top.recompute_of], True
        if self.phase == Phase.BACKWARD:
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
