"""The "what fits" panel, the comparison view and the plan view: their payloads, and the samples
the front end's tests render (``js/fixtures/explore.json``, ``js/fixtures/plan.json``;
``python tests/test_explore_view.py`` rewrites them)."""

from __future__ import annotations

import copy
import json
import os
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "..", "js", "fixtures", "explore.json")
PLAN_FIXTURE = os.path.join(HERE, "..", "js", "fixtures", "plan.json")
sys.path.insert(0, HERE)

import pytest  # noqa: E402
from models import SmallCNN, llama_config  # noqa: E402

import meta_widget as mw  # noqa: E402

#: the plan sample's budget: some candidates of the tiny Llama fit it, some do not
PLAN_BUDGET = 700 * 2**20  # on the GPU: FSDP's and TP's 620 MiB fit, DDP's 748 MiB not


def small_plan() -> Any:
    """The tiny Llama (1, 16) on 2 H100s in 700 MiB each (the CUDA context and NCCL's buffers
    count): every layout, with and without
    checkpointing, as given and bf16 parameters, one micro-batch (12 candidates); the optimizer
    one parameter at a time (the tensor-parallel layout shards the sequence, as plan's default
    layouts do where the model takes it)."""
    config = llama_config()
    config.use_cache = False  # a training plan: no KV cache (Plan.notes would say so)
    return mw.plan(
        config,
        input_size=(1, 16),
        gpu="H100",
        devices=2,
        budget=PLAN_BUDGET,
        precisions=["as given", "param_dtype bf16"],
        micro_batches=[1],
        foreach=False,
    )


@pytest.fixture(scope="module")
def plan() -> Any:
    return small_plan()


def samples() -> dict[str, Any]:
    """A fit of a CNN's batch in 8 MiB, and GQA against MHA on the tiny Llama."""
    from meta_widget.explore.comparison import comparison_payload
    from meta_widget.explore.fit import fit_payload

    fit = mw.max_fit(SmallCNN(), input_size=(1, 3, 32, 32), budget="8MiB")
    mha = copy.deepcopy(llama_config())
    mha.num_key_value_heads = mha.num_attention_heads
    comparison = mw.compare(
        mw.analyze(llama_config(), input_size=(1, 16)), mw.analyze(mha, input_size=(1, 16))
    )
    return {"fit": fit_payload(fit), "compare": comparison_payload(comparison)}


def test_the_front_ends_sample_is_what_the_encoders_make() -> None:
    with open(FIXTURE, encoding="utf-8") as f:
        recorded = json.load(f)
    # after a deliberate change of the payloads: python tests/test_explore_view.py
    assert recorded == json.loads(json.dumps(samples()))


def test_fit_panel_payload_is_the_fits_numbers() -> None:
    fit = mw.max_fit(SmallCNN(), input_size=(1, 3, 32, 32), budget="8MiB")
    view = fit.widget()
    p = view.payload
    assert (view.kind, p["size"], p["budget"]) == ("fit", fit.size, 8 * 2**20)
    assert (p["peakBytes"], p["nextPeakBytes"]) == (fit.peak_bytes, fit.next_peak_bytes)
    assert p["history"] == [list(h) for h in fit.history]
    assert sum(p["categories"].values()) == fit.analysis.peak_bytes  # categories add up
    data, _ = fit._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in data
    assert data["text/plain"] == repr(fit)


def test_comparison_view_folds_repeated_layers() -> None:
    mha = copy.deepcopy(llama_config())
    mha.num_key_value_heads = mha.num_attention_heads
    a = mw.analyze(llama_config(), input_size=(1, 16))
    comparison = mw.compare(a, mw.analyze(mha, input_size=(1, 16)))
    view = comparison.widget()
    rows = view.payload["rows"]
    layers = llama_config().num_hidden_layers
    folded = [r for r in rows if r["count"] > 1]
    assert folded and all(r["count"] == layers for r in folded)
    assert "model.layers.0–1.self_attn.k_proj" in [r["module"] for r in rows]
    # every module is in exactly one row (folded rows stand for `count` modules)
    assert sum(r["count"] for r in rows) == len(a.modules)
    changed = {r["module"] for r in rows if r["changed"]}
    assert changed == {f"model.layers.0–1.self_attn{p}" for p in ("", ".k_proj", ".v_proj")}
    data, _ = comparison._repr_mimebundle_()
    assert data["text/plain"] == comparison.summary()


def test_plan_payload_is_each_candidates_own_analysis(plan: Any) -> None:
    from meta_widget.explore.plan_view import plan_payload

    p = plan_payload(plan)
    assert (p["gpu"], p["devices"], p["mode"], p["budget"]) == ("H100", 2, "training", PLAN_BUDGET)
    assert len(p["candidates"]) == len(plan.candidates) == 12
    traced = [(c, plan.candidates[c["index"]].analysis) for c in p["candidates"]]
    traced = [(c, a) for c, a in traced if a is not None and a.error is None]
    assert traced, "no candidate was traced"
    for c, a in traced:  # the numbers are the candidate's own trace, not a formula
        assert c["peakBytes"] == a.peak_bytes and c["deviceBytes"] == a.footprint_bytes
        assert c["fits"] == (a.footprint_bytes <= PLAN_BUDGET)
        assert c["stepS"] == a.time.step_s and c["mfu"] == a.time.mfu
        assert c["openable"] is True and c["error"] is None
    fits = [c for c, _ in traced if c["fits"]]
    assert 0 < len(fits) < len(traced), "the sample should have candidates on both sides"
    fastest = max(fits, key=lambda c: c["tokensPerS"])  # 16 tokens a step: the most tokens/s
    assert p["best"] == fastest["index"]
    for c in p["candidates"]:
        if c["peakBytes"] is None:  # not traced: its reason says why
            assert c["error"]


def test_opening_a_candidate_shows_its_analysis(plan: Any) -> None:
    view = plan.widget()
    assert view.kind == "plan" and view.detail == {}
    i = next(i for i, c in enumerate(plan.candidates) if c.analysis is not None and not c.fits)
    view._on_message(view, {"type": "open", "index": i}, [])
    assert view.detail["index"] == i
    assert view.detail["payload"] == plan.candidates[i].analysis.to_payload()
    assert view.detail["payload"]["time"]["gpu"] == "H100"
    for wrong in ({"type": "open", "index": 999}, {"type": "open", "index": "1"}, {"open": 0}):
        view._on_message(view, wrong, [])  # ignored: the detail stays
        assert view.detail["index"] == i
    data, _ = plan._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in data
    assert data["text/plain"] == repr(plan)


def test_the_front_ends_plan_sample_is_what_the_encoder_makes(plan: Any) -> None:
    from meta_widget.explore.plan_view import plan_payload

    with open(PLAN_FIXTURE, encoding="utf-8") as f:
        recorded = json.load(f)
    # after a deliberate change of the payload or the plan: python tests/test_explore_view.py
    assert recorded == json.loads(json.dumps(plan_payload(plan)))


if __name__ == "__main__":
    from meta_widget.explore.plan_view import plan_payload

    with open(FIXTURE, "w", encoding="utf-8") as f:
        json.dump(samples(), f, indent=1)
        f.write("\n")
    with open(PLAN_FIXTURE, "w", encoding="utf-8") as f:
        json.dump(plan_payload(small_plan()), f, indent=1)
        f.write("\n")
    print(f"wrote {os.path.normpath(FIXTURE)} and {os.path.normpath(PLAN_FIXTURE)}")
