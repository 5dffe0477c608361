"""What the widget is told while an analysis runs, before its first traced row (issue 40, warm
start): the ``waiting`` messages (``meta_widget.views.waiting``) in the order the pipeline goes
through its states, the module tree (``start``) before the trace's first call, and an ``error``
when the analysis stops before it has a result, so that no view waits on forever."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from make_fixtures import FIXTURES

import meta_widget as mw
from meta_widget.choices import WaitState
from meta_widget.options import OptionError
from meta_widget.views import protocol, waiting
from meta_widget.views.widget import MetaWidget

ROOT = Path(__file__).resolve().parents[1]


def captured() -> tuple[MetaWidget, list[dict[str, Any]]]:
    """A widget whose messages are kept as the front end receives them (JSON)."""
    view = MetaWidget()
    sent: list[dict[str, Any]] = []
    view.send = lambda m: sent.append(json.loads(json.dumps(m)))  # type: ignore[method-assign]
    return view, sent


def kinds(sent: list[dict[str, Any]]) -> list[str]:
    """The messages' types, a ``waiting`` one with its state, repeated ``calls`` once."""
    out: list[str] = []
    for m in sent:
        kind = f"waiting:{m['state']}" if m["type"] == "waiting" else m["type"]
        if not out or out[-1] != kind or kind != "calls":
            out.append(kind)
    return out


def model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def test_the_states_come_in_order_and_the_tree_before_the_first_call() -> None:
    view, sent = captured()
    a = mw.analyze(model(), input_size=(2, 4), widget=view, gpu="H100")
    assert kinds(sent) == [
        "waiting:build",
        "start",
        "waiting:trace",
        "calls",
        "waiting:analyze",
        "done",
    ]
    build, start, trace = sent[0], sent[1], sent[2]
    assert build["text"] == waiting.BUILD_TEXTS["module"] and build["elapsed_s"] == 0.0
    # the start carries the structural rows: every module, its type and parameters, no calls
    modules = start["payload"]["modules"]
    assert len(modules["parent"]) == len(a.modules) == 4
    assert modules["params"] == [m.params for m in a.modules]
    assert not start["payload"].get("calls", {}).get("module")
    assert trace["text"] == waiting.TRACE_TEXT
    analyze = next(m for m in sent if m["type"] == "waiting" and m["state"] == "analyze")
    assert "the time on H100" in analyze["text"]
    # the calls recorded before the analyze state are all sent before it
    calls = sum(len(m["calls"]["index"]) for m in sent if m["type"] == "calls")
    assert calls == len(a.calls)


def test_every_state_and_message_type_is_one_the_front_end_knows() -> None:
    with open(os.path.join(FIXTURES, "choices.json"), encoding="utf-8") as f:
        front = json.load(f)
    assert front["wait_states"] == [s.value for s in WaitState]
    assert "waiting" in front["kernel_messages"]
    assert "waiting" in protocol.MESSAGE_TYPES_TO_JS
    assert [s.value for s in waiting.ORDER] == front["wait_states"]


def test_the_build_says_what_is_built() -> None:
    view, sent = captured()
    mw.analyze(model, input_size=(2, 4), widget=view)  # a class: built on meta
    assert sent[0]["text"] == waiting.BUILD_TEXTS["factory"]
    config = pytest.importorskip("transformers").GPT2Config(
        n_layer=1, n_embd=16, n_head=2, vocab_size=50, n_positions=16
    )
    view, sent = captured()
    mw.analyze(config, input_size=(1, 4), widget=view)
    assert sent[0]["text"] == waiting.BUILD_TEXTS["config"]


def test_a_structural_analysis_ends_with_its_payload() -> None:
    view, sent = captured()
    mw.analyze(model(), widget=view)
    assert kinds(sent) == ["waiting:build"]
    assert view.payload["status"] == "structural"  # the views' payload ends the waiting


def test_a_failure_before_the_trace_is_sent_as_an_error() -> None:
    def broken() -> torch.nn.Module:
        raise ZeroDivisionError("the factory failed")

    view, sent = captured()
    with pytest.raises(ZeroDivisionError):
        mw.analyze(broken, input_size=(2, 4), widget=view)
    assert kinds(sent) == ["waiting:build", "error"]
    assert sent[-1]["error"]["type"] == "ZeroDivisionError"
    assert "the factory failed" in sent[-1]["error"]["message"]
    # an option that does not fit the model, found once it is built
    view, sent = captured()
    with pytest.raises(OptionError):
        mw.analyze(model(), input_size=(2, 4), widget=view, activation_checkpointing=["nope"])
    assert kinds(sent) == ["waiting:build", "error"]
    assert sent[-1]["error"]["type"] == "OptionError"


def test_a_rerun_says_its_states_too() -> None:
    view, sent = captured()
    a = mw.analyze(model(), input_size=(2, 4), widget=view)
    assert view.last_done is not None
    sent.clear()
    ended: list[object] = []  # what a view mounting at each message would be told ended
    send = view.send
    view.send = lambda m: (ended.append(view.last_done), send(m))  # type: ignore[method-assign]
    view.rerun(mode="training")
    assert ended[0] is None  # from its first state on, the last analysis is not "done"
    assert kinds(sent)[:3] == ["waiting:build", "start", "waiting:trace"]
    assert kinds(sent)[-2:] == ["waiting:analyze", "done"]
    assert view.analysis is not None and view.analysis is not a


WARM_UP = """
import json, threading
from meta_widget import warm
gate = threading.Event()
assert warm.start(gate.wait)  # a warm-up that ends when the widget has said it waits for it
import torch, meta_widget as mw
from meta_widget.views.widget import MetaWidget
view, sent = MetaWidget(), []
def send(m):
    sent.append(json.loads(json.dumps(m)))
    if m["type"] == "waiting" and m["state"] == "warm-up":
        gate.set()
view.send = send
mw.analyze(torch.nn.Linear(4, 5), input_size=(2, 4), widget=view)
print(json.dumps(sent[:4]))
"""


def test_the_widget_says_it_waits_for_the_warm_up() -> None:
    done = subprocess.run(
        [sys.executable, "-c", WARM_UP],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=True,
    )
    first, build, start, trace = json.loads(done.stdout.strip().splitlines()[-1])
    assert (first["type"], first["state"]) == ("waiting", "warm-up")
    assert first["text"] == waiting.WARM_UP_TEXT and first["elapsed_s"] >= 0
    assert (build["state"], start["type"], trace["state"]) == ("build", "start", "trace")
    assert trace["text"] == waiting.TRACE_TEXT


def test_a_pipeline_layout_shows_its_result_in_the_widget() -> None:
    from parallel_truth import tiny_llama_config

    view, sent = captured()
    x = torch.randint(0, 100, (4, 16))
    a = mw.analyze(
        tiny_llama_config(), input_data=x, mode="training", parallel={"pp": 2}, widget=view
    )
    assert kinds(sent) == ["waiting:build"]  # the stages are traced without a stream
    assert view.analysis is a and view.payload["status"] == "done"
