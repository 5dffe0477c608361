"""Function replay: a call of a taped function seen before on the same metadata replays its tape.

Some torch functions are several aten ops each, each through the recorder: attention's math
path (what the target device runs for grouped-query attention in fp32, or a mask the fused
kernels refuse; ``meta_widget.trace.kernels``) is about 30, ``linear`` and ``matmul`` on batched
inputs up to four (a transpose, views, the product). An 80-layer decoder makes the same calls,
on the same metadata, 80 times; the op cache skips each kernel, replay skips the ops.

These functions (``kernels.TAPED``) are functions of their arguments' metadata: the first call
of a key (the function, then every argument as the op cache keys them) runs and is recorded as
usual, and its *tape* is what it added to the trace: its allocations and frees in order (by op,
bytes, and which allocation each free releases), its FLOPs by op, its ops' costs
(``meta_widget.trace.costs``) and how many aten ops it ran.
A later call with an equal key makes only its outputs (fresh meta storage, as the kernel would)
and replays the tape into the running call: the same events, allocations, FLOPs and op counts,
so every record is what running it again would have made.

A call is taped only where a replay cannot differ from a run:

- inference with gradients off, inside a forward call, the op cache on, no observer of ops,
  no assumption at work (nothing tainted or known);
- and only when what it recorded stayed inside it: no module call started, every event is the
  running call's, every storage it allocated is freed before it returns except its outputs,
  which are fresh tensors (not views, offset 0, the whole storage) and not an argument.

Anything else runs as is, every time (``fast=False`` turns replay off with the op cache).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch

from ..choices import Phase
from ..data.records import Allocation, CallRecord
from .opcache import call_key_parts

if TYPE_CHECKING:
    from .recorder import Recorder

__all__ = ["Tapes"]

_EMPTY_STRIDED = torch.empty_strided
_autocast_on = torch._C._is_any_autocast_enabled
_META = torch.device("meta")
_STRIDED = torch.strided
#: the dispatch keys of Python dispatch modes, excluded while replay makes outputs
_PYTHON_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.Python) | torch._C.DispatchKeySet(
    torch._C.DispatchKey.PythonTLSSnapshot
)
#: one output of a taped call: size, stride, dtype
_Spec = tuple[tuple[int, ...], tuple[int, ...], torch.dtype]
#: a tape step: allocate ``n`` bytes by ``op`` / track output ``i`` (made by ``op``) / free the
#: ``j``-th allocation of the call
_ALLOC, _OUTPUT, _FREE = 0, 1, 2
#: a key whose call cannot be replayed (its first run recorded what a tape cannot hold)
_UNTAPED = "untaped"
#: how a tape writes a tensor id of a flow: an argument's, new storage's, any other
_ARG, _NEW, _ABS = 0, 1, 2
#: a flow as a tape keeps it: op name, the ids it read and made (relative, see ``_Tape.flows``)
_TapedFlow = tuple[str, tuple[tuple[int, int], ...], tuple[tuple[int, int], ...]]


@dataclass(frozen=True, slots=True)
class _Tape:
    #: (size, stride, dtype) of each output
    outputs: tuple[_Spec, ...]
    #: the container of several outputs (tuple or list), or None for one tensor
    container: type | None
    steps: tuple[tuple[int, Any, Any], ...]
    #: FLOPs by op name
    flops: tuple[tuple[str, int], ...]
    #: aten ops the call ran
    ops: int
    #: the costs its ops added to the running call: (cost, how many)
    costs: tuple[tuple[tuple[str, int, int, tuple[Any, ...]], int], ...] = ()
    #: the data flow its ops noted in the running call (``CallRecord.flows``), each id as
    #: (``_ARG``, argument position) / (``_NEW``, event offset) / (``_ABS``, the id), or None:
    #: the call ran where no flow is noted (a leaf module's body)
    flows: tuple[_TapedFlow, ...] | None = None


class Tapes:
    """The tapes of one trace's calls of taped functions, by key (see the module docstring).

    :meth:`call` runs a function, or replays an earlier call of it on the same metadata.
    """

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self._tapes: dict[Any, _Tape | str] = {}

    def call(
        self,
        func: Any,
        run: Callable[[Any, tuple[Any, ...], dict[str, Any]], Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """``run(func, args, kwargs)`` (the function mode's routing of ``func``), or its
        replay."""
        owner = self._owner()
        if owner is None:
            return run(func, args, kwargs)
        parts: list[Any] = [func]
        if call_key_parts(args, kwargs, parts) is not None:
            return run(func, args, kwargs)
        key = tuple(parts)
        tape = self._tapes.get(key)
        if tape is None:
            return self._record(key, owner, func, run, args, kwargs)
        if type(tape) is str:
            return run(func, args, kwargs)
        assert isinstance(tape, _Tape)
        return self._replay(tape, owner, func, args, kwargs)

    def _owner(self) -> CallRecord | None:
        """The running forward call, if a call made now may be taped or replayed."""
        rec = self.recorder
        stack = rec.callstack.stack
        assumptions = rec.assumptions
        if (
            rec.cache is None
            or rec.observer is not None
            or torch.is_grad_enabled()
            or _autocast_on()  # casts inside the call follow it: not in the key
            or not rec.storage.active
            or rec.storage.phase != Phase.FORWARD
            or rec.callstack.phase != Phase.FORWARD
            or assumptions.tainted
            or assumptions.known
            or not stack
            or stack[-1].index < 0
        ):
            return None
        return stack[-1]

    def _record(
        self,
        key: Any,
        owner: CallRecord,
        func: Any,
        run: Callable[[Any, tuple[Any, ...], dict[str, Any]], Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        rec = self.recorder
        storage, stats = rec.storage, rec.cache.stats  # type: ignore[union-attr]
        start = (len(rec.callstack.calls), len(storage.events), len(storage.allocations))
        ops, ran, costs = dict(owner.ops), stats.ops, dict(owner.costs)
        flows = len(owner.flows) if owner.flows is not None else -1
        out = run(func, args, kwargs)
        tape = None
        if self._owner() is owner:  # still inside the same call, no assumption taken
            tape = self._tape(out, args, kwargs, owner, start, ops, stats.ops - ran)
            if tape is not None:
                tape = _with_costs(tape, costs, owner.costs)
                if flows >= 0:
                    tape = replace(tape, flows=self._relative(owner, flows, args, kwargs, start[1]))
        self._tapes[key] = tape if tape is not None else _UNTAPED
        return out

    def _tape(
        self,
        out: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        owner: CallRecord,
        start: tuple[int, int, int],
        ops_before: dict[str, int],
        ops: int,
    ) -> _Tape | None:
        """The tape of a call that just ran, or None if a replay could differ from a run."""
        rec = self.recorder
        storage = rec.storage
        calls, first_event, first_alloc = start
        if len(rec.callstack.calls) != calls:
            return None  # a module ran inside it
        container = type(out) if isinstance(out, (tuple, list)) else None
        outs = list(out) if container is not None else [out]
        inputs = {id(a) for a in (*args, *kwargs.values())}  # an out= tensor among them
        made: dict[int, int] = {}  # storage key -> index of the output it holds
        specs = []
        for i, o in enumerate(outs):
            if (
                type(o) is not torch.Tensor
                or id(o) in inputs
                or not o.is_meta
                or o._is_view()
                or o.layout is not _STRIDED
                or o.storage_offset() != 0
            ):
                return None
            st = o.untyped_storage()
            spec = (tuple(o.shape), o.stride(), o.dtype)
            if st._cdata in made or _made([spec])[0].untyped_storage().nbytes() != st.nbytes():
                return None  # two outputs on one storage, or a view of a larger one
            made[st._cdata] = i
            specs.append(spec)
        allocs = storage.allocations[first_alloc:]
        by_event = {a.event: a for a in allocs}
        freed = {a.freed: j for j, a in enumerate(allocs) if a.freed >= 0}
        steps: list[tuple[int, Any, Any]] = []
        for i in range(first_event, len(storage.events)):
            event = storage.events[i]
            if event.call != owner.index or event.phase != Phase.FORWARD:
                return None
            if i in by_event:
                a = by_event[i]
                if a.freed < 0:
                    if a.key not in made:
                        return None  # a storage outlived the call, not as an output
                    steps.append((_OUTPUT, made.pop(a.key), event.op))
                else:
                    steps.append((_ALLOC, a.nbytes, event.op))
            elif i in freed:
                steps.append((_FREE, freed[i], None))
            else:
                return None  # a free of storage from before the call
        if made:
            return None  # an output the call did not allocate
        flops = tuple(
            (name, n - ops_before.get(name, 0))
            for name, n in owner.ops.items()
            if n != ops_before.get(name, 0)
        )
        return _Tape(tuple(specs), container, tuple(steps), flops, ops)

    def _relative(
        self,
        owner: CallRecord,
        first: int,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        first_event: int,
    ) -> tuple[_TapedFlow, ...]:
        """The flows a taped call noted (``owner.flows[first:]``), their ids relative to the
        call: its arguments by position, the storage it made by event offset."""
        position = {tid: i for i, tid in enumerate(self.recorder.read_ids(args, kwargs))}

        def rel(tid: int) -> tuple[int, int]:
            if tid in position:
                return (_ARG, position[tid])
            if tid >= first_event:
                return (_NEW, tid - first_event)
            return (_ABS, tid)

        noted = owner.flows[first:]  # type: ignore[index]
        return tuple((name, tuple(map(rel, r)), tuple(map(rel, m))) for _, name, r, m in noted)

    def _note_flows(
        self,
        tape: _Tape,
        owner: CallRecord,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        start: int,
    ) -> None:
        """Note the flows of ``tape``'s first run again, on this call's arguments and storage
        (its events replay in the same order, from event ``start``)."""
        rec = self.recorder
        assert tape.flows is not None and owner.flows is not None
        ids = rec.read_ids(args, kwargs)
        seq = len(rec.callstack.calls)

        def back(ref: tuple[int, int]) -> int:
            kind, v = ref
            return ids[v] if kind == _ARG else start + v if kind == _NEW else v

        for name, read, made in tape.flows:
            owner.flows.append((seq, name, tuple(map(back, read)), tuple(map(back, made))))

    def _replay(
        self,
        tape: _Tape,
        owner: CallRecord,
        func: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        storage = self.recorder.storage
        start = len(storage.events)
        outs = _made(tape.outputs)
        made: list[Allocation | None] = []
        for kind, a, b in tape.steps:
            if kind == _FREE:
                alloc = made[a]
                assert alloc is not None
                storage.freed(alloc, owner.index)
            elif kind == _ALLOC:
                made.append(storage.allocated(-1, a, b, owner))
            else:
                storage.track(outs[a], b, owner, False)
                made.append(None)
        ops = owner.ops
        for name, n in tape.flops:
            ops[name] = ops.get(name, 0) + n
            owner.flops += n
            owner.self_flops += n
        costs = owner.costs
        for cost, count in tape.costs:
            costs[cost] = costs.get(cost, 0) + count
        self.recorder.cache.stats.replayed += tape.ops  # type: ignore[union-attr]
        out = outs[0] if tape.container is None else tape.container(outs)
        if owner.flows is not None:
            if tape.flows is not None:  # as its first run noted them
                self._note_flows(tape, owner, args, kwargs, start)
            else:  # its first run was in a leaf's body: the graph reads the call as one op
                self.recorder.note_flow(getattr(func, "__name__", "call"), args, kwargs, out, owner)
        return out


def _with_costs(
    tape: _Tape,
    before: dict[tuple[str, int, int, tuple[Any, ...]], int],
    after: dict[tuple[str, int, int, tuple[Any, ...]], int],
) -> _Tape:
    """``tape`` with the costs its call added to the running call's (``after`` less
    ``before``)."""
    added = tuple(
        (cost, n - before.get(cost, 0)) for cost, n in after.items() if n != before.get(cost, 0)
    )
    return _Tape(tape.outputs, tape.container, tape.steps, tape.flops, tape.ops, added)


def _made(specs: Sequence[_Spec]) -> list[torch.Tensor]:
    """Fresh meta tensors of ``specs``, made unseen by the recorder's dispatch mode (this runs
    in the function mode, where the recorder would take them for the model's allocations)."""
    with torch._C._ExcludeDispatchKeyGuard(_PYTHON_KEYS):
        return [
            _EMPTY_STRIDED(size, stride, dtype=dtype, device=_META) for size, stride, dtype in specs
        ]
