"""The standalone page with hostile names: the HTML text itself, read in Python.

Class names, module names and error messages are the user's (or a stranger's model file's). Inside
``<script>``, ``</script`` ends the element early and ``<!--`` followed by ``<script`` puts the
HTML tokenizer in the "script data double escaped" state, where ``</script>`` no longer ends it:
the data block then swallows the rest of the page. In the title, ``</title>`` ends the title.
(The same page is opened in a real browser by ``tests/e2e/test_standalone.py``.)
"""

from __future__ import annotations

import html
import json
import pathlib
import re
from typing import Any

import torch
from torch import nn

import meta_widget as mw

CLOSE_SCRIPT = "</script><script>alert(1)</script>"
DOUBLE_ESCAPE = "<!--<script>"
CLOSE_TITLE = "</title><script>alert(2)</script>"
AMPERSAND = "&lt;b&gt; & \\u003c"  # entities and an escape-looking text must come back verbatim
HOSTILE = (CLOSE_SCRIPT, DOUBLE_ESCAPE, CLOSE_TITLE, AMPERSAND)

DATA_OPEN = "<script id='meta-widget-data' type='application/json'>"


def _model(names: tuple[str, ...], error: str | None) -> nn.Module:
    """A model whose class names, child names and (optionally) error message are ``names``."""

    def forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
        for child in self.children():
            x = child(x)
        if error is not None:
            raise RuntimeError(error)
        return x

    root = type(names[2], (nn.Module,), {"forward": forward})()
    leaf = type(names[1], (nn.Linear,), {})
    for name in names:
        root.add_module(name, leaf(4, 4))
    return root


def _page(names: tuple[str, ...], error: str | None, tmp_path: pathlib.Path) -> tuple[str, Any]:
    a = mw.analyze(_model(names, error), input_size=(2, 4))
    path = tmp_path / "page.html"
    returned = a.to_html(str(path))
    written = path.read_text(encoding="utf-8")
    assert returned == written
    return written, a


def _data_block(page: str) -> str:
    start = page.index(DATA_OPEN) + len(DATA_OPEN)
    return page[start : page.index("</script", start)]


def _strings(value: Any) -> set[str]:
    if isinstance(value, str):
        return {value}
    if isinstance(value, dict):
        return set().union(*(_strings(v) for v in value.values()), set(value))
    if isinstance(value, list):
        return set().union(set(), *(_strings(v) for v in value))
    return set()


def test_hostile_names_stay_data_in_the_standalone_page(tmp_path: pathlib.Path) -> None:
    benign = ("first", "second", "third", "fourth")
    plain, _ = _page(benign, "plain error", tmp_path)
    page, a = _page(HOSTILE, " ".join(HOSTILE), tmp_path)
    # the same elements as the page of a model with harmless names: nothing opened or closed
    for tag in ("<script", "</script", "<title", "</title", "<style", "</style", "<!--", "-->"):
        assert page.lower().count(tag) == plain.lower().count(tag), tag
    assert page.lower().count("<script") == 3 and page.lower().count("</script") == 3
    assert "<!--" not in page  # (the bundle's own "<!--" is escaped as well)
    # the data block holds no '<' at all: no tokenizer state can start inside it (every
    # transition out of "script data" begins with '<'), and it ends at the data close tag
    data = _data_block(page)
    assert "<" not in data and ">" not in data and "&" not in data
    assert page.index("</script", page.index(DATA_OPEN)) == page.index(DATA_OPEN) + len(
        DATA_OPEN
    ) + len(data)
    # it decodes to the analysis, every hostile name intact
    decoded = json.loads(data)
    assert decoded == json.loads(a.to_json())
    assert decoded["title"] == CLOSE_TITLE == type(_model(HOSTILE, None)).__name__
    module_names = [name for name, _ in _model(HOSTILE, None).named_children()]
    assert module_names == list(HOSTILE)
    strings = _strings(decoded)
    for name in HOSTILE:
        assert name in strings, name
    assert decoded["error"]["message"] == " ".join(HOSTILE)


def test_the_title_is_escaped_text(tmp_path: pathlib.Path) -> None:
    page, a = _page(HOSTILE, None, tmp_path)
    titles = re.findall(r"<title>(.*?)</title>", page, flags=re.DOTALL)
    assert len(titles) == 1 and page.count("</title>") == 1
    assert titles[0] == "meta_widget · " + html.escape(CLOSE_TITLE, quote=True)
    assert html.unescape(titles[0]) == f"meta_widget · {a.title}"
    assert "<" not in titles[0] and ">" not in titles[0]
