"""The widget's front end in a real Chromium: first paint, expand all, scroll, bytes on the wire.

    python benchmarks/widget.py [--runs 5] [--skip-70b] [--bundle PATH]

``--bundle`` measures another build of ``standalone.js`` (e.g. a candidate fix) in place of
``meta_widget/static/standalone.js``.

Pages are the standalone HTML of ``Analysis.to_html`` (the widget's own bundle and view, a fake
model instead of a kernel), opened in headless ``/usr/bin/chromium`` through Playwright.

Models
------
- **1k**: ``nn.Sequential`` of 1,000 ``nn.Linear`` layers of varying widths (no two neighbours
  alike, so nothing folds: 1,001 rows), traced on meta with an input of (1, 8).
- **25k**: ``nn.Sequential`` of 5,000 blocks of 4 leaves (Identity, ReLU, Identity, Dropout),
  25,001 modules and 25,001 traced calls. The leaves are cheap ops, so the real trace takes
  ~15 s instead of ~40 s for Linear leaves; the payload has every column a traced model has.
- **70B**: ``examples/llama_70b.py:config`` (a Llama-3-70B-shaped ``LlamaForCausalLM``) traced
  at ``input_ids`` (1, 4096): bytes per module and the Graph tab.

Measures
--------
- *first paint*: from a ``performance.mark`` placed before the bundle's ``<script>`` (so bundle
  evaluation, ``JSON.parse`` of the payload, decoding and the first render all count) to the
  first ``.mw-row`` in the DOM (a ``MutationObserver``), and to the next animation frame.
- *expand all* (25k): Alt+click the root's caret, which opens everything below it, the
  5,000 members of the folded ``0–4999 · 5000 × Block`` group included: time from the click to
  the next frame.
- *scroll* (25k, all expanded: 25,002 rows): scroll the table by 40 rows per animation frame
  from top to bottom; record every rAF delta and every long task (``PerformanceObserver``
  ``longtask``, which reports main-thread tasks over 50 ms).
- *Graph tab* (25k and 1k as they open; 70B with the depth menu at 3, folded): click the tab;
  time to its first node and the next frame, the fold + layout inside it, and the longest task
  meanwhile (the 25k's level 1 has 5,000 unfolded nodes to fold; the 1k's 1,000 never fold).
  Then (25k) click the folded blocks' "+" to open them in place: time to the frame that draws
  them, the nodes drawn (the first blocks and one "… N more" node) and the longest task.
- *bytes per module*: the payload as the page embeds it (compact JSON, what the ``payload``
  trait and a saved notebook carry) divided by the module count; and the streamed messages of a
  ``widget=True`` run (``start`` + ``calls`` + ``done``, compact JSON) per module.

Times are medians over ``--runs`` page loads. Prints a markdown table with targets.
"""

from __future__ import annotations

import argparse
import json
import runpy
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import meta_widget as mw  # noqa: E402
from meta_widget.views.widget import STATIC, MetaWidget, _inline, standalone_html  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]
ROWS_PER_FRAME = 40
ROW_HEIGHT = 26

# Installed before the bundle runs: the start mark and a watcher for the first row.
PROBE = """<script>
performance.mark('mw-start');
window.__mw = {};
new MutationObserver((_, obs) => {
  if (document.querySelector('.mw-row')) {
    window.__mw.row = performance.now();
    obs.disconnect();
    requestAnimationFrame(() => { window.__mw.frame = performance.now(); });
  }
}).observe(document.documentElement, {childList: true, subtree: true});
</script>
"""


def sequential_1k() -> nn.Module:
    widths = [8 + (i * 5) % 11 for i in range(1001)]  # neighbours always differ
    return nn.Sequential(*[nn.Linear(widths[i], widths[i + 1]) for i in range(1000)])


class CheapBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Identity()
        self.b = nn.ReLU()
        self.c = nn.Identity()
        self.d = nn.Dropout()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.d(self.c(self.b(self.a(x))))


