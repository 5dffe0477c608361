"""Issue 40, part A, in a real JupyterLab and Chromium: the serving view of ``mode="generate"``,
the Graph tab that leaves the wheel to the page, the timeline's labels that never overlap.

A small Llama's ``generate()`` timed on an H100: the header speaks in serving words, with the
numbers of the notebook's own ``a.kv_cache`` and ``a.time`` (printed by the kernel, parsed
here); the root row counts the calls the model ran (one per token); the mode switch lights
"generate", not "inference"; the timeline has a KV cache band; no ``eos_token_id`` warning is
printed. Screenshots at 1,400 and 900 px, light and dark, land in ``test-artifacts/``.
"""

from __future__ import annotations

import json
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

NEW_TOKENS = 24
GENERATE = (
    "config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=4,"
    " num_attention_heads=4, num_key_value_heads=2, vocab_size=128,"
    " architectures=['LlamaForCausalLM'])\n"
    f"a = mw.analyze(config, input_size=(2, 48), mode='generate', new_tokens={NEW_TOKENS},"
    " gpu='H100')\n"
    "a"
)
TRUTHS = (
    "import json\n"
    "fit = a.kv_cache.paged(a.time.gpu.memory_bytes)\n"
    "print(json.dumps({'kv': a.kv_cache.bytes, 'prefill': a.time.prefill_s,"
    " 'per_token': a.time.per_token_s, 'tokens_per_s': a.time.tokens_per_s,"
    " 'paged': int(fit), 'length': fit.length, 'peak': a.peak_bytes}))"
)
CELLS = ["import transformers\nimport meta_widget as mw", GENERATE, TRUTHS]

UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
SECONDS = {"s": 1.0, "ms": 1e-3, "µs": 1e-6, "ns": 1e-9}


def number(text: str, units: dict[str, float]) -> float:
    """``"1.44 µs"`` -> 1.44e-6; ``"287 KiB"`` -> 293888."""
    m = re.fullmatch(r"([\d.,]+)\s*(\S+)", text.strip())
    assert m and m.group(2) in units, text
    return float(m.group(1).replace(",", "")) * units[m.group(2)]


def close(shown: float, truth: float) -> bool:
    """Equal to the three figures the header shows."""
    return abs(shown - truth) <= 0.006 * abs(truth)


def header_totals(page: Any) -> dict[str, str]:
    items = page.eval_on_selector_all(
        ".mw-root .mw-total",
        "xs => xs.map(x => [x.querySelector('.mw-total-label').textContent,"
        " x.querySelector('.mw-total-value').textContent])",
    )
    return dict(items)


def truths(page: Any) -> dict[str, Any]:
    text = page.locator(".jp-OutputArea-output pre").last.inner_text()
    return json.loads(text.strip().splitlines()[-1])  # type: ignore[no-any-return]


def check_labels(page: Any) -> None:
    """The timeline's labels (drawn on its canvas, their boxes on the chart): none overlaps
    another, each inside the plot (clear of the axes' titles); the parameters band shown."""
    leave = page.locator(".mw-root .mw-leave-out")
    if leave.is_checked():
        leave.uncheck()
    page.wait_for_function(
        "() => (document.querySelector('.mw-root .mw-chart-timeline')?.dataset.labels ?? '')"
        ".includes('band')",
        timeout=SLOW_MS,
    )
    chart = page.locator(".mw-root .mw-chart-timeline")
    boxes = json.loads(chart.get_attribute("data-labels") or "[]")
    plot = json.loads(chart.get_attribute("data-plot") or "{}")
    names = [b["name"] for b in boxes]
    assert "peak" in names and "band" in names and "phase decode" in names, names
    for i, a in enumerate(boxes):
        assert plot["x"] - 0.5 <= a["x"] and a["x"] + a["w"] <= plot["x"] + plot["w"] + 0.5, a
        assert plot["y"] - 0.5 <= a["y"] and a["y"] + a["h"] <= plot["y"] + plot["h"] + 0.5, a
        for b in boxes[i + 1 :]:
            apart = (
                a["x"] + a["w"] <= b["x"]
                or b["x"] + b["w"] <= a["x"]
                or a["y"] + a["h"] <= b["y"]
                or b["y"] + b["h"] <= a["y"]
            )
            assert apart, (a, b)


