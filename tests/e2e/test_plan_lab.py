"""The plan view of ``mw.plan`` and the Time column of ``analyze(..., gpu=)`` in a real
JupyterLab, in a real Chromium: clicking a candidate opens its analysis below the chart."""

from __future__ import annotations

import re
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
    "import transformers\nimport meta_widget as mw\n"
    "cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,\n"
    "    num_attention_heads=4, num_key_value_heads=2, vocab_size=100,\n"
    "    max_position_embeddings=64, architectures=['LlamaForCausalLM'], use_cache=False)",
    "p = mw.plan(cfg, input_size=(1, 16), gpu='H100', devices=2, budget='700MiB',\n"
    "            precisions=['as given', 'param_dtype bf16'], micro_batches=[1], foreach=False)\n"
    "p",
    "a = mw.analyze(cfg, input_size=(1, 16), mode='training', gpu='H100')\na",
    "b = mw.analyze(cfg, input_size=(1, 16), mode='training', gpu=mw.GPU(name='Small',\n"
    "    memory_bytes=512 * 2**10, hbm_bytes_per_s=1e12, fp32_flops=1e13))\nb",
    "print(a.to_payload()['time']['modules']['time_s'][0], "
    "[i for i, c in enumerate(p.candidates) if not c.fits][0], "
    "p.candidates.index(p.best))",
]


def shoot(page: Any, artifacts: Path, name: str, width: int) -> None:
    page.set_viewport_size({"width": width, "height": 1400})
    page.wait_for_timeout(300)  # a frame for the layout to follow the new width
    page.screenshot(path=str(artifacts / f"{name}-{width}.png"), full_page=True)