def sequential_25k() -> nn.Module:
    with torch.device("meta"):
        return nn.Sequential(*[CheapBlock() for _ in range(5000)])


def llama_70b_config() -> Any:
    return runpy.run_path(str(ROOT / "examples" / "llama_70b.py"))["config"]


class Recorder(MetaWidget):  # type: ignore[misc]
    """A widget that keeps what it would send to the front end (compact JSON bytes)."""

    def send(self, content: Any, buffers: Any = None) -> None:
        self.__dict__.setdefault("sent_bytes", 0)
        self.__dict__["sent_bytes"] += len(json.dumps(content, separators=(",", ":")))


def analyze(model: Any, **kwargs: Any) -> tuple[Any, float, int]:
    """The analysis, its wall time, and the bytes streamed to a widget while tracing."""
    widget = Recorder()
    start = time.perf_counter()
    a = mw.analyze(model, widget=widget, **kwargs)
    return a, time.perf_counter() - start, int(widget.__dict__.get("sent_bytes", 0))


def payload_bytes(a: Any) -> int:
    return len(json.dumps(a.to_payload(), separators=(",", ":")).encode())


def probed_page(a: Any, path: Path, bundle: Path | None = None) -> Path:
    html = standalone_html(a.to_payload())
    if bundle is not None:
        inline = _inline((STATIC / "standalone.js").read_text(encoding="utf-8"))
        assert inline in html
        html = html.replace(inline, _inline(bundle.read_text(encoding="utf-8")))
    marker = "<script>"  # the first inline script is the bundle (the data is type=json)
    i = html.index(marker, html.index("meta-widget-data") + 1)
    path.write_text(html[:i] + PROBE + html[i:], encoding="utf-8")
    return path


def first_paint(page: Any, url: str, runs: int) -> tuple[float, float]:
    rows, frames = [], []
    for _ in range(runs):
        page.goto(url)
        page.wait_for_function("() => window.__mw && window.__mw.frame")
        t = page.evaluate(
            "() => { const s = performance.getEntriesByName('mw-start')[0].startTime;"
            " return [window.__mw.row - s, window.__mw.frame - s]; }"
        )
        rows.append(t[0])
        frames.append(t[1])
    return statistics.median(rows), statistics.median(frames)


EXPAND_ALL = """async () => {
  const frame = () => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
  const t0 = performance.now();
  const root = document.querySelector('.mw-row[data-row="0"] .mw-caret');
  root.dispatchEvent(new MouseEvent('click', {bubbles: true, altKey: true}));
  await frame();
  const body = document.querySelector('.mw-tbody');
  return {ms: performance.now() - t0, height: body.getBoundingClientRect().height};
}"""

SCROLL = """async ([step]) => {
  const body = document.querySelector('.mw-tbody');
  let el = body.parentElement;
  while (el && !(el.scrollHeight > el.clientHeight + 1
                 && /(auto|scroll)/.test(getComputedStyle(el).overflowY))) el = el.parentElement;
  const longTasks = [];
  const obs = new PerformanceObserver(list => {
    for (const e of list.getEntries()) longTasks.push(e.duration);
  });
  obs.observe({type: 'longtask', buffered: false});
  const deltas = [];
  el.scrollTop = 0;
  await new Promise(r => requestAnimationFrame(r));
  await new Promise(done => {
    let last = performance.now();
    const tick = now => {
      deltas.push(now - last);
      last = now;
      if (el.scrollTop + el.clientHeight >= el.scrollHeight - 1) return done();
      el.scrollTop += step;
      requestAnimationFrame(tick);
    };
    requestAnimationFrame(tick);
  });
  await new Promise(r => setTimeout(r, 100));
  obs.disconnect();
  const inDom = [...document.querySelectorAll('.mw-row')].filter(r => r.style.display !== 'none');
  const last = inDom.sort((a, b) => Number(b.dataset.row) - Number(a.dataset.row))[0];
  return {deltas: deltas.slice(1), longTasks, lastRow: last ? Number(last.dataset.row) : -1,
          inDom: inDom.length, scroller: el.className};
}"""


