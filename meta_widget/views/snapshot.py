"""``mw.load_snapshot``: a CUDA memory snapshot or a profiler memory trace in the widget's
timeline, with the module of each event where its frames name one.

The numbers and how modules are found are defined in ``meta_widget.memory.snapshot``; this
module reads what the user passes (a path, the snapshot dict, the pickle's bytes, a profiler),
and shows it: a table of events, a plotly line, and the widget's payload (a module row per
module the frames name, a call per module call, the live bytes as the timeline).
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import heavy
from ..memory.snapshot import SnapshotError, SnapshotTimeline, from_snapshot, from_trace
from ..memory.snapshot_files import (
    MAX_BYTES,
    MAX_OBJECTS,
    check_objects,
    read_file,
    read_recording,
)
from ..units import format_bytes
from .protocol import Dictionary, encode_header, timeline_points

if TYPE_CHECKING:
    import pandas as pd
    import plotly.graph_objects as go

    from .widget import MetaWidget

__all__ = ["MemorySnapshot", "SnapshotError", "encode_snapshot", "load_snapshot"]


@dataclass(frozen=True)
class MemorySnapshot:
    """A recorded run's memory history (see :func:`load_snapshot`).

    ``peak_bytes`` is the largest live bytes after any event, ``baseline_bytes`` what was live
    before the first; ``timeline`` (``SnapshotTimeline``) holds the live bytes after each
    event, the events' actions and sizes, and the module calls found in their frames.
    Displayed in a notebook, it is the widget with this timeline.
    """

    timeline: SnapshotTimeline
    #: where it came from, in words (a path, "a snapshot dict", "a profiler")
    origin: str

    @property
    def peak_bytes(self) -> int:
        return self.timeline.peak_bytes

    @property
    def baseline_bytes(self) -> int:
        return self.timeline.baseline_bytes

    @property
    def device(self) -> str:
        return self.timeline.device

    @property
    def peak_module(self) -> str | None:
        """The path of the innermost module call at the peak ("" outside every module)."""
        at = self.timeline.peak_index
        if at is None:
            return None
        call = self.timeline.event_call[at]
        return self.timeline.module_path(self.timeline.calls[call][0]) if call >= 0 else ""

    @property
    def title(self) -> str:
        kind = "memory snapshot" if self.timeline.source == "snapshot" else "profiler trace"
        return f"{kind} ({self.device})"

    def __repr__(self) -> str:
        return (
            f"MemorySnapshot({self.title}: {len(self.timeline.live)} events, peak "
            f"{format_bytes(self.peak_bytes)} in {self.peak_module or 'no module'!r})"
        )

    def to_dataframe(self) -> pd.DataFrame:
        """One row per event: ``action``, ``bytes`` (+ allocated, - freed), ``live_bytes``
        after it, ``module`` (the innermost module call's path; "" outside every module)."""
        t = self.timeline
        paths = [t.module_path(row) for row, _ in t.calls]
        return heavy.pandas().DataFrame(
            {
                "action": t.actions,
                "bytes": t.sizes,
                "live_bytes": t.live,
                "module": [paths[c] if c >= 0 else "" for c in t.event_call],
            }
        )

    def figure(self) -> go.Figure:
        """The live bytes after each event, as a plotly line."""
        go = heavy.plotly_go()
        fig = go.Figure(go.Scatter(y=self.timeline.live, mode="lines", name="live bytes"))
        fig.update_layout(title=self.title, xaxis_title="event", yaxis_title="bytes")
        return fig

    def notes(self) -> list[str]:
        """What the numbers are, in words."""
        live = (
            "allocated blocks (alloc adds, free_completed removes)"
            if self.timeline.source == "snapshot"
            else "the allocator's Total Allocated of each [memory] event"
        )
        return [
            f"A recorded run ({self.origin}), not a prediction: the live bytes are {live}; "
            f"{format_bytes(self.baseline_bytes)} were live before the first event.",
            "Modules are those the events' frames name; shapes, FLOPs and output bytes are "
            "not in a recording.",
        ]

    def to_payload(self) -> dict[str, Any]:
        """The widget's payload (``encode_snapshot``)."""
        return encode_snapshot(self.timeline, self.title, self.notes())

    def widget(self) -> MetaWidget:
        """The widget showing this timeline (a new one each call)."""
        from .widget import MetaWidget

        return MetaWidget(payload=self.to_payload())

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        bundle = self.widget()._repr_mimebundle_(**kwargs)
        data, meta = bundle if isinstance(bundle, tuple) else (bundle, {})
        data["text/plain"] = repr(self)
        return data, meta


def encode_snapshot(s: SnapshotTimeline, title: str, notes: Sequence[str]) -> dict[str, Any]:
    """A recorded memory history (``meta_widget.memory.snapshot``) as a payload the widget's
    timeline draws (``meta_widget.views.protocol``'s format): a module row per module its
    frames name (row 0: the whole run), a call per module call (no shapes, FLOPs or output
    bytes: a recording has none), the live bytes after each event as the timeline (``op``: the
    allocator's action), the peak and its module."""
    d = Dictionary()
    n = len(s.modules)
    payload = encode_header([], d, title=title, source=s.source, mode="inference", status="done")
    payload["modules"] = {
        "name": [d.string(name) for name, _, _ in s.modules],
        "type": [d.string(kind) for _, kind, _ in s.modules],
        "parent": [parent for _, _, parent in s.modules],
        **{k: [0] * n for k in ("params", "param_bytes", "float_params")},
        "own_params": [[] for _ in range(n)],
    }
    c = len(s.calls)
    payload["calls"] = {
        "module": [row for row, _ in s.calls],
        "parent": [parent for _, parent in s.calls],
        **{k: [0] * c for k in ("flops", "self_flops", "activation_bytes", "duration_us")},
        **{k: [[] for _ in range(c)] for k in ("inputs", "outputs", "ops")},
    }
    keep = timeline_points(s.live, ["forward"] * len(s.live))
    payload["timeline"] = {
        "bytes": [s.live[i] for i in keep],
        "call": [s.event_call[i] for i in keep],
        "op": [d.string(s.actions[i]) for i in keep],
        "phase": [d.string("forward") for _ in keep],
        "event": list(keep),
    }
    payload["totals"] = {"peak_bytes": s.peak_bytes, "input_bytes": s.baseline_bytes}
    at = s.peak_index
    if at is not None:
        call = s.event_call[at]
        payload["peak"] = {
            "bytes": s.peak_bytes,
            "call": call,
            "module": s.module_path(s.calls[call][0]) if call >= 0 else "",
            "op": s.actions[at],
        }
    payload["device"] = s.device.split(":")[0]
    payload["notes"] = list(notes)
    return payload


def _is_profiler(obj: Any) -> bool:
    return type(obj).__module__.startswith("torch.profiler") and hasattr(obj, "export_chrome_trace")


def _from_profiler(prof: Any, device: str | None) -> SnapshotTimeline:
    if getattr(prof, "profiler", None) is None:
        raise SnapshotError(
            "this profiler was never run, so it holds no trace: record with `with "
            "torch.profiler.profile(profile_memory=True) as prof: ...` around the run (or "
            "prof.start() ... prof.stop()), then pass prof."
        )
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "trace.json")
        # PyTorch's Python exporter: the native one saves a profile once only (the user may
        # still export theirs after this)
        prof.export_chrome_trace(path, use_python_export=True)
        return from_trace(read_recording(read_file(path), "the profiler's trace"), "", device)


