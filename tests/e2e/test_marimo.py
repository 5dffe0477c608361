"""The widget in marimo, driven by a real Chromium: ``marimo run tests/e2e/marimo_app.py``.

The app shows three analyses the ways the README gives: an ``Analysis`` as a cell's last
expression (marimo turns its widget view into ``<marimo-anywidget>``), ``mo.ui.anywidget(...)``,
and ``widget=True`` (displayed from inside the cell, calls streamed in); and ``mw.compare``'s
view. Each must render its tree and totals, the switches must reach the kernel (a click on
"training" re-runs it there), and the views must follow marimo's dark theme although marimo
draws them inside a shadow root, where the page's CSS cannot reach (``js/theme.ts``).
Screenshots land in ``test-artifacts/``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import _free_port, _missing
from playwright.sync_api import expect
from test_jupyterlab import SLOW_MS, expected_params, luminance
from test_notebook7 import wait_chart_labels

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
APP = Path(__file__).with_name("marimo_app.py")


@pytest.fixture(scope="module")
def marimo_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``marimo run`` of the app on loopback, no token, its own config (theme: follow the OS)."""
    try:
        import marimo  # noqa: F401
    except ImportError:
        _missing("marimo is not installed: pip install -e '.[test]'")
    base = tmp_path_factory.mktemp("marimo")
    (base / "config" / "marimo").mkdir(parents=True)
    (base / "config" / "marimo" / "marimo.toml").write_text(
        '[display]\ntheme = "system"\n', encoding="utf-8"
    )
    env = {
        **os.environ,
        "XDG_CONFIG_HOME": str(base / "config"),
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
        "TRANSFORMERS_VERBOSITY": "error",
    }
    port = _free_port()
    log = (base / "server.log").open("wb")
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "marimo", "run", str(APP), "--headless"),
            *("--host", "127.0.0.1", "--port", str(port), "--no-token", "--no-sandbox"),
        ],
        env=env,
        cwd=base,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                log.flush()
                raise RuntimeError(
                    "marimo did not start:\n"
                    + (base / "server.log").read_text(encoding="utf-8", errors="replace")[-3000:]
                )
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def rows(root: Any) -> list[tuple[str, str]]:
    """(name, type) of the rows a view shows, in row order (inside marimo's shadow root)."""
    found = root.evaluate(
        """r => [...r.querySelectorAll('.mw-row')]
            .filter(x => x.style.display !== 'none')
            .sort((a, b) => Number(a.dataset.row) - Number(b.dataset.row))
            .map(x => [x.querySelector('.mw-mname').textContent,
                       x.querySelector('.mw-mtype')?.textContent ?? ''])"""
    )
    return [(name, kind) for name, kind in found]


def test_widget_in_marimo(page: Any, marimo_url: str, artifacts: Path) -> None:
    page.set_viewport_size({"width": 1400, "height": 1300})
    page.emulate_media(color_scheme="light")
    page.goto(marimo_url)
    # Playwright's CSS locators pierce open shadow roots
    views = page.locator(".mw-root:not(.mw-cmp)")
    expect(views).to_have_count(3, timeout=SLOW_MS)
    comparison = page.locator(".mw-root.mw-cmp")
    expect(comparison).to_contain_text("Sequential", timeout=SLOW_MS)
    gpt2, mlp, stream = views.nth(0), views.nth(1), views.nth(2)
    # marimo renders the widget, not the static text/html beside it
    assert page.locator(".meta-widget-fallback").count() == 0

    # 1. an Analysis as the cell's output: the tree, folded layers, totals
    expect(gpt2.locator(".mw-totals")).to_contain_text(
        f"{expected_params() / 1000:.1f} K", timeout=SLOW_MS
    )
    shown = rows(gpt2)
    assert shown[0][0] == "GPT2LMHeadModel", shown
    assert {"transformer", "wte", "wpe", "h", "ln_f", "lm_head"} <= {n for n, _ in shown}, shown
    assert ("0–1", "2 × GPT2Block") in shown, shown

    # 2. mo.ui.anywidget(b.widget()): its tree, and its switches reach the kernel
    n = 64 * 256 + 256 + 256 * 10 + 10
    expect(mlp.locator(".mw-totals")).to_contain_text(f"{n / 1000:.1f} K", timeout=SLOW_MS)
    assert [name for name, _ in rows(mlp)] == ["Sequential", "0", "1", "2"]
    training = mlp.locator(".mw-mode button[data-mode='training']")
    expect(training).to_be_enabled(timeout=SLOW_MS)  # the kernel answered the view's hello
    training.click()
    # AdamW: gradients = parameter bytes, optimizer state = 2 x parameter bytes (fp32)
    totals = mlp.locator(".mw-totals")
    expect(totals).to_contain_text(f"{n * 4 / 1024:.1f} KiB", timeout=SLOW_MS)
    expect(totals).to_contain_text(f"{n * 8 / 1024:.0f} KiB", timeout=SLOW_MS)
    expect(mlp.locator(".mw-progress")).to_contain_text("calls recorded in", timeout=SLOW_MS)
    assert "…" not in totals.inner_text()

    # 3. widget=True inside the cell: the finished analysis reached the view (its calls stream
    # in only when the view is on the page before the trace ends: this one takes milliseconds)
    expect(stream.locator(".mw-totals")).to_contain_text(f"{8 * 3 * 9 + 8}", timeout=SLOW_MS)
    assert [name for name, _ in rows(stream)] == ["Sequential", "0", "1", "2"]

    # light, then marimo's dark theme (it follows the OS here): colors and the canvas follow
    gpt2.locator(".mw-tab[data-tab='memory']").click()
    expect(gpt2.locator(".mw-chart-bars canvas")).to_have_count(1, timeout=SLOW_MS)
    wait_chart_labels(page, dark=False)
    page.screenshot(path=str(artifacts / "marimo-light.png"), full_page=True)
    page.emulate_media(color_scheme="dark")
    expect(gpt2).to_have_class("mw-root mw-dark-vars", timeout=SLOW_MS)
    expect(comparison).to_have_class("mw-root mw-cmp mw-dark-vars", timeout=SLOW_MS)
    wait_chart_labels(page, dark=True)
    bg = gpt2.evaluate("r => getComputedStyle(r).backgroundColor")
    fg = gpt2.locator(".mw-mname").first.evaluate("e => getComputedStyle(e).color")
    assert luminance(bg) < 0.3 < luminance(fg), (bg, fg)
    page.screenshot(path=str(artifacts / "marimo-dark.png"), full_page=True)
    comparison.screenshot(path=str(artifacts / "marimo-compare-dark.png"))
    assert not [e for e in page.errors if "meta_widget" in e or "mw-" in e], page.errors
