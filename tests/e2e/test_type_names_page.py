"""A module's name and class in the tree's name cell, on the standalone page in a real Chromium:
the class's head gives way first, then the name, never both at once (issue 40, defect 8: "type
names are cut mid-word with room to spare").

Flex layout shares a shortfall among the items that may shrink by factor times size. With the
head's factor at 100, the name took about 1 % of it: a fraction of a pixel, and its ellipsis
cut two letters ("rotary_e…  Lla…  Embedding", a gap beside each "…"). Widths are read as the
browser lays them out (fractional: a text's range against its box), across window widths from
narrow to wide, in a table with shape columns (a folded group of layers, a rotary embedding).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import meta_widget as mw
from tests.models import llama_config

pytestmark = pytest.mark.e2e

#: each visible row's name and class head: their texts' widths against their boxes'
READ = """() => [...document.querySelectorAll('.mw-root .mw-row')]
  .filter(r => r.offsetParent !== null)
  .map(r => {
    const width = el => {
      const range = document.createRange();
      range.selectNodeContents(el);
      return {text: range.getBoundingClientRect().width, box: el.getBoundingClientRect().width};
    };
    const name = r.querySelector('.mw-mname'), head = r.querySelector('.mw-mtype-head');
    return {name: name.textContent, head: head.textContent, n: width(name), h: width(head)};
  })"""


@pytest.fixture(scope="module")
def llama_html(tmp_path_factory: pytest.TempPathFactory) -> Path:
    config = llama_config()
    config.num_hidden_layers = 4
    path = tmp_path_factory.mktemp("html") / "llama.html"
    mw.analyze(config, input_size=(1, 16)).to_html(str(path))
    return path


def frames(page: Any) -> None:
    """Two animation frames: the table lays its columns out when its box resizes."""
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")


def test_a_name_gives_way_only_after_its_class_head(page: Any, llama_html: Path) -> None:
    page.set_viewport_size({"width": 1400, "height": 900})
    page.goto(llama_html.as_uri())
    page.wait_for_selector(".mw-root .mw-row .mw-mname", state="attached")
    cut_heads = 0
    for width in range(520, 1401, 12):
        page.set_viewport_size({"width": width, "height": 900})
        frames(page)
        for row in page.evaluate(READ):
            name_cut = row["n"]["text"] > row["n"]["box"] + 0.01
            head_shown = row["h"]["box"] > 0.5
            assert not (name_cut and head_shown), (width, row)
            cut_heads += row["h"]["text"] > row["h"]["box"] + 0.01
    assert cut_heads  # the widths reach ones where a head gives way
    assert not page.errors, page.errors
