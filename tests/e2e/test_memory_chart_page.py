"""The memory-by-module chart in a real Chromium (the standalone page).

A tiny GPT-2 training step with AdamW (tied ``lm_head``/``wte``, 4 identical layers): each bar
stacks parameters, gradients, optimizer state and output mem, repeated layers fold into one bar
(``transformer.h.0–3 · 4 × GPT2Block``), the tied weight counts at its first owner, and the chart
has no scrollbar of its own (the tree is the one inner scrollbox). Light and dark screenshots
land in ``test-artifacts/``; look at them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

import meta_widget as mw
from meta_widget.units import format_bytes
from meta_widget.views.memory_bars import memory_bars

pytestmark = pytest.mark.e2e

CONFIG = dict(n_layer=4, n_embd=64, n_head=2, vocab_size=1000, n_positions=128)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[mw.Analysis, Path]]:
    out = tmp_path_factory.mktemp("bars")
    config = transformers.GPT2Config(**CONFIG, architectures=["GPT2LMHeadModel"])
    paths = {}
    for mode in ("training", "inference"):
        a = mw.analyze(config, input_size=(2, 32), dtypes=[torch.long], mode=mode)
        paths[mode] = (a, out / f"{mode}.html")
        a.to_html(str(paths[mode][1]))
    fsdp = mw.analyze(
        config, input_size=(2, 32), dtypes=[torch.long], mode="training",
        parallel=mw.Parallel(fsdp=4),
    )  # fmt: skip
    paths["fsdp"] = (fsdp, out / "fsdp.html")
    fsdp.to_html(str(paths["fsdp"][1]))
    return paths


def open_memory(page: Any, path: Path, depth: str, theme: str = "light") -> list[dict[str, Any]]:
    """The page at ``depth`` on the memory tab; the bars' centers (``barCenters``)."""
    page.emulate_media(color_scheme=theme)
    page.goto(path.as_uri())
    page.wait_for_selector(".mw-row")
    page.select_option(".mw-toolbar select >> nth=0", depth)
    page.click(".mw-tab[data-tab='memory']")
    page.wait_for_selector(".mw-memory canvas")
    root = page.query_selector(".mw-root").evaluate_handle("r => r.parentElement")
    return page.evaluate("el => window.metaWidget.barCenters(el)", root)  # type: ignore[no-any-return]


def hover_text(page: Any, bar: dict[str, Any]) -> str:
    page.mouse.move(bar["x"], bar["y"])
    page.wait_for_function(
        "() => document.querySelector('.mw-chart-bars .mw-chart-tip').textContent"
    )
    return page.inner_text(".mw-chart-bars .mw-chart-tip")  # type: ignore[no-any-return]


def test_training_bars_stack_the_step_and_fold_the_layers(
    page: Any, runs: dict[str, tuple[mw.Analysis, Path]], artifacts: Path
) -> None:
    a, path = runs["training"]
    for theme in ("light", "dark"):
        bars = open_memory(page, path, "3", theme)
        legend = page.eval_on_selector_all(
            ".mw-bar-legend [data-part]", "xs => xs.map(x => x.textContent)"
        )
        assert legend == ["parameters", "gradients", "optimizer state", "output mem"]
        # the same bars as Python's a.figure("memory", depth=3): the 4 layers are one
        expected = memory_bars(a, depth=3)
        assert [b["module"] for b in bars] == [b.modules[0] for b in expected]
        layers = next(b for b in expected if b.count > 1)
        assert layers.label == "transformer.h.0–3 · 4 × GPT2Block"
        tip = hover_text(page, next(b for b in bars if b["module"] == layers.modules[0]))
        assert tip.startswith("transformer.h.0–3 · 4 × GPT2Block · parameters ")
        assert " · gradients " in tip and " · optimizer state " in tip and " · total " in tip
        page.screenshot(path=str(artifacts / f"memory-bars-training-{theme}.png"), full_page=True)
    assert page.errors == []


def test_tied_weight_counts_at_its_first_owner(
    page: Any, runs: dict[str, tuple[mw.Analysis, Path]]
) -> None:
    a, path = runs["training"]
    bars = open_memory(page, path, "1")
    assert len(bars) == 2  # transformer, lm_head
    head = next(b for b in bars if a.modules[b["module"]].path == "lm_head")
    tip = hover_text(page, head)
    # lm_head's weight is transformer.wte's: its bar is its output only, the weight said apart
    assert tip.startswith(
        "lm_head · parameters 0 B · gradients 0 B · optimizer state 0 B · output "
    )
    assert "of tied parameters, counted at their first owner" in tip


