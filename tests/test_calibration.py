"""The time model against published measurements (``benchmarks/published/measurements.toml``,
issue 37): every row reproduced on the CPU, its predicted / measured time printed
(``pytest -s`` shows the table), and the spread per kind held where it stands.

Issue 37's acceptance is a median |ratio - 1| of at most 10 % and a worst of at most 25 % per
kind. Where the model does not reach it, the bounds below are what is true today (see
docs/speed-model.md, "Calibration"), not the goal: they fail when the model moves away from the
measurements, and are tightened as it moves closer.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks" / "published"))
import calibrate  # noqa: E402

#: per kind, over the rows no constant of ``meta_widget.timing.efficiency`` comes from: (median
#: |ratio - 1|, worst |ratio - 1|) the model stays within today. Training on H100 is predicted
#: 24-32 % too fast (A100 within 5 %), and so are the bf16 GEMMs of Llama 2 70B training timed
#: on an H100 (float8_experimental's rows: 0.67-0.75); the one kernel past 33 % is a pair of
#: H100 PCIe cards joined by NVLink bridges (mw.gpus()'s H100-PCIe-NVLink at the datasheet's
#: 600 GB/s), which measured under half of that; the serving row past 25 % is TensorRT-LLM's
#: time to the first token of 128 tokens on A100, predicted 0.67 of it (docs/speed-model.md).
BOUNDS = {"training": (0.27, 0.32), "kernel": (0.05, 0.54), "serving": (0.11, 0.34)}
#: the rows a constant comes from reproduce it (the constant is read as published)
DEFINING = 0.021


@pytest.fixture(scope="module")
def results() -> list[calibrate.Result]:
    out = []
    for row in calibrate.rows():
        r = calibrate.reproduce(row)
        print(f"{r.id:<36} {r.kind:<9} predicted/measured {r.ratio:5.2f}")
        out.append(r)
    return out


def test_the_table_has_what_issue_37_asks_for() -> None:
    with calibrate.TABLE.open("rb") as f:
        table = tomllib.load(f)["row"]
    assert len(table) >= 25
    assert len({r["id"] for r in table}) == len(table)
    for r in table:
        assert r["kind"] in calibrate.KINDS
        for field in ("source", "url", "setup", "unmatched", "measured", "unit"):
            assert r.get(field) not in (None, ""), (r["id"], field)
        assert r["url"].startswith("https://"), r["id"]
    training = {r["source"].split(",")[0] for r in table if r["kind"] == "training"}
    assert len(training) >= 2  # llm-foundry and torchtitan (a third source is still wanted)
    runs = {r["run"]["type"] for r in table}
    assert {"gemm", "attention", "collective", "decode", "train"} <= runs


def test_every_row_is_reproduced_and_within_todays_spread(
    results: list[calibrate.Result],
) -> None:
    spread = calibrate.summary(results, checked=True)
    for kind, (median, worst, n) in spread.items():
        print(f"{kind}: {n} rows, median |ratio-1| {median:.1%}, worst {worst:.1%}")
    assert set(spread) == set(calibrate.KINDS)
    for r in results:
        if r.defines:
            assert abs(r.ratio - 1) <= DEFINING, (r.id, r.defines, r.ratio)
    for kind, (median, worst, _) in spread.items():
        most_median, most_worst = BOUNDS[kind]
        assert median <= most_median, (kind, median)
        assert worst <= most_worst, (kind, worst)
