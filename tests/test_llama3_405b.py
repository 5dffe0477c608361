"""Llama 3 405B in the Llama 3 paper's 16,384-GPU layout fits on 80 GB H100s, traced per rank.

``benchmarks/llama3_405b.py`` traces the full 126 layers (about a CPU-hour); this test (8
minutes on two shared cores; its table is in docs/parallel.md) traces the same widths on the
same mesh (a fake process group of 16,384 ranks: PP 16 x DP 128 x TP 8), the same schedule
(PyTorch's interleaved 1F1B, 2 stages a rank, 16 micro-batches of 8,192 tokens) and optimizer,
at 32 layers: one layer a stage, every one of the 16 pipeline ranks traced. The same trace
without activation checkpointing peaks at 122.5 GiB (rank 1), so the bound below is not vacuous.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from parallel_truth import no_process_group_left  # noqa: F401  (an autouse fixture)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import itertools

from llama3_405b import HBM, job_mfu, layout, report, trace


def test_the_paper_layout_is_the_mesh_of_16384_ranks() -> None:
    full = layout()
    assert (full.world, full.pp, full.tp, full.data_parallel) == (16384, 16, 8, 128)
    assert full.stages == 32 and full.microbatches == 16
    # the first and the last stage one layer fewer: 3 + 30 x 4 + 3 = 126
    bounds = (0, *full.stage_boundaries, 126)  # type: ignore[misc]
    sizes = [b - a for a, b in itertools.pairwise(bounds)]
    assert sizes == [3] + [4] * 30 + [3]


@pytest.mark.slow
def test_every_pipeline_rank_of_the_405b_fits_in_80_gb() -> None:
    a = trace(layers=32)
    assert a.error is None, a.error
    print(report(a, 0))  # the table, with pytest -s
    assert len(a.stages) == 16
    for stage in a.stages:
        assert stage.analysis.error is None, stage.analysis.error
        assert 0 < stage.peak_bytes < HBM, (stage.rank, stage.peak_bytes)
        # each rank sends its activations on and their gradients back (bf16, 8,192 x 16,384)
        assert stage.send_bytes > 0 and stage.recv_bytes > 0
    mfu, _tflops, step = job_mfu(a)
    assert 0 < mfu < 1 and step > 0
