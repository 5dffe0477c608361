"""The widget in a real JupyterLab, driven by a real Chromium.

A notebook analyzes a tiny transformers GPT-2 with ``widget=True`` (the widget shows before the
trace and the calls stream in), then displays the returned ``Analysis``. The test runs it, checks
the tree, saves the notebook with the widget state, and reopens it with a fresh kernel that runs
nothing: the widgets must render from the saved state alone. Where no widget can render (no
kernel at all, a notebook saved with Lab's default settings, i.e. without widget state, or one
whose restored state a later save dropped) each output's static view shows instead, never
"Error displaying widget: model not found". Keys pressed in the widget stay in it. A tutorial
notebook runs top to bottom in Lab.
Screenshots (light and dark) land in ``test-artifacts/``; look at them.
"""

from __future__ import annotations

import json
import re
import shutil
import urllib.request
from pathlib import Path
from typing import Any

# Plain imports, no importorskip: a missing test dependency must fail the run, not skip it.
import nbformat
import pytest
import transformers

pytestmark = pytest.mark.e2e

KERNEL_NAME = "meta-widget-test"  # the kernelspec the jupyter_lab fixture writes

ROOT = Path(__file__).resolve().parents[2]
GPT2 = (
    "transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=64,\n"
    '                                  architectures=["GPT2LMHeadModel"])'
)
CELLS = [
    "import transformers\nimport meta_widget as mw",
    f"config = {GPT2}\na = mw.analyze(config, input_size=(1, 16), widget=True)",
    "a",
    "print(a.total_params, len(a.calls))",
]
#: a generous ceiling for any one state to arrive: these tests must pass on a machine whose every
#: core is busy with something else (they wait for states, so a long ceiling costs nothing)
SLOW_MS = 180_000
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
STREAM_ERRORS = re.compile(r"Error|Traceback", re.IGNORECASE)
#: what third-party imports print on stderr in the test environment, not meta_widget: torchao
#: 0.18 (a test dependency, imported by transformers when installed) beside this torch build
THIRD_PARTY_NOISE = re.compile(
    r"^(Failed to load \S*/torchao/\S*\.so\b.*"
    r"|W\d{4} [\d:.]+ \d+ \S*torch/utils/_pytree\.py:\d+\] <enum .*register_constant.*"
    r"|\s*)$"
)


def failures(stderr: list[str]) -> list[str]:
    """The stderr lines that are not the known third-party import noise above: anything
    meta_widget (or the user's code) prints there is a failure."""
    return [
        line for text in stderr for line in text.splitlines() if not THIRD_PARTY_NOISE.match(line)
    ]


def api(lab: dict[str, Any], path: str, method: str = "GET") -> Any:
    req = urllib.request.Request(f"{lab['url']}{path}", method=method)
    with urllib.request.urlopen(req, timeout=10) as r:
        body = r.read()
    return json.loads(body) if body else None


def delete_sessions(lab: dict[str, Any]) -> None:
    for s in api(lab, "/api/sessions"):
        api(lab, f"/api/sessions/{s['id']}", "DELETE")


def write_notebook(path: Path, cells: list[str]) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    nb.metadata["kernelspec"] = {
        "name": KERNEL_NAME,
        "display_name": "meta_widget test (Python)",
        "language": "python",
    }
    nbformat.write(nb, str(path))


def command(page: Any, name: str, args: dict[str, Any] | None = None) -> Any:
    return page.evaluate("([n, a]) => window.jupyterapp.commands.execute(n, a)", [name, args or {}])


def open_notebook(page: Any, lab: dict[str, Any], name: str) -> None:
    page.goto(f"{lab['url']}/lab/tree/{name}?reset")
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell", timeout=SLOW_MS)
    page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=SLOW_MS)


def wait_idle(page: Any, timeout: float = SLOW_MS) -> None:
    """Wait for "| Idle" in the status bar (the toolbar indicator alone is not enough)."""
    page.wait_for_function(
        """() => [...document.querySelectorAll('#jp-main-statusbar *')]
            .some(e => e.children.length === 0 && /\\|\\s*Idle/.test(e.textContent))""",
        timeout=timeout,
    )


def prompts(page: Any) -> list[str]:
    return page.eval_on_selector_all(
        ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell .jp-InputPrompt",
        "ps => ps.map(p => p.textContent.trim())",
    )


