"""Streaming states that agree (issue 28, item 6), in a real JupyterLab and Chromium.

``analyze(llama_3_70b_config, input_size=(1, 4096), widget=True)`` shows the widget before the
trace and streams its calls in. The kernel displays the widget and sends the stream's ``start``
(the module table, the model's parameters) at once, before the front end has mounted a view; a
view that missed it showed "123 calls recorded · 17.0 s" over a table "Waiting for the first
calls…" and a header "params 0". Here a listener holds the trace at its 600th call until the
test says so (a file appears), the page's three texts are read together while it is held, and
every state the page passes through from the first call to the end is recorded by a
``MutationObserver`` and checked: the progress line, the table and the header always tell one
state. Screenshot of the held state in ``test-artifacts/``; look at it.
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
    write_notebook,
)

pytestmark = pytest.mark.e2e

#: the trace is held at this call: at least two batches of 256 calls have been sent by then
HOLD_AT = 600
LLAMA_70B = (
    "transformers.LlamaConfig(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,"
    " num_attention_heads=64, num_key_value_heads=8, vocab_size=128256)"
)


def cells(gate: Path) -> list[str]:
    """A notebook whose trace waits at call ``HOLD_AT`` until ``gate`` exists."""
    hold = (
        "import threading, pathlib\n"
        f"gate, seen, tick = pathlib.Path({str(gate)!r}), [0], threading.Event()\n"
        "def hold(record):\n"
        "    seen[0] += 1\n"
        f"    while seen[0] == {HOLD_AT} and not gate.exists():\n"
        "        tick.wait(0.05)  # the test creates the file once it has read the page\n"
    )
    return [
        "import transformers\nimport meta_widget as mw\n" + hold,
        f"config = {LLAMA_70B}\n"
        "a = mw.analyze(config, input_size=(1, 4096), widget=True, listeners=[hold])",
        "print(a.total_params, len(a.calls))",
    ]


#: The page's three texts, read in one go: the progress line, the table (its "empty" line and
#: its rows) and the header's parameter count (its tooltip holds the exact number).
READ_STATE = """() => [...document.querySelectorAll('.mw-root')].map(root => {
  const progress = root.querySelector('.mw-progress');
  const empty = root.querySelector('.mw-table-empty');
  const params = [...root.querySelectorAll('.mw-total')]
    .find(t => t.querySelector('.mw-total-label')?.textContent === 'params');
  return {
    progress: progress && progress.style.display !== 'none' ? progress.textContent : '',
    empty: empty && empty.style.display !== 'none' ? empty.textContent : '',
    rows: [...root.querySelectorAll('.mw-row')].filter(r => r.style.display !== 'none').length,
    names: [...root.querySelectorAll('.mw-row .mw-mname')].map(n => n.textContent),
    pending: [...root.querySelectorAll('.mw-row.mw-pending')]
      .filter(r => r.style.display !== 'none').length,
    params: params ? params.querySelector('.mw-total-value').textContent : '',
    paramsTitle: params ? params.title : '',
  };
})"""

#: Record the page's state at every change of the widget from now on (window.__mwStates).
WATCH = (
    """() => {
  const read = """
    + READ_STATE
    + """;
  window.__mwStates = [];
  new MutationObserver(() => {
    window.__mwStates.push(...read());
  }).observe(document.body, {subtree: true, childList: true, characterData: true});
}"""
)


def exact_params(state: dict[str, Any]) -> int:
    """The header's exact parameter count (its tooltip: "69,503,033,344 parameters ...")."""
    m = re.match(r"([\d,]+) parameters", state["paramsTitle"])
    return int(m.group(1).replace(",", "")) if m else 0


def recorded(state: dict[str, Any]) -> int:
    """The calls the progress line says were recorded (-1: it says none)."""
    m = re.search(r"([\d,]+) calls recorded", state["progress"])
    return int(m.group(1).replace(",", "")) if m else -1


def disagreement(state: dict[str, Any], n_params: int) -> str:
    """Why ``state`` contradicts itself ("" when it does not): while the progress line counts
    recorded calls, the table shows the model's modules and the header its parameters."""
    n = recorded(state)
    if n <= 0:
        return ""
    if state["empty"] or state["rows"] == 0:
        return f"the progress line says {n} calls recorded, the table {state['empty']!r}"
    if exact_params(state) != n_params:
        return f"the progress line says {n} calls recorded, the header params {state['params']!r}"
    return ""


