"""Per-rank traces of FSDP2 and tensor parallelism against real CPU ranks (``parallel_truth``).

Truth: the same model built for real, wrapped by hand with PyTorch's ``fully_shard`` /
``parallelize_module`` under the fake process group, one AdamW step measured by MemTracker.
"""

from __future__ import annotations

import json
import math
from functools import partial
from typing import Any

import pytest
import torch
import torch.distributed as dist
from parallel_truth import (
    DeepMLP,
    allocator_rank_peak,
    llama_sp_plan,
    llama_tp_plan,
    no_decision_kept,
    no_process_group_left,  # noqa: F401  (an autouse fixture)
    real_output_bytes,
    real_rank_peak,
    tiny_llama_config,
)
from torch import nn
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel
from torch.testing._internal.distributed.fake_pg import FakeStore

import meta_widget as mw
from meta_widget.distributed import decisions
from meta_widget.distributed.decisions import keeping_decisions

#: the acceptance bounds of the issue (the traces below land on the byte)
FSDP_TOLERANCE = 0.02
TP_TOLERANCE = 0.05


def llama_input() -> torch.Tensor:
    return torch.randint(0, 32000, (2, 128))


def analyze_rank(model: Any, x: torch.Tensor, **parallel: Any) -> mw.Analysis:
    a = mw.analyze(model, input_data=x, mode="training", device="cpu", parallel=parallel)
    assert a.error is None, a.error
    return a


@pytest.mark.parametrize("n", [2, 4])
def test_fsdp2_steady_step_per_rank_is_a_real_ranks_over_three_steps(n: int) -> None:
    """From the second step on a rank holds its shard of AdamW's state through forward and
    backward: the analysis's steady peak is a real rank's from step 2, its first step's the
    real first step's."""
    import transformers

    config = tiny_llama_config()
    x = llama_input()
    truth = real_rank_peak(lambda: transformers.LlamaForCausalLM(config), x, fsdp=n, steps=3)
    a = analyze_rank(config, x, fsdp=n)
    assert a.peak_bytes == pytest.approx(truth["Steady"], rel=FSDP_TOLERANCE)
    assert a.memory.first_step_peak_bytes == pytest.approx(truth["Total"], rel=FSDP_TOLERANCE)
    assert a.peak_bytes > a.memory.first_step_peak_bytes and a.memory.peak_step == 2


@pytest.mark.slow
@pytest.mark.parametrize("n", [2, 4, 8])
def test_fsdp2_peak_per_rank_is_a_real_ranks_peak_on_a_tiny_llama(n: int) -> None:
    import transformers

    config = tiny_llama_config()
    x = llama_input()
    truth = real_rank_peak(lambda: transformers.LlamaForCausalLM(config), x, fsdp=n)
    a = analyze_rank(config, x, fsdp=n)
    assert a.memory.first_step_peak_bytes == pytest.approx(truth["Total"], rel=FSDP_TOLERANCE)
    # MemTracker's parameters at its own peak: this rank's shards, and the gathered parameters
    # then (MemTracker does not see the clone the LM head's backward matmul makes of the
    # loss's expanded gradient, so its peak can fall elsewhere than the allocator's)
    cats = a.memory.categories
    shards = cats["parameters"]
    assert shards <= truth["PARAM"] <= shards + cats.get("unsharded parameters", 0)


@pytest.mark.slow
@pytest.mark.parametrize("n", [2, 4, 8])
def test_fsdp2_peak_per_rank_is_a_real_ranks_peak_on_an_mlp(n: int) -> None:
    x = torch.randn(64, 256)
    truth = real_rank_peak(DeepMLP, x, fsdp=n)
    a = analyze_rank(DeepMLP, x, fsdp=n)
    assert a.memory.first_step_peak_bytes == pytest.approx(truth["Total"], rel=FSDP_TOLERANCE)
    assert a.param_bytes < mlp_param_bytes() / n + 4 * 1024 * n  # this rank's shards only


def half_frozen_mlp() -> DeepMLP:
    """DeepMLP with its first two blocks frozen (no gradients, no optimizer state)."""
    model = DeepMLP()
    model.layers[:2].requires_grad_(False)
    return model


