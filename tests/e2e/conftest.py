"""Fixtures for browser tests of the standalone page: a headless Chromium (the system one).

Without /usr/bin/chromium or playwright these tests skip locally and fail in CI (CI=true).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path("/usr/bin/chromium")
ROOT = Path(__file__).resolve().parents[2]
STATIC = ROOT / "meta_widget" / "static"
ARTIFACTS = ROOT / "test-artifacts"
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


def _missing(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (required in CI)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def browser_context() -> Iterator[Any]:
    """One persistent Chromium context (fresh profile) for the session."""
    if not CHROMIUM.exists():
        _missing(f"{CHROMIUM} not found: apt-get install -y chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("playwright is not installed: pip install playwright")
    if not (STATIC / "standalone.js").exists():
        _missing("meta_widget/static/standalone.js is missing: run `npm ci && npm run build`")
    profile = tempfile.mkdtemp(prefix="mw-chromium-")
    with sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(
            profile,
            executable_path=str(CHROMIUM),
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1200, "height": 1000},
        )
        try:
            yield ctx
        finally:
            ctx.close()
            shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def page(browser_context: Any) -> Iterator[Any]:
    """A fresh page that records console errors, page errors and dialogs."""
    p = browser_context.new_page()
    p.errors = []  # type: ignore[attr-defined]
    p.dialogs = []  # type: ignore[attr-defined]
    p.on("pageerror", lambda e: p.errors.append(str(e)))
    p.on("console", lambda m: p.errors.append(m.text) if m.type == "error" else None)

    def on_dialog(d: Any) -> None:
        p.dialogs.append(d.message)
        d.dismiss()

    p.on("dialog", on_dialog)
    try:
        yield p
    finally:
        p.close()


@pytest.fixture(scope="session")
def artifacts() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS
