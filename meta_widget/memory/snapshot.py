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

import gzip
import io
import json
import os
import pickle
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any

from ..errors import MetaWidgetError

__all__ = ["SnapshotError", "SnapshotTimeline", "from_snapshot", "from_trace", "read_recording"]

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


class _NoGlobals(pickle.Unpickler):
    """Builds dicts, lists, strings and numbers; refuses every global and persistent id."""

    def find_class(self, module: str, name: str) -> Any:
        raise SnapshotError(
            f"this snapshot pickle names the global {module}.{name}: a memory snapshot holds "
            "only dicts, lists, strings and numbers, so it was refused unread (nothing was "
            "imported or run). Check where the file came from."
        )

    def persistent_load(self, pid: Any) -> Any:
        raise SnapshotError(
            "this snapshot pickle holds a persistent id (a torch.save file?): not a memory "
            "snapshot; refused unread. Pass the file torch.cuda.memory._dump_snapshot wrote."
        )


def read_recording(data: bytes, shown: str) -> Any:
    """The recording in ``data``: a snapshot pickle (no globals allowed) or a trace's JSON."""
    if data[:1] == b"\x80":
        try:
            return _NoGlobals(io.BytesIO(data)).load()
        except SnapshotError:
            raise
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError) as exc:
            raise SnapshotError(f"{shown}: a damaged pickle ({exc}).") from exc
    try:
        return json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SnapshotError(
            f"{shown} is neither a memory snapshot pickle (torch.cuda.memory._dump_snapshot) nor "
            f"a chrome trace JSON (torch.profiler's export_chrome_trace): {exc}"
        ) from exc


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


def frame_stack(frames: Sequence[dict[str, Any]]) -> Stack:
    """The module calls that ``frames`` (innermost first) pass through, outermost first."""
    out: list[tuple[str, str]] = []
    for i, f in enumerate(frames):
        name = str(f.get("name", ""))
        if name.startswith(_MODULE_PREFIX):
            label = name[len(_MODULE_PREFIX) :]
            out.append((label, label.rsplit("_", 1)[0]))
        elif i + 1 < len(frames) and _is_call_impl(frames[i + 1]) and not _is_call_impl(f):
            caller = next((g for g in frames[i + 1 :] if not _is_module_py(g)), None)
            site = f"{_stem(caller['filename'])}:{caller.get('line', 0)}" if caller else "?"
            out.append((site, f"{_stem(str(f.get('filename', '')))}.{name}"))
    return tuple(reversed(out))


def _is_module_py(frame: dict[str, Any]) -> bool:
    return str(frame.get("filename", "")).replace("\\", "/").endswith("torch/nn/modules/module.py")


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


def _allocated_at_end(segments: Iterable[Any], device: int) -> int:
    total = 0
    for seg in segments:
        if isinstance(seg, dict) and seg.get("device", device) == device:
            for b in seg.get("blocks", []):
                if b.get("state") in _ALLOCATED_STATES:
                    total += int(b.get("size", 0))
    return total


def from_snapshot(data: Any, shown: str, device: int | None = None) -> SnapshotTimeline:
    """The timeline of a snapshot dict (see the module docstring), for ``device`` (its index in
    ``device_traces``; default: the one with the most events)."""
    _check_snapshot(data, shown)
    traces = data["device_traces"]
    index = _pick_device(traces, device, shown)
    calls = _Calls(f"memory snapshot (device {index})")
    out = SnapshotTimeline("snapshot", f"cuda:{index}")
    delta = 0
    for e in traces[index]:
        action = str(e.get("action", ""))
        size = int(e.get("size", 0))
        change = size if action == "alloc" else -size if action == "free_completed" else 0
        delta += change
        out.live.append(delta)
        out.actions.append(action)
        out.sizes.append(change)
        out.event_call.append(calls.at(frame_stack(e.get("frames") or [])))
    out.baseline_bytes = _allocated_at_end(data.get("segments", []), index) - delta
    out.live = [out.baseline_bytes + x for x in out.live]
    out.modules, out.calls = calls.modules, calls.calls
    return out