#: one row of the table: measure, target, reached, met (None: no target)
Row = tuple[str, str, str, bool | None]

# Set the depth menu (the first .mw-select) to `depth`, then click the Graph tab; time from the
# click to its first node and the next frame; long tasks meanwhile.
GRAPH_TAB = """async ([depth]) => {
  const menu = document.querySelector('.mw-select');
  if (depth !== null && [...menu.options].some(o => o.value === String(depth))) {
    menu.value = String(depth);
    menu.dispatchEvent(new Event('change', {bubbles: true}));
    await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
  }
  const longTasks = [];
  const obs = new PerformanceObserver(list => {
    for (const e of list.getEntries()) longTasks.push(e.duration);
  });
  obs.observe({type: 'longtask', buffered: false});
  const t0 = performance.now();
  document.querySelector('.mw-tab[data-tab=graph]').click();
  await new Promise(done => {
    const check = () =>
      document.querySelector('.mw-graph-node') ? done() : requestAnimationFrame(check);
    check();
  });
  await new Promise(r => requestAnimationFrame(r));
  const ms = performance.now() - t0;
  await new Promise(r => setTimeout(r, 100));
  obs.disconnect();
  const el = document.querySelector('.mw-graph');
  return {ms, layoutMs: Number(el.dataset.layoutMs), longTasks,
          nodes: document.querySelectorAll('.mw-graph-node').length,
          depth: document.querySelector('.mw-graph-depth').textContent};
}"""

# Click the first folded node's "+" (open its group in place); time to the next frame with the
# new nodes drawn; long tasks meanwhile.
GRAPH_OPEN = """async () => {
  const toggle = document.querySelector('.mw-graph-node:not(.mw-io) .mw-graph-toggle');
  if (!toggle) return null;
  const before = document.querySelectorAll('.mw-graph-node').length;
  const longTasks = [];
  const obs = new PerformanceObserver(list => {
    for (const e of list.getEntries()) longTasks.push(e.duration);
  });
  obs.observe({type: 'longtask', buffered: false});
  const t0 = performance.now();
  toggle.dispatchEvent(new MouseEvent('click', {bubbles: true}));
  await new Promise(done => {
    const check = () => document.querySelectorAll('.mw-graph-node').length !== before
      ? done() : requestAnimationFrame(check);
    check();
  });
  await new Promise(r => requestAnimationFrame(r));
  const ms = performance.now() - t0;
  await new Promise(r => setTimeout(r, 100));
  obs.disconnect();
  const more = document.querySelector('.mw-graph-more');
  return {ms, longTasks, nodes: document.querySelectorAll('.mw-graph-node').length,
          more: more ? more.dataset.label : null};
}"""


def graph_tab(page: Any, url: str, runs: int, depth: int | None = None) -> dict[str, Any]:
    """The Graph tab's first frame on ``url`` at the tree's ``depth`` (None: as it opens;
    medians of ``runs`` loads), its fold + layout time and the longest task meanwhile."""
    got = []
    for _ in range(runs):
        page.goto(url)
        page.wait_for_selector(".mw-row")
        got.append(page.evaluate(GRAPH_TAB, [depth]))
        if depth is None:  # and its folded group opened in place
            got[-1]["open"] = page.evaluate(GRAPH_OPEN)
    opened = [g["open"] for g in got if g.get("open")]
    return {
        "ms": statistics.median(g["ms"] for g in got),
        "layout_ms": statistics.median(g["layoutMs"] for g in got),
        "longest_task": max((t for g in got for t in g["longTasks"]), default=0.0),
        "nodes": got[0]["nodes"],
        "depth": got[0]["depth"],
        "open": {
            "ms": statistics.median(o["ms"] for o in opened),
            "longest_task": max((t for o in opened for t in o["longTasks"]), default=0.0),
            "nodes": opened[0]["nodes"],
            "more": opened[0]["more"],
        }
        if opened
        else None,
    }


