"""Step times against a real GPU: ``benchmarks/gpu_step_time.py`` and what it measured.

The issue's goal: predicted step times within 25 % of an H200's where compute-bound (training
steps of small and medium decoders and a CNN, fp32 and bf16), within 15 % for a one-token
forward. The measurement needs a GPU, which no session has been lent yet: until
``benchmarks/results/gpu_step_time_h200.json`` exists, the ratio test is skipped and says so,
and the measuring code is checked here on the CPU (``--device cpu --quick``), so that the
device's few minutes are spent measuring, not debugging.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_step_time  # noqa: E402

STORED = ROOT / "benchmarks/results/gpu_step_time_h200.json"


def test_the_measuring_code_runs_every_case(tmp_path: Path) -> None:
    out = tmp_path / "dry.json"
    gpu_step_time.measure(str(out), "cpu", quick=True, repeats=1)
    found = json.loads(out.read_text())
    keys = {f"{c.name} | {c.kind}" for c in gpu_step_time.CASES}
    assert set(found["cases"]) == keys and len(keys) >= 6
    assert all(case["step_s"] > 0 for case in found["cases"].values())
    kinds = {c.kind for c in gpu_step_time.CASES}
    assert kinds == set(gpu_step_time.GOALS)  # training steps and one-token forwards


@pytest.mark.skipif(not STORED.exists(), reason="no GPU has been lent to measure step times yet")
def test_stored_step_times_are_within_the_goals() -> None:
    rows = gpu_step_time.compare(str(STORED))
    assert len(rows) >= 6
    for row in rows:
        assert abs(row["ratio"] - 1) <= gpu_step_time.GOALS[row["kind"]], row
