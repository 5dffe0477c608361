"""``mw.plan``: the best candidate is the fastest row that fits, checked against the rows and
against its configuration traced again here with ``mw.analyze``; layouts the model does not
allow are recorded and skipped; nothing fitting and bad arguments are errors."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch import nn

import meta_widget as mw
from meta_widget.explore.plan_view import plan_payload

transformers = pytest.importorskip("transformers")

PRECISION_OPTIONS: dict[str, dict[str, Any]] = {
    "as given": {},
    "autocast bf16": {"autocast": torch.bfloat16},
    "param_dtype bf16": {"param_dtype": torch.bfloat16},
}


def tiny_llama() -> Any:
    return transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(64, 64) for _ in range(3)])
        self.head = nn.Linear(64, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = torch.relu(block(x))
        return self.head(x)


def reanalyze(model: Any, size: Any, row: Any, **options: Any) -> mw.Analysis:
    """``row``'s configuration traced again with ``mw.analyze`` (options spelled here)."""
    parallel = {k: int(row[k]) for k in ("replicate", "fsdp", "tp") if int(row[k]) > 1}
    checkpointing = row["activation_checkpointing"]  # False, True or "selective"
    return mw.analyze(
        model,
        size,
        mode="training",
        gpu="H100",
        parallel=parallel or None,
        activation_checkpointing=(
            checkpointing if isinstance(checkpointing, str) else bool(checkpointing)
        ),
        micro_batches=int(row["micro_batches"]),
        **PRECISION_OPTIONS[row["precision"]],
        **options,
    )


def check_best(p: Any, model: Any, size: Any, rate: str) -> None:
    """``p.best`` fits, no fitting row is faster, and its configuration re-traced agrees."""
    df = p.to_dataframe()
    traced = df[df["peak_bytes"].notna()]
    assert (traced["fits"] == (traced["device_bytes"] <= p.budget)).all()
    assert (traced["device_bytes"] > traced["peak_bytes"]).all()  # + the CUDA context at least
    fitting = df[df["fits"]]
    assert len(fitting) and (~df["fits"]).any()  # the budget separates the candidates
    best = p.best
    assert best.fits and best.analysis is not None
    assert getattr(best, rate) == fitting[rate].max()
    row = next(r for _, r in df.iterrows() if r[rate] == getattr(best, rate) and r["fits"])
    again = reanalyze(model, size, row)
    assert again.error is None
    assert again.peak_bytes == best.peak_bytes
    assert best.device_bytes <= p.budget
    if not best.traced_layers:  # at full depth: what analyze says the GPU holds
        assert again.footprint_bytes == best.device_bytes
    assert getattr(again.time, rate) == pytest.approx(getattr(best, rate))
    assert not (fitting[rate] > getattr(again.time, rate) * (1 + 1e-9)).any()


def test_best_is_the_fastest_row_that_fits_llama() -> None:
    # activations large enough that the precisions and checkpointing differ on the GPU, not
    # only in the tensors' bytes (the caching allocator's 2 MiB segments round small ones away)
    cfg, size = tiny_llama(), (8, 256)
    # a budget the plain fp32 step does not fit (traced here, independently of plan)
    plain = mw.analyze(cfg, size, mode="training", gpu="H100")
    budget = plain.footprint_bytes - 1
    p = mw.plan(cfg, size, gpu="H100", devices=1, budget=budget)
    df = p.to_dataframe()
    assert len(df) == 12  # 1 layout x 2 checkpointing x 3 precisions x 2 micro-batches
    plain_row = df[(df["precision"] == "as given") & ~df["activation_checkpointing"]]
    plain_row = plain_row[plain_row["micro_batches"] == 1]
    assert int(plain_row["peak_bytes"].iloc[0]) == plain.peak_bytes
    assert int(plain_row["device_bytes"].iloc[0]) == plain.footprint_bytes
    assert not bool(plain_row["fits"].iloc[0])
    check_best(p, cfg, size, "tokens_per_s")


