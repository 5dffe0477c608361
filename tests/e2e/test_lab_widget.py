"""The widget's second pass (issue 28), in a real JupyterLab and Chromium.

A Llama training step timed on an H100 with autocast and micro-batches: the header's peak line
splits the peak and holds it against the GPU's memory (or a typed budget) with the levers; the
settings show as badges; Details stays capped, with gradients, optimizer state and the module's
constructor settings; names and sorted headers are whole at 900 px; the timeline speaks of every
event and of all live bytes; the filter counts its matches. The truths come from the notebook's
own kernel (transformers' modules built on meta, torch's ``extra_repr``). A notebook saved with
JupyterLab's default settings reopens with its static views. Screenshots at 1,400 and 900 px,
light and dark, land in ``test-artifacts/``; look at them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_jupyterlab import (
    CELLS,
    SLOW_MS,
    command,
    delete_sessions,
    open_notebook,
    run_all,
    wait_idle,
    wait_rewritten,
    wait_static_views,
    wait_text,
    wait_theme,
    widget_views,
    write_notebook,
)

pytestmark = pytest.mark.e2e


SAVE_STATE = "@jupyter-widgets/jupyterlab-manager:saveWidgetState"


def test_saved_with_default_settings_reopens_with_the_static_view(
    page: Any, jupyter_lab: dict[str, Any], artifacts: Path
) -> None:
    """JupyterLab's default is not to save widget state: the reopened notebook's outputs have no
    model, and show the static view (before: "Error displaying widget: model not found")."""
    lab = jupyter_lab
    delete_sessions(lab)
    nb_path = lab["root"] / "default.ipynb"
    write_notebook(nb_path, CELLS)
    page.set_viewport_size({"width": 1400, "height": 1400})
    open_notebook(page, lab, nb_path.name)
    wait_idle(page)
    run_all(page, len(CELLS))
    page.wait_for_function(
        "() => document.querySelectorAll('.mw-root .mw-row').length > 0", timeout=SLOW_MS
    )
    # while the widget shows, its static view beside it does not
    page.wait_for_function(
        """() => [...document.querySelectorAll('.meta-widget-fallback')].length === 2
                 && [...document.querySelectorAll('.meta-widget-fallback')]
                      .every(v => !v.offsetParent)""",
        timeout=SLOW_MS,
    )
    if page.evaluate("id => window.jupyterapp.commands.isToggled(id)", SAVE_STATE):
        command(page, SAVE_STATE)  # off, as a fresh JupyterLab has it
    try:
        before = nb_path.stat().st_mtime
        command(page, "docmanager:save")
        saved = wait_rewritten(nb_path, before)
        assert "widgets" not in saved.metadata
        assert len(widget_views(saved)) == 2
    finally:
        command(page, SAVE_STATE)  # back on, for the other tests
    delete_sessions(lab)
    open_notebook(page, lab, nb_path.name)
    wait_idle(page)
    wait_static_views(page, 2, artifacts / "lab-default-settings-reopened.png")
    command(page, "apputils:change-theme", {"theme": "JupyterLab Dark"})
    wait_static_dark(page)
    page.screenshot(path=str(artifacts / "lab-default-settings-dark.png"), full_page=True)
    command(page, "apputils:change-theme", {"theme": "JupyterLab Light"})


def wait_static_dark(page: Any) -> None:
    """The static view's text follows the dark theme (light text)."""
    page.wait_for_function(
        """() => { const v = document.querySelector('.meta-widget-fallback');
          const [r, g, b] = getComputedStyle(v).color.match(/\\d+/g).map(Number);
          return document.body.dataset.jpThemeLight === 'false' && (r + g + b) / 3 > 150; }""",
        timeout=SLOW_MS,
    )


LLAMA = (
    "config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=4,"
    " num_attention_heads=4, num_key_value_heads=2, vocab_size=128,"
    " architectures=['LlamaForCausalLM'])\n"
    "a = mw.analyze(config, input_size=(2, 32), mode='training', gpu='H100',"
    " autocast=torch.bfloat16, micro_batches=2)\n"
    "a"
)
TRUTHS = (
    "import json\n"
    "with torch.device('meta'):\n"
    "    m = transformers.LlamaForCausalLM(config)\n"
    "own = lambda p: p.rpartition('.')[2].lower()\n"
    "print(json.dumps({'mlp': sum(1 for p, x in m.named_modules()"
    " if 'mlp' in own(p) or 'mlp' in type(x).__name__.lower()),"
    " 'lm_head': m.lm_head.extra_repr(), 'events': len(a.memory.timeline)}))"
)
SECOND_PASS = ["import torch, transformers\nimport meta_widget as mw", LLAMA, TRUTHS]


def truths(page: Any) -> dict[str, Any]:
    text = page.locator(".jp-OutputArea-output pre").last.inner_text()
    return json.loads(text.strip().splitlines()[-1])  # type: ignore[no-any-return]


def whole(page: Any, selector: str) -> list[str]:
    """The texts of the visible ``selector`` elements that their box cuts."""
    return page.eval_on_selector_all(
        selector,
        "xs => xs.filter(x => x.offsetParent && x.scrollWidth > x.clientWidth + 1)"
        ".map(x => x.textContent)",
    )


def check_peak_line(page: Any) -> None:
    line = wait_text(page, ".mw-root .mw-peakline", ["peak", "fits:", "H100 80 GiB"])
    for part in ("params", "grads", "optimizer", "activations", "FSDP", "(est.)", "bf16"):
        assert part in line, (part, line)
    # a typed budget under the peak: the line says by how much it is over
    page.fill(".mw-root .mw-budget-input", "0.00001")
    page.press(".mw-root .mw-budget-input", "Enter")
    wait_text(page, ".mw-root .mw-peakline", ["over 10.5 KiB by"])
    page.fill(".mw-root .mw-budget-input", "")
    page.press(".mw-root .mw-budget-input", "Enter")
    wait_text(page, ".mw-root .mw-peakline", ["fits:"])


