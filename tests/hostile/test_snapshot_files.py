"""``mw.load_snapshot`` of recordings built to exhaust memory or time, or of the wrong shape.

Bombs are measured, never timed: the truth for memory is ``tracemalloc``'s peak of Python
allocations while ``load_snapshot`` runs (the old reader held a gzip bomb's ``max_bytes`` and built
a pickle's 20,000,000 dicts, 1.5-2.1 GB, before refusing); for work, a list of frames that counts
every element handed out (iterated or indexed: a slice counts its length), against the frames
there are (the old search for each module call's caller sliced the rest of the stack: quadratic).
Each malformed recording is one line of ``SnapshotError`` that names the part that is wrong.
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
import threading
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import meta_widget as mw

MiB = 2**20


def peak_while(call: Callable[[], Any]) -> tuple[BaseException | None, int]:
    """(the exception ``call`` raised or None, the peak of Python allocations meanwhile)."""
    tracemalloc.start()
    try:
        call()
    except Exception as exc:
        return exc, tracemalloc.get_traced_memory()[1]
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return None, peak


def gzip_pieces(path: Path, pieces: Iterator[bytes]) -> Path:
    with gzip.open(path, "wb", compresslevel=9) as f:
        for piece in pieces:
            f.write(piece)
    return path


def empty_dicts_pickle(n: int) -> Iterator[bytes]:
    """A protocol-2 pickle of a list of ``n`` distinct empty dicts, written in batches."""
    yield b"\x80\x02]("
    batch = b"}" * 1000 + b"e("
    for _ in range(n // 1000):
        yield batch
    yield b"e."


def held(device: int, size: int) -> list[dict[str, Any]]:
    """A snapshot's segments with ``size`` bytes allocated on ``device`` at its end."""
    return [{"device": device, "blocks": [{"state": "active_allocated", "size": size}]}]


def one_line(exc: BaseException | None) -> str:
    assert isinstance(exc, mw.SnapshotError), repr(exc)
    assert "\n" not in str(exc)
    return str(exc)


# -- 5. bombs --------------------------------------------------------------------------------------


def test_a_pickle_of_20m_empty_dicts_is_refused_before_building(tmp_path: Path) -> None:
    bomb = gzip_pieces(tmp_path / "dicts.pickle.gz", empty_dicts_pickle(20_000_000))
    assert bomb.stat().st_size < 64 * 1024  # ~20 KB on disk
    exc, peak = peak_while(lambda: mw.load_snapshot(bomb))
    assert "max_objects=5,000,000" in one_line(exc)
    assert peak < 8 * MiB, peak  # one 1 MiB piece at a time, never the 20 MB pickle


