"""The widget before its first traced row (issue 40, "warm start"), in a real JupyterLab and a
real Chromium: it says what the analysis waits for, and shows the module tree before the trace's
first call.

``analyze(Net, input_size=..., widget=True)`` in a kernel whose warm-up (``meta_widget.warm``) is
still running: the test holds the warm-up until it has read the page (a file appears), then
holds the model's forward in its first module until it has read the page again. Held 1: the
progress line says the analysis waits for PyTorch's meta kernels (with seconds so far) and the
table says where the tree will be. Held 2: every module is a row (names, types, parameters), its
shapes, output memory and FLOPs pending ("…"), no row traced, and the line says the trace waits
for its first module call. Then the analysis ends with every row traced. Screenshots of held 2
at 1,400 and 900 px, light and dark (``lab-waiting-*.png``); look at them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from test_jupyterlab import (
    SLOW_MS,
    command,
    delete_sessions,
    open_notebook,
    wait_idle,
    wait_theme,
    write_notebook,
)

pytestmark = pytest.mark.e2e

#: the modules of ``Net`` below, in ``named_modules()`` order
MODULES = 1 + 1 + 1 + 1 + 8 * 3 + 1


def cells(warm_gate: Path, trace_gate: Path) -> list[str]:
    """A notebook whose warm-up waits for ``warm_gate`` and whose trace waits for ``trace_gate``
    (files the test creates once it has read the page)."""
    return [
        # the kernel's own warm-up off: this one, which the test holds, takes its place
        "import os, pathlib, threading\n"
        "os.environ['META_WIDGET_WARMUP'] = '0'\n"
        "import torch\nfrom torch import nn\n"
        "import meta_widget as mw\nfrom meta_widget import warm\n"
        f"warm_gate = pathlib.Path({str(warm_gate)!r})\n"
        f"trace_gate = pathlib.Path({str(trace_gate)!r})\n"
        "tick = threading.Event()\n"
        "def hold(gate):\n"
        "    while not gate.exists():\n"
        "        tick.wait(0.05)  # the test creates the file once it has read the page\n"
        "assert warm.start(lambda: hold(warm_gate))\n"
        "class Hold(nn.Module):\n"
        "    def forward(self, x):\n"
        "        hold(trace_gate)\n"
        "        return x\n"
        "class Net(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.hold = Hold()\n"
        "        self.embed = nn.Linear(64, 128)\n"
        "        self.layers = nn.ModuleList(\n"
        "            nn.Sequential(nn.Linear(128, 128), nn.GELU()) for _ in range(8))\n"
        "        self.head = nn.Linear(128, 10)\n"
        "    def forward(self, x):\n"
        "        x = self.embed(self.hold(x))\n"
        "        for layer in self.layers:\n"
        "            x = layer(x)\n"
        "        return self.head(x)",
        "a = mw.analyze(Net, input_size=(4, 64), widget=True, depth=1)",
        "print(len(a.modules), len(a.calls))",
    ]


#: the widget's texts, read in one go
READ = """() => {
  const root = document.querySelector('.mw-root');
  if (!root) return null;
  const progress = root.querySelector('.mw-progress');
  const empty = root.querySelector('.mw-table-empty');
  const rows = [...root.querySelectorAll('.mw-row')].filter(r => r.style.display !== 'none');
  return {
    progress: progress && progress.style.display !== 'none' ? progress.textContent : '',
    empty: empty && empty.style.display !== 'none' ? empty.textContent : '',
    names: rows.map(r => r.querySelector('.mw-mname').textContent),
    pending: rows.filter(r => r.classList.contains('mw-pending')).length,
    waitingCells: root.querySelectorAll('.mw-row .mw-td-pending').length,
    params: rows.map(r => [...r.querySelectorAll('.mw-td:not(.mw-name)')]
      .filter(c => !c.classList.contains('mw-td-pending')).map(c => c.textContent).join(' ')),
  };
}"""


def wait_for(page: Any, js: str) -> dict[str, Any]:
    """Wait until the widget's state satisfies ``js`` (a condition on ``s``); the state."""
    page.wait_for_function(
        f"() => {{ const s = ({READ})(); return s && ({js}); }}", timeout=SLOW_MS
    )
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
    state: dict[str, Any] = page.evaluate(READ)
    return state


def shoot(page: Any, artifacts: Path, label: str) -> None:
    page.locator(".mw-root").first.scroll_into_view_if_needed()
    page.screenshot(path=str(artifacts / f"lab-waiting-{label}.png"), full_page=True)