def test_layout_the_model_does_not_allow_is_skipped_with_its_reason() -> None:
    size = (4, 64)
    p = mw.plan(MLP, size, gpu="H100", devices=2, budget=10**9)
    df = p.to_dataframe()
    # 3 layouts (fsdp 2; 2 HSDP replicas; tp 2) x 2 checkpointing x 3 precisions x 2 micro-batches
    assert len(df) == 36
    tp = df[df["tp"] == 2]
    assert len(tp) == 12 and not tp["fits"].any() and tp["peak_bytes"].isna().all()
    assert tp["error"].str.contains("ParallelError").all()
    fsdp = df[df["fsdp"] == 2]
    assert fsdp["error"].isna().all() and fsdp["fits"].all()
    assert df["tokens_per_s"].isna().all()  # float inputs: samples per second
    best = p.best
    assert best.fsdp == 2 and best.samples_per_s == fsdp["samples_per_s"].max()


def test_budget_separates_mlp_candidates() -> None:
    size = (4, 64)
    plain = mw.analyze(MLP, size, mode="training", gpu="H100", parallel={"fsdp": 2})
    # on the GPU, FSDP's rank fits (one communicator's NCCL buffers), DDP's does not (two)
    p = mw.plan(MLP, size, gpu="H100", devices=2, budget=plain.footprint_bytes)
    check_best(p, MLP, size, "samples_per_s")


def test_nothing_fits() -> None:
    p = mw.plan(MLP, (4, 64), gpu="H100", budget=1024)
    assert not p.to_dataframe()["fits"].any()
    with pytest.raises(mw.NothingFitsError, match="none of the 12 candidates") as raised:
        _ = p.best
    assert "sequence parallelism" not in str(raised.value)  # no tensor-parallel layout


def test_nothing_fits_names_sequence_parallelism_when_tp_ran_without_it() -> None:
    cfg, size = tiny_llama(), (2, 64)
    few: dict[str, Any] = {
        "gpu": "H100", "devices": 2, "budget": 1024, "activation_checkpointing": [False],
        "precisions": ["as given"], "micro_batches": [1],
    }  # fmt: skip
    p = mw.plan(cfg, size, layouts=[{"fsdp": 2}, {"tp": 2}], **few)
    with pytest.raises(mw.NothingFitsError) as raised:
        _ = p.best
    assert "sequence parallelism (layouts=[{'tp': 2, 'sequence_parallel': True}])" in str(
        raised.value
    )
    tried = mw.plan(cfg, size, layouts=[{"tp": 2}, {"tp": 2, "sequence_parallel": True}], **few)
    with pytest.raises(mw.NothingFitsError) as raised:
        _ = tried.best
    assert "sequence parallelism" not in str(raised.value)


def test_budget_defaults_to_the_gpu_memory_and_progress_is_reported() -> None:
    seen: list[tuple[int, int]] = []
    p = mw.plan(MLP, (4, 64), gpu="L4", progress=lambda d, t, _: seen.append((d, t)))
    assert p.budget == mw.gpus().loc["L4", "memory_bytes"]
    assert seen[0] == (0, 12) and seen[-1] == (12, 12)
    assert seen.count((12, 12)) == 1  # the last candidate's line is the closing one
    assert p.traces == 12


def test_progress_is_shown_by_default_one_closing_line(capsys: pytest.CaptureFixture[str]) -> None:
    mw.plan(MLP, (4, 64), gpu="L4", workers=1)
    err = capsys.readouterr().err
    lines = err.replace("\r", "\n").split("\n")
    assert any(line.startswith("plan [") and "/12 " in line for line in lines), err
    closing = [line for line in lines if "12/12" in line]
    assert [line.rstrip() for line in closing] == [
        "plan [####################] 12/12 done, 12 traces"
    ]
    mw.plan(MLP, (4, 64), gpu="L4", workers=1, progress=False)
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    "kwargs",
    [
        {"devices": 0},
        {"devices": "2"},
        {"devices": True},
        {"mode": "eval"},
        {"budget": "lots"},
        {"budget": -5},
        {"gpu": "not-a-gpu"},
        {"parallel": {"fsdp": 2}},
        {"autocast": torch.bfloat16},
        {"micro_batches": 2},
        {"micro_batches": [0]},
        {"precisions": ["fp8"]},
        {"activation_checkpointing": "yes"},
        {"activation_checkpointing": ["full"]},
        {"activation_checkpointing": [1]},
        {"activation_checkpointing": [None]},
        {"activation_checkpointing": ["blocks.0"]},  # a setting of names is a list of its own
        {"activation_checkpointing": [[]]},
        {"activation_checkpointing": [["blocks.0", 3]]},
        {"activation_checkpointing": [["no.such.module"]]},
        {"layouts": [{"fsdp": 4}]},
        {"layouts": [{"dp": 2}]},
        {"layouts": {"fsdp": 2}},
        {"mode": "inference", "micro_batches": [1, 2]},
    ],
)
def test_bad_arguments(kwargs: dict[str, Any]) -> None:
    args: dict[str, Any] = {"gpu": "H100", **kwargs}
    with pytest.raises(mw.OptionError):
        mw.plan(MLP, (4, 64), **args)


