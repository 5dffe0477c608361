"""Pipeline parallelism traced per stage against real gloo ranks (``pipeline_truth``).

Truth: the same tiny Llama built for real, split by hand, run by PyTorch's own
``torch.distributed.pipelining`` schedules on one gloo process per rank for three AdamW steps,
measured by the CPU allocator; its sends and receives counted at the dispatcher. The bubble's
truth: the closed form of a schedule's idle share when every forward and backward takes one
slot, (P - 1) / (v m + P - 1) for P ranks, v stages a rank and m micro-batches (1F1B and GPipe:
v = 1): each rank idles P - 1 slots at the start and at the end, and works 2 v m.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import transformers
from parallel_truth import (
    DeepMLP,
    no_process_group_left,  # noqa: F401  (an autouse fixture)
    tiny_llama_config,
)
from pipeline_truth import real_pipeline_ranks
from test_expert_parallel import tiny_mixtral

import meta_widget as mw

#: the acceptance bound of the issue
TOLERANCE = 0.02


def tokens(batch: int = 4, vocab: int = 32000) -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randint(0, vocab, (batch, 128))


def analyze_pipeline(config: Any, x: torch.Tensor, **layout: Any) -> mw.Analysis:
    a = mw.analyze(config, input_data=x, mode="training", device="cpu", parallel=layout)
    for stage in a.stages:
        assert stage.analysis.error is None, stage.analysis.error
    return a


def agree(a: mw.Analysis, truth: list[dict[str, Any]]) -> None:
    """Every stage's steady and first-step peaks within 2 % of its real rank's, its sends and
    receives equal to the real ones, and the analysis the worst stage's."""
    assert [list(s.stages) for s in a.stages] == [t["stages"] for t in truth]
    for stage, real in zip(a.stages, truth, strict=True):
        assert stage.peak_bytes == pytest.approx(real["steady"], rel=TOLERANCE)
        first = stage.analysis.memory.first_step_peak_bytes
        assert first == pytest.approx(real["first_step"], rel=TOLERANCE)
        assert (stage.send_bytes, stage.recv_bytes) == (real["sent"], real["received"])
    worst = max(a.stages, key=lambda s: s.peak_bytes)
    assert a.peak_bytes == worst.peak_bytes == max(s.analysis.peak_bytes for s in a.stages)
    assert f"Pipeline rank {worst.rank}" in a.notes[-1]


def test_a_pipeline_under_autocast_is_its_real_gloo_ranks(tmp_path: Path) -> None:
    """``autocast=`` runs every stage's forward under autocast, as a training loop's
    ``with torch.autocast`` around the schedule's step does (it was ignored under a pipeline:
    each stage ran in float32). A small vocabulary: CPU matmuls in bf16 are slow, and the
    output layer's were most of the real ranks' time."""
    config, x = tiny_llama_config(vocab=2048), tokens(vocab=2048)
    truth = real_pipeline_ranks(config, x, 2, tmp_path, autocast=True)
    a = mw.analyze(
        config, input_data=x, mode="training", device="cpu", parallel={"pp": 2}, autocast="bfloat16"
    )
    assert all(stage.analysis.error is None for stage in a.stages)
    agree(a, truth)
    # the bound is not vacuous: the trace in float32 (autocast ignored, as it was) misses it
    ignored = mw.analyze(config, input_data=x, mode="training", device="cpu", parallel={"pp": 2})
    assert any(
        abs(s.peak_bytes - t["steady"]) > TOLERANCE * t["steady"]
        for s, t in zip(ignored.stages, truth, strict=True)
    )


@pytest.mark.parametrize(
    ("schedule", "v", "bounds"),
    [("1F1B", 1, ()), ("interleaved-1F1B", 2, ()), ("1F1B", 1, (1,))],
)
def test_each_stage_of_a_two_rank_pipeline_is_its_real_gloo_rank(
    schedule: str, v: int, bounds: tuple[int, ...], tmp_path: Path
) -> None:
    config, x = tiny_llama_config(), tokens()
    truth = real_pipeline_ranks(config, x, 2, tmp_path, schedule, v, bounds=bounds)
    layout: dict[str, Any] = {"pp": 2, "schedule": schedule, "virtual_stages": v}
    if bounds:
        layout["stage_boundaries"] = bounds
    a = analyze_pipeline(config, x, **layout)
    agree(a, truth)
    # the last stage holds the logits of every micro-batch in flight: it peaks, not the embedding
    if not bounds and v == 1:
        assert a.stages[1].peak_bytes > a.stages[0].peak_bytes
        assert a.stages[0].modules[:2] == ("model.embed_tokens", "model.layers.0")
        assert a.stages[1].modules[-2:] == ("model.norm", "lm_head")


