"""The Graph tab of a 25,000-module model on the standalone page, in a real Chromium.

An ``nn.Sequential`` of 5,000 blocks of 4 leaves (the model ``benchmarks/widget.py`` times),
traced on meta. What keeps the tab quick is what it draws: the 5,000 blocks fold into one node
as the tree folds them, and opened in place they show their first ones and one "… N more" node
for the rest, which draws more when clicked. The counts are checked against the model's own
numbers (5,000 blocks of 4 leaves); timings live in the benchmark. Screenshots at 900 and
1,400 px, light and dark, land in ``test-artifacts/``; look at them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import meta_widget as mw

pytestmark = pytest.mark.e2e

BLOCKS = 5000


class Block(nn.Module):
    """Four cheap leaves in a row (a short trace for 25,000 modules)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Identity()
        self.b = nn.ReLU()
        self.c = nn.Identity()
        self.d = nn.Dropout()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.d(self.c(self.b(self.a(x))))


@pytest.fixture(scope="module")
def large_html(tmp_path_factory: pytest.TempPathFactory) -> Path:
    with torch.device("meta"):
        model = nn.Sequential(*[Block() for _ in range(BLOCKS)])
    a = mw.analyze(model, input_size=(2, 4))
    assert len(a.modules) == 1 + BLOCKS * 5
    path = tmp_path_factory.mktemp("html") / "large.html"
    a.to_html(str(path))
    return path


def settle(page: Any) -> None:
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")


def open_graph(page: Any, path: Path, width: int = 1400, theme: str = "light") -> None:
    page.set_viewport_size({"width": width, "height": 1000})
    page.emulate_media(color_scheme=theme)
    page.goto(path.as_uri())
    page.wait_for_selector(".mw-row")
    page.click(".mw-tab[data-tab=graph]")
    page.wait_for_selector(".mw-graph-node")
    settle(page)


def labels(page: Any) -> list[str]:
    return page.eval_on_selector_all(".mw-graph-node", "els => els.map(e => e.dataset.label)")


def blocks_drawn(page: Any) -> set[str]:
    """The blocks drawn one by one: their index, the first part of a node's name."""
    return {n.split(".")[0] for n in labels(page) if n.split(".")[0].isdigit()}


def hidden(page: Any) -> int:
    """Modules the "… N more" node stands for (its N counts blocks)."""
    label = page.get_attribute(".mw-graph-more", "data-label") or ""
    return int(label.strip("… more").replace(",", ""))


def open_group(page: Any) -> None:
    page.click(".mw-graph-node:not(.mw-io) .mw-graph-toggle")
    page.wait_for_selector(".mw-graph-more")
    settle(page)


def test_opens_folded_and_draws_a_bounded_part(page: Any, large_html: Path) -> None:
    open_graph(page, large_html)
    # the 5,000 identical blocks are one node, as in the tree
    assert sorted(labels(page)) == sorted(["input", f"0–{BLOCKS - 1}", "output"])
    open_group(page)
    drawn = blocks_drawn(page)
    assert 0 < len(drawn) <= 100  # a part, not 5,000 boxes
    assert drawn == {str(i) for i in range(len(drawn))}  # the first ones, in order
    assert hidden(page) == BLOCKS - len(drawn)  # and one node for all the others
    assert len(labels(page)) == len(drawn) + 3  # input, output, "… more"
    # clicking "… more" draws more of them
    page.click(".mw-graph-more")
    page.wait_for_function(
        f"() => document.querySelectorAll('.mw-graph-node').length > {len(drawn) + 3}"
    )
    more = blocks_drawn(page)
    assert len(more) > len(drawn)
    assert hidden(page) == BLOCKS - len(more)
    # Fold all: the one folded node again
    page.click(".mw-graph-btn >> text='Fold all'")
    page.wait_for_function("() => !document.querySelector('.mw-graph-more')")
    assert sorted(labels(page)) == sorted(["input", f"0–{BLOCKS - 1}", "output"])
    # opened again, it starts from the first ones again
    open_group(page)
    assert blocks_drawn(page) == drawn
    assert not page.errors, page.errors


def test_selection_syncs_with_drawn_and_hidden_blocks(page: Any, large_html: Path) -> None:
    open_graph(page, large_html)
    open_group(page)
    page.click(".mw-graph-node[data-key='1']")
    settle(page)
    assert page.inner_text(".mw-row.mw-selected .mw-mname") == "1"
    # a block behind "… more", selected in the tree: the "more" node is marked
    page.fill(".mw-search", str(BLOCKS - 1))
    last = re.compile(f"^{BLOCKS - 1}$")
    page.locator(".mw-row .mw-mname").filter(has_text=last).first.click()
    settle(page)
    selected = page.eval_on_selector_all(
        ".mw-graph-node.mw-selected", "els => els.map(e => e.dataset.label)"
    )
    assert selected == [f"… {BLOCKS - len(blocks_drawn(page)):,} more"]
    assert not page.errors, page.errors


@pytest.mark.parametrize("width", [900, 1400])
@pytest.mark.parametrize("theme", ["light", "dark"])
def test_screenshots(page: Any, large_html: Path, artifacts: Path, width: int, theme: str) -> None:
    open_graph(page, large_html, width, theme)
    open_group(page)
    svg_width = page.eval_on_selector(".mw-graph-svg", "s => s.getBoundingClientRect().width")
    assert svg_width <= width
    page.screenshot(path=str(artifacts / f"graph-25k-{width}-{theme}.png"), full_page=True)
    assert not page.errors, page.errors