def test_fsdp_bars_are_one_ranks_shards_beside_its_gradients(
    page: Any, runs: dict[str, tuple[mw.Analysis, Path]], artifacts: Path
) -> None:
    """Under FSDP 4 the bars hold what one rank does (its shards, gradients and state: the tree
    counts the model), the tied weight said as the rank's shard of it."""
    a, path = runs["fsdp"]
    bars = open_memory(page, path, "1")
    expected = memory_bars(a, depth=1)
    assert sum(b.param_bytes for b in expected) == a.memory.param_bytes < a.root.param_bytes / 3
    for bar, want in zip(bars, expected, strict=True):
        tip = hover_text(page, bar)
        assert tip.startswith(f"{want.path} · parameters {format_bytes(want.param_bytes)} · ")
        assert f" · gradients {format_bytes(want.gradient_bytes)} · " in tip
    head = hover_text(page, bars[1])
    assert f"+ {format_bytes(expected[1].tied_bytes)} of tied parameters" in head
    assert 0 < expected[1].tied_bytes < a.modules[expected[1].modules[0]].param_bytes
    page.screenshot(path=str(artifacts / "memory-bars-fsdp-light.png"), full_page=True)
    assert page.errors == []


def test_inference_bars_have_no_step_parts(
    page: Any, runs: dict[str, tuple[mw.Analysis, Path]], artifacts: Path
) -> None:
    _, path = runs["inference"]
    open_memory(page, path, "3")
    legend = page.eval_on_selector_all(
        ".mw-bar-legend [data-part]", "xs => xs.map(x => x.textContent)"
    )
    assert legend == ["parameters", "output mem"]
    page.screenshot(path=str(artifacts / "memory-bars-inference-light.png"), full_page=True)


def test_one_scrollbox_at_a_time(page: Any, runs: dict[str, tuple[mw.Analysis, Path]]) -> None:
    _, path = runs["training"]
    open_memory(page, path, "5")  # everything open: the tree is taller than its box
    # a chart taller than the box it used to scroll in (360 px): grown with the page instead
    assert page.eval_on_selector(".mw-chart-bars .mw-chart-host", "e => e.clientHeight") > 360
    for tab in ("memory", "details", "timeline"):
        page.click(f".mw-tab[data-tab='{tab}']")
        page.evaluate(
            "() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))"
        )
        scrolling = page.evaluate(
            """() => [...document.querySelectorAll('.mw-root *')].filter(e => {
                  const s = getComputedStyle(e);
                  const scrolls = (o) => /(auto|scroll)/.test(o);
                  const y = scrolls(s.overflowY) && e.scrollHeight > e.clientHeight + 1;
                  const x = scrolls(s.overflowX) && e.scrollWidth > e.clientWidth + 1;
                  return y || x;
                }).map(e => e.className)"""
        )
        # Details of a root with many outputs is capped (issue 28: 3,850 px for a 70B's root
        # pushed the charts 4,000 px down): its own box, like the tree's
        assert scrolling == (["mw-table", "mw-details"] if tab == "details" else ["mw-table"]) or (
            scrolling == ["mw-table"]
        ), tab
        if tab == "details":
            assert page.eval_on_selector(".mw-details", "e => e.clientHeight") <= 460


def test_a_folded_bars_click_says_which_member_it_opened_and_offers_the_group(
    page: Any, runs: dict[str, tuple[mw.Analysis, Path]], artifacts: Path
) -> None:
    """Issue 28, item 9: clicking ``transformer.h.0–3 · 4 × GPT2Block`` selects
    ``transformer.h.0`` (one of the four); the panel says so and offers the folded group."""
    a, path = runs["training"]
    bars = open_memory(page, path, "3")
    layers = next(b for b in memory_bars(a, depth=3) if b.count > 1)
    bar = next(b for b in bars if b["module"] == layers.modules[0])
    page.mouse.click(bar["x"], bar["y"])
    pick = page.locator(".mw-bar-pick")
    pick.wait_for()
    assert "first of the 4 modules" in pick.inner_text()
    assert "transformer.h.0–3 · 4 × GPT2Block" in pick.inner_text()
    selected = page.locator(".mw-row.mw-selected")
    assert selected.locator(".mw-mname").inner_text() == "0"  # a member, opened
    page.screenshot(path=str(artifacts / "memory-bars-folded-pick.png"), full_page=True)
    pick.locator("button").click()
    page.wait_for_function(
        "() => document.querySelector('.mw-row.mw-selected .mw-mname')?.textContent === '0–3'"
    )
    assert selected.locator(".mw-mtype").text_content() == "4 × GPT2Block"
    seam = page.eval_on_selector(
        ".mw-row.mw-selected .mw-mtype-head",
        "h => h.getBoundingClientRect().right - h.nextElementSibling.getBoundingClientRect().left",
    )
    assert abs(seam) < 1, seam  # head and tail meet, the space between them kept
    assert page.errors == []
