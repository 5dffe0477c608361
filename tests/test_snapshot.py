"""``mw.load_snapshot``: recorded memory histories in the widget's timeline.

No GPU here, so the CUDA snapshots are written by PyTorch's own snapshot format code
(``torch.cuda._memory_viz._profile_to_snapshot`` turns a real CPU profile into the dict
``torch.cuda.memory._snapshot()`` returns), or written out in that documented format with Python
frames as ``_record_memory_history(stacks="python")`` records them, which PyTorch's own
readers (``_memory_viz.segsum``, ``trace``) parse. Truths are computed here from the recordings'
own events; the profiler's from its event tree (not the chrome trace the loader reads).
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch._C._profiler import _EventType
from torch.cuda import _memory_viz
from torch.profiler import ProfilerActivity, profile

import meta_widget as mw


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 128), nn.GELU())


def profiled(**kw: Any) -> Any:
    m, x = model(), torch.randn(32, 64)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, **kw) as prof:
        y = m(x)
        del y
    return prof


def max_live(snapshot: dict[str, Any], device: int) -> int:
    """Live bytes over the device trace: the blocks allocated at the snapshot, less the
    trace's allocations, plus its completed frees, then alloc adds and free_completed removes."""
    at_end = sum(_memory_viz.calc_active(s) for s in snapshot["segments"] if s["device"] == device)
    trace = snapshot["device_traces"][device]
    allocs = sum(e["size"] for e in trace if e["action"] == "alloc")
    frees = sum(e["size"] for e in trace if e["action"] == "free_completed")
    live = peak = at_end - allocs + frees
    for e in trace:
        live += {"alloc": e["size"], "free_completed": -e["size"]}.get(e["action"], 0)
        peak = max(peak, live)
    return peak


def test_a_snapshot_written_by_pytorchs_own_code_loads_with_its_peak(tmp_path: Path) -> None:
    prof = profiled(record_shapes=True, with_stack=True)
    snapshot = _memory_viz._profile_to_snapshot(prof)
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(pickle.dumps(snapshot))
    s = mw.load_snapshot(path)
    expected = max_live(snapshot, 0)
    assert s.peak_bytes == expected
    # the model's weights and input were live before the trace: 4 * (64*256 + 256 + 256*128
    # + 128 + 32*64)
    assert s.baseline_bytes == 4 * (64 * 256 + 256 + 256 * 128 + 128 + 32 * 64)
    frame = s.to_dataframe()
    assert frame["live_bytes"].max() == expected
    assert {"Sequential_0.Linear_0", "Sequential_0.ReLU_0"} <= set(frame["module"])
    assert s.peak_module is not None and s.peak_module.startswith("Sequential_0.")
    assert mw.load_snapshot(snapshot).peak_bytes == expected  # the dict itself


def cuda_like_snapshot() -> dict[str, Any]:
    """A snapshot in ``torch.cuda.memory._snapshot()``'s format, frames as
    ``_record_memory_history(stacks="python")`` records them (innermost first)."""
    module_py = "/usr/lib/python3/site-packages/torch/nn/modules/module.py"

    def frames(*forwards: tuple[str, int]) -> list[dict[str, Any]]:
        """A stack through the module forwards at (file, line), innermost first."""
        out: list[dict[str, Any]] = []
        for file, line in forwards:
            out += [
                {"filename": file, "line": line, "name": "forward"},
                {"filename": module_py, "line": 1762, "name": "_call_impl"},
                {"filename": module_py, "line": 1751, "name": "_wrapped_call_impl"},
            ]
        out.append({"filename": "/home/u/train.py", "line": 12, "name": "<module>"})
        return out

    attn = frames(("/home/u/model.py", 30), ("/home/u/model.py", 51))
    mlp = frames(("/home/u/model.py", 40), ("/home/u/model.py", 52))
    mib = 2**20

    def ev(action: str, addr: int, size: int, f: list[dict[str, Any]]) -> dict[str, Any]:
        return {"action": action, "addr": addr, "size": size, "stream": 0, "frames": f,
                "time_us": 0}  # fmt: skip

    trace = [
        ev("segment_alloc", 0, 20 * mib, attn),
        ev("alloc", 0, 4 * mib, attn),
        ev("alloc", 4 * mib, 6 * mib, attn),
        ev("free_requested", 0, 4 * mib, attn),
        ev("free_completed", 0, 4 * mib, attn),
        ev("alloc", 10 * mib, 8 * mib, mlp),
        ev("free_requested", 4 * mib, 6 * mib, mlp),
        ev("free_completed", 4 * mib, 6 * mib, mlp),
    ]
    blocks = [
        {"size": 10 * mib, "requested_size": 0, "state": "inactive", "frames": []},
        {"size": 8 * mib, "requested_size": 8 * mib, "state": "active_allocated", "frames": mlp},
        {"size": 2 * mib, "requested_size": 0, "state": "inactive", "frames": []},
    ]
    weights = {"size": 3 * mib, "requested_size": 3 * mib, "state": "active_allocated",
               "frames": []}  # fmt: skip

    def segment(address: int, size: int, allocated: int, blocks: list[Any]) -> dict[str, Any]:
        return {
            "device": 0, "address": address, "total_size": size, "allocated_size": allocated,
            "active_size": allocated, "requested_size": allocated, "stream": 0,
            "segment_type": "large", "blocks": blocks,
        }  # fmt: skip

    return {
        "segments": [
            segment(0, 20 * mib, 8 * mib, blocks),
            segment(64 * mib, 3 * mib, 3 * mib, [weights]),
        ],
        "device_traces": [trace],
    }


