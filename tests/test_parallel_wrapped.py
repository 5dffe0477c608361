"""A model the user wrapped with FSDP2 / tensor parallelism, under their own fake process group,
traced as it stands (``meta_widget.distributed.wrapped``).

Truth: the same wrapping run for real (``parallel_truth.real_rank_peak``: the model built for
real, wrapped by the same function, one AdamW step measured by MemTracker) on the same rank, and
``parallel=`` on the unwrapped model where the wrapping is the same.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.distributed.tensor._random as dtensor_random
from parallel_truth import (
    DeepMLP,
    default_wrap,
    hsdp,
    llama_tp_plan,
    real_rank_peak,
    tiny_llama_config,
    with_settings,
    wrapped_on_meta,
)
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module
from torch.testing._internal.distributed.fake_pg import FakeStore

import meta_widget as mw
from meta_widget.distributed.decisions import forget_meshes

FSDP_TOLERANCE = 0.02
TP_TOLERANCE = 0.05


@pytest.fixture(autouse=True)
def _no_process_group_left() -> Iterator[None]:
    assert not dist.is_initialized()
    yield
    assert not dist.is_initialized()


@contextmanager
def users_group(fsdp: int, tp: int = 1, rank: int = 0) -> Iterator[DeviceMesh]:
    """The user's own fake process group and a ("dp", "tp") mesh, destroyed afterwards."""
    dist.init_process_group("fake", rank=rank, world_size=fsdp * tp, store=FakeStore())
    try:
        yield init_device_mesh("cpu", (fsdp, tp), mesh_dim_names=("dp", "tp"))
    finally:
        dist.destroy_process_group()
        # as a new process would (see meta_widget.distributed.parallel.forget_meshes)
        forget_meshes()


def analyze(model: Any, x: torch.Tensor, **kw: Any) -> mw.Analysis:
    a = mw.analyze(model, input_data=x, mode="training", device="cpu", **kw)
    assert a.error is None, a.error
    return a


def llama() -> nn.Module:
    import transformers

    return transformers.LlamaForCausalLM(tiny_llama_config())  # type: ignore[no-any-return]


def llama_input() -> torch.Tensor:
    return torch.randint(0, 32000, (2, 128))


MLP_INPUT = (64, 256)


# -- FSDP2 ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "rank"), [("mlp", 2), pytest.param("llama", 3, marks=pytest.mark.slow)]
)
def test_a_users_fsdp2_wrapping_on_meta_is_a_real_ranks_peak(name: str, rank: int) -> None:
    make, x = (DeepMLP, torch.randn(*MLP_INPUT)) if name == "mlp" else (llama, llama_input())
    planned = analyze(make, x, parallel={"fsdp": 4})  # rank 0 of meta_widget's own wrapping
    wrap = default_wrap
    truth = real_rank_peak(make, x, fsdp=4, rank=rank, wrap=wrap)
    with users_group(4, rank=rank) as mesh:
        model = wrapped_on_meta(make, mesh, wrap)
        a = analyze(model, x)
        assert dist.get_rank() == rank
    assert a.memory.first_step_peak_bytes == pytest.approx(truth["Total"], rel=FSDP_TOLERANCE)
    # the same wrapping as parallel={"fsdp": 4}: the same bytes, category by category (FSDP2
    # pads every rank's shard to the same size), and the same collectives
    assert a.peak_bytes == planned.peak_bytes
    assert a.memory.categories == planned.memory.categories
    same = ["module", "phase", "collective", "bytes", "group_size", "op"]
    assert a.comms[same].equals(planned.comms[same])
    assert set(a.comms.group) == {"dp"}  # the user's name of the mesh dimension
    assert a.total_params == planned.total_params  # the model's, not a shard's
    assert f"rank {rank} of 4" in " ".join(a.notes)


def test_the_users_fsdp2_settings_are_the_ones_traced() -> None:
    x = torch.randn(*MLP_INPUT)
    truth = real_rank_peak(DeepMLP, x, fsdp=4, rank=1, wrap=with_settings)
    default = real_rank_peak(DeepMLP, x, fsdp=4, rank=1)
    with users_group(4, rank=1) as mesh:
        a = analyze(wrapped_on_meta(DeepMLP, mesh, with_settings), x)
    assert a.memory.first_step_peak_bytes == pytest.approx(truth["Total"], rel=FSDP_TOLERANCE)
    assert abs(default["Total"] - truth["Total"]) > 0.05 * truth["Total"]  # the settings matter
    gathers = a.comms[(a.comms.phase == "forward") & (a.comms.collective == "all_gather")]
    full = sum(p.numel() for p in DeepMLP().layers[0].parameters())
    assert list(gathers.bytes) == [full * 2] * 4  # gathered in bf16


