"""The storage tracker: every storage a trace allocates and frees, as a live-bytes timeline.

A storage is known by its key (:func:`storage_key`). Storage that existed before the trace
(parameters, buffers, inputs) is never new. A new storage is noted when an op returns it, and
its free when the storage object dies: a weak reference reports it, so the timeline follows
reference counting exactly as a real allocator would see it.
"""

from __future__ import annotations

import _thread
import weakref
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from ..data.records import Allocation, CallRecord, Event

__all__ = ["StorageTracker", "inner_tensors", "local", "on_meta", "storage_key"]


def _nobody() -> CallRecord | None:
    return None


def storage_key(t: torch.Tensor) -> int:
    """The key of ``t``'s storage: equal for views of one storage, unique among live ones."""
    return t.untyped_storage()._cdata


def on_meta(t: torch.Tensor) -> bool:
    """Whether ``t``'s data is on meta: a meta tensor, or a fake tensor (meta data standing for
    another device, as in a parallel trace, ``meta_widget.distributed.parallel``)."""
    return type(t) is FakeTensor or t.is_meta  # is_meta asks a fake tensor's mode: last


def inner_tensors(t: torch.Tensor) -> list[torch.Tensor]:
    """The plain tensors holding the data of a tensor subclass that wraps others (a DTensor's
    local shard), or ``[t]``."""
    if not is_traceable_wrapper_subclass(t):
        return [t]
    names, _ = t.__tensor_flatten__()
    inner = (getattr(t, name) for name in names)  # a DTensor also names its (tensor-like) mesh
    return [x for v in inner if isinstance(v, torch.Tensor) for x in inner_tensors(v)]


def local(t: torch.Tensor) -> torch.Tensor:
    """The tensor holding ``t``'s data on this device: ``t``, or a DTensor's local shard."""
    return inner_tensors(t)[0]