_CUDA = re.compile(r"cuda:(\d+)")


def _snapshot_device(device: int | str | None, shown: str) -> int | None:
    """``device=`` for a snapshot: the index of its device trace (``3`` or ``"cuda:3"``)."""
    if device is None or (isinstance(device, int) and not isinstance(device, bool)):
        return device
    m = _CUDA.fullmatch(device) if isinstance(device, str) else None
    if m is None:
        raise SnapshotError(
            f"{shown} is a CUDA memory snapshot: device= is the index of a device trace (0, "
            f"1, ... or 'cuda:N'), not {device!r}."
        )
    return int(m.group(1))


def _trace_device(device: int | str | None, shown: str) -> str | None:
    """``device=`` for a profiler trace: ``"cpu"`` or ``"cuda:N"`` (``N`` alone or ``"cuda"``
    mean the CUDA device ``N`` or 0)."""
    if device is None:
        return None
    if isinstance(device, int) and not isinstance(device, bool) and device >= 0:
        return f"cuda:{device}"
    if device == "cuda":
        return "cuda:0"
    if device == "cpu" or (isinstance(device, str) and _CUDA.fullmatch(device)):
        return device
    raise SnapshotError(
        f"{shown} is a profiler trace: device= is 'cpu' or 'cuda:N' (an int N for "
        f"'cuda:N'), not {device!r}."
    )


