"""A world's sub-meshes made once (``distributed.submeshes``): no change but the time.

A slice or join asked again of the same meshes must be the mesh PyTorch makes (equal, the same
ranks, names and process groups) and the same object each time; every layout that slices or
joins meshes must trace the same with it and without it; and ``DeviceMesh`` has its own methods
again after every world, nothing kept, an interrupt in ``fully_shard`` included.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch.distributed as dist
from parallel_truth import (
    no_process_group_left,  # noqa: F401  (an autouse fixture)
    tiny_llama_config,
)
from test_fast_path import assert_same_parallel
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp._fully_shard import _fsdp_param
from torch.testing._internal.distributed.fake_pg import FakeStore

import meta_widget as mw
from meta_widget.distributed import parallel, submeshes

OWN = {name: vars(DeviceMesh)[name] for name in ("__getitem__", "_concatenate")}


def own_methods() -> bool:
    return all(vars(DeviceMesh)[name] is value for name, value in OWN.items())


def same_mesh(a: DeviceMesh, b: DeviceMesh) -> None:
    assert a == b and hash(a) == hash(b)
    assert a.mesh.tolist() == b.mesh.tolist()
    assert a.mesh_dim_names == b.mesh_dim_names
    assert a._dim_group_names == b._dim_group_names


def test_a_slice_or_join_asked_again_is_pytorchs_mesh_made_once() -> None:
    dist.init_process_group("fake", rank=5, world_size=16, store=FakeStore())
    try:
        mesh = init_device_mesh("cpu", (2, 4, 2), mesh_dim_names=("replicate", "fsdp", "tp"))
        own = {
            "fsdp": mesh["fsdp"],
            "hsdp": mesh["replicate", "fsdp"],
            "tp": mesh["tp"],
        }
        own["join"] = DeviceMesh._concatenate([own["hsdp"], own["tp"]])
        submeshes.same_submeshes()
        try:
            for _ in range(2):
                made = {
                    "fsdp": mesh["fsdp"],
                    "hsdp": mesh["replicate", "fsdp"],
                    "tp": mesh["tp"],
                }
                made["join"] = DeviceMesh._concatenate([made["hsdp"], made["tp"]])
                for name, m in made.items():
                    same_mesh(m, own[name])
                    assert m is not own[name]
            assert mesh["fsdp"] is mesh["fsdp"] and mesh["tp"] is made["tp"]
            assert DeviceMesh._concatenate([made["hsdp"], made["tp"]]) is made["join"]
            assert mesh[mesh.mesh_dim_names] is mesh  # PyTorch's own answer for every name
            with pytest.raises(KeyError):
                mesh["pp"]
        finally:
            submeshes.own_submeshes()
        assert own_methods() and not submeshes._made
        assert mesh["fsdp"] is not mesh["fsdp"]  # PyTorch's own: a new mesh each time
    finally:
        dist.destroy_process_group()


LAYOUTS = [
    {"replicate": 2, "fsdp": 4},  # FSDP2 slices the shard mesh of each parameter
    {"fsdp": 2, "tp": 2, "sequence_parallel": True},  # and joins it to TP's
    {"replicate": 2, "fsdp": 2, "tp": 2, "sequence_parallel": True},
    {"pp": 2, "fsdp": 2, "tp": 2, "microbatches": 2},
]


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda p: "-".join(f"{k}{v}" for k, v in p.items()))
def test_every_layout_traces_the_same_with_submeshes_made_once(
    monkeypatch: pytest.MonkeyPatch, layout: dict[str, Any]
) -> None:
    made: list[int] = []
    real = submeshes._SLICE

    def counted(self: DeviceMesh, names: Any) -> DeviceMesh:
        made.append(1)
        return real(self, names)  # type: ignore[no-any-return]

    options: dict[str, Any] = {
        "input_size": (2, 64),
        "parallel": layout,
        "mode": "training",
        "gpu": "H100",
        "activation_checkpointing": True,
    }
    with monkeypatch.context() as m:
        m.setattr(submeshes, "_SLICE", counted)
        fast = mw.analyze(tiny_llama_config(), **options)
    assert made, "the world sliced its mesh through the memo"
    assert own_methods() and not submeshes._made
    with monkeypatch.context() as m:
        m.setattr(parallel, "same_submeshes", lambda: None)
        slow = mw.analyze(tiny_llama_config(), **options)
    assert_same_parallel(fast, slow)


def test_an_interrupt_in_fully_shard_gives_devicemesh_its_own_methods_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = [0]
    real = _fsdp_param.FSDPParam._init_shard_mesh

    def interrupted(self: Any) -> DeviceMesh:
        calls[0] += 1
        if calls[0] == 3:  # the third parameter FSDP2 shards
            raise KeyboardInterrupt
        return real(self)

    with monkeypatch.context() as m:
        m.setattr(_fsdp_param.FSDPParam, "_init_shard_mesh", interrupted)
        with pytest.raises(KeyboardInterrupt):
            mw.analyze(
                tiny_llama_config(), (2, 64), mode="training", parallel={"replicate": 2, "fsdp": 2}
            )
    assert calls[0] == 3
    assert own_methods() and not submeshes._made
    again = mw.analyze(tiny_llama_config(), (2, 64), mode="training", parallel={"fsdp": 2})
    assert again.error is None