def test_a_json_list_of_empty_objects_is_refused_before_building(tmp_path: Path) -> None:
    n = 15_000_000
    pieces = iter([b"[", *([b"{}, " * 100_000] * (n // 100_000)), b"{}]"])
    bomb = gzip_pieces(tmp_path / "objects.json.gz", pieces)
    assert bomb.stat().st_size < 128 * 1024
    exc, peak = peak_while(lambda: mw.load_snapshot(bomb))
    assert "max_objects" in one_line(exc)
    assert peak < 8 * MiB, peak


def test_a_gzip_bomb_is_measured_in_pieces(tmp_path: Path) -> None:
    bomb = gzip_pieces(tmp_path / "zeros.gz", iter([bytes(MiB)] * 256))  # 256 MiB of zeros
    assert bomb.stat().st_size < 512 * 1024
    exc, peak = peak_while(lambda: mw.load_snapshot(bomb, max_bytes=128 * MiB))
    assert "more than max_bytes=134,217,728 bytes once gunzipped" in one_line(exc)
    assert peak < 8 * MiB, peak  # the old reader held the 128 MiB it was allowed


def test_a_legitimate_snapshot_under_the_bounds_still_loads(tmp_path: Path) -> None:
    events = [{"action": "alloc", "size": 512, "frames": []}] * 3
    snap = {"segments": held(0, 1536), "device_traces": [events]}
    path = tmp_path / "snap.pickle.gz"
    path.write_bytes(gzip.compress(pickle.dumps(snap)))
    assert mw.load_snapshot(path).peak_bytes == 1536
    with pytest.raises(mw.SnapshotError, match="max_objects=2"):
        mw.load_snapshot(path, max_objects=2)
    for bad in (0, True, 1.5):
        with pytest.raises(mw.SnapshotError, match="max_objects must be a positive int"):
            mw.load_snapshot(path, max_objects=bad)


class CountingFrames(list):  # type: ignore[type-arg]
    """A list of frames that counts every element it hands out, and stops the test past
    ``budget`` (the quadratic reader would otherwise run for minutes)."""

    def __init__(self, items: list[dict[str, Any]], budget: int) -> None:
        super().__init__(items)
        self.handed = 0
        self.budget = budget

    def _count(self, n: int) -> None:
        self.handed += n
        if self.handed > self.budget:
            raise AssertionError(f"{self.handed:,} frame reads for {len(self):,} frames")

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for item in super().__iter__():
            self._count(1)
            yield item

    def __getitem__(self, key: Any) -> Any:
        got = super().__getitem__(key)
        self._count(len(got) if isinstance(key, slice) else 1)
        return got


def module_frames(depth: int) -> list[dict[str, Any]]:
    """A stack (innermost first) of ``depth`` nested module calls, as a Python-stack snapshot
    records them: each module's forward, then module.py's ``_call_impl`` that called it."""
    impl = {"filename": "/x/torch/nn/modules/module.py", "name": "_call_impl", "line": 1}
    out: list[dict[str, Any]] = []
    for k in range(depth):
        out += [{"filename": f"/src/block{k}.py", "name": "forward", "line": k}, impl]
    return out


def test_events_sharing_a_deep_stack_are_read_in_linear_work() -> None:
    depth = 100_000  # 200,000 frames
    frames = CountingFrames(module_frames(depth), budget=50 * 2 * depth)
    events = [{"action": "alloc", "size": 8, "frames": frames} for _ in range(10)]
    s = mw.load_snapshot({"segments": held(0, 80), "device_traces": [events]})
    assert frames.handed <= 10 * len(frames)  # each event may read them once, no more
    assert len(s.timeline.calls) == depth  # one call per module, shared by the 10 events
    assert s.peak_bytes == 80


def test_a_small_stack_reads_its_modules(tmp_path: Path) -> None:
    events = [{"action": "alloc", "size": 8, "frames": module_frames(3)}] * 2
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [events]}))
    s = mw.load_snapshot(path)
    # outermost first; each named by the line that called it (the outermost's caller is not
    # in the stack): block2 is called from outside, block1 from block2's line 2...
    names = [(m[0], m[1]) for m in s.timeline.modules[1:]]
    assert names == [
        ("?", "block2.forward"),
        ("block2:2", "block1.forward"),
        ("block1:1", "block0.forward"),
    ]
    assert len(s.timeline.calls) == 3 and s.peak_module == "?.block2:2.block1:1"


# -- 14. malformed recordings ----------------------------------------------------------------

OK_EVENT = {"action": "alloc", "size": 8, "frames": []}
MEMORY = {
    "name": "[memory]",
    "ph": "i",
    "ts": 1,
    "tid": 1,
    "args": {"Bytes": 8, "Total Allocated": 8},
}
MALFORMED: dict[str, tuple[Any, str]] = {
    "event a number": ({"segments": [], "device_traces": [[1]]}, "device_traces[0][0] is 1"),
    "size a word": (
        {"device_traces": [[{**OK_EVENT, "size": "big"}]]},
        "device_traces[0][0]['size'] is 'big'",
    ),
    "size a float": ({"device_traces": [[{**OK_EVENT, "size": 1.5}]]}, "['size'] is 1.5"),
    "size a bool": ({"device_traces": [[{**OK_EVENT, "size": True}]]}, "['size'] is True"),
    "size negative": ({"device_traces": [[{**OK_EVENT, "size": -8}]]}, "['size'] is -8"),
    "action a list": ({"device_traces": [[{**OK_EVENT, "action": ["alloc"]}]]}, "['action']"),
    "frames a string": ({"device_traces": [[{**OK_EVENT, "frames": "x"}]]}, "['frames'] is 'x'"),
    "a frame a number": ({"device_traces": [[{**OK_EVENT, "frames": [1]}]]}, "['frames'][0] is 1"),
    "segments a number": ({"segments": 5, "device_traces": [[OK_EVENT]]}, "segments is 5"),
    "a segment a list": ({"segments": [[1]], "device_traces": [[OK_EVENT]]}, "segments[0] is [1]"),
    "blocks a number": (
        {"segments": [{"device": 0, "blocks": 5}], "device_traces": [[OK_EVENT]]},
        "segments[0]['blocks'] is 5",
    ),
    "a block size a word": (
        {
            "segments": [{"blocks": [{"state": "active_allocated", "size": "x"}]}],
            "device_traces": [[OK_EVENT]],
        },
        "segments[0]['blocks'][0]['size'] is 'x'",
    ),
    "trace args a number": (
        {"traceEvents": [{**MEMORY, "args": 5}]},
        "traceEvents[0]['args'] is 5",
    ),
    "trace bytes a word": (
        {"traceEvents": [{**MEMORY, "args": {"Bytes": "x", "Total Allocated": 8}}]},
        "['args']['Bytes'] is 'x'",
    ),
    "trace time a word": (
        {"traceEvents": [{**MEMORY, "ts": "soon"}]},
        "traceEvents[0]['ts'] is 'soon'",
    ),
    "trace thread a list": (
        {
            "traceEvents": [
                {**MEMORY, "tid": [1]},
                {"ph": "X", "name": "nn.Module: A_0", "tid": [1], "ts": 0, "dur": 5},
            ]
        },
        "['tid'] is [1]",
    ),
    "trace total a null": (
        {"traceEvents": [{**MEMORY, "args": {"Bytes": 8, "Total Allocated": None}}]},
        "['Total Allocated'] is None",
    ),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_recording_is_one_line_naming_the_part(case: str, tmp_path: Path) -> None:
    data, said = MALFORMED[case]
    with pytest.raises(mw.SnapshotError) as info:
        mw.load_snapshot(data)
    assert said in one_line(info.value)
    path = tmp_path / "recording.json"  # the same through a file
    path.write_text(json.dumps(data))
    with pytest.raises(mw.SnapshotError) as info:
        mw.load_snapshot(path)
    assert said in one_line(info.value)


def test_json_nested_deep_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "deep.json"
    path.write_text('{"traceEvents": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(mw.SnapshotError) as info:
        mw.load_snapshot(path)
    assert "nested too deep" in one_line(info.value)


def test_a_profiler_never_entered_is_one_line() -> None:
    prof = torch.profiler.profile(profile_memory=True)
    with pytest.raises(mw.SnapshotError) as info:
        mw.load_snapshot(prof)
    assert "never run" in one_line(info.value)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_is_refused_without_opening_it(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    done = threading.Event()

    def unblock() -> None:
        """Should the reader block in open(), a writer that comes and goes lets it return."""
        while not done.wait(0.5):
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                continue  # no reader waiting: nothing to unblock

    helper = threading.Thread(target=unblock, daemon=True)
    helper.start()
    try:
        with pytest.raises(mw.SnapshotError) as info:
            mw.load_snapshot(fifo)
    finally:
        done.set()
        helper.join()
    assert "not a regular file" in one_line(info.value)


SNAPSHOT = {
    "segments": held(0, 4) + held(1, 16),
    "device_traces": [[{**OK_EVENT, "size": 4}], [OK_EVENT, OK_EVENT]],
}
TRACE = {"traceEvents": [MEMORY]}


def test_device_values_are_used_or_refused() -> None:
    assert mw.load_snapshot(SNAPSHOT).device == "cuda:1"  # the most events
    assert mw.load_snapshot(SNAPSHOT, device=0).peak_bytes == 4
    assert mw.load_snapshot(SNAPSHOT, device="cuda:0").peak_bytes == 4  # the same device
    with pytest.raises(mw.SnapshotError, match="no device 2"):
        mw.load_snapshot(SNAPSHOT, device="cuda:2")
    for bad in ("gpu", "cpu", True, 1.5, [0]):
        with pytest.raises(mw.SnapshotError, match="device="):
            mw.load_snapshot(SNAPSHOT, device=bad)  # type: ignore[arg-type]
    assert mw.load_snapshot(TRACE, device="cpu").device == "cpu"
    with pytest.raises(mw.SnapshotError, match="no \\[memory\\] events on 'cuda:0'"):
        mw.load_snapshot(TRACE, device=0)  # the CUDA device 0, which this trace has not
    for bad in ("gpu", True, -1, 1.5):
        with pytest.raises(mw.SnapshotError, match="device="):
            mw.load_snapshot(TRACE, device=bad)  # type: ignore[arg-type]


def test_bytes_naming_a_file_say_so(tmp_path: Path) -> None:
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps(SNAPSHOT))
    assert mw.load_snapshot(path.read_bytes()).peak_bytes == 16  # bytes are the content
    with pytest.raises(mw.SnapshotError) as info:
        mw.load_snapshot(os.fsencode(path))
    assert "as a str or pathlib.Path" in one_line(info.value)