def test_frozen_parameters_under_fsdp2_are_a_real_ranks_peak() -> None:
    # truth: the CPU allocator on a real rank (MemTracker cannot hook a frozen parameter)
    x = torch.randn(64, 256)
    truth = allocator_rank_peak(half_frozen_mlp, x, fsdp=2)
    a = analyze_rank(half_frozen_mlp(), x, fsdp=2)
    assert a.memory.first_step_peak_bytes == pytest.approx(truth, rel=FSDP_TOLERANCE)
    # the frozen blocks save the gradients and AdamW state of half the model (the whole
    # model's peak by MemTracker: the allocator's reading of a second run in one process can
    # miss blocks allocated before its profiler started)
    assert truth < 0.85 * real_rank_peak(DeepMLP, x, fsdp=2)["MemTracker"]
    assert a.trainable_params == sum(p.numel() for p in DeepMLP().layers[2:].parameters())


def test_tensor_parallel_all_gathers_carry_dtensors_real_output_bytes() -> None:
    # truth: the tensors the gathered-output layers return on a real rank of 2
    x = torch.randn(64, 256)
    paths = [f"layers.{i}.0" for i in range(4)]
    real = real_output_bytes(
        DeepMLP, x, 2, {p: ColwiseParallel(output_layouts=Replicate()) for p in paths}
    )
    a = analyze_rank(DeepMLP, x, tp=2, tp_plan={"layers.*.0": "colwise_gather_output"})
    gathers = a.comms[(a.comms.collective == "all_gather") & (a.comms.group == "tp")]
    assert list(gathers.module) == paths
    assert list(gathers.bytes) == [real[p] for p in paths]
    assert real["layers.0.0"] == 64 * 1024 * 4  # the whole output, not one rank's half


def mlp_param_bytes() -> int:
    return sum(p.numel() * p.element_size() for p in DeepMLP().parameters())


@pytest.mark.slow
@pytest.mark.parametrize(("fsdp", "tp"), [(1, 2), (4, 2)])
def test_tensor_parallel_and_2d_peaks_per_rank_on_a_tiny_llama(fsdp: int, tp: int) -> None:
    import transformers

    config = tiny_llama_config()
    x = llama_input()
    truth = real_rank_peak(
        lambda: transformers.LlamaForCausalLM(config), x, fsdp=fsdp, tp=tp, tp_plan=llama_tp_plan()
    )
    a = analyze_rank(config, x, fsdp=fsdp, tp=tp)
    assert a.memory.first_step_peak_bytes == pytest.approx(truth["Total"], rel=TP_TOLERANCE)
    groups = set(a.comms["group"])
    assert groups == ({"fsdp", "tp"} if fsdp > 1 else {"tp"})


@pytest.mark.slow
@pytest.mark.parametrize(("fsdp", "tp"), [(1, 2), (4, 2)])
def test_sequence_parallel_peaks_per_rank_on_a_tiny_llama(fsdp: int, tp: int) -> None:
    """Sequence parallelism (torchtitan's Llama plan, written by hand in the truth) is a real
    rank's first and steady step; on a short vocabulary and a long sequence (activations, not
    the logits, decide the peak) it is below plain tensor parallelism's, the tensor-parallel
    all-reduces become reduce-scatters and all-gathers."""
    import transformers

    config = tiny_llama_config(vocab=128)
    x = torch.randint(0, 128, (2, 512))

    def make() -> nn.Module:
        return transformers.LlamaForCausalLM(config)

    real = real_rank_peak(make, x, fsdp=fsdp, tp=tp, tp_plan=llama_sp_plan(), steps=2)
    plain = real_rank_peak(make, x, fsdp=fsdp, tp=tp, tp_plan=llama_tp_plan(), steps=2)
    a = analyze_rank(config, x, fsdp=fsdp, tp=tp, sequence_parallel=True)
    assert a.memory.first_step_peak_bytes == pytest.approx(real["Total"], rel=TP_TOLERANCE)
    assert a.peak_bytes == pytest.approx(real["Steady"], rel=TP_TOLERANCE)
    assert real["Total"] < 0.95 * plain["Total"]  # the truth tells the two apart
    tp_comms = a.comms[a.comms.group == "tp"]
    assert {"all_gather", "reduce_scatter"} <= set(tp_comms.collective)
    # no activation is all-reduced: what is left are the norms' weight gradients (replicated
    # over the tensor-parallel ranks, reduced by FSDP2 with fsdp > 1), one hidden row each
    reduced = tp_comms[tp_comms.collective == "all_reduce"]
    assert (reduced.bytes <= 4 * config.hidden_size).all()
    assert "sequence parallel" in a.options.parallel.label()