def test_inference_has_no_checkpointing_or_micro_batch_candidates() -> None:
    p = mw.plan(MLP, (4, 64), gpu="H100", mode="inference")
    df = p.to_dataframe()
    assert len(df) == 3 and not df["activation_checkpointing"].any()
    assert (df["micro_batches"] == 1).all() and df["fits"].all()


def test_hsdp_layouts_are_candidates_and_each_axis_can_be_narrowed() -> None:
    cfg, size = tiny_llama(), (2, 16)
    p = mw.plan(
        cfg,
        size,
        gpu="H100",
        devices=4,
        layouts=[{"fsdp": 4}, {"replicate": 2, "fsdp": 2}, {"replicate": 4}],
        activation_checkpointing=[True],
        precisions=["param_dtype bf16"],
        micro_batches=[1],
    )
    df = p.to_dataframe()
    assert list(zip(df["replicate"], df["fsdp"], df["tp"], strict=True)) == [
        (1, 4, 1),
        (2, 2, 1),
        (4, 1, 1),
    ]
    assert df["error"].isna().all() and p.traces == 3
    for _, row in df.iterrows():  # each row is its configuration traced by analyze itself
        again = reanalyze(cfg, size, row)
        assert again.peak_bytes == row["peak_bytes"]
        assert again.time is not None and again.time.tokens_per_s == row["tokens_per_s"]
    # the replicas all-reduce the gradients: more data-parallel ranks, the same per-rank work
    replicas = df.set_index("replicate")
    assert replicas.loc[4, "peak_bytes"] > replicas.loc[1, "peak_bytes"]  # unsharded weights


def test_selective_checkpointing_is_a_candidate_between_none_and_whole_blocks() -> None:
    """``activation_checkpointing=[False, "selective", True]``: three candidates a layout, each
    the row ``analyze`` traces with that setting. Selective (torchtitan's op list: matmuls but
    every second, attention) keeps more than whole blocks and recomputes less: its peak and its
    step lie between the other two (a config that keeps its KV cache is refused: the
    recomputation would run other ops). ``checkpoint_policy=`` is the selective candidates' alone:
    ``True`` stays whole blocks. ``sort`` orders the column by what is recomputed."""
    cfg, size = tiny_llama(), (2, 256)
    space: dict[str, Any] = dict(
        gpu="H100", devices=2, layouts=[{"fsdp": 2}], precisions=["as given"], micro_batches=[1]
    )
    # a layer that writes its KV cache runs other ops when recomputed: refused before any trace
    with pytest.raises(mw.OptionError, match=r"use_cache=True.*config.use_cache = False"):
        mw.plan(cfg, size, activation_checkpointing=["selective"], **space)
    cfg.use_cache = False
    # an encoder's config says use_cache=True (BERT's) and keeps no cache: not refused
    bert = transformers.BertConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4,
    )  # fmt: skip
    encoder = mw.plan(bert, (2, 16), activation_checkpointing=["selective"], **space)
    assert encoder.to_dataframe()["error"].isna().all()
    p = mw.plan(cfg, size, activation_checkpointing=[True, "selective", False], **space)
    df = p.to_dataframe()
    assert list(df["activation_checkpointing"]) == [True, "selective", False]
    assert df["error"].isna().all() and p.traces == 3
    whole, selective, none = (int(b) for b in df["peak_bytes"])
    assert whole < selective < none
    step = list(df["step_s"])
    assert step[2] < step[1] < step[0]  # none recomputed, some, every op of each block
    for _, row in df.iterrows():
        again = reanalyze(cfg, size, row)
        assert again.peak_bytes == row["peak_bytes"]
        assert again.time is not None and again.time.step_s == row["step_s"]
    assert list(p.sort("activation_checkpointing").to_dataframe()["activation_checkpointing"]) == [
        False,
        "selective",
        True,
    ]
    assert "checkpointing=selective" in repr(p.sort("peak_bytes", descending=True)[1:2])
    # a policy of one's own: the selective candidate saves only the matmuls; True is unchanged
    mm = mw.plan(
        cfg,
        size,
        activation_checkpointing=[True, "selective"],
        checkpoint_policy=["aten.mm"],
        **space,
    )
    rows = mm.to_dataframe()
    assert rows["peak_bytes"][0] == whole
    policy = mw.analyze(
        cfg, size, mode="training", gpu="H100", parallel={"fsdp": 2},
        activation_checkpointing="selective", checkpoint_policy=["aten.mm"],
    )  # fmt: skip
    assert rows["peak_bytes"][1] == policy.peak_bytes != selective