def test_plan_view_opens_a_candidate_and_the_time_column_shows(
    page: Any, jupyter_lab: dict[str, Any], artifacts: Path
) -> None:
    lab = jupyter_lab
    delete_sessions(lab)
    write_notebook(lab["root"] / "plan.ipynb", CELLS)
    page.set_viewport_size({"width": 1400, "height": 1400})
    open_notebook(page, lab, "plan.ipynb")
    wait_idle(page)
    run_all(page, len(CELLS))
    stdout = "[data-mime-type='application/vnd.jupyter.stdout']"
    page.wait_for_function(  # the last cell's printed line: the kernel's numbers
        "sel => (document.querySelectorAll(sel).length > 0)",
        arg=f".jp-OutputArea-output{stdout}",
        timeout=SLOW_MS,
    )
    printed = page.locator(f".jp-OutputArea-output{stdout}").last.inner_text().split()
    root_s, over, best = float(printed[0]), int(printed[1]), int(printed[2])

    # the plan: a point per candidate traced, the budget line, the best ringed
    page.locator(".mw-plan-chart").wait_for(timeout=SLOW_MS)
    assert page.locator(".mw-plan-dot").count() == 12
    assert page.locator(".mw-plan-budget").count() == 1
    ring = page.locator(".mw-plan-best-ring").locator("xpath=..")
    assert ring.get_attribute("data-index") == str(best)
    point = page.locator(f'.mw-plan-point[data-index="{over}"]')
    assert "mw-plan-out" in (point.locator(".mw-plan-dot").get_attribute("class") or "")
    point.hover()
    page.wait_for_function(
        "n => document.querySelector('.mw-plan-tip')?.textContent.startsWith(`#${n} `)",
        arg=over,
        timeout=SLOW_MS,
    )
    tip = page.locator(".mw-plan-tip").inner_text()
    assert tip.startswith(f"#{over} ") and "micro-batch" in tip and "over the budget" in tip
    point.click()
    head = page.locator(".mw-plan-detail-head")
    page.wait_for_function(
        "n => document.querySelector('.mw-plan-detail-head')?.textContent.startsWith("
        "`Candidate #${n}:`)",
        arg=over,
        timeout=SLOW_MS,
    )
    assert "over the budget" in head.inner_text()
    detail = page.locator(".mw-plan-detail")
    detail.locator(".mw-row").first.wait_for(timeout=SLOW_MS)
    assert "on H100" in detail.locator(".mw-header").inner_text()
    page.locator(f'.mw-plan-table tr.mw-plan-opened[data-index="{over}"]').wait_for(timeout=SLOW_MS)
    assert page.locator(".mw-plan-table tr.mw-plan-opened").count() == 1
    shoot(page, artifacts, "lab-plan", 1400)
    shoot(page, artifacts, "lab-plan", 900)

    # only the candidates that fit: their points alone, the axes spanning them; and back
    page.set_viewport_size({"width": 1400, "height": 1400})
    fitting = page.locator(".mw-plan-table tr.mw-plan-row:not(.mw-plan-over)").count()
    assert 0 < fitting < 12
    page.locator(".mw-plan-zoom .mw-seg-btn", has_text="those that fit").click()
    page.wait_for_function(
        "n => document.querySelectorAll('.mw-plan-dot').length === n", arg=fitting, timeout=SLOW_MS
    )
    assert page.locator(".mw-plan-dot.mw-plan-out").count() == 0
    page.locator(".mw-plan-chart").scroll_into_view_if_needed()
    page.screenshot(path=str(artifacts / "lab-plan-fitting-1400.png"))
    page.locator(".mw-plan-zoom .mw-seg-btn", has_text="all traced").click()
    page.wait_for_function(
        "() => document.querySelectorAll('.mw-plan-dot').length === 12", timeout=SLOW_MS
    )

    # the analysis widget with gpu=: the Time column, its root's time the kernel's
    page.set_viewport_size({"width": 1400, "height": 1400})
    widget = page.locator(".mw-root:visible").filter(has=page.locator(".mw-table.mw-has-time")).last
    time_head = widget.locator(".mw-thead .mw-col-time")
    time_head.wait_for(state="visible", timeout=SLOW_MS)  # drawn, then shown with the time
    widget.locator(".mw-thead .mw-col-time", has_text="Time").wait_for(timeout=SLOW_MS)
    assert time_head.inner_text() == "Time"
    cell = widget.locator('.mw-row[data-row="0"] .mw-td.mw-col-time')
    cell.wait_for(state="visible", timeout=SLOW_MS)
    shown = cell.inner_text().strip()
    value, unit = re.fullmatch(r"([\d.]+) (ms|µs|s)", shown.split("\n")[-1].strip()).groups()
    scale = {"s": 1.0, "ms": 1e-3, "µs": 1e-6}[unit]
    assert float(value) * scale == pytest.approx(root_s, rel=0.01)
    assert cell.get_attribute("data-bound") in ("compute", "memory", "comm")
    widget.scroll_into_view_if_needed()
    shoot(page, artifacts, "lab-time-column", 1400)
    shoot(page, artifacts, "lab-time-column", 900)

    # the GPU's memory as the memory charts' budget line (a GPU of 512 KiB: the line in view)
    page.set_viewport_size({"width": 1400, "height": 1400})
    small = page.locator(".mw-root:visible").filter(has_text="on Small").last
    small.locator(".mw-tab", has_text="Memory timeline").click()
    legend = small.locator(".mw-chart-timeline .mw-budget-item")
    legend.wait_for(timeout=SLOW_MS)
    assert legend.inner_text() == "Small 512 KiB (the GPU's memory)"
    small.locator(".mw-chart-timeline canvas").first.scroll_into_view_if_needed()
    shoot(page, artifacts, "lab-budget-line", 1400)
    small.locator(".mw-tab", has_text="Memory by module").click()
    bars = small.locator(".mw-chart-bars .mw-budget-item")
    bars.wait_for(timeout=SLOW_MS)
    assert bars.inner_text().startswith("Small 512 KiB")
    small.locator(".mw-chart-bars canvas").first.scroll_into_view_if_needed()
    shoot(page, artifacts, "lab-budget-bars", 900)
