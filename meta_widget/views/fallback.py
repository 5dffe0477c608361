"""The static view of an analysis: the ``text/html`` every widget output carries beside the widget.

Where the interactive widget cannot render, a front end shows this instead: nbconvert's HTML (no
widget state saved, or offline), GitHub's notebook viewer, a notebook reopened without "Save Widget
State Automatically", marimo or any viewer that picks HTML over a widget. It is the summary's
content as a table: the header (class, source, mode), the totals, the folded tree to a small
depth, the peak by category, notes and the error.

Self-contained and bounded: inline styles only (no script, no external sheet, nothing a sanitizer
must strip for the page to read), every user string escaped, at most :data:`MAX_ROWS` rows, so a
Llama-3-70B renders in a few KB whatever the model's size.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

from .summary import summary_columns, summary_header, summary_rows, totals_lines

if TYPE_CHECKING:
    from .analyzed import Analyzed

#: how deep the static tree opens (repeated siblings folded below it)
FALLBACK_DEPTH = 3
#: the most tree rows the static view holds; the rest is counted in a last line
MAX_ROWS = 120

_BOX = (
    "font:12px/1.45 var(--jp-code-font-family,ui-monospace,SFMono-Regular,Menlo,monospace);"
    "color:var(--jp-content-font-color1,inherit);max-width:100%;overflow-x:auto"
)
_CELL = "padding:1px 8px;text-align:right;white-space:nowrap"
_LEFT = "padding:1px 8px;text-align:left;white-space:pre"


def _esc(text: str) -> str:
    return html.escape(text, quote=True)


def fallback_html(analysis: Analyzed, depth: int = FALLBACK_DEPTH) -> str:
    """``analysis`` as a small static HTML block (see the module docstring).

    Parameters
    ----------
    analysis
        What to show.
    depth
        How deep the tree opens; repeated identical siblings fold into one row
        (``0–79 · 80 × LlamaDecoderLayer``) at every depth.
    """
    columns = summary_columns(analysis)
    rows = summary_rows(analysis, depth)
    more = len(rows) - MAX_ROWS
    head = "".join(
        f"<th style='{_LEFT if i < 2 else _CELL}'>{_esc(c)}</th>" for i, c in enumerate(columns)
    )
    body = "".join(
        "<tr>"
        + "".join(
            f"<td style='{_LEFT if i < 2 else _CELL}'>{_esc(c)}</td>" for i, c in enumerate(r)
        )
        + "</tr>"
        for r in rows[:MAX_ROWS]
    )
    if more > 0:
        body += (
            f"<tr><td colspan='{len(columns)}' style='{_LEFT}'>… {more} more rows "
            "(a.summary(None) prints them all)</td></tr>"
        )
    totals = "".join(f"<div>{_esc(line)}</div>" for line in totals_lines(analysis) if line)
    return (
        f"<div class='meta-widget-fallback' style='{_BOX}'>"
        f"<div style='font-weight:600'>{_esc(summary_header(analysis))}</div>"
        f"<table style='border-collapse:collapse;margin:4px 0;font:inherit;color:inherit'>"
        f"<thead style='border-bottom:1px solid #8886'><tr>{head}</tr></thead>"
        f"<tbody>{body}</tbody></table>{totals}"
        "<div style='opacity:.7;margin-top:4px'>A static view of the meta_widget analysis, "
        "shown where the interactive widget is not: run the cell for the widget.</div></div>"
    )
