"""nbconvert's HTML of a notebook that shows an analysis, opened offline in Chromium: the static
view of ``meta_widget.fallback`` is what the reader sees (no widget manager can load offline)."""

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
