"""Issue 40 (#6) in a real JupyterLab and Chromium: the Graph tab shows a transformer's residual
stream as its spine, names its nodes as the tree does, draws attention as a node, and explains
the KV cache the model returns.

A small Llama (4 layers) analyzed in a notebook; the Graph tab stepped to depth 4 and 5 with its
own buttons. On screen: the residual adds in one column, the stream between them one straight
thick line; no tooltip names a folded group by the fold's internal key (``layers.g4``); the
attention a node (q, k, v in; o_proj out) and no edge says ``bmm`` or ``softmax``; the cache a
node "cache" whose edges say "KV cache", only the logits into "output". Screenshots at 1,400 and
900 px (the file browser open), light and dark: ``test-artifacts/lab-graph40-*.png``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from test_jupyterlab import (
    SLOW_MS,
    command,
    delete_sessions,
    open_notebook,
    run_all,
    wait_idle,
    wait_theme,
    write_notebook,
)

pytestmark = pytest.mark.e2e

CELLS = [
    "import transformers\nimport meta_widget as mw",
    "cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=4,\n"
    "    num_attention_heads=4, num_key_value_heads=2, vocab_size=100,\n"
    "    max_position_embeddings=64, architectures=['LlamaForCausalLM'])\n"
    "a = mw.analyze(cfg, input_size=(1, 16))\na",
]
GROUP = "model.layers.0–3"
GRAPH = ".mw-root .mw-graph"


def settle(page: Any) -> None:
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")


def depth(page: Any) -> int:
    return int(page.inner_text(f"{GRAPH} .mw-graph-depth").split()[-1])


def go_to_depth(page: Any, want: int) -> None:
    for _ in range(12):
        now = depth(page)
        if now == want:
            settle(page)
            return
        page.locator(f"{GRAPH} .mw-graph-btn", has_text="+" if now < want else "−").first.click()
        page.wait_for_function(
            "([sel, d]) => document.querySelector(sel)?.textContent !== d",
            arg=[f"{GRAPH} .mw-graph-depth", f"depth {now}"],
            timeout=SLOW_MS,
        )
    raise AssertionError(f"the Graph tab never showed depth {want}")


def titles(page: Any, selector: str) -> list[str]:
    return page.eval_on_selector_all(
        f"{GRAPH} {selector} > title", "els => els.map(e => e.textContent)"
    )


def check(page: Any) -> None:
    """What the tab shows at depth 4 and 5 (see the module docstring)."""
    go_to_depth(page, 4)
    shown = titles(page, ".mw-graph-edge") + titles(page, ".mw-graph-node")
    assert not [t for t in shown if re.search(r"\.g\d+\b", t)]
    assert any(f"{GROUP}.<residual 1>" in t for t in shown)
    for want in (4, 5):
        go_to_depth(page, want)
        adds = page.locator(f"{GRAPH} .mw-graph-node[data-kind=residual]")
        assert adds.count() == 2
        boxes = [adds.nth(i).locator("rect").bounding_box() for i in range(2)]
        xs = [b["x"] + b["width"] / 2 for b in boxes if b]
        assert len(xs) == 2 and abs(xs[0] - xs[1]) < 1  # one column: their centres line up
        spine = page.eval_on_selector_all(
            f"{GRAPH} .mw-graph-edge.mw-residual .mw-graph-line",
            "els => els.map(e => e.getAttribute('d'))",
        )
        assert len(spine) == 2 and re.fullmatch(r"M([\d.]+),[\d.]+ L\1,[\d.]+", spine[1]), spine
        edge_tips = titles(page, ".mw-graph-edge")
        assert not [t for t in edge_tips if re.search(r"\.g\d+\b", t)]
        assert not [t for t in edge_tips if re.search(r"via .*(bmm|softmax)", t)]
        outputs = [t.split(" → ")[0] for t in edge_tips if " → output:" in t]
        assert outputs == ["lm_head"], outputs
        cache = titles(page, ".mw-graph-edge.mw-cache")
        assert cache and all("KV cache entries returned by the model" in t for t in cache)
    attn = page.locator(f"{GRAPH} .mw-graph-node[data-kind=attention]")
    assert attn.get_attribute("data-label") == f"{GROUP}.self_attn.<attention>"


def fits_its_box(page: Any) -> None:
    """The drawn graph lies inside the tab's box (its view fit to the box after a resize)."""
    box = page.evaluate(
        """sel => { const svg = document.querySelector(sel + ' .mw-graph-svg');
        const s = svg.getBoundingClientRect(), g = svg.querySelector('g').getBoundingClientRect();
        return [s.left, s.right, g.left, g.right]; }""",
        GRAPH,
    )
    left, right, g_left, g_right = box
    assert left - 1 <= g_left and g_right <= right + 1, str(box)


def shoot(page: Any, artifacts: Path, label: str) -> None:
    page.locator(GRAPH).scroll_into_view_if_needed()
    settle(page)
    page.screenshot(path=str(artifacts / f"lab-graph40-{label}.png"))


def test_graph_spine_names_attention_cache_in_lab(
    page: Any, jupyter_lab: dict[str, Any], artifacts: Path
) -> None:
    lab = jupyter_lab
    delete_sessions(lab)
    write_notebook(lab["root"] / "graph40.ipynb", CELLS)
    page.set_viewport_size({"width": 1400, "height": 1100})
    open_notebook(page, lab, "graph40.ipynb")
    wait_idle(page)
    run_all(page, len(CELLS))
    page.locator(".mw-root .mw-tab[data-tab='graph']").click(timeout=SLOW_MS)
    page.wait_for_selector(f"{GRAPH} .mw-graph-node", timeout=SLOW_MS)
    check(page)
    shoot(page, artifacts, "1400-light")
    page.set_viewport_size({"width": 900, "height": 1100})
    command(page, "filebrowser:activate")
    page.wait_for_function("() => !window.jupyterapp.shell.leftCollapsed", timeout=SLOW_MS)
    command(page, "apputils:change-theme", {"theme": "JupyterLab Dark"})
    wait_theme(page, dark=True)
    check(page)
    shoot(page, artifacts, "900-dark")
    fits_its_box(page)
    page.set_viewport_size({"width": 1400, "height": 1100})
    shoot(page, artifacts, "1400-dark")
    command(page, "apputils:change-theme", {"theme": "JupyterLab Light"})
    wait_theme(page, dark=False)
    page.set_viewport_size({"width": 900, "height": 1100})
    shoot(page, artifacts, "900-light")
    assert not page.errors, page.errors