def test_the_widget_says_what_it_waits_for_and_shows_the_tree_before_the_first_call(
    page: Any, jupyter_lab: dict[str, Any], artifacts: Path
) -> None:
    lab = jupyter_lab
    delete_sessions(lab)
    warm_gate, trace_gate = lab["root"] / "warm-gate", lab["root"] / "trace-gate"
    for gate in (warm_gate, trace_gate):
        gate.unlink(missing_ok=True)
    write_notebook(lab["root"] / "waiting.ipynb", cells(warm_gate, trace_gate))
    page.set_viewport_size({"width": 1400, "height": 1000})
    open_notebook(page, lab, "waiting.ipynb")
    wait_idle(page)
    # not awaited: the command resolves when the cells ran, and they wait for the test
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
    try:
        # held 1: the warm-up runs, the model is not built: no tree, the line says why
        warming = wait_for(page, "/meta kernels to load/.test(s.progress)")
        assert re.search(r"· \d+\.\d s so far$", warming["progress"]), warming
        assert warming["names"] == [], warming
        assert warming["empty"] == "The module tree shows here as soon as the model is built."
        # nothing to re-run yet: the mode switch is off while the analysis waits
        modes = page.locator(".mw-root .mw-mode button")
        assert modes.count() >= 2, modes.count()
        assert all(modes.nth(i).is_disabled() for i in range(modes.count()))
        shoot(page, artifacts, "warm-up-1400-light")
        warm_gate.touch()
        # held 2: the model built, its forward held in its first module: the tree, pending
        held = wait_for(page, "/first module call/.test(s.progress) && s.names.length > 0")
        assert held["names"][:5] == ["Net", "hold", "embed", "layers", "head"], held
        assert held["pending"] == len(held["names"]), held  # no row traced yet
        assert held["waitingCells"] == 4 * len(held["names"]), held  # shapes, out mem, FLOPs
        # the structure is known: Net's parameters (64·128+128 + 8·(128·128+128) + 128·10+10)
        assert re.search(r"14[12][.\d]* ?K", held["params"][0]), held
        assert "calls recorded" not in held["progress"], held
        # the selected root's details: its parameters, no made-up zeros for what is pending
        details = page.locator(".mw-root .mw-details").first.inner_text()
        assert "Not traced yet" in details and "0 FLOPs (0)" not in details, details
        assert "output mem (its" not in details, details
        shoot(page, artifacts, "held-1400-light")
        command(page, "apputils:change-theme", {"theme": "JupyterLab Dark"})
        wait_theme(page, dark=True)
        shoot(page, artifacts, "held-1400-dark")
        page.set_viewport_size({"width": 900, "height": 1000})
        wait_for(page, "s.pending > 0")
        shoot(page, artifacts, "held-900-dark")
        command(page, "apputils:change-theme", {"theme": "JupyterLab Light"})
        wait_theme(page, dark=False)
        shoot(page, artifacts, "held-900-light")
        still = page.evaluate(READ)
        assert still["pending"] == len(still["names"]), still  # held: still nothing traced
    finally:
        warm_gate.touch()
        trace_gate.touch()
    done = wait_for(page, "/calls recorded in/.test(s.progress)")
    page.set_viewport_size({"width": 1400, "height": 1000})
    wait_idle(page)
    shoot(page, artifacts, "done-1400-light")
    assert done["pending"] == 0 and done["waitingCells"] == 0, done
    assert done["names"][:5] == ["Net", "hold", "embed", "layers", "head"], done
    out = page.locator(".jp-NotebookPanel .jp-CodeCell").last.locator(".jp-OutputArea")
    page.wait_for_function(
        "el => /^\\d+ \\d+\\s*$/m.test(el.innerText)", arg=out.element_handle(), timeout=SLOW_MS
    )
    n_modules = int(re.search(r"^(\d+) \d+\s*$", out.inner_text(), re.MULTILINE).group(1))  # type: ignore[union-attr]
    assert n_modules == MODULES
    for gate in (warm_gate, trace_gate):
        gate.unlink(missing_ok=True)


LLAMA_70B = (
    "transformers.LlamaConfig(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,"
    " num_attention_heads=64, num_key_value_heads=8, vocab_size=128256)"
)

#: from now on, when the page first showed: the waiting line, a module row, a traced call
WATCH_FIRST = """() => {
  const begun = performance.now();
  window.__mwFirst = {};
  const seen = new MutationObserver(() => {
    const t = performance.now() - begun;
    const f = window.__mwFirst;
    const root = document.querySelector('.mw-root');
    if (!root) return;
    const line = root.querySelector('.mw-progress');
    const wait = root.querySelector('.mw-progress .mw-waiting');
    if (f.waiting === undefined && wait) f.waiting = t;
    const said = wait ? wait.textContent.split(' (')[0].split(' · ')[0] : null;
    window.__mwSaid = window.__mwSaid || [];
    if (said && !window.__mwSaid.includes(said)) window.__mwSaid.push(said);
    if (f.row === undefined && root.querySelector('.mw-row')) f.row = t;
    if (f.traced === undefined && line && /[1-9][\\d,]* calls recorded/.test(line.textContent))
      f.traced = t;
    if (f.done === undefined && line && /calls recorded in/.test(line.textContent)) f.done = t;
  });
  seen.observe(document.body, {childList: true, subtree: true, characterData: true});
}"""


def test_time_to_the_first_row_in_a_fresh_kernel(
    page: Any, jupyter_lab: dict[str, Any], artifacts: Path
) -> None:
    """A measure, printed (not asserted): from running a fresh kernel's notebook
    (``%load_ext meta_widget``, then Llama-3-70B with ``widget=True`` in the next cell) to the
    waiting line, the first (structural) row, the first traced call and the end. The order is
    asserted: the waiting line first, the tree no later than the first traced call."""
    lab = jupyter_lab
    delete_sessions(lab)
    write_notebook(
        lab["root"] / "first-row.ipynb",
        [
            "%load_ext meta_widget\nimport transformers\nimport meta_widget as mw",
            f"a = mw.analyze({LLAMA_70B}, input_size=(1, 4096), widget=True)",
        ],
    )
    page.set_viewport_size({"width": 1400, "height": 1000})
    open_notebook(page, lab, "first-row.ipynb")
    wait_idle(page)
    page.evaluate(WATCH_FIRST)
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
    page.wait_for_function("() => window.__mwFirst.done !== undefined", timeout=SLOW_MS)
    first = page.evaluate("() => window.__mwFirst")
    said = page.evaluate("() => window.__mwSaid || []")
    print(
        "\nfresh kernel, Llama-3-70B widget=True: "
        + ", ".join(f"{k} {v / 1000:.1f} s" for k, v in first.items())
        + f"; said before the tree: {said}"
    )
    # the tree and the first call may land in one frame; the held test above orders them
    assert first["waiting"] <= first["row"] <= first["traced"] <= first["done"], first
    wait_idle(page)
