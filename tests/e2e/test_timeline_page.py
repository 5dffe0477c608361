"""The memory timeline stacked by category, in a real Chromium (the standalone page).

A Llama-3-70B-shaped inference (examples/llama_70b.py: parameters are ~97 % of the peak, so
they are left out by default and the activations fill the chart) and a tiny Llama training step
(gradients, optimizer state, activations, temporaries), in light and dark. Screenshots land in
``test-artifacts/``; look at them.
"""

from __future__ import annotations

import runpy
from pathlib import Path
from typing import Any

import pytest
import transformers

import meta_widget as mw

pytestmark = pytest.mark.e2e

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("timeline")
    big = runpy.run_path(str(EXAMPLES / "llama_70b.py"))["config"]
    tiny = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
    )
    runs = {"llama-70b": (big, (1, 4096), "inference"), "training": (tiny, (2, 32), "training")}
    paths = {}
    for name, (config, size, mode) in runs.items():
        paths[name] = out / f"{name}.html"
        mw.analyze(config, input_size=size, mode=mode).to_html(str(paths[name]))
    return paths


@pytest.mark.parametrize("theme", ["light", "dark"])
@pytest.mark.parametrize(
    ("name", "bands"),
    [
        ("llama-70b", ["activations"]),
        (
            "training",
            ["gradients", "optimizer state", "activations", "parameters, buffers, inputs"],
        ),
    ],
)
def test_timeline_is_stacked_by_category(
    page: Any, pages: dict[str, Path], artifacts: Path, name: str, bands: list[str], theme: str
) -> None:
    page.emulate_media(color_scheme=theme)
    page.goto(pages[name].as_uri())
    page.wait_for_selector(".mw-row")
    page.click(".mw-tab[data-tab='timeline']")
    page.wait_for_selector(".mw-timeline canvas")
    legend = page.inner_text(".mw-timeline .mw-timeline-legend")
    for band in bands:
        assert band in legend
    if name == "llama-70b":  # parameters are most of the peak: left out, activations fill the chart
        # no band of them; the legend names the left-out part's size instead (issue 28)
        bands_shown = page.eval_on_selector_all(
            ".mw-timeline .mw-timeline-legend > span:not(.mw-left-out-item)",
            "xs => xs.map(x => x.textContent)",
        )
        assert not any("parameters, buffers, inputs" in b for b in bands_shown), bands_shown
        left_out = page.inner_text(".mw-timeline .mw-left-out-item")
        assert left_out.startswith("left out: parameters, buffers, inputs "), left_out
    page.locator(".mw-timeline").screenshot(path=str(artifacts / f"timeline-{name}-{theme}.png"))


def test_drag_zooms_into_a_range_and_double_click_resets(page: Any, pages: dict[str, Path]) -> None:
    page.goto(pages["training"].as_uri())
    page.wait_for_selector(".mw-row")
    page.click(".mw-tab[data-tab='timeline']")
    page.wait_for_selector(".mw-timeline canvas")
    r = page.eval_on_selector(".mw-timeline .u-over", "e => e.getBoundingClientRect().toJSON()")
    y = r["y"] + r["height"] / 2

    def event_at(fraction: float) -> int:
        page.mouse.move(r["x"] + r["width"] * fraction, y)
        tip = page.inner_text(".mw-timeline .mw-chart-tip")
        return int(tip.split()[1].replace(",", ""))  # "event 1,123 (forward) · ..."

    whole = event_at(0.9)
    page.mouse.move(r["x"] + r["width"] * 0.1, y)
    page.mouse.down()
    page.mouse.move(r["x"] + r["width"] * 0.3, y, steps=5)
    page.mouse.up()
    zoomed = event_at(0.9)
    assert zoomed < whole  # the plot now spans 10 %..30 % of the events
    assert "(" in page.inner_text(".mw-timeline .mw-chart-tip")  # the split by category
    page.mouse.dblclick(r["x"] + r["width"] * 0.5, y)
    assert event_at(0.9) == whole
