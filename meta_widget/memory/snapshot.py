"""A recorded memory history read as plain data: a CUDA memory snapshot or a profiler trace.

Two recordings of a real run are read, never run:

- **a CUDA memory snapshot**: the dict ``torch.cuda.memory._snapshot()`` returns (and
  ``torch.cuda.memory._dump_snapshot(path)`` pickles), with ``segments`` (each ``device`` and its
  ``blocks``, each ``size`` and ``state``) and ``device_traces`` (per device, the allocator's
  events in order: ``action``, ``addr``, ``size``, ``frames``). Its pickle is read by an
  unpickler that allows no global at all: a snapshot holds dicts, lists, strings and numbers
  only, so a pickle naming any class or function (``os.system``) is refused unread.
- **a ``torch.profiler`` trace with ``profile_memory=True``**: its chrome trace JSON (what
  ``export_chrome_trace`` writes), whose ``[memory]`` instant events carry ``Bytes`` and the
  allocator's ``Total Allocated``.

**Live bytes** after each event: for a snapshot, the bytes allocated before the trace began
(the ``active_allocated`` and ``active_pending_free`` blocks at the snapshot, less what the
trace allocated, plus what it freed) plus every ``alloc`` and minus every ``free_completed`` so
far (a block counts until the allocator has it back, as ``torch.cuda.memory_allocated`` does;
``free_requested`` and segment events leave it unchanged). For a profiler trace: the
``Total Allocated`` of each ``[memory]`` event of the device. **The peak** is their maximum.

**Modules** come from the events' frames: a frame named ``nn.Module: Linear_0`` (the profiler's
name for a module call, also in snapshots made from a profile by
``torch.cuda._memory_viz._profile_to_snapshot``), or a Python frame called from
``torch/nn/modules/module.py``'s ``_call_impl`` (a snapshot recorded with
``torch.cuda.memory._record_memory_history(stacks="python")``), named by the file and line
that called the module (``model:42``), its type the forward's file and function
(``linear.forward``). For a profiler trace, the ``nn.Module: ...`` Python events (recorded with
``with_stack=True``) that enclose each memory event in time on its thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any

from ..errors import MetaWidgetError

__all__ = ["SnapshotError", "SnapshotTimeline", "from_snapshot", "from_trace"]

#: a module stack: (name, type) of each module call, outermost first
Stack = tuple[tuple[str, str], ...]

_MODULE_PREFIX = "nn.Module: "
_ALLOCATED_STATES = ("active_allocated", "active_pending_free")


class SnapshotError(MetaWidgetError, ValueError):
    """A memory snapshot or profiler trace cannot be read (not one, damaged, or unsafe)."""


@dataclass
class SnapshotTimeline:
    """The live bytes of a recorded run after each allocator event, and the module calls
    the events happened in (see the module docstring for the definitions)."""

    #: ``"snapshot"`` (a CUDA memory snapshot) or ``"profiler"`` (a profiler trace)
    source: str
    #: the device the events are of: ``"cuda:0"``, ``"cpu"``...
    device: str
    #: live bytes after each event
    live: list[int] = field(default_factory=list)
    #: the event's action (``alloc``, ``free_completed``...; ``alloc`` / ``free`` in a profiler
    #: trace)
    actions: list[str] = field(default_factory=list)
    #: bytes the event allocated (> 0) or freed (< 0)
    sizes: list[int] = field(default_factory=list)
    #: the innermost module call each event happened in (an index of ``calls``), or -1
    event_call: list[int] = field(default_factory=list)
    #: (name, type, parent row) of each module found in frames; row 0 is the whole run
    modules: list[tuple[str, str, int]] = field(default_factory=list)
    #: (module row, parent call or -1) of each module call, in start order
    calls: list[tuple[int, int]] = field(default_factory=list)
    #: bytes live before the first event
    baseline_bytes: int = 0

    @property
    def peak_bytes(self) -> int:
        """The largest live bytes after any event (the baseline when there is none)."""
        return max(self.live, default=self.baseline_bytes)

    @property
    def peak_index(self) -> int | None:
        """The first event at the peak, or None without events."""
        return self.live.index(self.peak_bytes) if self.live else None

    def module_path(self, row: int) -> str:
        """The dotted path of module ``row`` (``""`` for the whole run)."""
        names: list[str] = []
        while row > 0:
            name, _, row = self.modules[row]
            names.append(name)
        return ".".join(reversed(names))


class _Calls:
    """Module rows and calls from the module stacks of successive events."""

    def __init__(self, title: str) -> None:
        self.rows: dict[tuple[int, str, str], int] = {}
        self.modules: list[tuple[str, str, int]] = [(title, title, -1)]
        self.calls: list[tuple[int, int]] = []
        self.open: list[tuple[tuple[str, str], int]] = []  # (module, call) outermost first

    def at(self, stack: Stack) -> int:
        """The innermost call for an event in ``stack`` (-1 outside every module)."""
        keep = 0
        while keep < min(len(stack), len(self.open)) and self.open[keep][0] == stack[keep]:
            keep += 1
        del self.open[keep:]
        for name, kind in stack[keep:]:
            parent_call = self.open[-1][1] if self.open else -1
            parent_row = self.calls[parent_call][0] if parent_call >= 0 else 0
            key = (parent_row, name, kind)
            row = self.rows.get(key)
            if row is None:
                row = self.rows[key] = len(self.modules)
                self.modules.append((name, kind, parent_row))
            self.calls.append((row, parent_call))
            self.open.append(((name, kind), len(self.calls) - 1))
        return self.open[-1][1] if self.open else -1


def _stem(path: str) -> str:
    return PurePath(path.replace("\\", "/")).stem


def _is_call_impl(frame: dict[str, Any]) -> bool:
    path = str(frame.get("filename", "")).replace("\\", "/")
    return path.endswith("torch/nn/modules/module.py") and "call_impl" in str(frame.get("name"))


def _is_module_py(frame: dict[str, Any]) -> bool:
    return str(frame.get("filename", "")).replace("\\", "/").endswith("torch/nn/modules/module.py")


def frame_stack(frames: Sequence[dict[str, Any]]) -> Stack:
    """The module calls that ``frames`` (innermost first) pass through, outermost first.

    Linear in the frames: each frame is looked at a fixed number of times (the caller of a
    module call, the first frame past it outside ``torch/nn/modules/module.py``, comes from
    one backward pass)."""
    frames = list(frames)
    n = len(frames)
    impl = [_is_call_impl(f) for f in frames]
    outside: list[int] = [n] * (n + 1)  # the first frame at or after i not in module.py
    for i in range(n - 1, -1, -1):
        outside[i] = outside[i + 1] if _is_module_py(frames[i]) else i
    out: list[tuple[str, str]] = []
    for i, f in enumerate(frames):
        name = str(f.get("name", ""))
        if name.startswith(_MODULE_PREFIX):
            label = name[len(_MODULE_PREFIX) :]
            out.append((label, label.rsplit("_", 1)[0]))
        elif i + 1 < n and impl[i + 1] and not impl[i]:
            j = outside[i + 1]
            caller = frames[j] if j < n else None
            site = f"{_stem(str(caller['filename']))}:{caller.get('line', 0)}" if caller else "?"
            out.append((site, f"{_stem(str(f.get('filename', '')))}.{name}"))
    return tuple(reversed(out))


class _Shape:
    """Checks of a recording's parts as they are read: each wrong one a :class:`SnapshotError`
    that says where (``device_traces[0][3]['size']``) and what it holds."""

    def __init__(self, shown: str) -> None:
        self.shown = shown

    def wrong(self, where: str, value: Any, expected: str) -> SnapshotError:
        got = repr(value)
        got = got if len(got) <= 60 else got[:57] + "..."
        return SnapshotError(
            f"{self.shown}: {where} is {got}, not {expected}: not a recording PyTorch wrote "
            "(damaged, or built by hand?)."
        )

    def whole(self, value: Any, where: str, low: int | None = None) -> int:
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or (low is not None and value < low)
        ):
            raise self.wrong(where, value, "a whole number" + (f" >= {low}" if low else ""))
        return value

    def number(self, value: Any, where: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            raise self.wrong(where, value, "a number")
        return float(value)

    def obj(self, value: Any, where: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.wrong(where, value, "a dict")
        return value

    def items(self, value: Any, where: str) -> list[Any]:
        if not isinstance(value, list):
            raise self.wrong(where, value, "a list")
        return value

    def text(self, value: Any, where: str) -> str:
        if not isinstance(value, str):
            raise self.wrong(where, value, "a string")
        return value

    def frames(self, value: Any, where: str) -> list[dict[str, Any]]:
        frames = self.items(value if value is not None else [], where)
        for k, f in enumerate(frames):
            self.obj(f, f"{where}[{k}]")
        return frames

    def tid(self, value: Any, where: str) -> Any:
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, str))):
            raise self.wrong(where, value, "a thread id (a number or a string)")
        return value


def _check_snapshot(data: Any, shown: str) -> None:
    if not isinstance(data, dict) or not isinstance(data.get("device_traces"), list):
        raise SnapshotError(
            f"{shown} is not a CUDA memory snapshot: expected a dict with 'device_traces' and "
            "'segments' (torch.cuda.memory._snapshot()). A snapshot taken without "
            "torch.cuda.memory._record_memory_history() running has no trace to show."
        )


def _pick_device(traces: list[Any], device: int | None, shown: str) -> int:
    if device is None:
        sizes = [len(t) if isinstance(t, list) else 0 for t in traces]
        if not any(sizes):
            raise SnapshotError(
                f"{shown}: the snapshot's device_traces are empty: record with "
                "torch.cuda.memory._record_memory_history() before the run, then snapshot."
            )
        return sizes.index(max(sizes))
    if not 0 <= device < len(traces):
        raise SnapshotError(f"{shown}: no device {device}; it has {len(traces)} device traces.")
    return device


def _allocated_at_end(segments: Any, device: int, shape: _Shape) -> int:
    total = 0
    for i, seg in enumerate(shape.items(segments, "segments")):
        seg = shape.obj(seg, f"segments[{i}]")
        if seg.get("device", device) != device:
            continue
        for k, b in enumerate(shape.items(seg.get("blocks", []), f"segments[{i}]['blocks']")):
            where = f"segments[{i}]['blocks'][{k}]"
            b = shape.obj(b, where)
            if b.get("state") in _ALLOCATED_STATES:
                total += shape.whole(b.get("size", 0), f"{where}['size']", 0)
    return total


def from_snapshot(data: Any, shown: str, device: int | None = None) -> SnapshotTimeline:
    """The timeline of a snapshot dict (see the module docstring), for ``device`` (its index in
    ``device_traces``; default: the one with the most events). A part of the wrong shape (an
    event that is no dict, a size that is no whole number...) is a :class:`SnapshotError`."""
    _check_snapshot(data, shown)
    shape = _Shape(shown)
    traces = data["device_traces"]
    index = _pick_device(traces, device, shown)
    calls = _Calls(f"memory snapshot (device {index})")
    out = SnapshotTimeline("snapshot", f"cuda:{index}")
    stacks: dict[int, Stack] = {}  # by the frames list: events often share one
    delta = 0
    for k, e in enumerate(shape.items(traces[index], f"device_traces[{index}]")):
        where = f"device_traces[{index}][{k}]"
        e = shape.obj(e, where)
        action = shape.text(e.get("action", ""), f"{where}['action']")
        size = shape.whole(e.get("size", 0), f"{where}['size']", 0)
        change = size if action == "alloc" else -size if action == "free_completed" else 0
        delta += change
        out.live.append(delta)
        out.actions.append(action)
        out.sizes.append(change)
        frames = e.get("frames")
        stack = stacks.get(id(frames))
        if stack is None:
            stack = stacks[id(frames)] = frame_stack(shape.frames(frames, f"{where}['frames']"))
        out.event_call.append(calls.at(stack))
    out.baseline_bytes = _allocated_at_end(data.get("segments", []), index, shape) - delta
    out.live = [out.baseline_bytes + x for x in out.live]
    out.modules, out.calls = calls.modules, calls.calls
    return out


def _module_spans(
    events: list[dict[str, Any]], shape: _Shape
) -> dict[Any, list[tuple[float, float, str]]]:
    """Per thread, the ``nn.Module: ...`` Python events as (start, end, label), by start."""
    spans: dict[Any, list[tuple[float, float, str]]] = {}
    for k, e in enumerate(events):
        name = str(e.get("name", ""))
        if e.get("ph") == "X" and name.startswith(_MODULE_PREFIX):
            where = f"traceEvents[{k}]"
            start = shape.number(e.get("ts", 0), f"{where}['ts']")
            end = start + shape.number(e.get("dur", 0), f"{where}['dur']")
            tid = shape.tid(e.get("tid"), f"{where}['tid']")
            spans.setdefault(tid, []).append((start, end, name[len(_MODULE_PREFIX) :]))
    for v in spans.values():
        v.sort(key=lambda s: (s[0], -s[1]))
    return spans


class _Enclosing:
    """The module spans enclosing each time, asked in increasing time per thread (a sweep)."""

    def __init__(self, spans: dict[Any, list[tuple[float, float, str]]]) -> None:
        self.spans = spans
        self.state: dict[Any, tuple[int, list[tuple[float, float, str]]]] = {}

    def at(self, tid: Any, ts: float) -> Stack:
        spans = self.spans.get(tid, [])
        ptr, stack = self.state.get(tid, (0, []))
        while ptr < len(spans) and spans[ptr][0] <= ts:
            while stack and stack[-1][1] < spans[ptr][0]:
                stack.pop()
            stack.append(spans[ptr])
            ptr += 1
        while stack and stack[-1][1] < ts:
            stack.pop()
        self.state[tid] = (ptr, stack)
        return tuple((label, label.rsplit("_", 1)[0]) for _, _, label in stack)


def _trace_device(args: dict[str, Any], where: str, shape: _Shape) -> str:
    kind = shape.whole(args.get("Device Type", 0), f"{where}['Device Type']")
    index = shape.whole(args.get("Device Id", 0), f"{where}['Device Id']")
    return f"cuda:{index}" if kind == 1 else "cpu"


def from_trace(data: Any, shown: str, device: str | None = None) -> SnapshotTimeline:
    """The timeline of a chrome trace's ``[memory]`` events on ``device`` (default: CUDA's
    first device if it has events, else the CPU); modules from its ``nn.Module`` events. A
    part of the wrong shape is a :class:`SnapshotError`."""
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise SnapshotError(f"{shown} is not a chrome trace: no 'traceEvents' list.")
    shape = _Shape(shown)
    dicts = [(k, e) for k, e in enumerate(events) if isinstance(e, dict)]
    memory = []
    for k, e in dicts:
        if e.get("name") == "[memory]":
            where = f"traceEvents[{k}]"
            args = shape.obj(e.get("args", {}), f"{where}['args']")
            memory.append(
                (
                    shape.number(e.get("ts", 0), f"{where}['ts']"),
                    shape.tid(e.get("tid"), f"{where}['tid']"),
                    shape.whole(args.get("Bytes", 0), f"{where}['args']['Bytes']"),
                    shape.whole(
                        args.get("Total Allocated", 0), f"{where}['args']['Total Allocated']", 0
                    ),
                    _trace_device(args, f"{where}['args']", shape),
                )
            )
    if not memory:
        raise SnapshotError(
            f"{shown} has no [memory] events: profile with torch.profiler.profile("
            "profile_memory=True) (and with_stack=True to see modules)."
        )
    devices = [m[4] for m in memory]
    chosen = device or next((d for d in devices if d.startswith("cuda")), "cpu")
    if chosen not in devices:
        raise SnapshotError(f"{shown}: no [memory] events on {chosen!r}; it has {set(devices)}.")
    picked = sorted((m for m in memory if m[4] == chosen), key=lambda m: m[0])
    enclosing = _Enclosing(_module_spans([e for _, e in dicts], shape))
    calls = _Calls(f"profiler trace ({chosen})")
    out = SnapshotTimeline("profiler", chosen)
    for ts, tid, size, total, _ in picked:
        out.live.append(total)
        out.actions.append("alloc" if size >= 0 else "free")
        out.sizes.append(size)
        out.event_call.append(calls.at(enclosing.at(tid, ts)))
    out.baseline_bytes = out.live[0] - out.sizes[0]
    out.modules, out.calls = calls.modules, calls.calls
    return out