def test_a_plan_says_when_its_checkpointed_layers_wrote_a_kv_cache() -> None:
    """A config with ``use_cache=True``: its checkpointed candidates hold transformers' KV cache
    through backward (their rows are that run's), which the plan says in ``notes`` and in one
    ``UserWarning``, whichever process traced them; with the cache off, nothing is said."""
    space: dict[str, Any] = dict(
        gpu="H100", devices=2, layouts=[{"fsdp": 2}], precisions=["as given"], micro_batches=[1],
        activation_checkpointing=[False, True], progress=False,
    )  # fmt: skip
    for workers in (1, 2):
        with pytest.warns(UserWarning, match="LlamaDecoderLayer ran checkpointed with a KV"):
            p = mw.plan(tiny_llama(), (2, 16), workers=workers, **space)
        assert len(p.notes) == 1 and "config.use_cache = False" in p.notes[0]
        assert plan_payload(p)["notes"] == list(p.notes)  # the plan view shows them
    off = tiny_llama()
    off.use_cache = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning of any kind
        q = mw.plan(off, (2, 16), workers=1, **space)
    assert q.notes == ()
    cached, plain = (p.to_dataframe()["peak_bytes"][1], q.to_dataframe()["peak_bytes"][1])
    assert cached > plain  # the cache's keys and values, held through backward


def test_sequence_parallel_layouts_are_candidates_traced_as_analyze_traces_them() -> None:
    """``sequence_parallel`` in a layout (a dict's key or ``mw.Parallel``'s field) is a
    candidate of its own, its row what ``analyze`` traces for that layout, below the plain
    tensor-parallel row on a long sequence; the label says ``sp``."""
    cfg, size = tiny_llama(), (2, 512)
    p = mw.plan(
        cfg, size, gpu="H100", devices=4,
        layouts=[{"fsdp": 2, "tp": 2}, mw.Parallel(fsdp=2, tp=2, sequence_parallel=True)],
        activation_checkpointing=[False], precisions=["as given"], micro_batches=[1],
    )  # fmt: skip
    df = p.to_dataframe()
    assert list(df["sequence_parallel"]) == [False, True]
    assert df["error"].isna().all()
    plain, sp = (int(b) for b in df["peak_bytes"])
    assert sp < plain
    again = mw.analyze(
        cfg, size, mode="training", gpu="H100",
        parallel={"fsdp": 2, "tp": 2, "sequence_parallel": True},
    )  # fmt: skip
    assert again.peak_bytes == sp
    assert "tp=2 sp" in p.candidates[1].layout.label()
    with pytest.raises(mw.OptionError, match="no tensor-parallel ranks"):
        mw.plan(cfg, size, gpu="H100", devices=1, layouts=[{"sequence_parallel": True}])