def padded_bytes(params: list[nn.Parameter], n: int) -> int:
    """What FSDP2 gathers for a group: each parameter's dim 0 padded up to a multiple of n."""
    total = 0
    for p in params:
        rows = math.ceil(p.shape[0] / n) * n
        total += rows * math.prod(p.shape[1:]) * p.element_size()
    return total


def test_forward_all_gathers_carry_each_groups_padded_parameters_in_order() -> None:
    n = 3  # 1024 and 256 rows are not multiples of 3: FSDP2 pads every parameter
    model = DeepMLP()
    a = analyze_rank(model, torch.randn(64, 256), fsdp=n)
    comms = a.comms
    forward = comms[(comms.phase == "forward") & (comms.collective == "all_gather")]
    assert list(forward.module) == [f"layers.{i}" for i in range(4)]
    for i, nbytes in enumerate(forward.bytes):
        expected = padded_bytes(list(model.layers[i].parameters()), n)
        assert nbytes == expected
        assert expected > sum(p.numel() * 4 for p in model.layers[i].parameters())
    # backward: each block gathered again and its gradients reduce-scattered, same bytes
    backward = comms[comms.phase == "backward"]
    for kind in ("all_gather", "reduce_scatter"):
        rows = backward[backward.collective == kind]
        assert sorted(rows.module) == [f"layers.{i}" for i in range(4)]
        assert sorted(rows.bytes) == sorted(forward.bytes)
    assert set(comms.group) == {"fsdp"} and set(comms.group_size) == {n}
    totals = a.comms_per_step()
    assert totals.bytes.sum() == comms.bytes.sum()


def test_each_all_gather_lands_on_the_timeline_before_its_block_runs() -> None:
    a = analyze_rank(DeepMLP, torch.randn(64, 256), fsdp=2)
    forward = a.comms[(a.comms.phase == "forward") & (a.comms.collective == "all_gather")]
    for module, event in zip(forward.module, forward.event, strict=True):
        call = next(c for c in a.calls if c.path == module and c.phase == "forward")
        assert event <= call.start_event  # gathered before the block's first op
        previous = [c for c in a.calls if c.end_event <= event and c.path.startswith("layers.")]
        assert all(c.path < module for c in previous)


def test_the_users_module_is_never_wrapped_and_no_group_is_left() -> None:
    model = DeepMLP()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    a = analyze_rank(model, torch.randn(8, 256), fsdp=4)
    assert type(model) is DeepMLP and type(model.layers[0]) is nn.Sequential
    assert all(type(p) is nn.Parameter and p.device.type == "cpu" for p in model.parameters())
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    assert a.total_params == sum(
        p.numel() for p in model.parameters()
    )  # the model's, not a shard's
    # a process group of the user's own can be made afterwards
    dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
    dist.destroy_process_group()


def test_a_users_process_group_is_left_alone_with_a_clear_error() -> None:
    dist.init_process_group("fake", rank=1, world_size=3, store=FakeStore())
    try:
        with pytest.raises(mw.ParallelError, match="already has a default process group"):
            mw.analyze(DeepMLP, input_size=(8, 256), parallel={"fsdp": 2})
        assert dist.get_rank() == 1 and dist.get_world_size() == 3
    finally:
        dist.destroy_process_group()


def test_tensor_parallelism_without_a_plan_says_how_to_give_one() -> None:
    with pytest.raises(mw.ParallelError, match="tp_plan"):
        mw.analyze(DeepMLP, input_size=(8, 256), parallel={"tp": 2})
    plan = {"layers.*.0": "colwise", "layers.*.2": "rowwise"}
    a = mw.analyze(DeepMLP, input_size=(8, 256), parallel={"tp": 2, "tp_plan": plan})
    assert a.error is None
    # each rank holds half of every block's weights (biases of the row-wise layers replicated)
    full = mlp_param_bytes()
    replicated = 4 * 256 * 4
    assert a.param_bytes == (full - replicated) // 2 + replicated


@pytest.mark.parametrize(
    ("parallel", "match"),
    [
        ({"fsdp": 0}, "whole number of devices"),
        ({"fsdp": 1}, "one device"),
        ({"dp": 2}, "unknown keys"),
        ([8], "must be a dict"),
        ({"fsdp": 2, "blocks": 3}, "module paths or class names"),
    ],
)
def test_parallel_options_are_checked_before_anything_is_built(parallel: Any, match: str) -> None:
    with pytest.raises(mw.OptionError, match=match):
        mw.analyze(DeepMLP, input_size=(8, 256), parallel=parallel)


