"""``mw.Parallel``: one typed layout, checked when made, the same trace as its dict.

Truths: the errors a user would meet (each one line, before any process group exists), a dict
layout's trace (which ``test_parallel`` holds against real ranks), and PyTorch's own
``init_device_mesh`` for the mesh.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
import torch.distributed as dist
from parallel_truth import (
    DeepMLP,
    no_process_group_left,  # noqa: F401  (an autouse fixture)
)
from torch.testing._internal.distributed.fake_pg import FakeStore

import meta_widget as mw
from meta_widget.distributed.decisions import forget_meshes


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"fsdp": 0}, r"parallel\['fsdp'\] must be a whole number of devices >= 1, not 0"),
        ({"tp": 2.0}, r"parallel\['tp'\] must be a whole number"),
        ({"fsdp": 1}, "is one device"),
        ({"fsdp": 128, "tp": 256}, "32,768 ranks"),
        ({"pp": 2, "ep": 2}, "ep=2 must divide fsdp x cp = 1"),
        ({"tp": 2, "schedule": "1F1B"}, "pp=1 is no pipeline"),
        ({"pp": 2, "schedule": "looped"}, "not a pipeline schedule"),
        ({"pp": 2, "virtual_stages": 2, "schedule": "gpipe"}, "one stage per rank"),
        ({"pp": 2, "schedule": "interleaved-1F1B"}, "virtual_stages=2"),
        ({"pp": 2, "virtual_stages": 3, "schedule": "ZBV-zero-bubble"}, "virtual_stages=2"),
        ({"pp": 4, "microbatches": 2}, "fewer than the 4 stages"),
        ({"pp": 4, "virtual_stages": 2, "microbatches": 9}, "multiple of the schedule's 2"),
        ({"pp": 2, "stage_boundaries": (3, 1)}, "1 rising layer indices"),
        ({"tp": 2, "mp": {"param_dtype": "bfloat16"}}, "shards nothing with FSDP2"),
        ({"fsdp": 2, "blocks": 3}, "module paths or class names"),
        ({"fsdp": 2, "sequence_parallel": True}, "tp=1 has none"),
        ({"tp": 2, "sequence_parallel": "yes"}, "must be True or False"),
    ],
)
def test_a_layout_checks_itself_in_one_line(fields: dict[str, Any], match: str) -> None:
    with pytest.raises(mw.OptionError, match=match) as raised:
        mw.Parallel(**fields)
    assert "\n" not in str(raised.value)
    # the same layout as a dict is refused by analyze the same way, before any trace
    with pytest.raises(mw.OptionError, match=match):
        mw.analyze(DeepMLP, input_size=(8, 256), parallel=fields)


def test_a_layout_is_normalized_frozen_and_equal_to_its_dict() -> None:
    layout = mw.Parallel(
        pp=4, fsdp=2, virtual_stages=2, schedule="Interleaved1F1B", mp={"param_dtype": "bfloat16"}
    )
    assert layout.schedule == "interleaved-1F1B"  # PyTorch's class names read as ours
    assert layout.microbatches == 8 and layout.stages == 8 and layout.world == 8
    assert layout.mp is not None and layout.mp.param_dtype == torch.bfloat16
    with pytest.raises(dataclasses.FrozenInstanceError):
        layout.pp = 2  # type: ignore[misc]
    layout = mw.Parallel(fsdp=4, tp=2, tp_plan={"layers.*.0": "colwise"}, blocks="Sequential")
    assert layout.blocks == ("Sequential",) and layout.tp_plan == (("layers.*.0", "colwise"),)
    assert hash(layout) == hash(
        mw.Parallel(**{f.name: getattr(layout, f.name) for f in dataclasses.fields(layout)})
    )
    assert layout.label() == "fsdp 4 × tp 2"
    assert mw.Parallel(pp=2).label() == "pp 2 · 1F1B, 2 micro-batches"


def test_the_mesh_is_pytorchs_of_the_layouts_shape() -> None:
    layout = mw.Parallel(replicate=2, fsdp=2, tp=2, pp=2)
    dist.init_process_group("fake", rank=0, world_size=layout.world, store=FakeStore())
    try:
        mesh = layout.mesh()
        # every dimension the layout uses, torchtitan's order; cp (size 1) left out
        assert mesh.mesh_dim_names == layout.mesh_dims == ("pp", "replicate", "fsdp", "tp")
        assert tuple(mesh.shape) == (2, 2, 2, 2)
        # rank 0's tp group is its neighbour, its pp group 8 ranks away (torchtitan's order)
        assert mesh["tp"].mesh.tolist() == [0, 1]
        assert mesh["pp"].mesh.tolist() == [0, 8]
    finally:
        dist.destroy_process_group()
        forget_meshes()


def test_the_mesh_of_llama_3_405bs_16384_ranks_has_its_three_dimensions() -> None:
    """The Llama 3 paper's layout: PP 16 x DP 128 x TP 8 on a fake group of 16,384 ranks."""
    layout = mw.Parallel(pp=16, fsdp=128, tp=8)
    dist.init_process_group("fake", rank=0, world_size=layout.world, store=FakeStore())
    try:
        mesh = layout.mesh()
        assert mesh.mesh_dim_names == ("pp", "fsdp", "tp") and tuple(mesh.shape) == (16, 128, 8)
        assert mesh["tp"].mesh.tolist() == list(range(8))
        assert mesh["fsdp"].mesh.tolist() == list(range(0, 1024, 8))
        assert mesh["pp"].mesh.tolist() == list(range(0, 16384, 1024))
    finally:
        dist.destroy_process_group()
        forget_meshes()


def test_analyze_takes_a_parallel_and_traces_it_as_its_dict() -> None:
    x = torch.randn(64, 256)
    layout = mw.Parallel(fsdp=2)
    a = mw.analyze(DeepMLP, input_data=x, mode="training", parallel=layout)
    b = mw.analyze(DeepMLP, input_data=x, mode="training", parallel={"fsdp": 2})
    assert a.error is None and b.error is None
    assert a.options.parallel == b.options.parallel == layout
    assert a.peak_bytes == b.peak_bytes and a.param_bytes == b.param_bytes


def test_sequence_parallelism_refuses_a_model_it_cannot_place_before_any_trace() -> None:
    """A model with no input embedding to shard the sequence from (an MLP stack), or a plan
    style with no sequence-parallel form: one LayoutError line, before a process group
    exists."""
    plan = {"layers.*.0": "colwise", "layers.*.2": "rowwise"}
    with pytest.raises(mw.LayoutError, match="DeepMLP has none meta_widget can find") as raised:
        mw.analyze(
            DeepMLP, input_size=(8, 256), mode="training",
            parallel={"tp": 2, "tp_plan": plan, "sequence_parallel": True},
        )  # fmt: skip
    assert "\n" not in str(raised.value) and not dist.is_initialized()
    with pytest.raises(mw.LayoutError, match="no sequence-parallel form"):
        mw.analyze(
            DeepMLP, input_size=(8, 256), mode="training",
            parallel={"tp": 2, "tp_plan": {"layers.*.0": "rowwise_rep"}, "sequence_parallel": True},
        )  # fmt: skip