def run_all(page: Any, n_cells: int, timeout_ms: int = SLOW_MS) -> None:
    """Run every cell; retry once when a prompt stays empty (seen once on a fresh server)."""
    for _attempt in range(2):
        command(page, "notebook:run-all-cells")
        try:
            page.wait_for_function(
                """n => {
                  const ps = [...document.querySelectorAll(
                    '.jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell .jp-InputPrompt')];
                  return ps.length === n && ps.every(p => /\\[\\d+\\]/.test(p.textContent));
                }""",
                arg=n_cells,
                timeout=timeout_ms,
            )
            wait_idle(page)
            return
        except Exception:
            if _attempt:
                raise
            wait_idle(page)
    raise AssertionError(f"cells did not run: {prompts(page)}")


def wait_text(page: Any, selector: str, needles: list[str], nth: int = 0) -> str:
    """Wait until the ``nth`` match of ``selector`` shows every one of ``needles``; its text.

    Wait for the values themselves, not for their labels: while a trace runs, the totals show
    their labels with "…" as the value.
    """
    page.wait_for_function(
        """([sel, n, needles]) => {
          const el = document.querySelectorAll(sel)[n];
          if (!el) return false;
          const text = el.innerText.replace(/\\s+/g, ' ');
          return needles.every(x => text.includes(x));
        }""",
        arg=[selector, nth, needles],
        timeout=SLOW_MS,
    )
    return str(page.locator(selector).nth(nth).inner_text())


def wait_theme(page: Any, dark: bool) -> None:
    """Wait until JupyterLab's theme switched, its splash screen is gone and the widget's
    colors followed it."""
    page.wait_for_function(
        """dark => {
          const lum = css => { const [r, g, b] = css.match(/\\d+/g).map(Number);
                               return (0.2126 * r + 0.7152 * g + 0.0722 * b) / 255; };
          const root = document.querySelector('.mw-root');
          const name = root && root.querySelector('.mw-mname');
          if (document.body.dataset.jpThemeLight !== String(!dark) || !name) return false;
          // JupyterLab shows its splash screen over the page while a theme loads, and takes it
          // away some time after (it covered every plan point in CI under load)
          if (document.getElementById('jupyterlab-splash')) return false;
          const bg = lum(getComputedStyle(root).backgroundColor);
          const fg = lum(getComputedStyle(name).color);
          return dark ? bg < 0.3 && fg > 0.3 : fg < 0.5;  // light: a root may be transparent
        }""",
        arg=dark,
        timeout=SLOW_MS,
    )


def wait_saved(path: Path, n_payloads: int) -> Any:
    """Poll the notebook file until it holds ``n_payloads`` finished widget payloads."""
    import time

    deadline = time.monotonic() + SLOW_MS / 1000
    while True:
        try:
            saved = nbformat.read(str(path), as_version=4)
            state = saved.metadata["widgets"][WIDGET_STATE]["state"]
            payloads = [m["state"]["payload"] for m in state.values() if m["state"].get("payload")]
            if len(payloads) == n_payloads:
                return saved
        except (KeyError, ValueError, OSError):  # not saved yet, or being written
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"{path.name} was not saved with {n_payloads} widget payloads")
        time.sleep(0.2)


def widget_views(notebook: Any) -> list[str]:
    """The model id of every widget view among ``notebook``'s outputs."""
    return [
        o["data"][WIDGET_VIEW]["model_id"]
        for c in notebook.cells
        for o in c.get("outputs", [])
        if WIDGET_VIEW in o.get("data", {})
    ]


def saved_notebook(lab: dict[str, Any]) -> Path:
    """The notebook ``test_stream_save_and_reopen`` saved, which the later tests reopen."""
    saved: Path = lab["root"] / "saved.ipynb"
    if not saved.exists():
        pytest.fail("test_stream_save_and_reopen did not leave its saved notebook")
    return saved


def widget_rows(page: Any, nth: int) -> list[tuple[str, str]]:
    """(name, type) of the rows the nth widget shows, in row order."""
    rows = page.evaluate(
        """n => {
          const root = document.querySelectorAll('.mw-root')[n];
          return [...root.querySelectorAll('.mw-row')]
            .filter(r => r.style.display !== 'none')
            .sort((a, b) => Number(a.dataset.row) - Number(b.dataset.row))
            .map(r => [r.querySelector('.mw-mname').textContent,
                       r.querySelector('.mw-mtype')?.textContent ?? '']);
        }""",
        nth,
    )
    return [(name, kind) for name, kind in rows]