def test_the_widget_payload_places_each_collective_on_the_timeline() -> None:
    a = analyze_rank(DeepMLP, torch.randn(64, 256), fsdp=2)
    payload = json.loads(a.to_json())
    comms = payload["comms"]
    assert comms["module"] == list(a.comms.module)
    assert comms["bytes"] == list(a.comms.bytes)
    points = comms["point"]
    assert (
        points == sorted(points)
        and points[0] >= 0
        and points[-1] < len(payload["timeline"]["bytes"])
    )
    # the phases of the points agree with the collectives' phases
    phase_names = [payload["strings"][i] for i in payload["timeline"]["phase"]]
    assert [phase_names[p] for p in points] == comms["phase"]
    assert "comms" not in json.loads(mw.analyze(DeepMLP, input_size=(8, 256)).to_json())


def test_max_fit_finds_the_largest_batch_per_rank_that_a_real_rank_fits() -> None:
    budget = 18_000_000
    fit = mw.max_fit(
        DeepMLP,
        input_size=(1, 256),
        budget=budget,
        vary="batch",
        mode="training",
        device="cpu",
        parallel={"fsdp": 4},
        limit=4096,
    )
    assert fit.analysis.comm_records  # each size traced as a rank of 4
    # max_fit reads the steady step: a real rank's steps 2 on
    at = partial(real_rank_peak, DeepMLP, fsdp=4, steps=2)
    assert at(torch.randn(fit.size, 256))["Steady"] <= budget
    assert at(torch.randn(fit.size + 1, 256))["Steady"] > budget


def test_kept_decisions_never_reach_a_world_of_another_shape() -> None:
    """``plan``'s worlds keep DTensor's sharding decisions (``keeping_decisions``), which hold
    their world's meshes. A world of another shape has a ``tp`` sub-mesh equal by value to the
    last one's, under another group's name: had it met the kept decisions it would fail
    ("Could not resolve the process group registered under the name ..."). Each shape is
    traced as it is alone, and after the block nothing is kept."""
    config = tiny_llama_config()
    layouts = [{"fsdp": 4, "tp": 2}, {"replicate": 2, "fsdp": 2, "tp": 2}, {"fsdp": 4, "tp": 2}]
    size = (2, 16)
    alone = [mw.analyze(config, size, mode="training", parallel=p).peak_bytes for p in layouts]
    with keeping_decisions():
        kept = []
        for p in layouts:
            a = mw.analyze(config, size, mode="training", parallel=p)
            assert a.error is None, a.error
            kept.append(a.peak_bytes)
    assert kept == alone
    assert decisions._kept.blocks == [] and decisions._kept.shape is None


def test_a_plans_world_is_kept_for_its_shape_and_destroyed_after(monkeypatch: Any) -> None:
    """Inside ``keeping_decisions`` a world's process group and meshes are kept for the next
    world of its shape (one group made for two worlds in a row), a world of another shape
    destroys them first, and every trace is the one it is alone. The block's end destroys the
    last one, an interrupt in a kept world's trace included: no group, no sub-mesh kept,
    ``DeviceMesh``'s own methods back."""
    from torch.distributed.device_mesh import DeviceMesh

    from meta_widget.distributed import parallel, submeshes

    own = {name: vars(DeviceMesh)[name] for name in ("__getitem__", "_concatenate")}
    made: list[int] = []
    real = dist.init_process_group

    def counted(*args: Any, **kwargs: Any) -> None:
        made.append(1)
        real(*args, **kwargs)

    monkeypatch.setattr(dist, "init_process_group", counted)
    config = tiny_llama_config()
    a, b = {"fsdp": 4, "tp": 2}, {"replicate": 2, "fsdp": 2, "tp": 2}
    options: dict[str, Any] = {"mode": "training", "gpu": "H100"}
    alone = {str(p): mw.analyze(config, (2, 16), parallel=p, **options) for p in (a, b)}
    assert len(made) == 2 and not dist.is_initialized()
    made.clear()
    with keeping_decisions():
        for p, groups in ((a, 1), (a, 1), (b, 2), (a, 3)):
            kept = mw.analyze(config, (2, 16), parallel=p, **options)
            assert len(made) == groups and dist.is_initialized()
            assert kept.error is None, kept.error
            assert kept.peak_bytes == alone[str(p)].peak_bytes
            assert kept.memory.timeline == alone[str(p)].memory.timeline
            assert kept.comm_records == alone[str(p)].comm_records
    assert not dist.is_initialized() and decisions._kept.mesh is None
    assert not submeshes._made and all(vars(DeviceMesh)[n] is f for n, f in own.items())

    calls = [0]

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt), keeping_decisions():
        mw.analyze(config, (2, 16), parallel=a, **options)
        assert dist.is_initialized()  # kept for the next world of its shape
        monkeypatch.setattr(parallel.World, "prepare", interrupted)  # in the kept world
        mw.analyze(config, (2, 16), parallel=a, **options)
    assert calls[0] == 1
    assert not dist.is_initialized() and decisions._kept.mesh is None
    assert not submeshes._made and all(vars(DeviceMesh)[n] is f for n, f in own.items())