def _module_spans(events: list[dict[str, Any]]) -> dict[Any, list[tuple[float, float, str]]]:
    """Per thread, the ``nn.Module: ...`` Python events as (start, end, label), by start."""
    spans: dict[Any, list[tuple[float, float, str]]] = {}
    for e in events:
        name = str(e.get("name", ""))
        if e.get("ph") == "X" and name.startswith(_MODULE_PREFIX):
            start = float(e.get("ts", 0))
            spans.setdefault(e.get("tid"), []).append(
                (start, start + float(e.get("dur", 0)), name[len(_MODULE_PREFIX) :])
            )
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


def _trace_device(args: dict[str, Any]) -> str:
    kind = args.get("Device Type", 0)
    return f"cuda:{args.get('Device Id', 0)}" if kind == 1 else "cpu"


def from_trace(data: Any, shown: str, device: str | None = None) -> SnapshotTimeline:
    """The timeline of a chrome trace's ``[memory]`` events on ``device`` (default: CUDA's
    first device if it has events, else the CPU); modules from its ``nn.Module`` events."""
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise SnapshotError(f"{shown} is not a chrome trace: no 'traceEvents' list.")
    memory = [e for e in events if isinstance(e, dict) and e.get("name") == "[memory]"]
    if not memory:
        raise SnapshotError(
            f"{shown} has no [memory] events: profile with torch.profiler.profile("
            "profile_memory=True) (and with_stack=True to see modules)."
        )
    devices = [_trace_device(e.get("args", {})) for e in memory]
    chosen = device or next((d for d in devices if d.startswith("cuda")), "cpu")
    if chosen not in devices:
        raise SnapshotError(f"{shown}: no [memory] events on {chosen!r}; it has {set(devices)}.")
    picked = sorted(
        (e for e, d in zip(memory, devices, strict=True) if d == chosen),
        key=lambda e: float(e.get("ts", 0)),
    )
    enclosing = _Enclosing(_module_spans([e for e in events if isinstance(e, dict)]))
    calls = _Calls(f"profiler trace ({chosen})")
    out = SnapshotTimeline("profiler", chosen)
    for e in picked:
        args = e.get("args", {})
        size = int(args.get("Bytes", 0))
        out.live.append(int(args.get("Total Allocated", 0)))
        out.actions.append("alloc" if size >= 0 else "free")
        out.sizes.append(size)
        stack = enclosing.at(e.get("tid"), float(e.get("ts", 0)))
        out.event_call.append(calls.at(stack))
    out.baseline_bytes = out.live[0] - out.sizes[0]
    out.modules, out.calls = calls.modules, calls.calls
    return out


#: the most bytes a recording is read as (gunzipped): past it, ``load_snapshot`` stops reading
#: and says so (a gzip bomb, ``/dev/zero`` or a file far larger than a run's history would
#: otherwise fill the memory); ``max_bytes=`` raises it
MAX_BYTES = 2 * 2**30


def read_file(path: str | os.PathLike[str], max_bytes: int = MAX_BYTES) -> bytes:
    """The bytes of a recording's file, gunzipped when it is a ``.gz``, at most ``max_bytes``
    of them (``SnapshotError`` past that, having read no more than ``max_bytes + 1``)."""
    shown = os.fspath(path)
    try:
        with open(path, "rb") as raw:
            gzipped = raw.read(2) == b"\x1f\x8b"
            raw.seek(0)
            f = gzip.GzipFile(fileobj=raw) if gzipped else raw
            data = f.read(max_bytes + 1)
    except (OSError, EOFError) as exc:
        why = getattr(exc, "strerror", None) or str(exc)
        raise SnapshotError(f"cannot read {shown!r}: {why}.") from exc
    if len(data) > max_bytes:
        raise SnapshotError(
            f"{shown!r} holds more than max_bytes={max_bytes:,} bytes"
            f"{' once gunzipped' if gzipped else ''}: it was not read further. A recording "
            "that large is rare (a gzip bomb or the wrong file?); pass a larger max_bytes= to "
            "load_snapshot to read it anyway."
        )
    return data
