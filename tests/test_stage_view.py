"""What the widget's Stages tab is sent (``payload["stages"]``, ``views/stages.py``) and the
header's layout badges, for a pipeline-parallel analysis.

Truth: a schedule's own rules, independent of how the kernel lays actions out: in one slot a
rank runs one action; a forward of micro-batch m on stage s comes after stage s - 1's forward
of m, a backward after stage s + 1's backward of m (or its own forward on the last stage);
1F1B and GPipe with P ranks and m micro-batches take 2 (m + P - 1) slots. A rank's sends and
receives are the bytes the trace recorded (``StageReport``), its peak's categories add up to
its peak.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from parallel_truth import no_process_group_left  # noqa: F401  (an autouse fixture)

import meta_widget as mw
from tests.models import llama_config


def config(layers: int = 4) -> Any:
    c = llama_config()
    c.num_hidden_layers = layers
    return c


@pytest.fixture(scope="module")
def one_f_one_b() -> mw.Analysis:
    return mw.analyze(
        config(),
        input_size=(4, 16),
        mode="training",
        parallel=mw.Parallel(pp=2, microbatches=4),
    )


def check_order(ranks: list[dict[str, Any]], last_stage: int) -> None:
    """Every action after what it needs, one a slot on each rank."""
    at: dict[tuple[str, int, int], int] = {}
    for r in ranks:
        assert len(r["slots"]) == len(r["actions"])
        assert len(set(r["slots"])) == len(r["slots"])  # one action a slot
        assert r["slots"] == sorted(r["slots"])  # in the order the rank ran them
        for (kind, stage, mb), slot in zip(r["actions"], r["slots"], strict=True):
            at[(kind, stage, mb)] = slot
    for (kind, stage, mb), slot in at.items():
        if kind == "F" and stage > 0:
            assert slot > at[("F", stage - 1, mb)]
        if kind == "B":
            after = ("F", stage, mb) if stage == last_stage else ("B", stage + 1, mb)
            assert slot > at[after]
        if kind == "W":
            assert slot > at[("B", stage, mb)]


def test_a_1f1b_pipeline_sends_every_rank_and_its_schedule(one_f_one_b: mw.Analysis) -> None:
    a = one_f_one_b
    s = a.to_payload()["stages"]
    P, m = 2, 4
    assert (s["pp"], s["schedule"], s["virtual_stages"], s["microbatches"]) == (P, "1F1B", 1, m)
    assert s["slots"] == 2 * (m + P - 1)
    ranks = s["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert [r["stages"] for r in ranks] == [[0], [1]]
    check_order(ranks, last_stage=1)
    for r, stage in zip(ranks, a.stages, strict=True):
        # every micro-batch's forward and backward, once
        assert sorted(r["actions"]) == sorted(
            [k, stage.rank, mb] for k in ("F", "B") for mb in range(m)
        )
        assert r["bubble"] == pytest.approx(1 - len(r["actions"]) / s["slots"])
        assert r["bubble"] == pytest.approx((P - 1) / (m + P - 1))
        assert sum(r["categories"].values()) == r["peak_bytes"] == stage.peak_bytes
        assert r["modules"] == list(stage.modules)
        sends = {c: (n, b) for g, c, n, b in r["comms"] if g == "pp"}
        assert sends["send"] == (m, r["send_bytes"])
        assert sends["recv"] == (m, r["recv_bytes"])
        assert r["step_s"] is None  # no gpu=
    # the analysis is the rank with the highest peak, and says so
    peaks = [r["peak_bytes"] for r in ranks]
    assert ranks[s["shown"]]["peak_bytes"] == max(peaks) == a.peak_bytes
    assert f"Pipeline rank {s['shown']}" in a.notes[-1]


def test_the_badges_read_the_pipeline_layout(one_f_one_b: mw.Analysis) -> None:
    badges = one_f_one_b.to_payload()["settings"]
    shown = one_f_one_b.to_payload()["stages"]["shown"]
    assert [label for label, _ in badges] == ["pp 2", "1F1B · 4 micro-batches"]
    layout, schedule = (tip for _, tip in badges)
    assert f"pipeline rank {shown} (rank {shown} of 2)" in layout
    assert "Schedule1F1B" in schedule and "waits 20% of the step" in schedule


def test_interleaved_stages_are_drawn_per_rank_with_weight_gradients() -> None:
    a = mw.analyze(
        config(8),
        input_size=(4, 16),
        mode="training",
        parallel=mw.Parallel(pp=2, schedule="zero-bubble", virtual_stages=2, microbatches=4),
    )
    s = a.to_payload()["stages"]
    assert [r["stages"] for r in s["ranks"]] == [[0, 2], [1, 3]]
    check_order(s["ranks"], last_stage=3)
    kinds = {k for r in s["ranks"] for k, _, _ in r["actions"]}
    assert kinds == {"F", "B", "W"}  # zero-bubble computes weight gradients apart
    for r in s["ranks"]:
        # each of its stages' micro-batches: forward, input gradient, weight gradient
        assert len(r["actions"]) == 2 * 3 * 4
        assert r["bubble"] == pytest.approx(1 - len(r["actions"]) / s["slots"])
    badges = [label for label, _ in a.to_payload()["settings"]]
    assert badges == ["pp 2", "zero-bubble · 4 micro-batches · 2 stages a rank"]


def test_no_stages_without_a_pipeline() -> None:
    a = mw.analyze(torch.nn.Linear(8, 8), input_size=(2, 8), mode="training")
    assert "stages" not in a.to_payload()


def test_the_badges_of_layouts_with_experts_and_mixed_precision() -> None:
    from types import SimpleNamespace

    from meta_widget.views.settings import encode_settings

    def badges(plan: mw.Parallel, stages: Any = ()) -> list[list[str]]:
        options = SimpleNamespace(autocast=None, param_dtype=None, parallel=plan)
        return encode_settings(options, stages)

    [(label, tip)] = badges(mw.Parallel(fsdp=2, ep=2))
    assert label == "fsdp 2 × ep 2"
    assert "rank 0 of 2" in tip and "1/2 of every MoE layer's experts" in tip
    ranks = [SimpleNamespace(peak_bytes=p, bubble=0.25) for p in (5, 9, 7)]
    plan = mw.Parallel(pp=3, fsdp=2, mp={"param_dtype": "bfloat16"}, microbatches=3)
    (layout, layout_tip), (schedule, schedule_tip) = badges(plan, ranks)
    assert layout == "pp 3 × fsdp 2 · mp bfloat16 param"
    # pipeline rank 1 peaks: rank 1 x (6 ranks / 3 pipeline ranks) of the mesh
    assert "pipeline rank 1 (rank 2 of 6)" in layout_tip
    assert "MixedPrecisionPolicy(param_dtype=torch.bfloat16)" in layout_tip
    assert schedule == "1F1B · 3 micro-batches"
    assert "waits 25% of the step" in schedule_tip