@pytest.mark.slow
def test_each_stage_of_a_four_rank_1f1b_pipeline_is_its_real_gloo_rank(tmp_path: Path) -> None:
    config, x = tiny_llama_config(), tokens()
    agree(analyze_pipeline(config, x, pp=4), real_pipeline_ranks(config, x, 4, tmp_path))


def eight_layers() -> Any:
    config = tiny_llama_config()
    config.num_hidden_layers = 8
    return config


@pytest.mark.parametrize(
    ("pp", "v", "m", "schedule"),
    [
        (2, 1, 2, "1F1B"),
        (2, 1, 4, "1F1B"),
        (4, 1, 4, "1F1B"),
        (2, 1, 4, "gpipe"),
        (2, 2, 4, "interleaved-1F1B"),
        (4, 2, 8, "interleaved-1F1B"),
    ],
)
def test_the_bubble_is_the_schedules_idle_share(pp: int, v: int, m: int, schedule: str) -> None:
    a = analyze_pipeline(
        eight_layers(), tokens(m), pp=pp, virtual_stages=v, microbatches=m, schedule=schedule
    )
    expected = (pp - 1) / (v * m + pp - 1)
    assert [s.bubble for s in a.stages] == pytest.approx([expected] * pp)


def test_step_time_stretches_each_stage_by_its_bubble_and_prices_the_sends() -> None:
    a = mw.analyze(
        tiny_llama_config(), input_data=tokens(), mode="training", parallel={"pp": 2}, gpu="H100"
    )
    for stage in a.stages:
        t = stage.analysis.time
        assert t is not None and stage.step_s is not None
        assert stage.step_s > t.forward_s + t.backward_s + t.optimizer_s
        # sends and receives are priced with the other collectives
        assert t.comm_s > 0 and set(stage.analysis.comms.collective) == {"send", "recv"}
    # the analysis's own time is the pipeline's step (the ranks step together): the shown
    # rank's step alone plus the time it waits, its rates over that step
    shown = next(s for s in a.stages if s.analysis.peak_bytes == a.peak_bytes)
    alone = shown.analysis.time
    assert a.time is not None and alone is not None
    assert a.time.step_s == pytest.approx(max(s.step_s or 0 for s in a.stages))
    assert a.time.bubble_s == pytest.approx(a.time.step_s - alone.step_s) and a.time.bubble_s > 0
    assert a.time.mfu == pytest.approx(alone.mfu * alone.step_s / a.time.step_s)
    for rate in ("tokens_per_s", "samples_per_s"):
        if getattr(alone, rate) is not None:
            scaled = getattr(alone, rate) * alone.step_s / a.time.step_s
            assert getattr(a.time, rate) == pytest.approx(scaled)
    assert "bubble" in repr(a.time) and "bubble" in a.summary()


@pytest.mark.parametrize(
    ("model", "layout", "match"),
    [
        (DeepMLP, {"pp": 2}, "not one; trace it without pp"),
        ("llama", {"pp": 4, "virtual_stages": 2}, "8 stages, more than the 4 layers"),
        ("llama", {"pp": 2, "stage_boundaries": (4,)}, "go past the 4 layers"),
        ("llama", {"pp": 2, "microbatches": 3}, "do not divide the batch of 4"),
        ("llama", {"pp": 2, "cp": 2}, "cp=2"),
    ],
)
def test_a_pipeline_the_model_cannot_take_is_a_layout_error(
    model: Any, layout: dict[str, Any], match: str
) -> None:
    model = tiny_llama_config() if model == "llama" else model
    x = tokens() if model is not DeepMLP else torch.randn(4, 256)
    with pytest.raises(mw.LayoutError, match=match) as raised:
        mw.analyze(model, input_data=x, mode="training", parallel=layout)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(
    "options", [{"mode": "inference"}, {"mode": "training", "micro_batches": 2}]
)
def test_a_pipeline_traces_a_training_step_of_its_own_micro_batches(options: Any) -> None:
    with pytest.raises(mw.OptionError, match="traces a training step run by a pipeline"):
        mw.analyze(tiny_llama_config(), input_data=tokens(), parallel={"pp": 2}, **options)


