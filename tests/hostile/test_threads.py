"""One model analyzed from two threads at once (issue 10.7): a clear error, never wrong results.

A trace changes state a thread cannot own alone (``training`` flags and ``.grad`` of the
module, hooks on it), so a module (or a sub-module shared with another model) is traced by one
trace at a time: a second one raises ``ConcurrentTraceError`` at once. Different models trace
in parallel, each recording only its own calls, and the garbage collector switch is restored
only when the last trace ends.
"""

from __future__ import annotations

import gc
import threading
from typing import Any

import pytest
import torch

import meta_widget as mw
from meta_widget.trace.passes import ConcurrentTraceError, _claims, _GcPause


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x).relu())


class Gate(torch.nn.Module):
    """Holds the first trace inside its forward until the test lets it go."""

    def __init__(self) -> None:
        super().__init__()
        self.inside = threading.Event()
        self.go = threading.Event()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.inside.set()
        assert self.go.wait(timeout=60), "the test never let the trace go"
        return x


def _meta(module: torch.nn.Module) -> torch.nn.Module:
    return module.to_empty(device="meta")


def _in_thread(work: Any) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = work()
        except BaseException as exc:  # handed to the test thread to assert on
            out["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def _calls(a: Any) -> list[tuple[str, int]]:
    df = a.to_dataframe()
    return list(zip(df["module"], df["calls"], strict=True))


def test_the_same_module_from_two_threads_is_a_clear_error() -> None:
    gate = Gate()
    model = _meta(torch.nn.Sequential(gate, Net()))
    alone = mw.analyze(_meta(torch.nn.Sequential(Net())), input_size=(2, 8))
    gate.go.set()
    single = _calls(mw.analyze(model, input_size=(2, 8)))
    gate.go.clear()
    gate.inside.clear()

    first, out = _in_thread(lambda: mw.analyze(model, input_size=(2, 8), mode="training"))
    try:
        assert gate.inside.wait(timeout=60)  # the first trace is running, hooks installed
        with pytest.raises(ConcurrentTraceError, match="being analyzed already"):
            mw.analyze(model, input_size=(2, 8))
        # the sub-module alone, too: its flags and grads are the first trace's
        with pytest.raises(ConcurrentTraceError, match=r"Net"):
            mw.analyze(model[1], input_size=(2, 8))
    finally:
        gate.go.set()
        first.join()
    assert "error" not in out, out.get("error")
    # the first trace saw only its own calls: one per module, as a single-threaded run
    assert _calls(out["result"]) == single
    assert out["result"].error is None and alone.error is None
    # and the module can be analyzed again once it returned
    assert _calls(mw.analyze(model, input_size=(2, 8))) == single
    assert not _claims


def test_two_models_in_two_threads_are_both_right() -> None:
    gate_a, gate_b = Gate(), Gate()
    model_a = _meta(torch.nn.Sequential(gate_a, Net()))
    model_b = _meta(torch.nn.Sequential(gate_b, Net(), Net()))
    for gate in (gate_a, gate_b):
        gate.go.set()
    want_a = _calls(mw.analyze(model_a, input_size=(2, 8), mode="training"))
    want_b = _calls(mw.analyze(model_b, input_size=(3, 8)))
    for gate in (gate_a, gate_b):
        gate.go.clear()
        gate.inside.clear()
    gc_was = gc.isenabled()

    ta, out_a = _in_thread(lambda: mw.analyze(model_a, input_size=(2, 8), mode="training"))
    tb, out_b = _in_thread(lambda: mw.analyze(model_b, input_size=(3, 8)))
    try:
        assert gate_a.inside.wait(timeout=60) and gate_b.inside.wait(timeout=60)
        # both traces are running at once: each analysis holds the pause, and its trace too
        assert len(_GcPause.holders) == 4
        assert not gc.isenabled()
        gate_a.go.set()
        ta.join()
        assert not gc.isenabled()  # the other trace still runs
    finally:
        gate_a.go.set()
        gate_b.go.set()
        ta.join()
        tb.join()
    assert gc.isenabled() == gc_was  # back on once the last trace ended
    assert "error" not in out_a and "error" not in out_b
    assert _calls(out_a["result"]) == want_a
    assert _calls(out_b["result"]) == want_b
    assert (
        out_a["result"].total_flops
        == mw.analyze(model_a, input_size=(2, 8), mode="training").total_flops
    )


def test_calls_from_another_thread_are_not_recorded() -> None:
    """The user's own thread running the module during a trace adds nothing to the trace."""
    gate = Gate()
    model = _meta(torch.nn.Sequential(gate, Net()))
    gate.go.set()
    single = _calls(mw.analyze(model, input_size=(2, 8)))
    gate.go.clear()
    gate.inside.clear()
    first, out = _in_thread(lambda: mw.analyze(model, input_size=(2, 8)))
    try:
        assert gate.inside.wait(timeout=60)
        model[1](torch.empty(2, 8, device="meta"))  # a call of this (test) thread
    finally:
        gate.go.set()
        first.join()
    assert _calls(out["result"]) == single