def test_a_users_hsdp_wrapping_and_max_fit_per_rank_match_a_real_rank() -> None:
    x = torch.randn(*MLP_INPUT)
    truth = real_rank_peak(DeepMLP, x, fsdp=2, tp=2, rank=3, wrap=hsdp)
    budget = 24_000_000
    with users_group(2, 2, rank=3) as mesh:
        model = wrapped_on_meta(DeepMLP, mesh, hsdp)
        a = analyze(model, x)
        fit = mw.max_fit(
            model, input_size=(1, 256), budget=budget, vary="batch", mode="training", device="cpu"
        )
    assert a.memory.first_step_peak_bytes == pytest.approx(truth["Total"], rel=FSDP_TOLERANCE)
    totals = a.comms_per_step()
    assert set(zip(totals.collective, totals.group, strict=True)) == {
        ("all_gather", "tp"),  # the mesh's second dimension ("tp" by name) shards
        ("reduce_scatter", "tp"),
        ("all_reduce", "dp"),  # and the first replicates: gradients all-reduced
    }
    assert fit.analysis.comm_records  # each size traced as the user's rank 3
    at = partial(real_rank_peak, DeepMLP, fsdp=2, tp=2, rank=3, wrap=hsdp, steps=2)
    assert at(torch.randn(fit.size, 256))["Steady"] <= budget  # max_fit reads the steady step
    assert at(torch.randn(fit.size + 1, 256))["Steady"] > budget


# -- tensor parallelism ------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(("fsdp", "tp"), [(1, 2), (2, 2)])
def test_a_users_tensor_parallel_wrapping_is_a_real_ranks_peak(fsdp: int, tp: int) -> None:
    x = llama_input()
    wrap = partial(default_wrap, tp_plan=llama_tp_plan())
    truth = real_rank_peak(llama, x, fsdp=fsdp, tp=tp, rank=1, wrap=wrap)
    planned = analyze(tiny_llama_config(), x, parallel={"fsdp": fsdp, "tp": tp})
    with users_group(fsdp, tp, rank=1) as mesh:
        model = wrapped_on_meta(llama, mesh, wrap)
        a = analyze(model, x)
    assert a.memory.first_step_peak_bytes == pytest.approx(truth["Total"], rel=TP_TOLERANCE)
    assert a.peak_bytes == pytest.approx(planned.peak_bytes, rel=TP_TOLERANCE)
    assert set(a.comms.group) == ({"dp", "tp"} if fsdp > 1 else {"tp"})


def test_a_wrapped_analysis_reruns_and_traces_inference_on_the_users_group() -> None:
    x = torch.randn(*MLP_INPUT)
    with users_group(4, rank=1) as mesh:
        model = wrapped_on_meta(DeepMLP, mesh, default_wrap)
        training = analyze(model, x)
        inference = training.rerun(mode="inference")
        again = inference.rerun(mode="training")
    assert inference.error is None and again.error is None
    assert again.peak_bytes == training.peak_bytes
    with pytest.raises(mw.MaterializeError, match="to_empty"):
        training.materialize()
    assert inference.peak_bytes < training.peak_bytes
    kinds = set(zip(inference.comms.phase, inference.comms.collective, strict=True))
    assert kinds == {("forward", "all_gather")}  # no backward: no reduce-scatter


def test_parallel_leaves_no_dead_mesh_for_the_users_own_group_of_the_same_shape() -> None:
    plan = {"layers.*.0": "colwise", "layers.*.2": "rowwise"}
    mw.analyze(
        DeepMLP,
        input_size=(8, 256),
        mode="training",
        parallel={"fsdp": 2, "tp": 2, "tp_plan": plan},
    )
    dist.init_process_group("fake", rank=3, world_size=4, store=FakeStore())
    try:
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        with torch.device("meta"):
            model = DeepMLP()
        parallelize_module(model, mesh["tp"], {"layers.*.0": ColwiseParallel()})
        weight = model.layers[0][0].weight
        assert weight.device_mesh._dim_group_names == mesh["tp"]._dim_group_names
        weight.device_mesh.get_group(0)  # the user's group, alive
    finally:
        dist.destroy_process_group()
        forget_meshes()


# -- the user's objects ------------------------------------------------------------------------


