"""``mw.plan`` over replicate x fsdp x tp x pp x cp x ep: pipeline layouts traced as ``analyze``
traces them; layouts and batches the model cannot take found before any trace, each a row with
``analyze``'s reason; ``global_batch`` and ``seq_len`` giving each candidate its share; default
pipelines beyond one node; the same plan in one process, in workers and on an executor; a
pipeline by the per-layer rule, rank by rank; and a pipeline's forward under autocast."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import pandas as pd
import pytest
from parallel_truth import no_process_group_left  # noqa: F401  (an autouse fixture)
from test_plan_depth import same_numbers

import meta_widget as mw
from meta_widget.explore.candidates import Layout, Space, candidates, default_layouts
from meta_widget.explore.depth import DEPTHS, held_state, overheads
from meta_widget.explore.depth_stages import extend_stages, stage_layers
from meta_widget.timing.gpus import resolve_gpu

transformers = pytest.importorskip("transformers")


def llama(layers: int = 6) -> Any:
    return transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        architectures=["LlamaForCausalLM"],  # a decoder a pipeline can split
    )


ONE = dict(gpu="H100", activation_checkpointing=[False], precisions=["as given"])


def analyzed(size: Any, parallel: Any, micro_batches: int = 1, **options: Any) -> mw.Analysis:
    """The truth: ``analyze`` itself, with the layout spelled here."""
    return mw.analyze(
        llama(),
        size,
        mode="training",
        gpu="H100",
        parallel=parallel,
        micro_batches=micro_batches,
        **options,
    )


def test_pipeline_layouts_are_traced_as_analyze_traces_them() -> None:
    size = (4, 32)
    pipelines = [
        {"pp": 2, "fsdp": 2, "schedule": "1F1B"},
        mw.Parallel(pp=2, tp=2),  # after another pipeline in one process: its own groups
        {"pp": 4, "schedule": "gpipe", "microbatches": 4},
        {"pp": 2, "virtual_stages": 2, "fsdp": 2},
    ]
    # foreach=False: tensor parallelism alone leaves the norms plain tensors (a foreach step fails)
    p = mw.plan(
        llama(), size, devices=4, layouts=[{"fsdp": 4}, *pipelines], workers=1, foreach=False, **ONE
    )
    df = p.to_dataframe()
    assert list(df.columns[:10]) == [
        "replicate",
        "fsdp",
        "tp",
        "pp",
        "cp",
        "ep",
        "sequence_parallel",
        "schedule",
        "virtual_stages",
        "activation_checkpointing",
    ]
    piped = df[df["pp"] > 1]
    assert len(piped) == 4 and piped["error"].isna().all()  # one candidate a pipeline
    assert list(piped["schedule"]) == ["1F1B", "1F1B", "gpipe", "interleaved-1F1B"]
    assert list(piped["micro_batches"]) == [2, 2, 4, 4]  # the schedule's micro-batches
    # at full depth: 3 layers a stage or fewer, no more than the rule's deepest trace
    assert (piped["traced_layers"] == "all").all()
    for (_, row), given in zip(piped.iterrows(), pipelines, strict=True):
        a = analyzed(size, given, foreach=False)
        assert a.error is None and a.time is not None and a.stages
        assert row["peak_bytes"] == a.peak_bytes == max(s.peak_bytes for s in a.stages)
        assert row["step_s"] == a.time.step_s  # the pipeline's step, its bubble included
        assert row["tokens_per_s"] == a.time.tokens_per_s
    plain = df[df["pp"] == 1]
    assert plain["schedule"].isna().all() and list(plain["micro_batches"]) == [1, 2]


def test_a_pipelines_ranks_follow_the_per_layer_rule_each_on_its_own() -> None:
    """21 layers over 2 stages (11 and 10 layers): each rank traced at 3 and 4 layers a stage
    and extended on its own (``explore.depth_stages``) gives the full depth's peak, what the GPU
    holds, step time (the schedule's bubble included) and rates, with and without
    checkpointing. Under a budget below the least either holds, the rule's numbers stand where
    the allocator's steps follow no rule too."""
    space: dict[str, Any] = dict(
        gpu="H100",
        devices=4,
        layouts=[{"pp": 2, "fsdp": 2, "schedule": "1F1B", "microbatches": 2}],
        precisions=["param_dtype bf16"],
        activation_checkpointing=[False, True],
        workers=1,
        budget="600MiB",
    )
    rule = mw.plan(llama(21), (4, 32), **space)
    full = mw.plan(llama(21), (4, 32), full_depth=True, **space)
    # with checkpointing, a free outside the layers' runs takes its third rank at 2 layers
    assert [c.traced_layers for c in rule.candidates] == [(3, 4), (2, 3, 4)]
    assert rule.traces == 5 and full.traces == 2
    for by_rule, whole in zip(rule.candidates, full.candidates, strict=True):
        same_numbers(by_rule, whole)
    # with checkpointing the allocator's steps follow the rule: what the GPU holds, exactly
    checkpointed = rule.candidates[1]
    assert checkpointed.device_bytes == full.candidates[1].device_bytes


def test_a_pipeline_whose_held_state_is_over_the_budget_is_pruned_at_3_and_4_layers() -> None:
    """A rank's parameters, gradients and optimizer state at the full depth, with the CUDA
    context, come exactly from its traces at 3 and 4 layers a stage (``held_by_ranks``): one
    byte of budget below the most a rank of the 21-layer pipeline holds so, neither candidate
    of the layout and precision can fit, the first is pruned after two traces and the second
    is not traced; at that budget itself, both are traced by the rule."""
    parallel = {"pp": 2, "fsdp": 2, "schedule": "1F1B", "microbatches": 2}
    whole = mw.analyze(llama(21), (4, 32), mode="training", gpu="H100", parallel=parallel)
    assert whole.stages is not None
    held = max(held_state(s.analysis) + overheads(s.analysis) for s in whole.stages)
    space: dict[str, Any] = dict(
        gpu="H100",
        devices=4,
        layouts=[parallel],
        precisions=["as given"],
        activation_checkpointing=[False, True],
        workers=1,
    )
    pruned = mw.plan(llama(21), (4, 32), budget=held - 1, **space)
    assert pruned.traces == 2
    assert [c.traced_layers for c in pruned.candidates] == [(3, 4), ()]
    for c in pruned.candidates:
        assert not c.fits and c.device_bytes == held
        assert c.error is not None and c.error.startswith("Cannot fit")
        assert "at 3 and 4 layers a stage" in c.error
    traced = mw.plan(llama(21), (4, 32), budget=held, **space)
    assert traced.traces == 5  # with checkpointing, at 2 layers a stage too (the reserve)
    assert [c.traced_layers for c in traced.candidates] == [(3, 4), (2, 3, 4)]
    assert all(c.error is None and not c.fits for c in traced.candidates)  # over, by activations


def test_stage_layers_are_the_full_depths_split() -> None:
    """The layers a stage of each rank, as ``layer_ranges`` splits them; None where a rank's
    stages differ, a stage holds 7 layers or fewer (the rule's traces, 3 + 4 layers a stage,
    would cost more than the full depth), or the boundaries are given."""
    assert stage_layers(mw.Parallel(pp=2), 21) == [11, 10]
    assert stage_layers(mw.Parallel(pp=3), 31) == [11, 10, 10]
    assert stage_layers(mw.Parallel(pp=2), 17) == [9, 8]
    assert stage_layers(mw.Parallel(pp=2), 15) is None  # 8 and 7 layers a stage
    interleaved = dict(pp=2, virtual_stages=2, schedule="interleaved-1F1B")
    assert stage_layers(mw.Parallel(**interleaved), 40) == [10, 10]
    assert stage_layers(mw.Parallel(**interleaved), 42) is None  # rank 0: stages of 11 and 10
    assert stage_layers(mw.Parallel(pp=2, stage_boundaries=(11,)), 22) is None


def test_what_the_model_cannot_take_is_a_row_with_its_reason_and_never_traced() -> None:
    size = (3, 32)
    refused = {
        "tp": {"tp": 4},  # past the 2 key/value heads
        "pp": {"pp": 8},  # more stages than the 6 layers
        "ep": {"fsdp": 2, "ep": 2, "tp": 2},  # a dense model has no experts
        "cp": {"fsdp": 2, "pp": 2, "cp": 2},  # no ring attention inside a pipeline yet
        "batch": {"pp": 2, "fsdp": 2},  # 3 sequences into 2 micro-batches
    }
    devices = {"tp": 4, "pp": 8, "ep": 4, "cp": 8, "batch": 4}
    for name, layout in refused.items():
        p = mw.plan(llama(), size, devices=devices[name], layouts=[layout], workers=1, **ONE)
        assert p.traces == 0, name  # found before any trace
        with pytest.raises(mw.LayoutError) as truth:
            analyzed(size, layout)
        for c in p.candidates:
            assert c.error == f"LayoutError: {truth.value}", name
            assert not c.fits and c.peak_bytes is None and not c.openable


def test_inference_refuses_a_pipeline_up_front() -> None:
    with pytest.raises(mw.OptionError, match="training step only"):
        mw.plan(llama(), (4, 32), gpu="H100", devices=2, mode="inference", layouts=[{"pp": 2}])


def test_global_batch_gives_each_candidate_its_share() -> None:
    p = mw.plan(
        llama(),
        devices=4,
        global_batch=16,
        seq_len=32,
        layouts=[{"fsdp": 4}, {"replicate": 2, "tp": 2}, {"pp": 2, "fsdp": 2}],
        micro_batches=[1, 2],
        workers=1,
        **ONE,
    )
    sizes = [(c.layout.label(), c.micro_batches, c.input_size) for c in p.candidates]
    assert sizes == [
        ("fsdp=4", 1, (4, 32)),  # 16 sequences over 4 data-parallel ranks
        ("fsdp=4", 2, (2, 32)),  # ... in 2 micro-batches
        ("replicate=2 tp=2", 1, (8, 32)),  # tp's ranks share their replica's samples
        ("replicate=2 tp=2", 2, (4, 32)),
        ("fsdp=2 pp=2 1F1B", 2, (8, 32)),  # a pipeline's step: its schedule splits it
    ]
    for c in p.candidates:  # the rates are the whole job's: 16 sequences of 32 tokens a step
        assert c.error is None and c.step_s is not None
        assert c.tokens_per_s * c.step_s == pytest.approx(16 * 32)
        assert c.samples_per_s * c.step_s == pytest.approx(16)
    c = p.candidates[1]
    a = analyzed(c.input_size, {"fsdp": 4}, micro_batches=2)
    assert a.peak_bytes == c.peak_bytes and a.time is not None
    # by the per-layer rule (2, 3, 4 layers) the costs are summed in another order
    assert a.time.step_s == pytest.approx(c.step_s, rel=1e-9)


def test_a_global_batch_that_does_not_divide_is_a_row_with_why() -> None:
    p = mw.plan(
        llama(),
        devices=4,
        global_batch=6,
        seq_len=32,
        layouts=[{"fsdp": 4}, {"fsdp": 2, "tp": 2}],
        micro_batches=[1, 2],
        workers=1,
        **ONE,
    )
    errors = [c.error for c in p.candidates]
    assert errors[0] == errors[1] and "over the 4 data-parallel ranks" in str(errors[0])
    assert errors[2] is None and p.candidates[2].input_size == (3, 32)
    assert "do not split into micro_batches=2" in str(errors[3])
    assert p.candidates[2].tokens_per_s * p.candidates[2].step_s == pytest.approx(6 * 32)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"input_size": (4, 32), "global_batch": 16, "seq_len": 32}, "not both"),
        ({"global_batch": 16}, "seq_len"),
        ({"seq_len": 32}, "global_batch"),
        ({"global_batch": 0, "seq_len": 32}, "whole number"),
    ],
)
def test_global_batch_is_checked(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(mw.OptionError, match=match):
        mw.plan(llama(), gpu="H100", devices=4, **kwargs)


def test_layouts_are_checked() -> None:
    with pytest.raises(mw.OptionError, match="uses 8 devices"):
        mw.plan(llama(), (4, 32), gpu="H100", devices=4, layouts=[{"pp": 2, "fsdp": 4}])
    with pytest.raises(mw.OptionError, match="does not vary"):
        mw.plan(llama(), (4, 32), gpu="H100", devices=4, layouts=[mw.Parallel(fsdp=4, mp={})])
    with pytest.raises(mw.OptionError, match="schedule"):
        mw.plan(llama(), (4, 32), gpu="H100", devices=2, layouts=[{"pp": 2, "schedule": "x"}])


def test_default_layouts_add_pipelines_beyond_a_node_only() -> None:
    h100 = resolve_gpu("H100")
    layouts = default_layouts(64, h100, layers=80)
    piped = [x for x in layouts if x.pp > 1]
    assert layouts[: len(layouts) - len(piped)] == default_layouts(64, h100)  # first, as before
    assert {x.pp for x in piped} == {2, 4, 8, 16, 32, 64}
    for x in piped:
        assert x.devices == 64 and x.tp <= 8 and x.replicate == 1 and x.schedule == "1F1B"
        assert x.microbatches == x.pp
    assert {x.pp for x in default_layouts(64, h100, layers=20) if x.pp > 1} == {2, 4, 8, 16}
    assert all(x.pp == 1 for x in default_layouts(8, h100, layers=80))  # one node: no pipeline
    assert len(candidates(8)) == 10 * 12  # the 8-GPU space unchanged
    space = Space.checked(16, "inference", h100, None, None, None, None, 80)
    assert all(x.pp == 1 for x in space.layouts)  # a pipeline traces training only
    assert Layout.of(mw.Parallel(pp=2, tp=4)) == Layout.of({"tp": 4, "pp": 2})


def plan_5d(**how: Any) -> mw.Plan:
    return mw.plan(
        llama(),
        devices=4,
        global_batch=8,
        seq_len=32,
        layouts=[
            {"fsdp": 4},
            {"pp": 2, "fsdp": 2},
            {"tp": 4},
            {"pp": 2, "fsdp": 2, "microbatches": 8},
            {"pp": 4},
        ],
        gpu="H100",
        activation_checkpointing=[False, True],
        precisions=["as given"],
        micro_batches=[1, 2],
        **how,
    )


@pytest.fixture(scope="module")
def alone() -> mw.Plan:
    return plan_5d(workers=1)


def same_rows(a: mw.Plan, b: mw.Plan) -> None:
    assert [c.key for c in a.candidates] == [c.key for c in b.candidates]
    pd.testing.assert_frame_equal(a.to_dataframe(), b.to_dataframe())


def test_workers_give_the_plan_of_one_process(
    alone: mw.Plan, remote: list[tuple[Any, ...]]
) -> None:
    df = alone.to_dataframe()
    assert df["error"].str.contains("tp=4 does not divide").sum() == 4
    assert df["error"].str.contains("microbatches=8 do not divide the batch of 4").sum() == 2
    assert df["error"].isna().sum() == 8
    same_rows(alone, plan_5d(workers=2))
    assert remote, "no candidate was traced by the child"


def test_an_executor_gives_the_plan_of_one_process(
    alone: mw.Plan, remote: list[tuple[Any, ...]]
) -> None:
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(2, mp_context=context) as executor:
        p = plan_5d(executor=executor)
    assert len(remote) == 8  # every candidate traced, on the executor
    same_rows(alone, p)


def test_every_pipeline_rank_counts_the_steps_tokens() -> None:
    """Each micro-batch passes every stage: any rank's rates are the step's whole batch (the
    worst rank, whose analysis a pipeline shows, need not be rank 0, which holds the input)."""
    a = analyzed((4, 32), {"pp": 2, "fsdp": 2})
    assert a.stages and a.time is not None
    for s in a.stages:
        t = s.analysis.time
        assert t is not None and t.tokens_per_s is not None and t.samples_per_s is not None
        assert t.tokens_per_s * t.step_s == pytest.approx(2 * 4 * 32)  # 2 data-parallel ranks
        assert t.samples_per_s * t.step_s == pytest.approx(2 * 4)


@pytest.mark.parametrize("checkpointed", [False, True])
def test_a_pipelines_forward_runs_under_autocast(checkpointed: bool) -> None:
    """``autocast=`` under a pipeline: every stage's forward in bf16, as without a pipeline (it
    ran in the parameters' float32, and its checkpointed layers, recomputed under autocast,
    failed with "Failed to run stage backward"); the candidates of ``plan``'s "autocast bf16"
    are then not those of "as given"."""
    options: dict[str, Any] = dict(
        mode="training",
        gpu="H100",
        parallel=mw.Parallel(pp=2, microbatches=2, schedule="1F1B"),
        activation_checkpointing=checkpointed,
    )
    a = mw.analyze(llama(4), (4, 32), autocast="bfloat16", **options)
    given = mw.analyze(llama(4), (4, 32), **options)
    assert a.error is None and given.error is None, a.error
    for stage, plain in zip(a.stages, given.stages, strict=True):
        linears = [c for c in stage.analysis.calls if c.type == "Linear"]
        assert linears and {out.dtype for c in linears for _, out in c.outputs} == {"bfloat16"}
        assert {
            out.dtype for c in plain.analysis.calls if c.type == "Linear" for _, out in c.outputs
        } == {"float32"}
    assert a.peak_bytes != given.peak_bytes


@pytest.mark.parametrize("checkpointing", [False, True])
def test_an_interleaved_pipelines_ranks_follow_the_per_layer_rule(checkpointing: bool) -> None:
    """PP 2 x FSDP 2, interleaved 1F1B, 2 stages a rank: a rank runs its two stages' forwards
    and backwards by turns, and the layer more each stage has is one block of the deeper trace
    only within one phase run (``depth._chunks``). Each rank extended from 3 and 4 layers a
    stage to 5 gives the 20-layer pipeline's peak and what its GPU holds, to the byte (the
    all-gather buffers a layer more adds are one in each stage's group: ``depth._spread``; with
    checkpointing, the forward's frees of the next stage's buffers are placed where their copies
    free the buffers the layer adds: ``depth._slid``; a free outside the runs whose rank moves
    with the depth takes its third rank from the 2-layer trace, as ``plan`` traces it), and its
    step time."""
    parallel = {
        "pp": 2,
        "fsdp": 2,
        "schedule": "interleaved-1F1B",
        "virtual_stages": 2,
        "microbatches": 2,
    }
    options: dict[str, Any] = dict(
        mode="training",
        gpu="H100",
        parallel=parallel,
        param_dtype="bfloat16",
        activation_checkpointing=checkpointing,
    )
    two, *analyses = (mw.analyze(llama(4 * d), (4, 32), **options) for d in (2, *DEPTHS))
    full = extend_stages(analyses, [5, 5], resolve_gpu("H100"), 2)
    assert full is not None and full.device_bytes is None
    full = extend_stages(analyses, [5, 5], resolve_gpu("H100"), 2, two)
    whole = mw.analyze(llama(20), (4, 32), **options)
    assert full is not None and whole.time is not None
    assert full.peak_bytes == whole.peak_bytes
    assert full.device_bytes == whole.footprint_bytes
    assert full.time.step_s == pytest.approx(whole.time.step_s, rel=1e-9)
