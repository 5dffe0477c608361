"""The Stages tab in a real JupyterLab and Chromium: a pipeline analysed in the notebook's own
kernel (``parallel=mw.Parallel(pp=2, microbatches=4)``, a 4-layer Llama, an H100).

What the tab draws is held against what the kernel says (``a.stages``, printed by the next
cell): one row per pipeline rank, each rank's bubble, the rank with the highest peak marked,
the header's badges naming the layout and the schedule. At 1,400 px, and at 900 px with the
file browser open (the notebook's output about 440 px wide), light and dark, no label over
another and nothing drawn past the tab's edge; screenshots land in ``test-artifacts/``.
"""

from __future__ import annotations

import json
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
from test_stages_page import TEXT_BOXES, overlaps, spills

pytestmark = pytest.mark.e2e

PIPELINE = (
    "config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=4,"
    " num_attention_heads=4, num_key_value_heads=2, vocab_size=128,"
    " architectures=['LlamaForCausalLM'])\n"
    "a = mw.analyze(config, input_size=(4, 32), mode='training', gpu='H100',"
    " parallel=mw.Parallel(pp=2, microbatches=4))\n"
    "a"
)
TRUTHS = (
    "import json\n"
    "print(json.dumps({'bubbles': [s.bubble for s in a.stages],"
    " 'worst': max(a.stages, key=lambda s: s.peak_bytes).rank,"
    " 'actions': [len(s.actions) for s in a.stages]}))"
)
CELLS = ["import transformers\nimport meta_widget as mw", PIPELINE, TRUTHS]


def check_tab(page: Any, name: str, artifacts: Path) -> None:
    """No label over another, none past its box or the tab's edge; a screenshot."""
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
    page.locator(".mw-root .mw-stages").scroll_into_view_if_needed()
    boxes = page.eval_on_selector(".mw-root .mw-stages", TEXT_BOXES)
    assert boxes, name
    assert not overlaps(boxes), (name, overlaps(boxes))
    assert not spills(boxes), (name, spills(boxes))
    wide = page.eval_on_selector(".mw-root .mw-stages", "e => e.scrollWidth - e.clientWidth")
    assert wide <= 0, (name, wide)
    page.screenshot(path=str(artifacts / f"lab-stages-{name}.png"), full_page=True)


def test_stages_tab_in_jupyterlab(page: Any, jupyter_lab: dict[str, Any], artifacts: Path) -> None:
    lab = jupyter_lab
    delete_sessions(lab)
    nb_path = lab["root"] / "stages.ipynb"
    write_notebook(nb_path, CELLS)
    page.set_viewport_size({"width": 1400, "height": 1400})
    open_notebook(page, lab, nb_path.name)
    wait_idle(page)
    run_all(page, len(CELLS))
    page.wait_for_selector(".mw-root .mw-row", timeout=SLOW_MS)
    text = page.locator(".jp-OutputArea-output pre").last.inner_text()
    truth = json.loads(text.strip().splitlines()[-1])
    chips = page.eval_on_selector_all(
        ".mw-root .mw-chip-setting", "xs => xs.map(x => x.textContent)"
    )
    assert chips == ["pp 2", "1F1B · 4 micro-batches"], chips
    page.locator(".mw-root .mw-tab[data-tab='stages']").click()
    page.wait_for_selector(".mw-root .mw-stage-sched-row", timeout=SLOW_MS)
    assert page.locator(".mw-root .mw-stage-peak-row").count() == 2
    bubbles = page.eval_on_selector_all(
        ".mw-root .mw-stage-bubble", "es => es.map(e => e.textContent)"
    )
    assert bubbles == [f"bubble {round(100 * b)} %" for b in truth["bubbles"]]
    worst = page.eval_on_selector(".mw-root .mw-stage-worst", "e => e.dataset.rank")
    assert worst == str(truth["worst"])
    for rank, n in enumerate(truth["actions"]):
        sel = f".mw-root .mw-stage-sched-row[data-rank='{rank}'] .mw-stage-act"
        assert page.locator(sel).count() == n
    check_tab(page, "1400-light", artifacts)
    # 900 px with the file browser open beside the notebook
    page.set_viewport_size({"width": 900, "height": 1400})
    command(page, "filebrowser:activate")
    page.wait_for_function(
        "() => !window.jupyterapp.shell.leftCollapsed"
        " && document.querySelector('.jp-FileBrowser').offsetParent !== null",
        timeout=SLOW_MS,
    )
    width = page.eval_on_selector(".mw-root", "e => e.clientWidth")
    assert width < 640, width  # really beside the file browser
    check_tab(page, "900-filebrowser-light", artifacts)
    command(page, "apputils:change-theme", {"theme": "JupyterLab Dark"})
    try:
        wait_theme(page, dark=True)
        check_tab(page, "900-filebrowser-dark", artifacts)
        page.set_viewport_size({"width": 1400, "height": 1400})
        check_tab(page, "1400-dark", artifacts)
    finally:
        command(page, "apputils:change-theme", {"theme": "JupyterLab Light"})
        wait_theme(page, dark=False)
    assert not page.errors, page.errors