def test_a_world_kept_by_a_plan_in_another_thread_is_not_taken_nor_destroyed() -> None:
    """A thread's analysis while another thread's plan keeps its world between traces is
    refused with a message that says so (it never runs on, nor destroys, the plan's process
    group); the plan's next world of that shape still finds it; nothing is left after."""
    import threading

    config = tiny_llama_config()
    layout = {"fsdp": 4, "tp": 2}
    options: dict[str, Any] = {"mode": "training", "gpu": "H100", "parallel": layout}
    alone = mw.analyze(config, (2, 16), **options)
    errors: list[BaseException] = []

    def beside() -> None:
        try:
            mw.analyze(config, (2, 16), **options)
        except BaseException as e:  # what the other thread met, for the test
            errors.append(e)

    with keeping_decisions():
        mw.analyze(config, (2, 16), **options)
        kept = decisions._kept.mesh
        assert kept is not None and dist.is_initialized()
        other = threading.Thread(target=beside)
        other.start()
        other.join()
        assert len(errors) == 1 and "a plan running in another thread" in str(errors[0])
        assert decisions._kept.mesh is kept and dist.is_initialized()
        again = mw.analyze(config, (2, 16), **options)
        assert again.peak_bytes == alone.peak_bytes and decisions._kept.mesh is kept
    assert not dist.is_initialized() and decisions._kept.mesh is None


def test_the_optimizers_foreach_ops_skip_dtensors_search_and_a_world_keeps_no_decision(
    monkeypatch: Any,
) -> None:
    """DTensor decides the multi-tensor optimizer's ops element by element, each a search over
    every placement; run on the shards (``meta_widget.trace.shard_foreach``) they need none.
    The trace equals the one DTensor makes deciding every element itself (events, costs,
    collectives, FLOPs), with fewer searches; after the world, also one whose trace failed,
    no decision is kept."""
    import contextlib

    from torch.distributed.tensor._ops import utils

    from meta_widget.explore.depth import sample
    from meta_widget.trace import passes

    searches: list[int] = []
    search = utils.expand_to_full_mesh_op_strategy

    def counted(*args: Any, **kwargs: Any) -> Any:
        searches.append(1)
        return search(*args, **kwargs)

    monkeypatch.setattr(utils, "expand_to_full_mesh_op_strategy", counted)
    config = tiny_llama_config()
    options: dict[str, Any] = {
        "mode": "training",
        "parallel": {"fsdp": 2, "tp": 2},
        "foreach": True,
        "gpu": "H100",
    }
    on_shards = mw.analyze(config, (2, 16), **options)
    assert on_shards.error is None, on_shards.error
    shard_searches = len(searches)
    assert no_decision_kept()

    with monkeypatch.context() as m:  # DTensor alone: every element searched
        m.setattr(passes, "ShardLocalForeach", contextlib.nullcontext)
        searches.clear()
        alone = mw.analyze(config, (2, 16), **options)
    assert alone.error is None, alone.error
    assert sample(on_shards, 4) == sample(alone, 4)
    assert on_shards.peak_bytes == alone.peak_bytes
    assert 0 < shard_searches < len(searches) / 2

    failed = mw.analyze(config, (2, 16), **{**options, "parallel": {"tp": 2}})
    assert failed.error is not None and "DTensor" in failed.error.message  # the mixed foreach
    assert utils.expand_to_full_mesh_op_strategy is counted and no_decision_kept()