def test_a_llama_for_causal_lm_module_splits_as_its_config() -> None:
    config = tiny_llama_config()
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config)
    a = analyze_pipeline(model, tokens(), pp=2)
    b = analyze_pipeline(config, tokens(), pp=2)
    assert [s.peak_bytes for s in a.stages] == [s.peak_bytes for s in b.stages]


def test_pp_x_fsdp_each_stage_is_its_real_rank_under_the_fake_group(tmp_path: Path) -> None:
    """PP 2 x FSDP 2: each stage's layers, then the stage, fully_shard-ed over its two FSDP
    ranks; pipeline rank r's trace against real rank 2 r run alone under the fake process group
    (real tensors, the vote settled as in the trace)."""
    config, x = tiny_llama_config(), tokens()
    truth = real_pipeline_ranks(config, x, 2, tmp_path, fsdp=2, backend="fake")[::2]
    a = analyze_pipeline(config, x, pp=2, fsdp=2)
    assert {"all_gather", "reduce_scatter", "send", "recv"} <= set(a.comms.collective)
    agree(a, truth)


def test_pp_x_ep_each_stage_is_its_real_rank_under_the_fake_group(tmp_path: Path) -> None:
    """PP 2 x FSDP 2 with EP 2 on a Mixtral: each stage's experts sliced over the two FSDP ranks
    and reached by all-to-all, the rest fully_shard-ed; the trace of pipeline rank r against
    real rank 2 r (experts sliced by hand in the truth), run alone under the fake process
    group. Each stage (one layer) moves tokens x top-k x hidden floats per all-to-all: the
    dispatch and the combine, forward and backward, for each of its 2 micro-batches."""
    config, x = tiny_mixtral(), tokens()
    truth = real_pipeline_ranks(config, x, 2, tmp_path, fsdp=2, ep=2, backend="fake")[::2]
    a = analyze_pipeline(config, x, pp=2, fsdp=2, ep=2)
    agree(a, truth)
    for stage in a.stages:  # micro-batches of 2 x 128 tokens, top-2, hidden 256, float32
        comms = stage.analysis.comms
        moved = comms[comms.collective == "all_to_all"].bytes
        assert list(moved) == [2 * 128 * 2 * 256 * 4] * (2 * 4)


def test_pp_x_tp_each_stage_is_its_real_rank_under_the_fake_group(tmp_path: Path) -> None:
    """PP 2 x TP 2: each stage parallelize_module-d with the Llama plan (its part of it); the
    trace of pipeline rank r against real rank 2 r run alone under the fake process group."""
    config, x = tiny_llama_config(), tokens()
    truth = real_pipeline_ranks(config, x, 2, tmp_path, tp=2, backend="fake")[::2]
    a = analyze_pipeline(config, x, pp=2, tp=2)
    assert {"all_reduce", "send", "recv"} <= set(a.comms.collective)
    agree(a, truth)