def check_tree_at(page: Any, width: int, names_whole: bool = True) -> None:
    page.set_viewport_size({"width": width, "height": 1400})
    page.wait_for_timeout(300)  # the table lays its columns out on resize (a frame)
    # the table never scrolls sideways (a narrow one leaves columns out: tests/e2e/
    # test_widget_narrow.py); beside Lab's file browser at 900 px a name may be shortened
    # after its class's head, never its class's end
    table = page.eval_on_selector(".mw-root .mw-table", "t => [t.scrollWidth, t.clientWidth]")
    assert table[0] <= table[1], (width, table)
    assert not names_whole or not whole(page, ".mw-root .mw-row .mw-mname"), width
    tails = page.eval_on_selector_all(
        ".mw-root .mw-row .mw-mtype-tail",
        """xs => xs.filter(t => t.offsetParent && t.textContent).filter(t => {
              const a = t.getBoundingClientRect();
              const b = t.closest('.mw-name').getBoundingClientRect();
              return a.right > b.right + 1; }).map(t => t.parentElement.textContent)""",
    )
    assert not tails, (width, tails)  # a class's end is never the part cut
    page.locator(".mw-root .mw-th", has_text="Params").click()  # on screen at every width
    page.wait_for_selector(".mw-root .mw-th.mw-sorted")
    assert not whole(page, ".mw-root .mw-th.mw-sorted"), width


def test_widget_second_pass(page: Any, jupyter_lab: dict[str, Any], artifacts: Path) -> None:
    lab = jupyter_lab
    delete_sessions(lab)
    nb_path = lab["root"] / "second.ipynb"
    write_notebook(nb_path, SECOND_PASS)
    page.set_viewport_size({"width": 1400, "height": 1400})
    open_notebook(page, lab, nb_path.name)
    wait_idle(page)
    run_all(page, len(SECOND_PASS))
    page.wait_for_selector(".mw-root .mw-row", timeout=SLOW_MS)
    truth = truths(page)
    # 7: every setting that changes the numbers is a badge
    chips = page.eval_on_selector_all(
        ".mw-root .mw-chip-setting", "xs => xs.map(x => x.textContent)"
    )
    assert chips == ["autocast bfloat16", "2 micro-batches"], chips
    # 2: the peak line
    check_peak_line(page)
    page.screenshot(path=str(artifacts / "lab-second-pass-1400-light.png"), full_page=True)
    # 9: the filter counts its matches (transformers' modules named or typed "mlp")
    page.fill(".mw-root .mw-search", "mlp")
    wait_text(page, ".mw-root .mw-match-count", [f"{truth['mlp']} matches"])
    page.fill(".mw-root .mw-search", "")
    # 9, 10: Details of lm_head: its gradients, optimizer state and torch's own extra_repr
    page.locator(".mw-root .mw-row .mw-mname", has_text="lm_head").click()
    details = wait_text(page, ".mw-root .mw-details", ["settings", truth["lm_head"]])
    assert "gradients" in details and "optimizer state" in details
    # 2: Details is capped: the charts' tabs stay within reach
    page.locator(".mw-root .mw-row .mw-mname").first.click()
    box = page.locator(".mw-root .mw-details").bounding_box()
    assert box and box["height"] <= 461, box
    # 5: the timeline in true terms: every event, all live bytes, the left-out band's size
    page.locator(".mw-root .mw-tab[data-tab='timeline']").click()
    page.wait_for_selector(".mw-root .mw-timeline canvas")
    label = page.locator(".mw-root .mw-chart-timeline").get_attribute("aria-label") or ""
    assert f"allocation and free events ({truth['events']:,}" in label, label
    leave = page.locator(".mw-root .mw-leave-out")
    if not leave.is_checked():
        leave.check()
    page.wait_for_selector(".mw-root .mw-left-out-item")
    label = page.locator(".mw-root .mw-chart-timeline").get_attribute("aria-label") or ""
    assert "y: live bytes above the left-out" in label, label
    over = page.locator(".mw-root .mw-timeline .u-over").bounding_box()
    assert over
    page.mouse.move(over["x"] + over["width"] * 0.6, over["y"] + over["height"] / 2)
    tip = wait_text(page, ".mw-root .mw-timeline .mw-chart-tip", ["live"])
    assert f"of {truth['events']:,}" in tip and "left out of the chart" in tip, tip
    page.screenshot(path=str(artifacts / "lab-second-pass-timeline-1400.png"), full_page=True)
    # 4: at 1,400 and 900 px no name is cut, no class loses its end, a sorted header is whole
    page.locator(".mw-root .mw-tab[data-tab='details']").click()
    check_tree_at(page, 1400)
    check_tree_at(page, 900, names_whole=False)
    page.screenshot(path=str(artifacts / "lab-second-pass-900-light.png"), full_page=True)
    command(page, "apputils:change-theme", {"theme": "JupyterLab Dark"})
    wait_theme(page, dark=True)
    page.screenshot(path=str(artifacts / "lab-second-pass-900-dark.png"), full_page=True)
    page.set_viewport_size({"width": 1400, "height": 1400})
    page.locator(".mw-root .mw-tab[data-tab='memory']").click()
    page.wait_for_selector(".mw-root .mw-chart-bars canvas")
    page.screenshot(path=str(artifacts / "lab-second-pass-1400-dark.png"), full_page=True)
    command(page, "apputils:change-theme", {"theme": "JupyterLab Light"})
    wait_theme(page, dark=False)
