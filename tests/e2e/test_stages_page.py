"""The Stages tab of a pipeline-parallel analysis in a real Chromium: the standalone page.

An 8-layer tiny Llama on four pipeline ranks, each FSDP2-sharded over two (``pp 4 × fsdp 2``,
1F1B over eight micro-batches, on an H100), written by ``Analysis.to_html``. What the tab draws
is checked against ``a.stages`` and the schedule's own arithmetic: 1F1B with P ranks and m
micro-batches takes 2 (m + P - 1) slots, a bubble of (P - 1) / (m + P - 1) on every rank. No two
labels may overlap (the text's own boxes, measured). A zero-bubble schedule (two stages a rank,
weight gradients apart) is drawn too. Screenshots at 900 and 1,400 px (and 470 px, a notebook
output's width at 900 px with JupyterLab's file browser open), light and dark, land in
``test-artifacts/``; look at them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import meta_widget as mw
from tests.models import llama_config

pytestmark = pytest.mark.e2e

P, M = 4, 8


def _config(layers: int) -> Any:
    config = llama_config()
    config.num_hidden_layers = layers
    return config


@pytest.fixture(scope="module")
def pipeline() -> Any:
    return mw.analyze(
        _config(8),
        input_size=(8, 32),
        mode="training",
        gpu="H100",
        parallel=mw.Parallel(pp=P, fsdp=2, microbatches=M),
    )


@pytest.fixture(scope="module")
def pipeline_html(pipeline: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("html") / "pipeline.html"
    pipeline.to_html(str(path))
    return path


def settle(page: Any) -> None:
    """Wait for the fonts and two frames: what is measured is the laid-out page."""
    page.evaluate(
        """() => document.fonts.ready.then(() =>
             new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r))))"""
    )


def open_stages(page: Any, path: Path, width: int, theme: str) -> None:
    page.set_viewport_size({"width": width, "height": 1000})
    page.emulate_media(color_scheme=theme)
    page.goto(path.as_uri())
    page.wait_for_selector(".mw-row")
    page.click(".mw-tab[data-tab=stages]")
    page.wait_for_selector(".mw-stage-sched-row")
    settle(page)


#: every piece of text the Stages tab draws, as the boxes of its own glyphs (a Range's rects:
#: a label that spills out of its box, or sits under another, is caught)
TEXT_BOXES = """root => {
  const out = [];
  const walk = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
  for (let n = walk.nextNode(); n; n = walk.nextNode()) {
    if (!n.textContent.trim()) continue;
    const el = n.parentElement;
    if (!el || el.closest("table")) continue;  // table cells lay out by themselves
    const r = document.createRange();
    r.selectNodeContents(n);
    const act = el.closest(".mw-stage-act");
    const clip = act ? act.getBoundingClientRect().toJSON() : null;
    for (const b of r.getClientRects()) {
      if (b.width > 0 && b.height > 0)
        out.push({text: n.textContent, left: b.left, right: b.right, top: b.top,
                  bottom: b.bottom, clip});
    }
  }
  return out;
}"""


def overlaps(boxes: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Pairs of texts whose boxes overlap (by more than half a pixel each way)."""
    found = []
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            if (
                min(a["right"], b["right"]) - max(a["left"], b["left"]) > 0.5
                and min(a["bottom"], b["bottom"]) - max(a["top"], b["top"]) > 0.5
            ):
                found.append((a["text"], b["text"]))
    return found


def spills(boxes: list[dict[str, Any]]) -> list[str]:
    """The schedule's labels wider than their action's box."""
    return [
        b["text"]
        for b in boxes
        if b["clip"]
        and (b["left"] < b["clip"]["left"] - 0.5 or b["right"] > b["clip"]["right"] + 0.5)
    ]