def test_default_tensor_parallel_layouts_shard_the_sequence_where_the_model_takes_it() -> None:
    """The default layouts with ``tp > 1`` shard the sequence too where the model takes it
    (its row what ``analyze`` traces with ``sequence_parallel=True``; the tensor-parallel-only
    layout, whose plain norms beside DTensors fail the multi-tensor optimizer, now traced), and
    stay plain where it cannot: a ``tp`` that does not divide the sequence, a tensor-parallel
    plan with a style sequence parallelism has no form for."""
    from meta_widget.explore.layouts import Layout
    from meta_widget.explore.plan_checks import on_meta, sequence_parallel_where_taken

    cfg, size = tiny_llama(), (2, 32)
    space = dict(activation_checkpointing=[False], precisions=["as given"], micro_batches=[1])
    p = mw.plan(cfg, size, gpu="H100", devices=2, workers=1, **space)
    df = p.to_dataframe().set_index(["replicate", "fsdp", "tp"])
    assert df["error"].isna().all(), list(df["error"])
    assert list(df["sequence_parallel"]) == [False, False, True]  # fsdp 2, replicate 2, tp 2
    again = mw.analyze(
        cfg, size, mode="training", gpu="H100", parallel={"tp": 2, "sequence_parallel": True}
    )
    assert int(df.loc[(1, 1, 2), "peak_bytes"]) == again.peak_bytes
    odd = mw.plan(cfg, (2, 33), gpu="H100", devices=2, workers=1, **space)
    assert not odd.to_dataframe()["sequence_parallel"].any()  # 2 does not divide 33
    plain = Layout(fsdp=2, tp=2)
    rowwise_rep = transformers.LlamaConfig(
        **{**cfg.to_dict(), "base_model_tp_plan": {"layers.*.mlp.down_proj": "rowwise_rep"}}
    )
    assert sequence_parallel_where_taken([plain], on_meta(rowwise_rep, [plain]), 32) == (plain,)
    sharded = Layout(fsdp=2, tp=2, sequence_parallel=True)
    assert sequence_parallel_where_taken([plain], on_meta(cfg, [plain]), 32) == (sharded,)


def test_a_mixture_of_experts_is_planned_with_expert_parallelism_by_default() -> None:
    """For a MoE config the default layouts add, to each without tensor parallelism, the same
    layout with ``ep`` the most ranks within a node dividing its ``fsdp`` and the experts, and
    give each with tensor parallelism an ``ep`` over its tp ranks (and some fsdp ones) where
    the model takes it; each such row is what ``analyze`` traces for it. A dense model's
    layouts have none."""
    import transformers

    from meta_widget.explore.candidates import default_layouts
    from meta_widget.timing.gpus import resolve_gpu

    h100 = resolve_gpu("H100")
    with_ep = [x for x in default_layouts(8, h100, experts=8) if x.ep > 1]
    assert [(x.replicate, x.fsdp, x.ep) for x in with_ep] == [(1, 8, 8), (2, 4, 4), (4, 2, 2)]
    assert next(x.ep for x in default_layouts(64, h100, experts=256) if x.ep > 1) == 8  # a node
    assert all(x.ep == 1 for x in default_layouts(8, h100))
    cfg = transformers.MixtralConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=128, num_local_experts=4, num_experts_per_tok=2,
        architectures=["MixtralForCausalLM"],
    )  # fmt: skip
    p = mw.plan(
        cfg, (2, 16), gpu="H100", devices=4,
        activation_checkpointing=[False], precisions=["as given"], micro_batches=[1],
    )  # fmt: skip
    rows = [c for c in p.candidates if c.layout is not None and c.layout.ep > 1]
    # the tensor-parallel layouts reach their experts over the tp ranks and some fsdp ones
    # (tp alone would run every expert on every tp rank); tp 4 cannot split the 2 kv heads
    assert [(c.layout.replicate, c.layout.fsdp, c.layout.tp, c.layout.ep) for c in rows] == [
        (1, 2, 2, 4),
        (2, 1, 2, 2),
        (1, 4, 1, 4),
        (2, 2, 1, 2),
    ]
    assert all(c.error is None for c in rows), [c.error for c in rows]
    again = mw.analyze(cfg, (2, 16), mode="training", gpu="H100", parallel={"fsdp": 4, "ep": 4})
    assert again.peak_bytes == rows[2].peak_bytes
    assert "ep=4" in rows[2].layout.label()
    with_tp = {"fsdp": 2, "tp": 2, "ep": 4, "sequence_parallel": True}
    again = mw.analyze(cfg, (2, 16), mode="training", gpu="H100", parallel=with_tp)
    assert (again.peak_bytes, again.time.step_s) == (rows[0].peak_bytes, rows[0].step_s)


def test_default_layouts_use_every_device_and_keep_tensor_parallelism_in_a_node() -> None:
    from meta_widget.explore.candidates import default_layouts
    from meta_widget.timing.gpus import resolve_gpu

    layouts = default_layouts(64, resolve_gpu("H100"))
    assert all(x.replicate * x.fsdp * x.tp == 64 and x.pp == 1 for x in layouts)
    assert max(x.tp for x in layouts) == 8  # 8 GPUs per H100 node
    assert len(layouts) == len(set(layouts)) == 7 + 6 + 5 + 4  # tp 1, 2, 4, 8
    assert len(mw.explore.candidates.candidates(8)) == 10 * 12  # 10 layouts of 8 devices
