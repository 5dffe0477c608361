"""The Graph tab's transformer on the standalone page, in a real Chromium: the residual stream
drawn as the spine, names as the tree shows them, attention a node, the KV cache explained.

A tiny Llama (4 layers, tied embeddings) traced on meta, in inference (it returns its KV cache),
written by ``Analysis.to_html``. On screen: the residual adds stand in one column, the stream's
edges between them one straight vertical line; every tooltip names a folded group as the tree
does (``model.layers.0–3``, never the fold's internal key ``model.layers.g4``); at the depth
where the attention's body is drawn, the attention is a node (q, k, v in; o_proj out) and no
edge carries ``bmm``/``softmax``; the cache the model returns is the node "cache", its edges
say "KV cache", and only the logits reach "output". Screenshots at 900 and 1,400 px, light and
dark, land in ``test-artifacts/graph-spine-*.png``; look at them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

import meta_widget as mw
from tests.e2e.test_graph_page import node_names, open_graph, python_names, settle
from tests.models import llama_config

pytestmark = pytest.mark.e2e

GROUP = "model.layers.0–3"


@pytest.fixture(scope="module")
def llama() -> Any:
    config = llama_config()
    config.num_hidden_layers = 4
    config.tie_word_embeddings = True
    return mw.analyze(config, input_size=(1, 16))


@pytest.fixture(scope="module")
def llama_html(llama: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("html") / "llama.html"
    llama.to_html(str(path))
    return path


def go_to_depth(page: Any, depth: int) -> None:
    """Step the tab's depth with its −/+ buttons until it shows ``depth``."""
    for _ in range(12):
        now = int(page.inner_text(".mw-graph-depth").split()[-1])
        if now == depth:
            return
        page.click(f".mw-graph-btn >> text='{'+' if now < depth else '−'}'")
        settle(page)
    raise AssertionError(f"the Graph tab never showed depth {depth}")


def titles(page: Any, selector: str) -> list[str]:
    return page.eval_on_selector_all(f"{selector} > title", "els => els.map(e => e.textContent)")


def boxes(page: Any, selector: str) -> list[dict[str, float]]:
    return page.eval_on_selector_all(
        selector,
        "els => els.map(e => { const r = e.querySelector('rect').getBoundingClientRect();"
        " return {x: r.x + r.width / 2, top: r.y, bottom: r.y + r.height}; })",
    )


SPINE_PATHS = (
    "els => els.map(e => e.querySelector('.mw-graph-line').getAttribute('d')"
    ".split(/[ML ]+/).filter(Boolean).map(p => p.split(',').map(Number)))"
)


@pytest.mark.parametrize("depth", [4, 5])
def test_the_residual_stream_is_the_spine(
    page: Any, llama: Any, llama_html: Path, depth: int
) -> None:
    open_graph(page, llama_html, 1400, "light")
    go_to_depth(page, depth)
    assert sorted(node_names(page)) == sorted(python_names(llama, depth))
    adds = page.eval_on_selector_all(
        ".mw-graph-node[data-kind=residual]", "els => els.map(e => e.dataset.label)"
    )
    assert adds == [f"{GROUP}.<residual 1>", f"{GROUP}.<residual 2>"]
    # one column: the adds' centres line up, the stream between them is one vertical line
    centres = [b["x"] for b in boxes(page, ".mw-graph-node[data-kind=residual]")]
    assert abs(centres[0] - centres[1]) < 1
    spine = page.eval_on_selector_all(".mw-graph-edge.mw-residual", SPINE_PATHS)
    assert len(spine) == 2  # embeddings -> first add, first add -> second add
    between = spine[1]
    assert len(between) == 2 and between[0][0] == between[1][0]  # straight down
    # drawn thicker than a plain edge, in its own colour
    widths = page.eval_on_selector_all(
        ".mw-graph-edge .mw-graph-line",
        "els => els.map(e => [e.closest('.mw-graph-edge').dataset.kind,"
        " parseFloat(getComputedStyle(e).strokeWidth)])",
    )
    assert min(w for k, w in widths if k == "residual") > 2 * max(
        w for k, w in widths if k == "data"
    )
    tips = titles(page, ".mw-graph-edge.mw-residual")
    assert all("the residual stream" in t for t in tips)
    assert not page.errors, page.errors


def test_names_are_the_trees(page: Any, llama_html: Path) -> None:
    open_graph(page, llama_html, 1400, "light")
    for depth in (2, 4, 5):
        go_to_depth(page, depth)
        shown = titles(page, ".mw-graph-edge") + titles(page, ".mw-graph-node")
        assert shown and not [t for t in shown if re.search(r"\.g\d+\b", t)], depth
        assert any(GROUP in t for t in shown)
    # the folded group's node is labelled as Analysis.graph (and the tree) name it
    go_to_depth(page, 2)
    assert GROUP in node_names(page)
    assert not page.errors, page.errors


def test_attention_is_a_node(page: Any, llama: Any, llama_html: Path) -> None:
    open_graph(page, llama_html, 1400, "light")
    go_to_depth(page, 4)
    assert f"{GROUP}.self_attn" in node_names(page)  # the module itself
    go_to_depth(page, 5)
    attn = f"{GROUP}.self_attn.<attention>"
    node = page.locator(".mw-graph-node[data-kind=attention]")
    assert node.count() == 1 and node.get_attribute("data-label") == attn
    edge_tips = titles(page, ".mw-graph-edge")
    into = [t for t in edge_tips if f" → {attn}:" in t]
    assert {t.split(" → ")[0].rsplit(".", 1)[-1] for t in into} >= {"q_proj", "k_proj", "v_proj"}
    out = [t.split(":")[0] for t in edge_tips if t.startswith(f"{attn} → ")]
    assert out == [f"{attn} → {GROUP}.self_attn.o_proj"]
    assert not [t for t in edge_tips if re.search(r"via .*(bmm|softmax)", t)]
    # clicking it selects the module that runs it
    node.click()
    settle(page)
    assert page.inner_text(".mw-row.mw-selected .mw-mname") == "self_attn"
    assert not page.errors, page.errors


def test_the_cache_is_explained(page: Any, llama_html: Path) -> None:
    open_graph(page, llama_html, 1400, "light")
    for depth in (2, 4, 5):
        go_to_depth(page, depth)
        cache = page.locator(".mw-graph-node[data-kind=cache]")
        assert cache.count() == 1
        assert "KV cache" in (cache.locator("title").first.text_content() or "")
        tips = titles(page, ".mw-graph-edge.mw-cache")
        assert tips and all("→ cache: KV cache entries returned by the model" in t for t in tips)
        into_output = [t for t in titles(page, ".mw-graph-edge") if " → output:" in t]
        assert [t.split(" → ")[0] for t in into_output] == ["lm_head"], depth
    assert not page.errors, page.errors


@pytest.mark.parametrize("width", [900, 1400])
@pytest.mark.parametrize("theme", ["light", "dark"])
def test_screenshots(page: Any, llama_html: Path, artifacts: Path, width: int, theme: str) -> None:
    open_graph(page, llama_html, width, theme)
    go_to_depth(page, 5)
    svg_width = page.eval_on_selector(".mw-graph-svg", "s => s.getBoundingClientRect().width")
    assert svg_width <= width  # the graph fits the page: no horizontal scroll
    page.locator(".mw-graph").screenshot(path=str(artifacts / f"graph-spine-{width}-{theme}.png"))
    go_to_depth(page, 4)
    page.locator(".mw-graph").screenshot(path=str(artifacts / f"graph-spine4-{width}-{theme}.png"))
    assert not page.errors, page.errors
