"""A parallel trace's collectives in a real Chromium: the standalone page's timeline tab.

The page comes from ``Analysis.to_html`` of one FSDP2 rank (``parallel={"fsdp": 2}``) of a
4-block MLP; the screenshot lands in ``test-artifacts/``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import meta_widget as mw

pytestmark = pytest.mark.e2e


class Blocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64)) for _ in range(4)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def test_each_collective_is_marked_under_the_timeline_where_it_ran(
    page: Any, tmp_path: Path, artifacts: Path
) -> None:
    a = mw.analyze(Blocks, input_size=(16, 64), mode="training", device="cpu", parallel={"fsdp": 2})
    path = tmp_path / "rank.html"
    a.to_html(str(path))
    page.goto(path.as_uri())
    page.wait_for_selector(".mw-row")
    page.get_by_text("Memory timeline").click()
    page.wait_for_selector(".mw-comm")
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
    marks = page.eval_on_selector_all(
        ".mw-comm", "ms => ms.map(m => [m.getBoundingClientRect().left, m.title])"
    )
    plot = page.eval_on_selector(".mw-timeline .u-over", "e => e.getBoundingClientRect().toJSON()")
    assert len(marks) == len(a.comm_records)
    lefts = [x for x, _ in marks]
    assert lefts == sorted(lefts)  # in the order they ran
    assert plot["left"] - 1 <= lefts[0] and lefts[-1] <= plot["left"] + plot["width"] + 1
    assert all(r.module in title for (_, title), r in zip(marks, a.comm_records, strict=True))
    assert page.locator(".mw-comms-table tr").count() == 1 + len(a.comms_per_step())
    page.screenshot(path=str(artifacts / "parallel-timeline.png"), full_page=True)
