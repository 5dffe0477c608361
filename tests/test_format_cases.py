"""The Python formatters write what the shared table ``tests/format_cases.json`` says, the table
``js/format.test.ts`` holds the widget's formatters to: one rounding (three significant figures,
ties away from zero on the exact value), one empty symbol and one set of unit names on both sides
(issue 28: the widget said 2.63 GiB where ``summary()`` said 2.62 GiB for the same bytes)."""

from __future__ import annotations

import json
import pathlib

import pytest

from meta_widget.units import format_bytes, format_count, format_flops

CASES = json.loads((pathlib.Path(__file__).parent / "format_cases.json").read_text("utf-8"))
FORMATS = {"bytes": format_bytes, "count": format_count, "flops": format_flops}


@pytest.mark.parametrize(
    ("kind", "value", "expected"),
    [(kind, value, expected) for kind in FORMATS for value, expected, _ in CASES[kind]],
)
def test_formats_as_the_shared_table_says(kind: str, value: float | str, expected: str) -> None:
    assert FORMATS[kind](float(value)) == expected


def test_integers_and_numpy_numbers_format_as_their_float() -> None:
    np = pytest.importorskip("numpy")
    assert format_bytes(2818572288) == format_bytes(np.int64(2818572288)) == "2.63 GiB"
    assert format_count(np.float32(1125.0)) == "1.13 K"