def test_pp_x_tp_with_sequence_parallelism_each_stage_is_its_real_rank(tmp_path: Path) -> None:
    """PP 2 x TP 2 with sequence parallelism: between stages each rank sends its shard of the
    sequence (half the bytes of plain tensor parallelism), inside a stage the residual stream
    is sharded; the trace of pipeline rank r against real rank 2 r (the plan written by hand
    in the truth), run alone under the fake process group."""
    config, x = tiny_llama_config(), tokens()
    truth = real_pipeline_ranks(
        config, x, 2, tmp_path, tp=2, backend="fake", sequence_parallel=True
    )[::2]
    a = analyze_pipeline(config, x, pp=2, tp=2, sequence_parallel=True)
    assert {"all_gather", "reduce_scatter", "send", "recv"} <= set(a.comms.collective)
    agree(a, truth)
    plain = analyze_pipeline(config, x, pp=2, tp=2)
    assert [s.send_bytes for s in a.stages] == [s.send_bytes // 2 for s in plain.stages]


@pytest.mark.slow
def test_pp_x_fsdp_on_gloo_varies_run_to_run(tmp_path: Path) -> None:
    """The same on four gloo ranks running together: sends, receives and the last stage's first
    step agree; the steady peaks do not, because the real ranks' own allocations vary from run
    to run by one unsharded root parameter (the embedding or the head, 32.8 MB: stage 0 gave
    192, 196, 229, 233 and 258 MB, stage 1 255 and 288 MB, where the fake group's run gives
    176 and 251 MB, the trace's): gloo completes FSDP2's collectives on threads of its own, so
    what is alive at the peak depends on timing. An expected failure while that holds."""
    config, x = tiny_llama_config(), tokens()
    truth = real_pipeline_ranks(config, x, 2, tmp_path, fsdp=2)[::2]
    a = analyze_pipeline(config, x, pp=2, fsdp=2)
    for stage, real in zip(a.stages, truth, strict=True):
        assert list(stage.stages) == real["stages"]
        assert (stage.send_bytes, stage.recv_bytes) == (real["sent"], real["received"])
    last = a.stages[1].analysis.memory.first_step_peak_bytes
    assert last == pytest.approx(truth[1]["first_step"], rel=TOLERANCE)
    peaks = [(s.peak_bytes, t["steady"]) for s, t in zip(a.stages, truth, strict=True)]
    if any(abs(p / t - 1) > TOLERANCE for p, t in peaks):
        pytest.xfail(f"PP x FSDP steady peaks on gloo (trace, real): {peaks}")


def test_a_pipeline_trace_leaves_no_process_group_or_patch_behind() -> None:
    import sys

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from meta_widget.distributed.decisions import forget_meshes

    resize, hook = torch.UntypedStorage.resize_, sys.excepthook
    analyze_pipeline(tiny_llama_config(), tokens(), pp=2, fsdp=2)
    assert torch.UntypedStorage.resize_ is resize and sys.excepthook is hook
    assert not dist.is_initialized()
    # the user's own process group and mesh of the same shape work afterwards
    dist.init_process_group("fake", rank=0, world_size=4, store=FakeStore())
    try:
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "fsdp"))
        model = fully_shard(torch.nn.Linear(8, 8), mesh=mesh["fsdp"])
        model(torch.randn(2, 8)).sum().backward()
    finally:
        dist.destroy_process_group()
        forget_meshes()


def test_activation_checkpointing_picks_each_stages_layers() -> None:
    """``activation_checkpointing=True`` checkpoints every decoder layer of every stage (a
    stage's layers are a ModuleList, as the model's): the last stage, which holds every
    micro-batch's layer activations, peaks lower, and its backward recomputes the forward."""
    plain = analyze_pipeline(tiny_llama_config(), tokens(), pp=2)
    saved = mw.analyze(
        tiny_llama_config(), input_data=tokens(), mode="training", device="cpu",
        parallel={"pp": 2}, activation_checkpointing=True,
    )  # fmt: skip
    assert saved.stages[1].peak_bytes < plain.stages[1].peak_bytes
    assert saved.stages[1].analysis.total_flops > plain.stages[1].analysis.total_flops


def test_a_pipeline_of_a_mixture_of_experts_finds_its_stages_tensors() -> None:
    """The stages run on meta to find the tensors between them (``stage_shapes``), outside the
    trace: a Mixtral's experts run ``_grouped_mm``, whose meta kernel refuses float32 where the
    devices do not; that run takes meta_widget's fix too (it raised a bare RuntimeError)."""
    config = transformers.MixtralConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=128, num_local_experts=4, num_experts_per_tok=2,
        architectures=["MixtralForCausalLM"],
    )  # fmt: skip
    x = tokens()[:, :16] % 128
    whole = mw.analyze(config, input_data=x, mode="training", device="cpu")
    a = analyze_pipeline(config, x, pp=2)
    assert [s.modules[-1] for s in a.stages] == ["model.layers.1", "lm_head"]
    assert sum(s.analysis.param_bytes for s in a.stages) == whole.param_bytes
    assert a.stages[0].send_bytes == a.stages[1].recv_bytes > 0
