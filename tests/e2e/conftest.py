"""Fixtures for browser tests of the standalone page: a headless Chromium (the system one).

Without /usr/bin/chromium, playwright or the built bundle these tests skip when run by hand, and
fail when the test command asks for them: ``CI`` set, or ``META_WIDGET_REQUIRE_BROWSER=1`` (which
``scripts/test.sh``, i.e. ``make test``, exports), so that no test command skips them silently.
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


#: set by scripts/test.sh: a missing browser, playwright or bundle is a failure, not a skip
REQUIRE_ENV = "META_WIDGET_REQUIRE_BROWSER"


def browser_required() -> bool:
    """Whether this test run must run the browser tests (CI, or the project's test command)."""
    return bool(os.environ.get("CI")) or os.environ.get(REQUIRE_ENV, "") not in ("", "0")


def _missing(reason: str) -> None:
    if browser_required():
        pytest.fail(f"{reason} (required: CI or {REQUIRE_ENV}=1 is set)", pytrace=False)
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
            # real scrollbars, as a desktop browser draws them (headless hides them by default,
            # and then a layout that breaks when a scrollbar appears cannot be seen)
            ignore_default_args=["--hide-scrollbars"],
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
    # Every wait is for a state; its ceiling is long so that a machine busy with other work (a
    # CPU burner on every core) slows these tests down without failing them.
    p.set_default_timeout(120_000)
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


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


KERNEL_NAME = "meta-widget-test"


@pytest.fixture(scope="session")
def jupyter_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A real JupyterLab on loopback, with its own config/data/runtime dirs and no token.

    The kernel is this interpreter (``sys.executable``, i.e. the venv's python in CI) through a
    kernelspec written into the server's own data dir, with the repository on ``PYTHONPATH``;
    only that kernelspec is allowed, so removing it leaves the server with no kernel to start.
    Widget state is saved with the notebook (``saveState``) and announcements are off.
    Yields ``url``, ``root`` (the server's root dir), ``kernel_dir`` and ``env``.
    """
    import json
    import subprocess
    import sys
    import time
    import urllib.request

    for mod in ("jupyterlab", "ipykernel", "anywidget"):
        try:
            __import__(mod)
        except ImportError:
            _missing(f"{mod} is not installed: pip install -e '.[test]'")
    base = tmp_path_factory.mktemp("lab")
    root, config, data, runtime = (base / d for d in ("root", "config", "data", "runtime"))
    for d in (root, config, data, runtime):
        d.mkdir()
    kernel_dir = data / "kernels" / KERNEL_NAME
    kernel_dir.mkdir(parents=True)
    env = {
        **os.environ,
        "JUPYTER_CONFIG_DIR": str(config),
        "JUPYTER_DATA_DIR": str(data),
        "JUPYTER_RUNTIME_DIR": str(runtime),
        "JUPYTERLAB_SETTINGS_DIR": str(config / "lab" / "user-settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(config / "lab" / "workspaces"),
        "JUPYTER_PLATFORM_DIRS": "1",
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
        ),
    }
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "meta_widget test (Python)",
        "language": "python",
        "env": {"PYTHONPATH": env["PYTHONPATH"]},
    }
    (kernel_dir / "kernel.json").write_text(json.dumps(spec), encoding="utf-8")
    settings = Path(env["JUPYTERLAB_SETTINGS_DIR"])
    widgets = settings / "@jupyter-widgets" / "jupyterlab-manager"
    widgets.mkdir(parents=True)
    (widgets / "plugin.jupyterlab-settings").write_text('{"saveState": true}', encoding="utf-8")
    subprocess.run(
        [
            *(sys.executable, "-m", "jupyter", "labextension", "disable", "--level=user"),
            "@jupyterlab/apputils-extension:announcements",
        ],
        env=env,
        check=True,
        capture_output=True,
    )
    port = _free_port()
    log = (base / "server.log").open("wb")
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "jupyterlab", "--ip=127.0.0.1", f"--port={port}"),
            *("--port-retries=0", "--IdentityProvider.token=", "--ServerApp.password="),
            *("--ServerApp.disable_check_xsrf=True", f"--ServerApp.root_dir={root}"),
            *("--no-browser", "--allow-root", "--LabApp.expose_app_in_browser=True"),
            # Notebook 7 (a server extension of this same server: /tree, /notebooks/...)
            "--JupyterNotebookApp.expose_app_in_browser=True",
            f"--KernelSpecManager.allowed_kernelspecs={KERNEL_NAME}",
            "--KernelSpecManager.ensure_native_kernel=False",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180  # a cold start on a busy machine takes a while
        while True:
            try:
                with urllib.request.urlopen(f"{url}/api/status", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                log.flush()
                raise RuntimeError(
                    "JupyterLab did not start:\n"
                    + (base / "server.log").read_text(encoding="utf-8", errors="replace")[-3000:]
                )
            time.sleep(0.5)
        yield {
            "url": url,
            "root": root,
            "kernel": KERNEL_NAME,
            "kernel_dir": kernel_dir,
            "env": env,
            "log": base / "server.log",
        }
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
