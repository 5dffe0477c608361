"""The standalone HTML report in a real Chromium: the widget's view with no kernel.

The page comes from ``Analysis.to_html`` on a real (tiny) transformers GPT-2 traced on the meta
device. Screenshots land in ``test-artifacts/``; look at them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

# Plain imports, no importorskip: a missing test dependency must fail the run, not skip it.
import pytest
import torch
import transformers

import meta_widget as mw

pytestmark = pytest.mark.e2e

EVIL = "<img src=x onerror=alert(1)>"
STATIC = Path(__file__).resolve().parents[2] / "meta_widget" / "static"


@pytest.fixture(scope="module")
def gpt2_html(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=1000, n_positions=128)
    model = transformers.GPT2LMHeadModel(cfg)
    path = tmp_path_factory.mktemp("html") / "gpt2.html"
    mw.analyze(model, input_size=(1, 16), dtypes=[torch.long]).to_html(str(path))
    return path


@pytest.fixture(scope="module")
def evil_html(tmp_path_factory: pytest.TempPathFactory) -> Path:
    nn = torch.nn

    def init(self: Any) -> None:
        nn.Module.__init__(self)
        self.fc = nn.Linear(4, 4)

    def forward(self: Any, x: Any) -> Any:
        return self.fc(x)

    Evil = type(EVIL, (nn.Module,), {"__init__": init, "forward": forward})
    path = tmp_path_factory.mktemp("html") / "evil.html"
    mw.analyze(Evil(), input_size=(2, 4)).to_html(str(path))
    return path


def open_page(page: Any, path: Path, theme: str = "light") -> None:
    page.emulate_media(color_scheme=theme)
    page.goto(path.as_uri())
    page.wait_for_selector(".mw-row")  # the page fixture's (long) default timeout


def visible_rows(page: Any) -> list[str]:
    return page.eval_on_selector_all(
        ".mw-row",
        """rows => rows.filter(r => r.style.display !== 'none')
            .sort((a, b) => Number(a.dataset.row) - Number(b.dataset.row))
            .map(r => r.querySelector('.mw-mname').textContent)""",
    )


def row(page: Any, name: str) -> Any:
    exact = re.compile(f"^{re.escape(name)}$")
    return page.locator(".mw-row", has=page.locator(".mw-mname", has_text=exact)).first


def settle(page: Any) -> None:
    """Wait two animation frames: the view re-renders on the next frame after a change."""
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")


def test_rows_appear_with_totals(page: Any, gpt2_html: Path, artifacts: Path) -> None:
    open_page(page, gpt2_html)
    rows = visible_rows(page)
    # default depth 2: root, transformer and its children, lm_head
    assert rows == ["GPT2LMHeadModel", "transformer", "wte", "wpe", "drop", "h", "ln_f", "lm_head"]
    # 2 GPT2Block layers of (ln, attn, ln, mlp) + embeddings + ln_f, lm_head tied to wte
    n_params = sum(
        p.numel()
        for p in transformers.GPT2LMHeadModel(
            transformers.GPT2Config(
                n_layer=2, n_embd=64, n_head=2, vocab_size=1000, n_positions=128
            )
        ).parameters()
    )
    header = page.inner_text(".mw-totals")
    assert f"{n_params / 1000:.0f} K" in header
    assert not page.errors, page.errors
    page.screenshot(path=str(artifacts / "standalone-light.png"), full_page=True)


def test_click_expands_and_folds_identical_blocks(page: Any, gpt2_html: Path) -> None:
    open_page(page, gpt2_html)
    row(page, "h").locator(".mw-caret").click()
    settle(page)
    rows = visible_rows(page)
    # the two identical GPT2Block layers fold into one group row below h
    assert rows[rows.index("h") + 1] == "0–1"
    group = row(page, "0–1")
    assert group.locator(".mw-mtype").inner_text() == "2 × GPT2Block"
    group.locator(".mw-caret").click()
    settle(page)
    rows = visible_rows(page)
    i = rows.index("0–1")
    assert rows[i + 1 : i + 3] == ["0", "1"]


def test_keyboard_navigation(page: Any, gpt2_html: Path) -> None:
    open_page(page, gpt2_html)
    row(page, "lm_head").locator(".mw-mname").click()
    page.keyboard.press("Home")
    page.keyboard.press("ArrowDown")
    settle(page)
    assert page.inner_text(".mw-row.mw-selected .mw-mname") == "transformer"
    page.keyboard.press("ArrowLeft")  # collapse transformer
    settle(page)
    assert visible_rows(page) == ["GPT2LMHeadModel", "transformer", "lm_head"]
    page.keyboard.press("End")
    settle(page)
    assert page.inner_text(".mw-row.mw-selected .mw-mname") == "lm_head"


def test_search_filters_keeping_ancestors(page: Any, gpt2_html: Path) -> None:
    open_page(page, gpt2_html)
    page.fill(".mw-search", "MLP")
    settle(page)
    # the GPT2MLP modules match by type; their ancestors stay, open, to show where they are;
    # the hits in the two folded blocks stay folded: the group, then its first member
    assert visible_rows(page) == ["GPT2LMHeadModel", "transformer", "h", "0–1", "0", "mlp"]
    # a dotted path, as "Copy path" hands it out, and a glob
    page.fill(".mw-search", "mlp.c_fc")
    settle(page)
    assert visible_rows(page) == ["GPT2LMHeadModel", "transformer", "h", "0–1", "0", "mlp", "c_fc"]
    page.fill(".mw-search", "transformer.h.*.attn.c_proj")
    settle(page)
    assert visible_rows(page)[-3:] == ["0", "attn", "c_proj"]
    page.fill(".mw-search", "")
    settle(page)
    assert "wte" in visible_rows(page)


def test_clicking_a_bar_selects_the_row(page: Any, gpt2_html: Path, artifacts: Path) -> None:
    open_page(page, gpt2_html)
    page.click(".mw-tab[data-tab='memory']")
    page.wait_for_selector(".mw-memory canvas")
    root = page.query_selector(".mw-root").evaluate_handle("r => r.parentElement")
    bars = page.evaluate("el => window.metaWidget.barCenters(el)", root)
    assert len(bars) == 6  # wte, wpe, drop, h, ln_f, lm_head
    target = next(b for b in bars if b["module"] == 3)  # rows: "", transformer, wte, wpe
    page.mouse.move(target["x"], target["y"])
    page.mouse.click(target["x"], target["y"])
    settle(page)
    assert page.inner_text(".mw-row.mw-selected .mw-mname") == "wpe"
    page.screenshot(path=str(artifacts / "standalone-memory-light.png"), full_page=True)
    page.click(".mw-tab[data-tab='timeline']")
    page.wait_for_selector(".mw-timeline canvas")
    assert "Peak" in page.inner_text(".mw-timeline .mw-chart-note")
    page.screenshot(path=str(artifacts / "standalone-timeline-light.png"), full_page=True)


def test_dark_theme(page: Any, gpt2_html: Path, artifacts: Path) -> None:
    open_page(page, gpt2_html, theme="dark")
    bg = page.eval_on_selector(".mw-root", "r => getComputedStyle(r).backgroundColor")
    fg = page.eval_on_selector(".mw-root", "r => getComputedStyle(r).color")
    assert bg == "rgb(22, 27, 34)" and fg == "rgb(230, 237, 243)"
    page.screenshot(path=str(artifacts / "standalone-dark.png"), full_page=True)
    page.click(".mw-tab[data-tab='memory']")
    page.wait_for_selector(".mw-memory canvas")
    page.screenshot(path=str(artifacts / "standalone-memory-dark.png"), full_page=True)
    # data-theme="dark" on a parent works without the media query
    page.emulate_media(color_scheme="light")
    page.evaluate("document.documentElement.setAttribute('data-theme', 'dark')")
    bg = page.eval_on_selector(".mw-root", "r => getComputedStyle(r).backgroundColor")
    assert bg == "rgb(22, 27, 34)"


#: the labels of the column headers on screen (a header's first text: the Module header also
#: holds "+N in Details" when columns are left out)
HEAD_LABELS = "cells => cells.filter(c => c.offsetParent).map(c => c.firstChild.textContent)"


def test_narrow_view_leaves_out_shape_columns(page: Any, gpt2_html: Path, artifacts: Path) -> None:
    """Beside a side panel a notebook is ~700-900 px wide: the numbers stay in view."""
    page.set_viewport_size({"width": 720, "height": 800})
    open_page(page, gpt2_html)
    table = page.locator(".mw-table")
    heads = page.eval_on_selector_all(".mw-th", HEAD_LABELS)
    assert heads == ["Module", "Params", "Param mem", "Output mem", "FLOPs"]
    # the Module header says how many columns were left out (their numbers are in Details)
    assert page.locator(".mw-th.mw-col-name .mw-hidden-cols").inner_text() == "+2 in Details"
    # no sideways scroll, and the FLOPs column ends inside the table
    assert table.evaluate("t => t.scrollWidth <= t.clientWidth")
    flops = page.locator(".mw-th.mw-col-flops").bounding_box()
    box = table.bounding_box()
    assert flops and box and flops["x"] + flops["width"] <= box["x"] + box["width"]
    assert "Details" in (page.get_attribute(".mw-th.mw-col-name", "title") or "")
    page.screenshot(path=str(artifacts / "standalone-narrow.png"), full_page=True)
    page.set_viewport_size({"width": 880, "height": 800})
    settle(page)
    heads = page.eval_on_selector_all(".mw-th", HEAD_LABELS)
    assert heads[:2] == ["Module", "Output shapes"]


def test_columns_stay_when_the_tree_starts_to_scroll(page: Any, gpt2_html: Path) -> None:
    """At a width just wide enough for every column, a tree that grows a scrollbar (everything
    opened, then sorted) keeps every column: the scrollbar's room is kept all along."""
    page.set_viewport_size({"width": 1000, "height": 800})
    open_page(page, gpt2_html)
    table = page.locator(".mw-table")
    # make the table 10 px wider than the columns' minimum: a scrollbar (15 px) would cross it
    extra = table.evaluate("t => t.clientWidth") - 2 - 872
    page.set_viewport_size({"width": 1000 - extra + 10, "height": 800})
    settle(page)

    def heads() -> list[str]:
        return page.eval_on_selector_all(".mw-th", HEAD_LABELS)

    before = heads()
    assert "Input shapes" in before and "Output shapes" in before
    assert not table.evaluate("t => t.scrollHeight > t.clientHeight")  # no scrollbar yet
    row(page, "GPT2LMHeadModel").locator(".mw-caret").click(modifiers=["Alt"])
    settle(page)
    assert table.evaluate("t => t.scrollHeight > t.clientHeight")  # now it scrolls
    assert heads() == before
    page.click(".mw-th.mw-col-params")
    settle(page)
    assert heads() == before


def test_class_name_stays_text(page: Any, evil_html: Path, artifacts: Path) -> None:
    open_page(page, evil_html)
    # an <img onerror> would have fired by the time the page has loaded and rendered twice
    page.wait_for_load_state("load")
    settle(page)
    assert page.dialogs == []
    assert page.query_selector_all(".mw-root img") == []
    assert page.inner_text(".mw-title") == EVIL
    assert visible_rows(page)[0] == EVIL
    page.screenshot(path=str(artifacts / "standalone-xss.png"), full_page=True)


#: names that end the data <script> early (``</script>``), open an HTML comment that swallows the
#: rest of the page (``<!--<script>``) or end the <title> early (``</title>``); names with a "." can
#: only be class names (module names may not hold one)
PWN_CLASS = "</script><script>window.__pwned=1</script>"
PWN_TITLE = "</title><script>window.__pwned=2</script>"
PWN_COMMENT = "<!--<script>"
PWN_MODULE = "</script><script>window['__pwned']=3</script>"


@pytest.fixture(scope="module")
def pwn_html(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The root class named ``PWN_TITLE`` holds ``<!--<script>`` (a ``PWN_CLASS`` Linear) and
    ``PWN_MODULE`` (a ReLU)."""
    nn = torch.nn
    child = type(PWN_CLASS, (nn.Linear,), {})

    def init(self: Any) -> None:
        nn.Module.__init__(self)
        self.add_module(PWN_COMMENT, child(4, 4))
        self.add_module(PWN_MODULE, nn.ReLU())

    def forward(self: Any, x: Any) -> Any:
        return getattr(self, PWN_MODULE)(getattr(self, PWN_COMMENT)(x))

    root = type(PWN_TITLE, (nn.Module,), {"__init__": init, "forward": forward})
    path = tmp_path_factory.mktemp("html") / "pwn.html"
    a = mw.analyze(root(), input_size=(2, 4))
    assert a.error is None, a.error
    a.to_html(str(path))
    return path


def test_hostile_names_render_as_text_and_run_nothing(
    page: Any, pwn_html: Path, artifacts: Path
) -> None:
    page.goto(pwn_html.as_uri())  # returns once the page has loaded: its scripts have run
    assert page.evaluate("() => typeof window.__pwned") == "undefined"
    started = page.evaluate("() => !!(window.metaWidget && document.querySelector('.mw-root'))")
    assert started, f"the page did not start (a name broke its scripts); errors: {page.errors}"
    page.wait_for_selector(".mw-row")
    settle(page)
    # the whole tree is there, every name as visible text
    assert visible_rows(page) == [PWN_TITLE, PWN_COMMENT, PWN_MODULE]
    types = page.eval_on_selector_all(
        ".mw-row",
        """rows => rows.sort((a, b) => Number(a.dataset.row) - Number(b.dataset.row))
            .map(r => r.querySelector('.mw-mtype')?.textContent ?? '')""",
    )
    assert PWN_CLASS in types, types
    assert page.inner_text(".mw-title") == PWN_TITLE
    assert page.title() == f"meta_widget · {PWN_TITLE}"
    # the page's only scripts are its own three (data, bundle, start)
    assert page.evaluate("() => document.scripts.length") == 3
    assert not page.errors, page.errors
    page.screenshot(path=str(artifacts / "standalone-hostile-names.png"), full_page=True)


@pytest.fixture(scope="module")
def big_html(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """25,001 modules: 5,000 identical blocks of 4 leaves (structural: no forward pass)."""
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(4, 4)
            self.b = nn.ReLU()
            self.c = nn.LayerNorm(4)
            self.d = nn.Dropout()

    with torch.device("meta"):
        model = nn.Sequential(*[Block() for _ in range(5000)])
    path = tmp_path_factory.mktemp("html") / "big.html"
    mw.analyze(model).to_html(str(path))
    return path


def test_25k_modules_stay_virtualized(page: Any, big_html: Path, artifacts: Path) -> None:
    open_page(page, big_html)
    # the 5,000 identical blocks fold into one row
    assert visible_rows(page) == ["Sequential", "0–4999"]
    page.select_option(".mw-select", "2")  # depth 2 = all: the fold opens, its first block too
    settle(page)
    total = page.eval_on_selector(".mw-tbody", "b => b.getBoundingClientRect().height")
    assert total == 26 * (2 + 5000 + 4)  # 5,000 block rows, one of them open: not 25,000 rows
    in_dom = page.eval_on_selector_all(
        ".mw-row", "rs => rs.filter(r => r.style.display !== 'none').length"
    )
    assert 10 < in_dom < 80  # only the viewport's rows (and a few more) are in the DOM
    row(page, "0").locator(".mw-mname").click()
    page.keyboard.press("End")
    settle(page)
    assert page.inner_text(".mw-row.mw-selected .mw-mname") == "4999"
    assert page.inner_text(".mw-details .mw-path") == "4999"
    for _ in range(5):
        page.mouse.wheel(0, -4000)
        settle(page)
    in_dom = page.eval_on_selector_all(
        ".mw-row", "rs => rs.filter(r => r.style.display !== 'none').length"
    )
    assert 10 < in_dom < 80
    assert not page.errors, page.errors
    page.screenshot(path=str(artifacts / "standalone-25k.png"), full_page=True)


@pytest.fixture(scope="module")
def broken_html(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model whose second Linear expects 32 features but gets 16: the trace fails in `dec`."""
    nn = torch.nn

    class Broken(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.enc = nn.Linear(8, 16)
            self.dec = nn.Linear(32, 4)

        def forward(self, x: Any) -> Any:
            return self.dec(torch.relu(self.enc(x)))

    path = tmp_path_factory.mktemp("html") / "broken.html"
    mw.analyze(Broken(), input_size=(2, 8)).to_html(str(path))
    return path


def test_error_banner_and_failing_row(page: Any, broken_html: Path, artifacts: Path) -> None:
    open_page(page, broken_html)
    banner = page.inner_text(".mw-banner")
    assert "RuntimeError" in banner
    assert "in module dec" in banner
    assert "[2, 16] X [32, 4]" in banner
    failing = page.eval_on_selector_all(
        ".mw-row.mw-error-row", "rs => rs.map(r => r.querySelector('.mw-mname').textContent)"
    )
    assert failing == ["Broken", "dec"]  # the call that raised and the root call around it
    page.click(".mw-banner button")
    settle(page)
    assert page.inner_text(".mw-row.mw-selected .mw-mname") == "dec"
    assert "raised" in page.inner_text(".mw-details")
    page.screenshot(path=str(artifacts / "standalone-error.png"), full_page=True)


@pytest.fixture(scope="module")
def gpt2_stream() -> dict[str, Any]:
    """The messages a real trace streams to the widget, and the final payload."""
    import json

    from meta_widget.views.widget import CallStream, MetaWidget

    class Recorder(MetaWidget):  # type: ignore[misc]
        def send(self, content: Any, buffers: Any = None) -> None:
            self.__dict__.setdefault("sent", []).append(json.loads(json.dumps(content)))

        def stream(self, nodes: Any, *, title: str, source: str, mode: str) -> CallStream:
            # batches of 8 calls, never by the clock: how many batches a fast machine sends in
            # 50 ms is no part of what this test checks
            return CallStream(
                self, nodes, title=title, source=source, mode=mode, batch=8, interval_s=1e9
            )

    w = Recorder()
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=1000, n_positions=128)
    mw.analyze(transformers.GPT2LMHeadModel(cfg), input_size=(1, 16), dtypes=[torch.long], widget=w)
    return {"messages": w.__dict__["sent"], "payload": w.payload}


def live_page(tmp_path: Path) -> Path:
    """A page with the bundle and a fake model that the test drives (no kernel)."""
    css = (STATIC / "widget.css").read_text(encoding="utf-8")
    js = (STATIC / "standalone.js").read_text(encoding="utf-8").replace("</script", "<\\/script")
    path = tmp_path / "live.html"
    path.write_text(
        f"<!doctype html><html><head><meta charset='utf-8'><style>{css}</style></head>"
        f"<body style='margin:0;padding:16px'><div id='w'></div><script>{js}</script>"
        "<script>window.live = window.metaWidget.renderLive(document.getElementById('w'));"
        "</script></body></html>",
        encoding="utf-8",
    )
    return path


def test_streamed_calls_show_progress_then_the_result(
    page: Any, gpt2_stream: dict[str, Any], tmp_path: Path, artifacts: Path
) -> None:
    msgs = gpt2_stream["messages"]
    kinds = [m["type"] for m in msgs]
    start, first_calls = kinds.index("start"), kinds.index("calls")
    # what the analysis waits for comes first (the build), then the module table
    assert set(kinds[:start]) == {"waiting"} and start < first_calls
    assert kinds[-1] == "done" and kinds.count("calls") >= 2
    page.goto(live_page(tmp_path).as_uri())
    page.wait_for_selector(".mw-root")
    for m in msgs[: first_calls + 1]:
        page.evaluate("m => window.live.message(m)", m)
    settle(page)
    first = len(msgs[first_calls]["calls"]["index"])
    expected = msgs[start]["expected_calls"]
    assert f"{first} calls recorded / {expected} expected" in page.inner_text(".mw-progress")
    # every module is a row from the start; lm_head runs last: its cells still pending
    assert "lm_head" in visible_rows(page)
    pending = page.eval_on_selector_all(
        ".mw-row.mw-pending", "rows => rows.map(r => r.querySelector('.mw-mname').textContent)"
    )
    assert "lm_head" in pending
    page.screenshot(path=str(artifacts / "standalone-streaming.png"), full_page=True)
    for m in msgs[first_calls + 1 : -1]:
        page.evaluate("m => window.live.message(m)", m)
    page.evaluate("p => window.live.set('payload', p)", gpt2_stream["payload"])
    page.evaluate("m => window.live.message(m)", msgs[-1])
    settle(page)
    total = len(gpt2_stream["payload"]["calls"]["module"])
    assert f"{total} calls recorded in" in page.inner_text(".mw-progress")
    assert "lm_head" in visible_rows(page)
    assert page.locator(".mw-row.mw-pending").count() == 0  # every row traced
    assert not page.errors, page.errors


def test_kernel_switches_disabled_without_kernel(page: Any, gpt2_html: Path) -> None:
    """The page has no kernel: mode, optimizer and device cannot re-run anything."""
    open_page(page, gpt2_html)
    switches = page.locator(".mw-switches")
    assert switches.is_visible()
    for sel in (".mw-mode button", ".mw-optimizer", ".mw-device"):
        for el in page.locator(sel).all():
            assert el.is_disabled(), sel
            assert "No kernel" in (el.get_attribute("title") or ""), sel
    page.locator(".mw-mode button[data-mode='training']").click(force=True)
    settle(page)
    assert "Re-running" not in page.locator(".mw-root").inner_text()
    assert not page.errors, page.errors