def check_graph_wheel(page: Any) -> None:
    """Over the graph the wheel scrolls the notebook; Ctrl + wheel zooms the graph."""
    page.locator(".mw-root .mw-tab[data-tab='graph']").click()
    page.wait_for_selector(".mw-root .mw-graph-node", timeout=SLOW_MS)
    svg = page.locator(".mw-root .mw-graph-svg")
    svg.scroll_into_view_if_needed()
    box = svg.bounding_box()
    assert box
    group = ".mw-root .mw-graph-svg > g"
    transform = page.locator(group).first.get_attribute("transform")
    # the notebook scrolls: the graph moves down the screen as the wheel turns upwards
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + 40)
    for _ in range(3):
        page.mouse.wheel(0, -150)
    page.wait_for_function(
        "y => document.querySelector('.mw-root .mw-graph-svg').getBoundingClientRect().y > y + 50",
        arg=box["y"],
        timeout=10_000,
    )
    assert page.locator(group).first.get_attribute("transform") == transform
    svg.scroll_into_view_if_needed()
    box = svg.bounding_box()
    assert box
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + min(box["height"] / 2, 100))
    page.keyboard.down("Control")
    page.mouse.wheel(0, -200)
    page.keyboard.up("Control")
    page.wait_for_function(
        "t => document.querySelector('.mw-root .mw-graph-svg > g').getAttribute('transform') !== t",
        arg=transform,
        timeout=10_000,
    )
    # and the hint says how
    note = page.locator(".mw-root .mw-graph .mw-chart-note").all_inner_texts()
    assert any("Ctrl" in n and "click the graph" in n for n in note), note


def run_serving(page: Any, lab: dict[str, Any], name: str, width: int = 1400) -> dict[str, Any]:
    """Open a notebook of ``CELLS``, run it, wait for the serving header; the kernel's truths."""
    delete_sessions(lab)
    nb_path = lab["root"] / f"{name}.ipynb"
    write_notebook(nb_path, CELLS)
    page.set_viewport_size({"width": width, "height": 1400})
    open_notebook(page, lab, nb_path.name)
    wait_idle(page)
    run_all(page, len(CELLS))
    page.wait_for_selector(".mw-root .mw-row", timeout=SLOW_MS)
    page.wait_for_function(
        "() => document.querySelector('.jp-OutputArea-output pre')"
        " && [...document.querySelectorAll('.jp-OutputArea-output pre')].some("
        "p => p.textContent.includes('tokens_per_s'))",
        timeout=SLOW_MS,
    )
    return truths(page)