def test_a_cuda_snapshot_with_python_frames_finds_its_modules(tmp_path: Path) -> None:
    snapshot = cuda_like_snapshot()
    assert "TOTAL MEM" in _memory_viz.trace(snapshot)  # PyTorch's own readers take it
    assert "segments: 2" in _memory_viz.segsum(snapshot)
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps(snapshot))
    s = mw.load_snapshot(str(path))
    mib = 2**20
    assert max_live(snapshot, 0) == 3 * mib + 4 * mib + 6 * mib + 8 * mib - 4 * mib
    assert s.peak_bytes == max_live(snapshot, 0)
    assert s.baseline_bytes == 3 * mib  # the weights' block, allocated before the trace
    # the modules: named by the file and line that called them, typed by their forward
    assert s.peak_module == "train:12.model:52"
    types = {kind for _, kind, _ in s.timeline.modules}
    assert "model.forward" in types
    assert set(s.to_dataframe()["module"]) == {"train:12.model:51", "train:12.model:52"}


def test_the_payload_draws_in_the_existing_timeline() -> None:
    s = mw.load_snapshot(cuda_like_snapshot())
    payload = s.to_payload()
    assert max(payload["timeline"]["bytes"]) == s.peak_bytes
    assert payload["totals"]["peak_bytes"] == s.peak_bytes
    assert payload["peak"]["module"] == s.peak_module
    calls = payload["calls"]
    assert len(calls["module"]) == len(calls["parent"]) == len(s.timeline.calls)
    assert all(-1 <= c < len(calls["module"]) for c in payload["timeline"]["call"])
    names = payload["modules"]["name"]
    assert [payload["strings"][i] for i in names][1:] == ["train:12", "model:51", "model:52"]
    json.dumps(payload)  # plain JSON
    w = s.widget()
    assert w.payload["title"] == s.title


def profiler_truth(prof: Any) -> int:
    """The CPU allocator's peak from the profiler's event tree: its total before the first
    allocation event plus the running sum of the allocations and frees, in time order."""
    events: list[tuple[int, int, int]] = []
    pending = list(prof.profiler.kineto_results.experimental_event_tree())
    while pending:
        node = pending.pop()
        if node.tag == _EventType.Allocation and node.extra_fields.device.type == "cpu":
            f = node.extra_fields
            events.append((node.start_time_ns, f.alloc_size, f.total_allocated))
        pending.extend(node.children)
    events.sort()
    live = events[0][2] - events[0][1]
    peak = live
    for _, size, _ in events:
        live += size
        peak = max(peak, live)
    return peak


def test_a_profiler_trace_loads_with_the_allocators_peak(tmp_path: Path) -> None:
    prof = profiled(with_stack=True)
    truth = profiler_truth(prof)
    from_object = mw.load_snapshot(prof)
    assert from_object.peak_bytes == truth
    assert truth >= 4 * 32 * 256  # the first Linear's output at least
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    from_file = mw.load_snapshot(path)
    assert from_file.peak_bytes == truth
    assert from_file.device == "cpu"
    modules = set(from_file.to_dataframe()["module"])
    assert "Sequential_0.Linear_0" in modules


class Hostile:
    def __reduce__(self) -> Any:
        return (os.system, ("touch /tmp/meta_widget_snapshot_pwned",))


def test_a_hostile_pickle_is_refused_unread(tmp_path: Path) -> None:
    marker = Path("/tmp/meta_widget_snapshot_pwned")
    marker.unlink(missing_ok=True)
    path = tmp_path / "evil.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [[Hostile()]]}))
    with pytest.raises(mw.SnapshotError, match=r"names the global .*system"):
        mw.load_snapshot(path)
    assert not marker.exists()
    with pytest.raises(mw.SnapshotError, match=r"not a CUDA memory snapshot|neither"):
        mw.load_snapshot(pickle.dumps({"weights": [1, 2]}))
    with pytest.raises(mw.SnapshotError, match="device_traces are empty"):
        mw.load_snapshot({"segments": [], "device_traces": [[]]})
    with pytest.raises(mw.SnapshotError, match="cannot read"):
        mw.load_snapshot(tmp_path / "missing.pickle")


def test_a_file_past_the_read_budget_is_not_read_further(tmp_path: Path) -> None:
    """A gzip bomb (64 MiB of zeros in 64 KiB) stops at ``max_bytes`` with a message, an
    endless file (``/dev/zero``) is refused unopened; a real trace under the budget still
    loads, gzipped or not."""
    import gzip

    bomb = tmp_path / "bomb.json.gz"
    with gzip.open(bomb, "wb") as f:
        for _ in range(64):
            f.write(bytes(2**20))
    assert bomb.stat().st_size < 2**20
    with pytest.raises(mw.SnapshotError, match=r"more than max_bytes=16,777,216 bytes once gunz"):
        mw.load_snapshot(bomb, max_bytes=16 * 2**20)
    if os.path.exists("/dev/zero"):
        with pytest.raises(mw.SnapshotError, match="not a regular file"):
            mw.load_snapshot("/dev/zero", max_bytes=2**20)  # refused before it is opened
    path = tmp_path / "trace.json"
    profiled().export_chrome_trace(str(path))
    size = path.stat().st_size
    with pytest.raises(mw.SnapshotError, match="max_bytes"):
        mw.load_snapshot(path, max_bytes=size - 1)
    assert mw.load_snapshot(path, max_bytes=size).peak_bytes > 0
    packed = tmp_path / "trace.json.gz"
    packed.write_bytes(gzip.compress(path.read_bytes()))
    assert mw.load_snapshot(packed, max_bytes=size).peak_bytes > 0
    for bad in (0, -1, True, 1.5):
        with pytest.raises(mw.SnapshotError, match="max_bytes must be a positive int"):
            mw.load_snapshot(path, max_bytes=bad)
