"""The "what fits" panel and the comparison view in a real JupyterLab, in a real Chromium."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_jupyterlab import (
    SLOW_MS,
    delete_sessions,
    open_notebook,
    run_all,
    wait_idle,
    write_notebook,
)

pytestmark = pytest.mark.e2e

CELLS = [
    "import torch.nn as nn\nimport meta_widget as mw",
    "def cnn():\n"
    "    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(),\n"
    "                         nn.Linear(8 * 16 * 16, 10))\n"
    "fit = mw.max_fit(cnn, input_size=(1, 3, 16, 16), budget='4MiB')\n"
    "fit",
    "a = mw.analyze(nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 4)), input_size=(2, 8))\n"
    "b = mw.analyze(nn.Sequential(nn.Linear(8, 32), nn.Linear(32, 4)), input_size=(2, 8))\n"
    "mw.compare(a, b)",
    "print(fit.size, fit.next_peak_bytes)",
]


def test_fit_panel_and_comparison_render_in_lab(
    page: Any, jupyter_lab: dict[str, Any], artifacts: Path
) -> None:
    lab = jupyter_lab
    delete_sessions(lab)
    write_notebook(lab["root"] / "explore.ipynb", CELLS)
    page.set_viewport_size({"width": 1200, "height": 1400})
    open_notebook(page, lab, "explore.ipynb")
    wait_idle(page)
    run_all(page, len(CELLS))
    verdict = page.locator(".mw-fit-verdict")
    verdict.wait_for(timeout=SLOW_MS)
    page.screenshot(path=str(artifacts / "lab-explore.png"), full_page=True)
    stdout = "[data-mime-type='application/vnd.jupyter.stdout']"
    printed = page.locator(f".jp-OutputArea-output{stdout}").last.inner_text().split()
    size = int(printed[0])
    assert verdict.inner_text().startswith(f"batch = {size:,} fits:")
    assert page.locator(".mw-fit-chart circle").count() >= 3
    tree = page.locator(".mw-cmp-tree")
    tree.wait_for(timeout=SLOW_MS)
    changed = page.locator(".mw-cmp-tree tr.mw-cmp-changed .mw-cmp-name span:first-child")
    assert changed.all_inner_texts() == ["0", "1"]  # both Linear layers changed width
    page.screenshot(path=str(artifacts / "lab-explore.png"), full_page=True)