def llama_70b_params() -> int:
    """The parameters of ``LlamaModel`` for the config above, from its numbers: the embedding,
    80 layers of attention (q, o: H x H; k, v: H x kv_heads x head_dim), MLP (3 x H x I) and
    two norms, and the final norm."""
    h, i, layers, heads, kv, vocab = 8192, 28672, 80, 64, 8, 128256
    kv_dim = kv * (h // heads)
    layer = 2 * h * h + 2 * h * kv_dim + 3 * h * i + 2 * h
    return vocab * h + layers * layer + h


def test_streaming_states_agree(page: Any, jupyter_lab: dict[str, Any], artifacts: Path) -> None:
    lab = jupyter_lab
    delete_sessions(lab)
    n_params = llama_70b_params()
    gate = lab["root"] / "stream-gate"
    gate.unlink(missing_ok=True)
    nb_path = lab["root"] / "streaming70b.ipynb"
    notebook = cells(gate)
    write_notebook(nb_path, notebook)
    page.set_viewport_size({"width": 1400, "height": 1200})
    open_notebook(page, lab, nb_path.name)
    wait_idle(page)
    page.evaluate(WATCH)
    # not awaited: the command resolves when the cells ran, and the trace waits for the test
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
    try:
        wait_held(page)
        # a second view of the running widget mounts now, after the stream's start (Lab's
        # "Create New View for Cell Output"): it must tell the state the first one tells
        page.evaluate(
            """() => { const nb = window.jupyterapp.shell.currentWidget.content;
                       nb.activeCellIndex = 1; }"""
        )
        command(page, "notebook:create-output-view")
        page.wait_for_function(
            "() => document.querySelectorAll('.mw-root').length === 2", timeout=SLOW_MS
        )
        # both progress lines count the held calls: each redraws on its own 250 ms timer, so
        # the second view's may show its replay's count a tick behind (CI, loaded: 487 beside
        # 579); a view that never catches up fails here
        page.wait_for_function(
            """() => { const n = [...document.querySelectorAll('.mw-root .mw-progress')]
                         .map(p => (p.textContent.match(/([\\d,]+) calls recorded/) || [])[1]);
                       return n.length === 2 && !!n[0] && n[0] === n[1]; }""",
            timeout=SLOW_MS,
        )
        held = page.evaluate(READ_STATE)
        page.screenshot(path=str(artifacts / "lab-streaming-70b-held.png"), full_page=True)
    finally:
        gate.touch()
    page.wait_for_function(
        """() => [...document.querySelectorAll('.mw-root .mw-progress')]
                   .some(p => /calls recorded in/.test(p.textContent))""",
        timeout=SLOW_MS,
    )
    wait_idle(page)
    # the last cell's printed line (its outputs may also hold a library's import noise on
    # stderr, e.g. torchao's in a fresh environment)
    last = page.locator(".jp-NotebookPanel .jp-CodeCell").last.locator(".jp-OutputArea")
    page.wait_for_function(
        """el => /^\\d+ \\d+\\s*$/m.test(el.innerText)""",
        arg=last.element_handle(),
        timeout=SLOW_MS,
    )
    out = last.inner_text()
    found = re.search(r"^(\d+) (\d+)\s*$", out, re.MULTILINE)
    assert found, out
    total_params, n_calls = int(found.group(1)), int(found.group(2))
    states = page.evaluate("() => window.__mwStates")
    gate.unlink(missing_ok=True)
    page.screenshot(path=str(artifacts / "lab-streaming-70b-done.png"), full_page=True)
    assert all(view["pending"] == 0 for view in page.evaluate(READ_STATE))  # all traced
    assert total_params == n_params, (total_params, n_params)
    # held: both views count the same calls, show the modules and the model's parameters
    first, second = held
    assert recorded(first) > 0 and recorded(second) == recorded(first), held
    # and the same clock: the second view's runs from the start's arrival, not from its mount
    # (the progress lines redraw every 250 ms)
    clocks = [float(re.findall(r"· ([\d.]+) s", s["progress"])[-1]) for s in held]
    assert abs(clocks[0] - clocks[1]) <= 0.3, held
    for state in held:
        assert not disagreement(state, n_params), state
        assert {"LlamaModel", "embed_tokens", "layers"} <= set(state["names"]), state
        # the whole tree from the start: the modules not traced yet (the root, the final norm)
        # are rows already, their cells pending (issue 40)
        assert "norm" in state["names"] and state["pending"] > 0, state
    # every state either view went through, from the first call to the end
    running = [s for s in states if recorded(s) > 0]
    assert running, states[-5:]
    bad = [(why, s) for s in running if (why := disagreement(s, n_params))]
    assert not bad, bad[:3]
    assert max(recorded(s) for s in running) == n_calls


def wait_held(page: Any) -> None:
    """Wait until the trace is held at call ``HOLD_AT``'s batch: the progress line counts calls
    and the spinner turns (its ceiling is the suite's long one: this waits for a state)."""
    page.wait_for_function(
        """() => { const p = document.querySelector('.mw-root .mw-progress');
                   return p && /[1-9][\\d,]* calls recorded/.test(p.textContent)
                     && p.querySelector('.mw-spinner'); }""",
        timeout=SLOW_MS,
    )
