"""The memory timeline split by category: at every event the categories add up to the live
bytes; at the peak they are the peak's categories; the payload keeps the same points."""

from __future__ import annotations

import pytest
from models import gpt2_config, llama_config

import meta_widget as mw
from meta_widget.views.protocol import encode_analysis


@pytest.mark.parametrize("mode", ["inference", "training"])
def test_category_series_add_up_to_the_timeline_and_equal_the_peak_categories(mode: str) -> None:
    for model in (gpt2_config(), llama_config()):
        a = mw.analyze(model, input_size=(2, 16), mode=mode)
        assert a.error is None
        mem = a.memory
        series = mem.timeline_categories
        assert all(len(s) == len(mem.timeline) for s in series.values())
        for i, (live, _, _) in enumerate(mem.timeline):
            assert sum(s[i] for s in series.values()) == live
        peak = max(range(len(mem.timeline)), key=lambda i: mem.timeline[i][0])
        assert {c: s[peak] for c, s in series.items()} == mem.categories
        assert series["activations"][peak] > 0
        if mode == "training":
            assert series["gradients"][-1] == mem.gradient_bytes > 0
            assert series["optimizer state"][-1] == mem.optimizer_state_bytes > 0


def test_payload_sends_the_category_series_at_the_timeline_points() -> None:
    a = mw.analyze(llama_config(), input_size=(2, 16), mode="training")
    tl = encode_analysis(a)["timeline"]
    cats = tl["categories"]
    assert {"parameters", "activations", "gradients", "optimizer state"} <= set(cats)
    assert all(len(s) == len(tl["bytes"]) for s in cats.values())
    for i, live in enumerate(tl["bytes"]):
        assert sum(s[i] for s in cats.values()) == live
    assert max(tl["bytes"]) == a.peak_bytes


def test_timeline_figure_stacks_the_categories_under_the_live_bytes_line() -> None:
    a = mw.analyze(llama_config(), input_size=(2, 16), mode="training")
    fig = a.figure("timeline")
    stacked = [d for d in fig.data if d.stackgroup == "categories"]
    names = [d.name for d in stacked]
    assert names[0] == "parameters"
    assert {"activations", "gradients", "optimizer state"} <= set(names)
    line = next(d for d in fig.data if d.name == "live bytes")
    for i, y in enumerate(line.y):
        assert sum(d.y[i] for d in stacked) == pytest.approx(y)