def luminance(css: str) -> float:
    r, g, b = (int(x) for x in re.findall(r"\d+", css)[:3])
    return (0.2126 * r + 0.7152 * g + 0.0722 * b) / 255


def check_tree(page: Any, nth: int) -> None:
    rows = widget_rows(page, nth)
    names = [n for n, _ in rows]
    assert names[0] == "GPT2LMHeadModel", rows
    assert {"transformer", "wte", "wpe", "h", "ln_f", "lm_head"} <= set(names), rows
    # the two identical GPT2Block layers fold into one group row
    assert ("0–1", "2 × GPT2Block") in rows, rows


def expected_params() -> int:
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=64)
    return sum(p.numel() for p in transformers.GPT2LMHeadModel(cfg).parameters())


def test_stream_save_and_reopen(page: Any, jupyter_lab: dict[str, Any], artifacts: Path) -> None:
    lab = jupyter_lab
    delete_sessions(lab)
    nb_path = lab["root"] / "stream.ipynb"
    write_notebook(nb_path, CELLS)
    page.set_viewport_size({"width": 1400, "height": 1400})
    open_notebook(page, lab, nb_path.name)
    wait_idle(page)
    assert page.evaluate(
        "id => window.jupyterapp.commands.isToggled(id)",
        "@jupyter-widgets/jupyterlab-manager:saveWidgetState",
    ), "widget state would not be saved with the notebook"

    run_all(page, len(CELLS))
    page.wait_for_function(
        "() => document.querySelectorAll('.mw-root').length === 2", timeout=SLOW_MS
    )
    # the streamed widget: the stream completed (no spinner; "N calls recorded in X s")
    page.wait_for_function(
        """() => { const p = document.querySelector('.mw-root .mw-progress');
                   return p && /calls recorded in/.test(p.textContent)
                     && !p.querySelector('.mw-spinner'); }""",
        timeout=SLOW_MS,
    )
    n_calls = int(page.locator(".jp-OutputArea-output pre").last.inner_text().split()[1])
    progress = page.locator(".mw-root .mw-progress").first.inner_text()
    assert f"{n_calls} calls recorded in" in progress, progress
    # (how long the whole cell took is said only when it ran 50 ms past the trace: with the
    # warm-up having imported transformers, building this model takes less; js/streaming.test.ts
    # holds the line's two forms)
    for nth in (0, 1):
        check_tree(page, nth)
    n_params = expected_params()
    wait_text(page, ".mw-root .mw-totals", [f"{n_params / 1000:.1f} K"])
    errors = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
    assert not failures(errors.all_inner_texts()), errors.all_inner_texts()
    page.screenshot(path=str(artifacts / "lab-light.png"), full_page=True)

    # dark theme: the widget follows JupyterLab's theme variables
    command(page, "apputils:change-theme", {"theme": "JupyterLab Dark"})
    wait_theme(page, dark=True)
    bg = page.eval_on_selector(".mw-root", "r => getComputedStyle(r).backgroundColor")
    fg = page.eval_on_selector(".mw-root .mw-mname", "r => getComputedStyle(r).color")
    assert luminance(bg) < 0.3 < luminance(fg), (bg, fg)
    page.screenshot(path=str(artifacts / "lab-dark.png"), full_page=True)
    command(page, "apputils:change-theme", {"theme": "JupyterLab Light"})
    wait_theme(page, dark=False)

    keys_stay_in_the_widget(page)

    # save: the widget state goes into the notebook's metadata
    command(page, "docmanager:save")
    page.wait_for_function(
        "() => !document.querySelector('.jp-NotebookPanel-toolbar')"
        " || !document.title.startsWith('*')",
        timeout=SLOW_MS,
    )
    # the streamed widget and `a` are one widget shown twice (a.widget() is the widget that
    # streamed it): one model in the saved state, two views of it
    saved = wait_saved(nb_path, 1)
    state = saved.metadata["widgets"][WIDGET_STATE]["state"]
    payloads = [m["state"]["payload"] for m in state.values() if m["state"].get("payload")]
    assert len(payloads) == 1, [m["model_name"] for m in state.values()]
    assert all(p["status"] == "done" for p in payloads)
    assert all(len(p["calls"]["module"]) == n_calls for p in payloads)
    views = widget_views(saved)
    assert len(views) == 2 and len(set(views)) == 1 and all(v in state for v in views)
    # the output of `a` carries the static view too, for front ends without the widget, and so
    # does the output of widget=True (updated in place when its analysis ended)
    for cell in (1, 2):
        outs = saved.cells[cell].outputs
        static = [o["data"]["text/html"] for o in outs if "text/html" in o.get("data", {})]
        assert static and "meta-widget-fallback" in static[0] and "GPT2LMHeadModel" in static[0]

    # reopen with a fresh kernel that runs nothing: the widgets come from the saved state
    delete_sessions(lab)
    assert api(lab, "/api/kernels") == []
    open_notebook(page, lab, nb_path.name)
    wait_idle(page)
    wait_rendered(page, artifacts / "lab-saved-fresh-kernel-failed.png")
    assert page.locator(".mw-root").count() == 2
    for nth in (0, 1):
        check_tree(page, nth)
    assert prompts(page) == ["[1]:", "[2]:", "[3]:", "[4]:"]  # the saved counts: nothing ran
    assert "calls recorded" not in page.locator(".mw-root").first.inner_text()
    # no kernel-side widget answers these views: their re-run switches are off and say why,
    # instead of "Re-running…" forever after a click
    for nth in (0, 1):
        root = page.locator(".mw-root").nth(nth)
        assert root.locator('.mw-mode button[data-mode="training"]').is_disabled()
        assert "No answer from the kernel" in (
            root.locator(".mw-switches").get_attribute("title") or ""
        )
    page.screenshot(path=str(artifacts / "lab-saved-fresh-kernel.png"), full_page=True)
    shutil.copy(nb_path, lab["root"] / "saved.ipynb")
    # the details panel's label/value pairs sit side by side (JupyterLab's output-area CSS
    # floats <dt>/<dd> at 20%/80% unless the widget's own rules win)
    misaligned = page.evaluate(
        """() => [...document.querySelectorAll('.mw-root .mw-kv dt')].filter(dt => {
              const dd = dt.nextElementSibling, a = dt.getBoundingClientRect();
              const b = dd ? dd.getBoundingClientRect() : null;
              return !b || Math.abs(a.top - b.top) > 2 || b.left < a.right;
            }).map(dt => dt.textContent)"""
    )
    assert not misaligned, f"details labels not beside their values: {misaligned}"