def test_the_tab_draws_every_rank_as_the_analysis_has_it(
    page: Any, pipeline: Any, pipeline_html: Path
) -> None:
    open_stages(page, pipeline_html, 1400, "light")
    stages = pipeline.stages
    assert page.locator(".mw-stage-peak-row").count() == P
    assert page.locator(".mw-stage-sched-row").count() == P
    # the highest peak marked: the rank whose analysis this is
    worst = max(stages, key=lambda s: s.peak_bytes)
    assert page.eval_on_selector(".mw-stage-worst", "e => e.dataset.rank") == str(worst.rank)
    assert worst.peak_bytes == pipeline.peak_bytes
    # the bars in proportion to the peaks
    widths = page.eval_on_selector_all(
        ".mw-stage-peak-row .mw-stage-bar", "bs => bs.map(b => b.getBoundingClientRect().width)"
    )
    for w, s in zip(widths, stages, strict=True):
        assert w / max(widths) == pytest.approx(s.peak_bytes / worst.peak_bytes, abs=0.01)
    # the schedule: each rank's 2 m actions, the bubble (P - 1) / (m + P - 1) written
    bubble = (P - 1) / (M + P - 1)
    assert all(s.bubble == pytest.approx(bubble) for s in stages)
    texts = page.eval_on_selector_all(".mw-stage-bubble", "es => es.map(e => e.textContent)")
    assert texts == [f"bubble {round(100 * bubble)} %"] * P
    for r in range(P):
        boxes = page.locator(f'.mw-stage-sched-row[data-rank="{r}"] .mw-stage-act')
        assert boxes.count() == 2 * M
    slots = 2 * (M + P - 1)
    track = page.eval_on_selector(
        '.mw-stage-sched-row[data-rank="0"] .mw-stage-slots', "e => e.getBoundingClientRect().width"
    )
    first = page.eval_on_selector(
        '.mw-stage-sched-row[data-rank="0"] .mw-stage-act', "e => e.getBoundingClientRect().width"
    )
    assert first == pytest.approx(track / slots, abs=1)
    # the collectives per mesh dimension: the shown rank's, then the one clicked
    rows = page.eval_on_selector_all(
        ".mw-stage-comms-table tr",
        "rs => rs.slice(1).map(r => [...r.cells].map(c => c.textContent))",
    )
    assert {(d, c.replace("-", "_")) for d, c, _, _ in rows} == {
        (r.group, r.collective) for r in worst.analysis.comm_records
    }
    page.click('.mw-stage-table tr[data-rank="2"]')
    settle(page)
    heading = page.inner_text(".mw-stage-comms .mw-stage-heading")
    assert "pipeline rank 2" in heading
    calls = page.eval_on_selector_all(
        ".mw-stage-comms-table tr", "rs => rs.slice(1).map(r => Number(r.cells[2].textContent))"
    )
    assert sum(calls) == len(stages[2].analysis.comm_records)
    # the header's badges: the layout, pipeline first, and the schedule
    badges = page.eval_on_selector_all(".mw-chip-setting", "cs => cs.map(c => c.textContent)")
    assert badges == ["pp 4 × fsdp 2", "1F1B · 8 micro-batches"]
    assert not page.errors, page.errors


def test_a_schedule_with_weight_gradients_and_two_stages_a_rank(
    page: Any, tmp_path: Path, artifacts: Path
) -> None:
    a = mw.analyze(
        _config(8),
        input_size=(8, 32),
        mode="training",
        parallel=mw.Parallel(pp=2, schedule="zero-bubble", virtual_stages=2, microbatches=4),
    )
    path = tmp_path / "zb.html"
    a.to_html(str(path))
    open_stages(page, path, 1400, "light")
    kinds = page.eval_on_selector_all(
        '.mw-stage-sched-row[data-rank="0"] .mw-stage-act', "es => es.map(e => e.dataset.kind)"
    )
    assert kinds == [kind for kind, _, _ in a.stages[0].actions]
    assert "W" in kinds
    # the later of a rank's two stages is drawn darker
    darker = page.locator('.mw-stage-sched-row[data-rank="0"] .mw-stage-chunk').count()
    assert darker == sum(1 for _, stage, _ in a.stages[0].actions if stage == 2)
    bubbles = page.eval_on_selector_all(".mw-stage-bubble", "es => es.map(e => e.textContent)")
    shown = [float(b.removeprefix("bubble ").removesuffix(" %")) for b in bubbles]
    assert shown == pytest.approx([100 * s.bubble for s in a.stages], abs=0.05)
    assert not overlaps(page.eval_on_selector(".mw-stages", TEXT_BOXES))
    page.locator(".mw-stages").screenshot(path=str(artifacts / "stages-zero-bubble.png"))
    assert not page.errors, page.errors


#: 470: about the notebook output's width in JupyterLab at 900 px with the file browser open
@pytest.mark.parametrize("width", [470, 900, 1400])
@pytest.mark.parametrize("theme", ["light", "dark"])
def test_screenshots_with_no_label_over_another(
    page: Any, pipeline_html: Path, artifacts: Path, width: int, theme: str
) -> None:
    open_stages(page, pipeline_html, width, theme)
    page.screenshot(path=str(artifacts / f"stages-{width}-{theme}.png"), full_page=True)
    boxes = page.eval_on_selector(".mw-stages", TEXT_BOXES)
    assert len(boxes) > 4 * P  # labels, values, bubbles, schedule text
    assert not overlaps(boxes), overlaps(boxes)
    assert not spills(boxes), spills(boxes)
    # the tab fits the page: no sideways scroll
    wide = page.eval_on_selector(
        ".mw-stages",
        """e => { const edge = e.getBoundingClientRect().right + 0.5;
                  return [...e.querySelectorAll("*")]
                    .filter(c => c.getBoundingClientRect().right > edge)
                    .map(c => c.className || c.tagName); }""",
    )
    assert not wide, wide
    assert page.eval_on_selector(".mw-stages", "e => e.scrollWidth - e.clientWidth") <= 0
    if theme == "dark":  # the text is light on the dark page
        lum = page.eval_on_selector(
            ".mw-stage-rank",
            """e => { const m = getComputedStyle(e).color.match(/\\d+/g).map(Number);
                      return (0.2126 * m[0] + 0.7152 * m[1] + 0.0722 * m[2]) / 255; }""",
        )
        assert lum > 0.6
    if (width, theme) == (1400, "light"):  # docs/images/stages.png is this one
        page.locator(".mw-stages").screenshot(path=str(artifacts / "stages-tab.png"))
    assert not page.errors, page.errors
