"""The Graph tab on the standalone page, in a real Chromium.

A tiny Llama (4 layers, tied embeddings) traced on meta, written by ``Analysis.to_html``. The
nodes the tab draws are checked against ``Analysis.graph`` (the Python side folds on its own,
the page folds with the tree's groups); selecting a node must select its row in the tree and in
Details, and the other way round. Screenshots at 900 and 1,400 px, light and dark, land in
``test-artifacts/``; look at them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import meta_widget as mw
from tests.models import llama_config

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def llama() -> Any:
    config = llama_config()
    config.num_hidden_layers = 4
    config.tie_word_embeddings = True
    return mw.analyze(config, input_size=(1, 16), mode="training")


@pytest.fixture(scope="module")
def llama_html(llama: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("html") / "llama.html"
    llama.to_html(str(path))
    return path


def settle(page: Any) -> None:
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")


def open_graph(page: Any, path: Path, width: int, theme: str) -> None:
    page.set_viewport_size({"width": width, "height": 1000})
    page.emulate_media(color_scheme=theme)
    page.goto(path.as_uri())
    page.wait_for_selector(".mw-row")
    page.click(".mw-tab[data-tab=graph]")
    page.wait_for_selector(".mw-graph-node")
    settle(page)


def node_names(page: Any) -> list[str]:
    """The drawn nodes' full names (a long one is shortened in its box)."""
    return page.eval_on_selector_all(".mw-graph-node", "els => els.map(e => e.dataset.label)")


def python_names(a: Any, depth: int) -> list[str]:
    names = list(a.graph(depth=depth).nodes.module)
    return [{"<input>": "input", "<output>": "output", "<cache>": "cache"}.get(n, n) for n in names]


def test_graph_tab_draws_the_python_graph(page: Any, llama: Any, llama_html: Path) -> None:
    open_graph(page, llama_html, 1400, "light")
    depth = int(page.inner_text(".mw-graph-depth").split()[-1])
    assert sorted(node_names(page)) == sorted(python_names(llama, depth))
    edges = page.eval_on_selector_all(".mw-graph-edge", "els => els.length")
    g = llama.graph(depth=depth)
    assert edges == len(g.edges[g.edges.src != g.edges.dst])
    # one level deeper: the layers' insides, folded
    page.click(".mw-graph-btn >> text='+'")
    settle(page)
    deeper = int(page.inner_text(".mw-graph-depth").split()[-1])
    assert deeper > depth
    assert sorted(node_names(page)) == sorted(python_names(llama, deeper))
    assert len(node_names(page)) > len(python_names(llama, depth))  # not a level alike
    assert not page.errors, page.errors


def test_selecting_a_node_selects_the_row_and_back(page: Any, llama_html: Path) -> None:
    open_graph(page, llama_html, 1400, "light")
    page.click(".mw-graph-node[data-key='lm_head']")
    settle(page)
    assert page.inner_text(".mw-row.mw-selected .mw-mname") == "lm_head"
    # Details shows it too (its tab)
    page.click(".mw-tab[data-tab=details]")
    settle(page)
    assert page.inner_text(".mw-details .mw-path") == "lm_head"
    page.click(".mw-tab[data-tab=graph]")
    page.locator(".mw-row", has_text="norm").first.locator(".mw-mname").click()
    settle(page)
    selected = page.eval_on_selector_all(
        ".mw-graph-node.mw-selected", "els => els.map(e => e.dataset.label)"
    )
    assert selected == ["model.norm"]
    assert not page.errors, page.errors


def test_group_opens_in_place_and_backward_shows(page: Any, llama_html: Path) -> None:
    open_graph(page, llama_html, 1400, "light")
    before = len(node_names(page))
    page.click(".mw-graph-toggle")
    settle(page)
    assert len(node_names(page)) == before + 3  # 4 layers instead of one folded node
    page.click(".mw-graph-backward")
    settle(page)
    shown = page.eval_on_selector_all(
        ".mw-graph-grad", "els => els.filter(e => getComputedStyle(e).display !== 'none').length"
    )
    assert shown > 0
    assert not page.errors, page.errors


@pytest.mark.parametrize("width", [900, 1400])
@pytest.mark.parametrize("theme", ["light", "dark"])
def test_screenshots(page: Any, llama_html: Path, artifacts: Path, width: int, theme: str) -> None:
    open_graph(page, llama_html, width, theme)
    page.click(".mw-graph-btn >> text='+'")
    settle(page)
    svg_width = page.eval_on_selector(".mw-graph-svg", "s => s.getBoundingClientRect().width")
    assert svg_width <= width  # the graph fits the page: no horizontal scroll
    page.hover(".mw-graph-edge .mw-graph-hit >> nth=3", force=True)
    page.screenshot(path=str(artifacts / f"graph-{width}-{theme}.png"), full_page=True)
    assert not page.errors, page.errors
