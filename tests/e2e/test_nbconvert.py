"""nbconvert's HTML of a notebook that shows an analysis, opened offline in Chromium: the static
view of ``meta_widget.views.fallback`` is what the reader sees (no widget manager can load
offline), whether the widget state was saved with the notebook or not: the static view is an
output of its own after the widget's (``MetaWidget._ipython_display_``)."""

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


@pytest.mark.parametrize("state", ["without widget state", "with widget state"])
def test_nbconvert_html_shows_the_static_view_offline(
    page: Any, tmp_path: Path, artifacts: Path, monkeypatch: pytest.MonkeyPatch, state: str
) -> None:
    """Executed (``jupyter nbconvert --execute`` / nbclient store the widget state) and exported
    with ``jupyter nbconvert --to html``: offline, the output shows the static view. Before, the
    saved state won and the output was empty unless the metadata was cleared."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("TRANSFORMERS_VERBOSITY", "error")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(CELL)]
    NotebookClient(nb, kernel_name="python3", timeout=180).execute()
    assert WIDGET_STATE in nb.metadata["widgets"]  # nbclient saved it
    if state == "without widget state":
        nb.metadata.pop("widgets", None)  # saved as JupyterLab saves by default
    body, _ = HTMLExporter().from_notebook_node(nb)
    path = tmp_path / "analysis.html"
    path.write_text(body, encoding="utf-8")
    # offline: every request that leaves the file is refused
    page.route("http*://**", lambda route: route.abort())
    page.goto(path.as_uri())
    view = page.locator(".meta-widget-fallback")
    view.wait_for()
    assert view.count() == 1 and view.is_visible()
    text = view.inner_text()
    assert "LlamaModel (config) · inference" in text  # no architectures: the base model
    assert "0–3 · 4 × LlamaDecoderLayer" in text  # the four layers folded
    assert "Peak (forward) = parameters" in text
    box = view.bounding_box()
    assert box and box["height"] > 150 and box["width"] > 400
    page.screenshot(
        path=str(artifacts / f"nbconvert-offline-{state.split()[0]}.png"), full_page=True
    )


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
    outputs = [o for o in nb.cells[0].outputs if o.output_type != "stream"]
    assert [o.output_type for o in outputs] == ["display_data"] * 2, outputs
    data, static = outputs[0].data, outputs[1].data
    assert WIDGET_VIEW in data and "text/html" not in data
    # the placeholder below the widget, filled when the analysis ended
    assert "meta-widget-fallback" in static["text/html"]
    assert "GPT2Model" in static["text/plain"]  # the summary, not the widget's repr
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
