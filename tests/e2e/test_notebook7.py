"""The widget in Notebook 7's own UI (``/tree``, ``/notebooks/...``), driven by a real Chromium.

Notebook 7 is a jupyter-server extension: the ``jupyter_lab`` fixture's server serves it beside
JupyterLab, so no second server starts. A notebook analyzes a tiny transformers GPT-2 and ends the
cell with ``a``; the widget must render there as in Lab: the folded tree, the header totals and
the memory chart, in the light and the dark theme. Screenshots land in ``test-artifacts/``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import _missing
from test_jupyterlab import (
    GPT2,
    SLOW_MS,
    check_tree,
    command,
    delete_sessions,
    expected_params,
    failures,
    luminance,
    wait_text,
    wait_theme,
    write_notebook,
)

pytestmark = pytest.mark.e2e

CELLS = [
    "import transformers\nimport meta_widget as mw",
    f"config = {GPT2}\na = mw.analyze(config, input_size=(1, 16))\na",
]


#: the median luminance of the text drawn on the first memory bar chart's canvas (its opaque grey
#: pixels: module names and axis values; the bars are colored), found through shadow roots too
#: (marimo draws widgets in one); -1 while there is no chart or nothing drawn yet
LABEL_LUMINANCE = """() => {
  const find = root => {
    const hit = root.querySelector('.mw-root .mw-chart-bars canvas');
    if (hit) return hit;
    for (const e of root.querySelectorAll('*'))
      if (e.shadowRoot) { const h = find(e.shadowRoot); if (h) return h; }
    return null;
  };
  const c = find(document);
  if (!c || !c.width) return -1;
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  const lums = [];
  for (let i = 0; i < d.length; i += 4) {
    const [r, g, b, a] = [d[i], d[i + 1], d[i + 2], d[i + 3]];
    if (a > 200 && Math.max(r, g, b) - Math.min(r, g, b) < 24)
      lums.push((0.2126 * r + 0.7152 * g + 0.0722 * b) / 255);
  }
  if (lums.length < 50) return -1;
  lums.sort((x, y) => x - y);
  return lums[lums.length >> 1];
}"""


def wait_chart_labels(page: Any, dark: bool) -> float:
    """Wait until the bar chart's module names are drawn in the theme's text color (light text
    on a dark page, dark text on a light one): a canvas draws its colors once, so a chart that
    does not redraw on a theme switch keeps the old ones. Returns their luminance."""
    page.wait_for_function(
        f"dark => {{ const l = ({LABEL_LUMINANCE})();"
        " return l >= 0 && (dark ? l > 0.6 : l < 0.5); }",
        arg=dark,
        timeout=SLOW_MS,
    )
    return float(page.evaluate(LABEL_LUMINANCE))


def wait_kernel_idle(page: Any) -> None:
    """Wait until the open notebook's kernel is started and idle (Notebook 7 has no status bar)."""
    page.wait_for_function(
        """() => { const w = window.jupyterapp?.shell?.currentWidget;
                   const k = w?.sessionContext?.session?.kernel;
                   return !!k && k.status === 'idle'; }""",
        timeout=SLOW_MS,
    )


def test_widget_in_notebook7(page: Any, jupyter_lab: dict[str, Any], artifacts: Path) -> None:
    try:
        import notebook  # noqa: F401  (the server extension that serves /tree and /notebooks)
    except ImportError:
        _missing("notebook is not installed: pip install -e '.[test]'")
    lab = jupyter_lab
    delete_sessions(lab)
    nb_path = lab["root"] / "nb7.ipynb"
    write_notebook(nb_path, CELLS)
    page.set_viewport_size({"width": 1400, "height": 1300})
    # Notebook 7's file browser lists the notebook: this is Notebook 7, not Lab's /lab/tree
    page.goto(f"{lab['url']}/tree")
    page.wait_for_selector(f".jp-DirListing-item[title*='{nb_path.name}']", timeout=SLOW_MS)
    page.goto(f"{lab['url']}/notebooks/{nb_path.name}")
    page.wait_for_function(
        "() => window.jupyterapp && window.jupyterapp.name === 'Jupyter Notebook'",
        timeout=SLOW_MS,
    )
    page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=SLOW_MS)
    wait_kernel_idle(page)

    command(page, "notebook:run-all-cells")
    page.wait_for_function(
        """n => { const ps = [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')];
                  return ps.length === n && ps.every(p => /\\[\\d+\\]/.test(p.textContent)); }""",
        arg=len(CELLS),
        timeout=SLOW_MS,
    )
    wait_kernel_idle(page)
    page.wait_for_selector(".mw-root .mw-row", timeout=SLOW_MS)
    errors = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
    assert not failures(errors.all_inner_texts()), errors.all_inner_texts()
    assert page.locator(".mw-root").count() == 1
    # the widget, not the static text/html beside it, is what Notebook 7 shows
    assert not page.locator(".meta-widget-fallback").first.is_visible()
    check_tree(page, 0)
    n_params = expected_params()
    wait_text(page, ".mw-root .mw-totals", [f"{n_params / 1000:.1f} K"])
    # the memory tab draws its charts: the peak by category and the per-module bars
    page.locator(".mw-root .mw-tab[data-tab='memory']").click()
    page.wait_for_selector(".mw-root .mw-catseg", timeout=SLOW_MS)
    page.wait_for_selector(".mw-root .mw-chart-bars canvas", timeout=SLOW_MS)
    box = page.locator(".mw-root .mw-chart-bars canvas").first.bounding_box()
    assert box and box["width"] > 200 and box["height"] > 50, box
    wait_chart_labels(page, dark=False)
    page.screenshot(path=str(artifacts / "notebook7-light.png"), full_page=True)

    command(page, "apputils:change-theme", {"theme": "JupyterLab Dark"})
    wait_theme(page, dark=True)
    bg = page.eval_on_selector(".mw-root", "r => getComputedStyle(r).backgroundColor")
    fg = page.eval_on_selector(".mw-root .mw-mname", "r => getComputedStyle(r).color")
    assert luminance(bg) < 0.3 < luminance(fg), (bg, fg)
    # the chart drawn in the light theme is drawn again in the dark one
    wait_chart_labels(page, dark=True)
    page.screenshot(path=str(artifacts / "notebook7-dark.png"), full_page=True)
    command(page, "apputils:change-theme", {"theme": "JupyterLab Light"})
    wait_theme(page, dark=False)
    assert not [e for e in page.errors if "meta_widget" in e or "mw-" in e], page.errors