def graph_rows(name: str, g: dict[str, Any], target_ms: float | None) -> list[Row]:
    """The table's rows for one model's Graph tab."""
    reached = (
        f"{g['ms']:.0f} ms ({g['nodes']} nodes at {g['depth']}; "
        f"fold + dagre {g['layout_ms']:.0f} ms)"
    )
    long_task = f"{g['longest_task']:.0f} ms" if g["longest_task"] else "none"
    return [
        (
            f"Graph tab, {name}: first frame",
            f"≤ {target_ms:.0f} ms" if target_ms else "–",
            reached,
            g["ms"] <= target_ms if target_ms else None,
        ),
        (
            f"  … longest task while it opens ({name})",
            "≤ 200 ms",
            long_task,
            g["longest_task"] <= 200,
        ),
        *open_rows(name, g["open"]),
    ]


def open_rows(name: str, o: dict[str, Any] | None) -> list[Row]:
    """The table's rows for opening the first folded group in place (None: not measured)."""
    if o is None:
        return []
    more = f", “{o['more']}”" if o["more"] else ""
    long_task = f"{o['longest_task']:.0f} ms" if o["longest_task"] else "none"
    return [
        (
            f"  … its folded group opened in place ({name})",
            "–",
            f"{o['ms']:.0f} ms ({o['nodes']} nodes{more}); longest task {long_task}",
            None,
        ),
    ]


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--skip-70b", action="store_true", help="skip the Llama-70B bytes row")
    ap.add_argument(
        "--bundle", type=Path, help="a standalone.js to measure instead of the built one"
    )
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    tmp = Path(tempfile.mkdtemp(prefix="mw-bench-"))
    print("tracing the 1k model ...", file=sys.stderr)
    a1k, s1k, _ = analyze(sequential_1k(), input_size=(1, 8))
    print(f"  {len(a1k.modules)} modules, {len(a1k.calls)} calls, {s1k:.1f} s", file=sys.stderr)
    print("tracing the 25k model ...", file=sys.stderr)
    a25, s25, streamed25 = analyze(sequential_25k(), input_size=(2, 4))
    print(f"  {len(a25.modules)} modules, {len(a25.calls)} calls, {s25:.1f} s", file=sys.stderr)
    rows: list[Row] = []
    bytes25 = payload_bytes(a25) / len(a25.modules)
    page1k = probed_page(a1k, tmp / "1k.html", args.bundle).as_uri()
    page25 = probed_page(a25, tmp / "25k.html", args.bundle).as_uri()

    profile = tempfile.mkdtemp(prefix="mw-bench-chromium-")
    with sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(
            profile,
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1200, "height": 1000},
        )
        page = ctx.new_page()
        row_ms, frame_ms = first_paint(page, page1k, args.runs)
        rows.append(
            (
                f"first paint, {len(a1k.modules):,}-row tree (to first row / to its frame)",
                "≤ 200 ms",
                f"{row_ms:.0f} ms / {frame_ms:.0f} ms",
                frame_ms <= 200,
            )
        )
        row25, frame25 = first_paint(page, page25, args.runs)
        rows.append(
            (
                f"first paint, {len(a25.modules):,} modules (folded: 2 rows)",
                "–",
                f"{row25:.0f} ms / {frame25:.0f} ms",
                None,
            )
        )
        graph25 = graph_tab(page, page25, args.runs)
        graph1k = graph_tab(page, page1k, args.runs)
        expand, scrolls = [], []
        for _ in range(args.runs):
            page.goto(page25)
            page.wait_for_selector(".mw-row")
            e = page.evaluate(EXPAND_ALL)
            assert e["height"] == ROW_HEIGHT * (len(a25.modules) + 1), e  # + the folded group
            expand.append(e["ms"])
            scrolls.append(page.evaluate(SCROLL, [ROWS_PER_FRAME * ROW_HEIGHT]))
        ctx.close()
    n_rows = len(a25.modules) + 1
    rows.extend(graph_rows(f"{len(a25.modules):,} modules", graph25, None))
    rows.extend(graph_rows(f"{len(a1k.modules):,} distinct modules", graph1k, None))
    rows.append(
        (
            f"expand all, {len(a25.modules):,} modules ({n_rows:,} rows)",
            "–",
            f"{statistics.median(expand):.0f} ms",
            None,
        )
    )
    deltas = [d for s in scrolls for d in s["deltas"]]
    long_tasks = [t for s in scrolls for t in s["longTasks"]]
    assert all(s["lastRow"] == n_rows - 1 for s in scrolls), [s["lastRow"] for s in scrolls]
    rows.append(
        (
            f"scroll {n_rows:,} rows, {ROWS_PER_FRAME} rows/frame: long tasks > 50 ms",
            "none",
            f"{len(long_tasks)}" + (f" (longest {max(long_tasks):.0f} ms)" if long_tasks else ""),
            not long_tasks,
        )
    )
    rows.append(
        (
            "scroll frame time (rAF delta) p50 / p95 / max",
            "–",
            f"{statistics.median(deltas):.1f} / {percentile(deltas, 0.95):.1f} / "
            f"{max(deltas):.1f} ms over {len(deltas):,} frames",
            None,
        )
    )
    rows.append(
        (
            f"bytes per module, {len(a25.modules):,}-module model with calls (payload)",
            "≤ 150 B",
            f"{bytes25:.0f} B ({payload_bytes(a25) / 1e6:.2f} MB)",
            bytes25 <= 150,
        )
    )
    rows.append(
        (
            "  … streamed while tracing (start + calls + done messages)",
            "–",
            f"{streamed25 / len(a25.modules):.0f} B",
            None,
        )
    )
    if not args.skip_70b:
        print("tracing the 70B model at (1, 4096) ...", file=sys.stderr)
        a70, s70, streamed70 = analyze(llama_70b_config(), input_size=(1, 4096))
        n70 = len(a70.modules)
        b70 = payload_bytes(a70) / n70
        print(f"  {n70} modules, {len(a70.calls)} calls, {s70:.1f} s", file=sys.stderr)
        rows.append(
            (
                f"bytes per module, Llama-3-70B shape at (1, 4096), {n70:,} modules (payload)",
                "≤ 150 B",
                f"{b70:.0f} B ({payload_bytes(a70) / 1e3:.0f} KB)",
                b70 <= 150,
            )
        )
        rows.append(
            (
                "  … streamed while tracing (start + calls + done messages)",
                "–",
                f"{streamed70 / n70:.0f} B",
                None,
            )
        )
        page70 = probed_page(a70, tmp / "70b.html", args.bundle).as_uri()
        with sync_playwright() as pw:
            ctx = pw.chromium.launch_persistent_context(
                tempfile.mkdtemp(prefix="mw-bench-chromium-"),
                executable_path=CHROMIUM,
                headless=True,
                args=CHROMIUM_ARGS,
                viewport={"width": 1200, "height": 1000},
            )
            graph70 = graph_tab(ctx.new_page(), page70, args.runs, depth=3)
            ctx.close()
        rows.extend(graph_rows("Llama-3-70B, depth 3 folded", graph70, 500))

    print(f"\nChromium {CHROMIUM}, medians of {args.runs} page loads\n")
    print("| measure | target | reached | |")
    print("|---|---|---|---|")
    for name, target, reached, ok in rows:
        mark = "" if ok is None else ("✅" if ok else "❌")
        print(f"| {name} | {target} | {reached} | {mark} |")


if __name__ == "__main__":
    main()