def snapshot(model: nn.Module) -> dict[str, Any]:
    """What must not change: parameters (identity, type, placements, local tensors), grads,
    class, FSDP2 state and hooks of every module, and the process group."""
    params = {
        n: (id(p), type(p), getattr(p, "placements", None), p.to_local().shape, p.grad)
        for n, p in model.named_parameters()
    }
    modules = {}
    for name, m in model.named_modules():
        state = m._get_fsdp_state() if isinstance(m, FSDPModule) else None
        groups = state._fsdp_param_groups if state is not None else []
        modules[name] = (
            type(m),
            m.training,
            dict(m._forward_pre_hooks),
            dict(m._forward_hooks),
            dict(m._backward_hooks),
            sorted(k for k in vars(m) if not k.startswith("_") or "composable" in k),
            None if state is None else (id(state), state._is_root, state._training_state),
            [(g._sharded_state, g._training_state, g.post_forward_mesh_info) for g in groups],
        )
    group = (dist.is_initialized(), dist.get_backend(), dist.get_rank(), dist.get_world_size())
    return {
        "params": params,
        "modules": modules,
        "group": group,
        "rng": dtensor_random._rng_tracker,
    }


def test_the_users_model_group_and_hooks_are_left_as_they_were() -> None:
    x = llama_input()
    wrap = partial(default_wrap, tp_plan=llama_tp_plan())
    with users_group(2, 2, rank=3) as mesh:
        model = wrapped_on_meta(llama, mesh, wrap)
        before = snapshot(model)
        analyze(model, x)
        analyze(model, x, activation_checkpointing=True)
        assert snapshot(model) == before
        assert all(p.is_meta and isinstance(p, DTensor) for p in model.parameters())
    # the user's wrapping still runs: materialized and stepped for real afterwards
    with users_group(4, rank=0) as mesh:
        model = wrapped_on_meta(DeepMLP, mesh, default_wrap)
        analyze(model, torch.randn(*MLP_INPUT))
        model.to_empty(device="cpu")
        model(torch.randn(8, 256)).sum().backward()
        assert all(p.grad is not None for p in model.parameters())


_REAL_SHARDS = textwrap.dedent(
    """
    import resource
    import torch, torch.distributed as dist
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore
    import meta_widget as mw

    def rss():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    def wrapped(width, mesh):
        with torch.device("meta"):
            model = nn.Sequential(*(nn.Linear(width, width) for _ in range(4)))
        for block in model:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        model.to_empty(device="cpu")  # this rank's shards, for real
        with torch.no_grad():
            for p in model.parameters():
                p._local_tensor.fill_(1.0)  # resident
        return model

    dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
    mesh = init_device_mesh("cpu", (2,))
    mw.analyze(wrapped(64, mesh), input_size=(2, 64), mode="training")  # warmed up
    model = wrapped(8192, mesh)  # 4 x 8192^2 x 4 bytes / 2 ranks: 512 MiB of shards here
    shards = sum(p.to_local().untyped_storage().nbytes() for p in model.parameters())
    before = rss()
    with open("/proc/self/statm") as f:
        size = int(f.read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (size + shards // 2, resource.RLIM_INFINITY))
    a = mw.analyze(model, input_size=(2, 8192), mode="training")
    params = list(model.parameters())
    unchanged = all(p.grad is None and bool((p._local_tensor == 1).all()) for p in params)
    print(a.error is None, a.param_bytes, shards, rss() - before, unchanged)
    dist.destroy_process_group()
    """
)


def test_real_local_shards_are_never_copied() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _REAL_SHARDS], capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stdout + out.stderr
    ok, param_bytes, shards, grown, unchanged = out.stdout.split()
    assert ok == "True" and unchanged == "True", out.stdout + out.stderr
    assert int(param_bytes) == int(shards)  # traced: this rank's shards (not the whole model)
    assert int(grown) < int(shards) // 8, f"RSS grew by {int(grown) / 2**20:.0f} MiB"


# -- what is refused ---------------------------------------------------------------------------


def test_a_real_process_group_is_refused_with_what_to_do() -> None:
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        model = wrapped_on_meta(DeepMLP, init_device_mesh("cpu", (1,)), _shard_blocks)
        before = snapshot(model)
        with pytest.raises(mw.ParallelError, match=r"real process group.*'gloo'.*fake"):
            mw.analyze(model, input_size=(8, 256), mode="training")
        # without inputs nothing runs: the structure of the whole model is shown
        structure = mw.analyze(model)
        assert structure.total_params == sum(p.numel() for p in DeepMLP().parameters())
        assert snapshot(model) == before
    finally:
        dist.destroy_process_group()


def _shard_blocks(model: nn.Module, mesh: DeviceMesh) -> None:
    for block in model.layers:  # type: ignore[union-attr]
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)


def test_parallel_on_a_wrapped_model_and_a_destroyed_group_are_refused() -> None:
    with users_group(2) as mesh:
        model = wrapped_on_meta(DeepMLP, mesh["dp"], _shard_blocks)
        with pytest.raises(mw.ParallelError, match=r"already wrapped.*leave parallel= out"):
            mw.analyze(model, input_size=(8, 256), parallel={"fsdp": 2})
    with pytest.raises(mw.ParallelError, match="no process group exists"):
        mw.analyze(model, input_size=(8, 256))
