"""nbconvert's HTML of a notebook that shows an analysis, opened offline in Chromium: the static
view of ``meta_widget.views.fallback`` is what the reader sees (no widget manager can load
offline)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient
from nbconvert import HTMLExporter

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
CELL = (
    "import meta_widget as mw, transformers\n"
    "config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=4,"
    " num_attention_heads=4, num_key_value_heads=2, vocab_size=128)\n"
    "a = mw.analyze(config, input_size=(1, 16))\n"
    "a"
)


def test_nbconvert_html_shows_the_static_view_offline(
    page: Any, tmp_path: Path, artifacts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("TRANSFORMERS_VERBOSITY", "error")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(CELL)]
    NotebookClient(nb, kernel_name="python3", timeout=180).execute()
    nb.metadata.pop("widgets", None)  # saved as JupyterLab saves by default: no widget state
    body, _ = HTMLExporter().from_notebook_node(nb)
    path = tmp_path / "analysis.html"
    path.write_text(body, encoding="utf-8")
    # offline: every request that leaves the file is refused
    page.route("http*://**", lambda route: route.abort())
    page.goto(path.as_uri())
    view = page.locator(".meta-widget-fallback")
    view.wait_for()
    assert view.is_visible()
    text = view.inner_text()
    assert "LlamaModel (config) · inference" in text  # no architectures: the base model
    assert "0–3 · 4 × LlamaDecoderLayer" in text  # the four layers folded
    assert "Peak (forward) = parameters" in text
    box = view.bounding_box()
    assert box and box["height"] > 150 and box["width"] > 400
    page.screenshot(path=str(artifacts / "nbconvert-offline.png"), full_page=True)


STREAM_CELL = (
    "import meta_widget as mw, transformers\n"
    "config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100,"
    " n_positions=64)\n"
    "a = mw.analyze(config, input_size=(1, 16), widget=True)"
)
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


def test_widget_true_output_carries_the_static_view_too(
    page: Any, tmp_path: Path, artifacts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``analyze(..., widget=True)`` shows its widget before there is an analysis; its output is
    updated in place when the analysis ends (same widget, one output), so that it carries the
    static view as ``a``'s output does, and nbconvert shows it offline."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("TRANSFORMERS_VERBOSITY", "error")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(STREAM_CELL)]
    NotebookClient(nb, kernel_name="python3", timeout=180).execute()
    outputs = nb.cells[0].outputs
    assert [o.output_type for o in outputs] == ["display_data"], outputs
    data = outputs[0].data
    assert WIDGET_VIEW in data and "meta-widget-fallback" in data["text/html"]
    assert "GPT2Model" in data["text/plain"]  # the summary, not the widget's repr
    # still the one widget that streamed: its model is the one in the saved state, with the
    # finished analysis in its payload
    state = nb.metadata["widgets"][WIDGET_STATE]["state"]
    payloads = {k: m["state"]["payload"] for k, m in state.items() if m["state"].get("payload")}
    assert list(payloads) == [data[WIDGET_VIEW]["model_id"]]
    assert payloads[data[WIDGET_VIEW]["model_id"]]["status"] == "done"

    nb.metadata.pop("widgets", None)  # saved as JupyterLab saves by default: no widget state
    body, _ = HTMLExporter().from_notebook_node(nb)
    path = tmp_path / "stream.html"
    path.write_text(body, encoding="utf-8")
    page.route("http*://**", lambda route: route.abort())
    page.goto(path.as_uri())
    view = page.locator(".meta-widget-fallback")
    view.wait_for()
    text = view.inner_text()
    assert "GPT2Model (config) · inference" in text
    assert "0–1 · 2 × GPT2Block" in text
    page.screenshot(path=str(artifacts / "nbconvert-widget-true-offline.png"), full_page=True)