def n_cells(page: Any) -> int:
    return int(page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell").count())


def keys_stay_in_the_widget(page: Any) -> None:
    """Notebook shortcuts (``a``/``b`` insert a cell, ``m`` makes it markdown, ``dd`` deletes
    it) do nothing with the focus in the widget's tree, and the tree still gets its keys."""
    before = n_cells(page)
    row = page.locator(".mw-root .mw-row").first
    row.locator(".mw-mname").click()
    page.keyboard.press("Escape")  # what leaves an editor: Lab's command mode, if it were there
    for key in ("a", "b", "m", "d", "d", "ArrowDown"):
        page.keyboard.press(key)
    assert n_cells(page) == before, "a key pressed in the widget changed the notebook's cells"
    assert page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-MarkdownCell").count() == 0
    # ArrowDown moved the selection to the next row: the tree heard the keys
    selected = page.locator(".mw-root").first.locator(".mw-row.mw-selected .mw-mname")
    assert selected.count() == 1 and selected.inner_text() != "GPT2LMHeadModel"


def visible_errors(page: Any) -> list[str]:
    """The widget manager's error texts that a reader sees."""
    return page.evaluate(
        """() => [...document.querySelectorAll('.jp-OutputArea-output')]
            .filter(o => /Error displaying widget/.test(o.textContent) && o.offsetParent)
            .map(o => o.textContent.trim())"""
    )


def wait_static_views(page: Any, n: int, screenshot: Path) -> None:
    """Wait until ``n`` static views are visible, with no widget error in sight."""
    try:
        page.wait_for_function(
            """n => [...document.querySelectorAll('.meta-widget-fallback')]
                .filter(v => v.offsetParent).length === n""",
            arg=n,
            timeout=SLOW_MS,
        )
    finally:
        page.screenshot(path=str(screenshot), full_page=True)
    for view in page.locator(".meta-widget-fallback").all():
        assert "0–1 · 2 × GPT2Block" in view.inner_text()
        box = view.bounding_box()
        assert box and box["height"] > 150 and box["width"] > 400, box
    assert not visible_errors(page), visible_errors(page)
    assert page.locator(".mw-root").count() == 0


class SavedWidgetNotRestored(AssertionError):
    """The saved widget state was not rendered."""


def wait_rendered(page: Any, screenshot: Path, timeout_ms: int = SLOW_MS) -> None:
    try:
        page.wait_for_function(
            "() => document.querySelectorAll('.mw-root .mw-row').length > 0", timeout=timeout_ms
        )
    except Exception as e:
        page.screenshot(path=str(screenshot))
        raise SavedWidgetNotRestored(
            f"the saved widget did not render; console: {page.errors}"
        ) from e


def test_saved_notebook_without_kernel(
    page: Any, jupyter_lab: dict[str, Any], artifacts: Path
) -> None:
    lab = jupyter_lab
    saved = saved_notebook(lab)
    delete_sessions(lab)
    page.set_viewport_size({"width": 1400, "height": 1400})
    # the only kernelspec removed: no kernel can start; the notebook opens with "No Kernel"
    hidden = lab["kernel_dir"].with_name(KERNEL_NAME + ".off")
    shutil.move(str(lab["kernel_dir"]), str(hidden))
    try:
        open_notebook(page, lab, saved.name)
        dialog = page.locator(".jp-Dialog")
        dialog.wait_for(timeout=SLOW_MS)
        dialog.locator("button", has_text=re.compile("^No Kernel$")).click()
        page.wait_for_function(
            """() => [...document.querySelectorAll('#jp-main-statusbar *')]
                .some(e => e.children.length === 0 && /No Kernel/.test(e.textContent))""",
            timeout=SLOW_MS,
        )
        assert api(lab, "/api/kernels") == [], "a kernel was started"
        page.screenshot(path=str(artifacts / "lab-saved-no-kernel.png"), full_page=True)
        # JupyterLab 4's widget manager restores no saved state without a kernel (upstream:
        # jupyter-widgets/ipywidgets#3773, jupyterlab/jupyterlab#15361): the static views show
        wait_static_views(page, 2, artifacts / "lab-saved-no-kernel.png")
    finally:
        shutil.move(str(hidden), str(lab["kernel_dir"]))


def wait_rewritten(path: Path, since: float) -> Any:
    """Poll until ``path`` is written again after ``since`` (its mtime), then read it."""
    import time

    deadline = time.monotonic() + SLOW_MS / 1000
    while path.stat().st_mtime <= since:
        if time.monotonic() > deadline:
            raise AssertionError(f"{path.name} was not saved again")
        time.sleep(0.2)
    return nbformat.read(str(path), as_version=4)


def test_reopen_run_a_cell_and_save_keeps_the_restored_widgets(
    page: Any, jupyter_lab: dict[str, Any], artifacts: Path
) -> None:
    lab = jupyter_lab
    saved = saved_notebook(lab)
    again = lab["root"] / "resaved.ipynb"
    shutil.copy(saved, again)
    delete_sessions(lab)
    page.set_viewport_size({"width": 1400, "height": 1400})
    open_notebook(page, lab, again.name)
    wait_idle(page)
    wait_rendered(page, artifacts / "lab-resaved-failed.png")
    # one run (the imports cell), then a save
    page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell").first.click()
    command(page, "notebook:run-cell")
    wait_idle(page)
    before = again.stat().st_mtime
    command(page, "docmanager:save")
    notebook = wait_rewritten(again, before)
    state = notebook.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    views = widget_views(notebook)
    assert views, "the saved outputs lost their widget views"
    if all(v in state for v in views):
        return  # the state was kept (a fixed jupyterlab_widgets): the widgets render again
    # saving a reopened notebook drops the state it restored (upstream: ipywidgets#3888,
    # #3270): reopened, the outputs show their static views, not "model not found"
    delete_sessions(lab)
    open_notebook(page, lab, again.name)
    wait_idle(page)
    wait_static_views(page, 2, artifacts / "lab-resaved-reopened.png")


TUTORIAL = ROOT / "notebooks" / "01-meta-tensors-101.ipynb"


def test_tutorial_runs_in_lab(page: Any, jupyter_lab: dict[str, Any], artifacts: Path) -> None:
    lab = jupyter_lab
    delete_sessions(lab)
    nb = nbformat.read(str(TUTORIAL), as_version=4)
    nb.metadata["kernelspec"] = {"name": KERNEL_NAME, "display_name": "test", "language": "python"}
    nbformat.write(nb, str(lab["root"] / TUTORIAL.name))
    n_code = sum(1 for c in nb.cells if c.cell_type == "code")
    page.set_viewport_size({"width": 1400, "height": 1400})
    open_notebook(page, lab, TUTORIAL.name)
    wait_idle(page)
    run_all(page, n_code, timeout_ms=2 * SLOW_MS)
    errors = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
    texts = [t for t in errors.all_inner_texts() if STREAM_ERRORS.search(t)]
    assert not texts, texts
    assert page.locator(".jp-OutputArea-output .jp-RenderedText", has_text="Traceback").count() == 0
    page.screenshot(path=str(artifacts / "lab-tutorial-01.png"), full_page=True)


TRAIN_CELLS = [
    "import torch.nn as nn\nimport meta_widget as mw",
    "m = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))\n"
    "a = mw.analyze(m, input_size=(32, 64), widget=True)",
]


def test_switch_to_training_reruns(page: Any, jupyter_lab: dict[str, Any], artifacts: Path) -> None:
    """Clicking "training" asks the kernel to re-run; the stream shows, then the training totals."""
    lab = jupyter_lab
    delete_sessions(lab)
    nb_path = lab["root"] / "train.ipynb"
    write_notebook(nb_path, TRAIN_CELLS)
    page.set_viewport_size({"width": 1400, "height": 1200})
    open_notebook(page, lab, nb_path.name)
    wait_idle(page)
    run_all(page, len(TRAIN_CELLS))
    page.wait_for_selector(".mw-root .mw-row", timeout=SLOW_MS)
    # the inference analysis is done (its parameter count shown) before the switch is clicked
    n = 64 * 256 + 256 + 256 * 10 + 10
    wait_text(page, ".mw-root .mw-totals", [f"{n / 1000:.1f} K"])
    assert "gradients" not in page.locator(".mw-root .mw-totals").inner_text()
    assert page.locator(".mw-root .mw-mode button[data-mode='training']").is_enabled()
    page.evaluate(
        """() => { window.__mwSeen = false;
          new MutationObserver(() => {
            const p = document.querySelector('.mw-root .mw-progress');
            if (p && (/Re-running/.test(p.textContent) || p.querySelector('.mw-spinner')))
              window.__mwSeen = true;
          }).observe(document.querySelector('.mw-root'),
                     {subtree: true, childList: true, characterData: true}); }"""
    )
    page.locator(".mw-root .mw-mode button[data-mode='training']").click()
    page.wait_for_function("() => window.__mwSeen", timeout=SLOW_MS)
    # the re-run is done: the progress line says so, and the totals show values, not "…"
    page.wait_for_function(
        """() => { const p = document.querySelector('.mw-root .mw-progress');
                   return p && /calls recorded in/.test(p.textContent)
                     && !p.querySelector('.mw-spinner'); }""",
        timeout=SLOW_MS,
    )
    # and where the re-run is in Python
    assert "in Python: a.widget().analysis" in page.locator(".mw-root .mw-progress").inner_text()
    # AdamW: gradients = parameter bytes, optimizer state = 2 x parameter bytes (fp32); waited
    # for as values: right after the click the labels show with "…" while the trace runs
    grads, state = f"{n * 4 / 1024:.1f} KiB", f"{n * 8 / 1024:.0f} KiB"
    totals = wait_text(page, ".mw-root .mw-totals", ["gradients", grads, "optimizer state", state])
    assert "…" not in totals, totals
    assert page.locator(".mw-root .mw-chip-training").count() == 1
    assert page.locator(".mw-root .mw-optimizer").is_enabled()
    page.locator(".mw-root .mw-tab[data-tab='memory']").click()
    page.wait_for_selector(".mw-root .mw-catseg")
    page.screenshot(path=str(artifacts / "lab-training-light.png"), full_page=True)
    page.locator(".mw-root .mw-tab[data-tab='timeline']").click()
    page.wait_for_selector(".mw-root .mw-timeline canvas", timeout=SLOW_MS)
    page.locator(".mw-root .mw-timeline").screenshot(
        path=str(artifacts / "lab-training-timeline.png")
    )
    command(page, "apputils:change-theme", {"theme": "JupyterLab Dark"})
    wait_theme(page, dark=True)
    page.locator(".mw-root .mw-tab[data-tab='memory']").click()
    page.wait_for_selector(".mw-root .mw-catseg", timeout=SLOW_MS)
    page.screenshot(path=str(artifacts / "lab-training-dark.png"), full_page=True)
    command(page, "apputils:change-theme", {"theme": "JupyterLab Light"})
    wait_theme(page, dark=False)
    errors = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
    assert not failures(errors.all_inner_texts()), errors.all_inner_texts()