def test_serving_view(page: Any, jupyter_lab: dict[str, Any], artifacts: Path) -> None:
    """1: the header in serving words with a.kv_cache's and a.time's numbers."""
    truth = run_serving(page, jupyter_lab, "serving")
    page.wait_for_function(
        "() => [...document.querySelectorAll('.mw-root .mw-total-label')]"
        ".some(x => x.textContent === 'KV cache')",
        timeout=30_000,
    )
    totals = header_totals(page)
    assert close(number(totals["KV cache"], UNITS), truth["kv"]), (totals, truth)
    assert close(number(totals["time to first token"], SECONDS), truth["prefill"]), totals
    assert close(number(totals["per output token"], SECONDS), truth["per_token"]), totals
    assert int(totals["tokens/s"].replace(",", "")) == round(truth["tokens_per_s"]), totals
    assert totals["fits on the H100"] == f"{truth['paged']:,} × {truth['length']:,} tokens"
    assert "step" not in totals and "MFU" not in " ".join(totals.values()), totals
    notes = page.locator(".mw-root .mw-notes").inner_text()
    assert f"{truth['paged']:,} sequences" in notes and "vLLM" in notes, notes
    # the root row counts the calls the model ran: one forward pass per token
    root = page.locator(".mw-root .mw-row").first
    assert f"×{NEW_TOKENS}" in root.inner_text().replace(" ", ""), root.inner_text()
    # the mode switch lights generate, not inference
    lit = page.eval_on_selector_all(
        ".mw-root .mw-mode .mw-seg-btn.mw-active",
        "xs => xs.filter(x => x.offsetParent).map(x => x.textContent)",
    )
    assert lit == ["generate"], lit
    # no eos_token_id warning on stderr
    stderr = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
    assert not [t for t in stderr.all_inner_texts() if "eos_token_id" in t]
    page.screenshot(path=str(artifacts / "lab-serving-1400-light.png"), full_page=True)
    # the timeline has the KV cache's band
    page.locator(".mw-root .mw-tab[data-tab='timeline']").click()
    page.wait_for_selector(".mw-root .mw-timeline canvas")
    legend = page.locator(".mw-root .mw-timeline-legend").inner_text()
    assert "KV cache" in legend, legend
    page.set_viewport_size({"width": 900, "height": 1400})
    command(page, "apputils:change-theme", {"theme": "JupyterLab Dark"})
    wait_theme(page, dark=True)
    page.locator(".mw-root .mw-tab[data-tab='details']").click()
    page.screenshot(path=str(artifacts / "lab-serving-900-dark.png"), full_page=True)
    command(page, "apputils:change-theme", {"theme": "JupyterLab Light"})
    wait_theme(page, dark=False)


def test_timeline_labels_never_overlap(
    page: Any, jupyter_lab: dict[str, Any], artifacts: Path
) -> None:
    """8 (the timeline's half): the peak's, the parameters band's and the phases' labels apart,
    inside the plot, at 1,400 and 900 px, light and dark."""
    run_serving(page, jupyter_lab, "labels")
    page.locator(".mw-root .mw-tab[data-tab='timeline']").click()
    page.wait_for_selector(".mw-root .mw-timeline canvas")
    check_labels(page)
    page.screenshot(path=str(artifacts / "lab-serving-timeline-1400-light.png"), full_page=True)
    page.set_viewport_size({"width": 900, "height": 1400})
    page.wait_for_timeout(300)  # the chart redraws on resize (a frame)
    check_labels(page)
    page.locator(".mw-root .mw-chart-timeline").scroll_into_view_if_needed()
    page.screenshot(path=str(artifacts / "lab-serving-timeline-900-light.png"), full_page=True)
    command(page, "apputils:change-theme", {"theme": "JupyterLab Dark"})
    wait_theme(page, dark=True)
    check_labels(page)
    page.screenshot(path=str(artifacts / "lab-serving-timeline-900-dark.png"), full_page=True)
    page.set_viewport_size({"width": 1400, "height": 1400})
    page.wait_for_timeout(300)
    check_labels(page)
    page.screenshot(path=str(artifacts / "lab-serving-timeline-1400-dark.png"), full_page=True)
    command(page, "apputils:change-theme", {"theme": "JupyterLab Light"})
    wait_theme(page, dark=False)


def test_the_graph_leaves_the_wheel_to_the_page(
    page: Any, jupyter_lab: dict[str, Any], artifacts: Path
) -> None:
    """2: over the Graph tab the wheel scrolls the notebook; Ctrl + wheel zooms."""
    run_serving(page, jupyter_lab, "wheel", width=900)
    page.set_viewport_size({"width": 900, "height": 700})
    check_graph_wheel(page)
    page.screenshot(path=str(artifacts / "lab-serving-graph-900-light.png"), full_page=True)