class StorageTracker:
    """Allocations and frees of meta storage, credited to module calls.

    ``events`` is the timeline (one :class:`Event` per allocation or free), ``allocations`` one
    :class:`Allocation` per new storage. ``free_owner()`` names the call a free happens in
    (given by the recorder: the call stack decides). Frees are noted only while ``active``.
    """

    def __init__(
        self, existing: Iterable[torch.Tensor], free_owner: Callable[[], CallRecord | None]
    ) -> None:
        self.events: list[Event] = []
        self.allocations: list[Allocation] = []
        self.live_bytes = 0
        self.phase = "forward"
        self.active = False
        self._free_owner = free_owner
        # storage key -> (its Allocation, the weak reference that reports its free)
        self._live: dict[int, tuple[Allocation, weakref.ref[Any]]] = {}
        self._existing = {storage_key(x) for t in existing for x in inner_tensors(t) if on_meta(x)}
        #: the ids ``ident`` gave storage from before the trace, by key
        self._existing_ids: dict[int, int] = {}
        #: told the key of each storage that dies: a later storage may get the same key
        self.on_free: Callable[[int], None] | None = None
        #: storages on every device are tracked, not only meta's (a real run: ``track_real``)
        self.real = False
        #: while paused (:meth:`pause`): each new storage, noted nowhere (key -> a weak reference
        #: to it and its bytes), and the storages live when the pause began; None otherwise
        self._quiet: dict[int, tuple[weakref.ref[Any], int]] | None = None
        self._before: dict[int, tuple[Allocation, weakref.ref[Any]]] = {}
        self._held: dict[int, weakref.ref[Any]] = {}
        #: storages that stand for host memory though on meta (:meth:`on_host`), while alive
        self._host: dict[int, weakref.ref[Any]] = {}

    def track_real(self, existing: Iterable[torch.Tensor]) -> None:
        """Track storages on every device from now on (``mw.measure``'s real run), ``existing``
        (the real parameters, buffers and inputs) being there before and never new."""
        self.real = True
        self._existing |= {storage_key(x) for t in existing for x in inner_tensors(t)}

    def tracks(self, t: torch.Tensor) -> bool:
        """Whether ``t``'s storage is one this tracker follows (on meta, or any in a real run)."""
        if self._host and storage_key(t) in self._host:
            return False
        return self.real or on_meta(t)

    def on_host(self, t: torch.Tensor) -> None:
        """Never track ``t``'s new storage: it stands for host memory though it is on meta (a
        parallel trace's fake tensors all stand for the device's; the optimizer's own scalars,
        AdamW's step counters, are the host's in a real run). Before its op's output is
        tracked. Forgotten when it dies: a later storage may get its key."""
        st = t.untyped_storage()
        key = st._cdata
        if key in self._host or key in self._existing or key in self._live:
            return
        self._host[key] = weakref.ref(st, partial(self._host_died, key))
        self._existing.add(key)

    def _host_died(self, key: int, _ref: Any) -> None:
        if self._host.pop(key, None) is not None:
            self._existing.discard(key)

    def detach(self) -> None:
        """Drop the callbacks (the recorder's methods) once the trace is over and nothing is
        noted any more: the frees still reported forget their storage, and that is all."""
        self.active = False
        self.on_free = None
        self._free_owner = _nobody

    def track(self, t: torch.Tensor, op: str, call: CallRecord | None, backward: bool) -> None:
        """Note new storage of an op's output, allocated for ``call`` (a backward one: for its
        backward, which the forward's ``alloc_bytes`` leaves out)."""
        if type(t) is not FakeTensor and not t.is_meta and not self.real:
            if is_traceable_wrapper_subclass(t):
                for inner in inner_tensors(t):
                    self.track(inner, op, call, backward)
            return
        st = t.untyped_storage()
        key = st._cdata
        if key in self._live or key in self._existing:
            return
        n = st.nbytes()
        if not n:
            return
        if self._quiet is not None:  # paused: kept aside, noted at resume() if still alive
            self._quiet[key] = (weakref.ref(st), n)
            return
        self._allocate(st, n, op, call, backward)

    def _allocate(self, st: Any, n: int, op: str, call: CallRecord | None, backward: bool) -> None:
        key = st._cdata
        alloc = self.allocated(key, n, op, call, backward)
        self._live[key] = (alloc, weakref.ref(st, partial(self._free, key)))

    def allocated(
        self, key: int, n: int, op: str, call: CallRecord | None, backward: bool = False
    ) -> Allocation:
        """Note an allocation of ``n`` bytes by ``op``. Its free is not watched: the caller notes
        it with :meth:`freed` (a replayed tape does, ``meta_widget.trace.replay``; ``key`` -1)."""
        index = call.index if call is not None else -1
        alloc = Allocation(key, n, len(self.events), index, self.phase)
        self.allocations.append(alloc)
        self.live_bytes += n
        if call is not None and not backward:
            call.alloc_bytes += n
        self.events.append(Event(n, self.live_bytes, index, op, self.phase))
        return alloc

    def track_output(self, out: Any, op: str, call: CallRecord | None, backward: bool) -> None:
        """:meth:`track` each tensor an op returned (a tensor, or a tuple/list of them)."""
        if isinstance(out, torch.Tensor):
            self.track(out, op, call, backward)
        elif isinstance(out, (tuple, list)):
            for o in out:
                if isinstance(o, torch.Tensor):
                    self.track(o, op, call, backward)

    def _free(self, key: int, _ref: Any) -> None:
        # a weak reference's callback: Python prints and drops what it raises, a Ctrl-C too;
        # hand the interrupt on to the code running when the storage died
        try:
            self._note_free(key)
        except KeyboardInterrupt:
            _thread.interrupt_main()

    def _note_free(self, key: int) -> None:
        entry = self._live.pop(key, None)
        if entry is None:
            return
        if self.on_free is not None:
            self.on_free(key)
        if not self.active:
            return
        owner = self._free_owner()
        self.freed(entry[0], owner.index if owner is not None else -1)

    def freed(self, alloc: Allocation, call: int) -> None:
        """Note the free of ``alloc``, in call ``call`` (its index, -1 for none)."""
        alloc.freed = len(self.events)
        self.live_bytes -= alloc.nbytes
        self.events.append(Event(-alloc.nbytes, self.live_bytes, call, "free", self.phase))

    def resized(self, st: Any, op: str, call: CallRecord | None, backward: bool) -> None:
        """Note that storage ``st`` was resized in place (FSDP2 frees and allocates unsharded
        parameters this way: ``resize_(0)``, then back to full size): a free of what it held,
        and an allocation of its new size."""
        if not self.active or st._cdata in self._existing:
            return
        entry = self._live.pop(st._cdata, None)
        if entry is not None:
            self.freed(entry[0], call.index if call is not None else -1)
        n = st.nbytes()
        if n:
            self._allocate(st, n, op, call, backward)

    def set_category(self, t: torch.Tensor, category: str) -> None:
        """Give the live storage of ``t`` (if this tracker follows it) its memory category, the
        one it keeps once freed (a first training step's gradients)."""
        entry = self._live.get(storage_key(t))
        if entry is not None:
            entry[0].category = category

    def mark_saved(self, t: torch.Tensor) -> None:
        """Note that autograd saved ``t`` for the backward pass (a saved-tensors pack hook)."""
        if self.tracks(t):
            entry = self._live.get(storage_key(t))
            if entry is not None:
                entry[0].saved = True

    def ident(self, t: torch.Tensor) -> int:
        """An id of ``t``'s data, unique over the trace: the event that allocated its storage
        (views share it), or, for storage from before the trace (parameters, buffers, inputs),
        ``-2 - n`` where it is the ``n``-th such storage asked for (the same in every run of the
        same trace, unlike its address); -1: unknown (storage this tracker does not follow,
        e.g. a CPU scalar, whose key a later one may reuse)."""
        try:
            key = t.untyped_storage()._cdata
        except (RuntimeError, NotImplementedError, TypeError):
            return -1  # a tensor subclass without storage of its own
        entry = self._live.get(key)
        if entry is not None:
            return entry[0].event
        if key not in self._existing:
            return -1
        n = self._existing_ids.get(key)
        if n is None:
            n = self._existing_ids[key] = -2 - len(self._existing_ids)
        return n

    def pause(self, held: Iterable[torch.Tensor] = ()) -> None:
        """Note nothing until :meth:`resume`: no event, no allocation (``mode="generate"``'s
        decode steps that the per-step rule gives, ``meta_widget.trace.decode_skip``). New
        storages are kept aside, frees pass unnoted. ``held``: tensors whose storage
        ``resume`` is to leave out if it is still the one they have now (not new)."""
        self._before = dict(self._live)
        self._held = {storage_key(t): weakref.ref(t.untyped_storage()) for t in held}
        self._quiet = {}
        self.active = False

    def resume(self, also: Iterable[torch.Tensor], op: str, call: int) -> Event:
        """Note again after :meth:`pause`, with one event (``op``, in call ``call``) standing for
        everything in between: the frees of the storages live at the pause that died since, and
        the allocations of the storages made since that are alive (those the tracker saw, and
        those of ``also``: tensors made with the recorder out of the way). Returns the event."""
        quiet, before = self._quiet or {}, self._before
        self._quiet, self._before = None, {}
        self.active = True
        dead = [a for key, (a, _) in before.items() if self._live.get(key, (None,))[0] is not a]
        alive: dict[int, tuple[Any, int]] = {}
        for key, (ref, n) in quiet.items():
            st = ref()
            if st is not None:
                alive[key] = (st, n)
        held, self._held = self._held, {}
        for t in also:
            if self.tracks(t):
                st = t.untyped_storage()
                was = held.get(st._cdata)
                if (
                    st.nbytes()
                    and st._cdata not in self._existing
                    and (was is None or was() is not st)
                ):
                    alive.setdefault(st._cdata, (st, st.nbytes()))
        index = len(self.events)
        for a in dead:
            a.freed = index
        net = 0
        for key, (st, n) in alive.items():
            if key in self._live:
                continue
            alloc = Allocation(key, n, index, call, self.phase)
            self.allocations.append(alloc)
            self._live[key] = (alloc, weakref.ref(st, partial(self._free, key)))
            net += n
        net -= sum(a.nbytes for a in dead)
        self.live_bytes += net
        event = Event(net, self.live_bytes, call, op, self.phase)
        self.events.append(event)
        return event

    def new_bytes(self, keys: set[int], start: int) -> int:
        """Bytes of the storages ``keys`` that were allocated since event ``start``."""
        total = 0
        for key in keys:
            entry = self._live.get(key)
            if entry is not None and entry[0].event >= start:
                total += entry[0].nbytes
        return total
