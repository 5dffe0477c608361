"""The "what fits" panel and the comparison view: their payloads, and the sample the front end's
tests render (``js/fixtures/explore.json``; ``python tests/test_explore_view.py`` rewrites it)."""

from __future__ import annotations

import copy
import json
import os
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "..", "js", "fixtures", "explore.json")
sys.path.insert(0, HERE)

from models import SmallCNN, llama_config  # noqa: E402

import meta_widget as mw  # noqa: E402


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
    assert "model.layers.{0..1}.self_attn.k_proj" in [r["module"] for r in rows]
    # every module is in exactly one row (folded rows stand for `count` modules)
    assert sum(r["count"] for r in rows) == len(a.modules)
    changed = {r["module"] for r in rows if r["changed"]}
    assert changed == {f"model.layers.{{0..1}}.self_attn{p}" for p in ("", ".k_proj", ".v_proj")}
    data, _ = comparison._repr_mimebundle_()
    assert data["text/plain"] == comparison.summary()


if __name__ == "__main__":
    with open(FIXTURE, "w", encoding="utf-8") as f:
        json.dump(samples(), f, indent=1)
        f.write("\n")
    print(f"wrote {os.path.normpath(FIXTURE)}")