def _check_arguments(device: Any, max_bytes: Any, max_objects: Any) -> None:
    for name, value in (("max_bytes", max_bytes), ("max_objects", max_objects)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SnapshotError(f"load_snapshot: {name} must be a positive int, not {value!r}.")
    if device is not None and (isinstance(device, bool) or not isinstance(device, (int, str))):
        raise SnapshotError(
            "load_snapshot: device= is a device trace's index or 'cuda:N' for a snapshot, "
            f"'cpu' or 'cuda:N' for a profiler trace, not {device!r}."
        )


def _timeline(
    source: Any, device: int | str | None, max_bytes: int, max_objects: int
) -> tuple[SnapshotTimeline, str]:
    if _is_profiler(source):
        return _from_profiler(source, _trace_device(device, "a profiler")), "a profiler"
    if isinstance(source, (str, os.PathLike)):
        shown = os.fsdecode(os.fspath(source))
        data = read_recording(read_file(source, max_bytes, max_objects), shown)
    elif isinstance(source, (bytes, bytearray)):
        shown = "the bytes given"
        data = bytes(source)
        if len(data) > max_bytes:
            raise SnapshotError(f"{shown}: more than max_bytes={max_bytes:,} bytes.")
        if data[:1] not in (b"\x80", b"{", b"[") and len(data) < 4096 and os.path.isfile(data):
            raise SnapshotError(
                f"the bytes given ({data!r}) name a file, but bytes are read as a recording's "
                "content: pass the path as a str or pathlib.Path."
            )
        check_objects(data, shown, max_objects)
        data = read_recording(data, shown)
    elif isinstance(source, (dict, list)):
        shown, data = f"a {type(source).__name__}", source
    else:
        raise SnapshotError(
            f"load_snapshot cannot read a {type(source).__name__}: pass a path (a snapshot "
            "pickle or a chrome trace JSON), the dict torch.cuda.memory._snapshot() returns, "
            "or a torch.profiler.profile run with profile_memory=True."
        )
    if isinstance(data, dict) and "device_traces" in data:
        return from_snapshot(data, shown, _snapshot_device(device, shown)), shown
    if isinstance(data, list) or (isinstance(data, dict) and "traceEvents" in data):
        return from_trace(data, shown, _trace_device(device, shown)), shown
    raise SnapshotError(
        f"{shown} is neither a CUDA memory snapshot (a dict with 'device_traces') nor a "
        "chrome trace (a dict with 'traceEvents')."
    )


def load_snapshot(
    source: Any,
    *,
    device: int | str | None = None,
    max_bytes: int = MAX_BYTES,
    max_objects: int = MAX_OBJECTS,
) -> MemorySnapshot:
    """Read a recorded run's memory history, to show it in the widget's timeline.

    Parameters
    ----------
    source
        A CUDA memory snapshot: the path of the pickle ``torch.cuda.memory._dump_snapshot``
        writes (read by an unpickler that allows no global: a pickle naming any class or
        function is refused unread), its bytes, or the dict ``torch.cuda.memory._snapshot()``
        returns. Or a ``torch.profiler`` trace recorded with ``profile_memory=True``: the
        profiler itself, or the path of its ``export_chrome_trace`` JSON (``.gz`` too).
    device
        For a snapshot, the index of the device trace, ``N`` or ``"cuda:N"`` (default: the
        one with most events); for a profiler trace, ``"cpu"`` or ``"cuda:N"`` (``N`` alone
        too; default: CUDA's if it has events). Any other value is a ``SnapshotError``.
    max_bytes
        The most bytes a file is read as, gunzipped (default 2 GiB): past it nothing more is
        read and a ``SnapshotError`` says so (a gzip bomb: measured in 1 MiB pieces, never
        held whole).
    max_objects
        The most dicts and lists a file or bytes may build (default 5,000,000), an upper
        bound counted in the bytes before anything is built
        (``meta_widget.memory.snapshot_files``).

    Returns
    -------
    MemorySnapshot
        ``peak_bytes``, ``to_dataframe()`` (one row per event, with its module),
        ``figure()``, and the widget when displayed.

    Raises
    ------
    SnapshotError
        Not a snapshot or trace, damaged or of the wrong shape, without events, a pickle
        naming a global, a file that is not a regular file, past ``max_bytes`` or
        ``max_objects``, a profiler never run, or a ``device`` it has not.
    """
    _check_arguments(device, max_bytes, max_objects)
    timeline, shown = _timeline(source, device, max_bytes, max_objects)
    return MemorySnapshot(timeline, shown)
