"""HSDP (``parallel={"replicate": r, "fsdp": f}``): one rank's traced peak equals a real rank's.

The truth is :func:`parallel_truth.real_rank_peak` with the model wrapped by hand the way
PyTorch documents HSDP: ``fully_shard`` on a 2-D ``(replicate, shard)`` mesh, each decoder layer
then the root, one real AdamW step measured by ``MemTracker``.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from parallel_truth import (
    no_process_group_left,  # noqa: F401  (an autouse fixture)
    real_rank_peak,
    tiny_llama_config,
)
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard

import meta_widget as mw
from meta_widget.options import OptionError

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def hsdp_wrap(replicate: int, shard: int) -> Any:
    """Wrap each decoder layer, then the root, with ``fully_shard`` on a replicate x shard mesh."""

    def wrap(model: nn.Module, _: DeviceMesh) -> None:
        mesh = init_device_mesh("cpu", (replicate, shard), mesh_dim_names=("replicate", "shard"))
        for layer in model.model.layers:  # type: ignore[union-attr]
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)

    return wrap


@pytest.mark.slow
@pytest.mark.parametrize(("replicate", "fsdp"), [(2, 2), (4, 1)])
def test_hsdp_peak_per_rank_is_a_real_ranks_peak(replicate: int, fsdp: int) -> None:
    import transformers

    config = tiny_llama_config()
    x = torch.randint(0, 32000, (2, 128))
    truth = real_rank_peak(
        lambda: transformers.LlamaForCausalLM(config),
        x,
        fsdp=replicate * fsdp,
        wrap=hsdp_wrap(replicate, fsdp),
    )
    parallel = {"replicate": replicate, "fsdp": fsdp}
    a = mw.analyze(config, input_data=x, mode="training", device="cpu", parallel=parallel)
    assert a.error is None, a.error
    assert a.memory.first_step_peak_bytes == pytest.approx(truth["Total"], rel=0.01)
    # gradients are reduce-scattered in the shard group, then all-reduced across the replicas
    reduced = a.comms[a.comms["collective"] == "all_reduce"]
    assert set(reduced["group"]) == {"replicate"}
    assert set(reduced["group_size"]) == {replicate}


def test_replicas_move_gradients_over_the_network_across_nodes() -> None:
    """8 ranks per node: a replica group 8 ranks apart crosses nodes, one 2 apart does not."""
    from meta_widget.timing.gpus import resolve_gpu
    from meta_widget.timing.model import collective_seconds, mesh_strides

    class Comm:
        def __init__(self, group: str, size: int) -> None:
            self.collective, self.bytes, self.group, self.group_size = (
                "all_reduce",
                2**30,
                group,
                size,
            )
            self.phase, self.module = "backward", ""

    gpu = resolve_gpu("H100")
    within = mesh_strides([Comm("fsdp", 2)])  # replicas 2 ranks apart: 2 x 2 = 4 on one node
    across = mesh_strides([Comm("fsdp", 8)])  # replicas 8 ranks apart: two nodes
    fast = collective_seconds(Comm("replicate", 2), gpu, within)
    slow = collective_seconds(Comm("replicate", 2), gpu, across)
    bytes_moved = 2 * (2 - 1) / 2 * 2**30  # a ring all-reduce of 1 GiB over 2 ranks
    assert fast < bytes_moved / (gpu.nvlink_bytes_per_s / 2) * 1.5
    assert slow > bytes_moved / gpu.network_bytes_per_s


@pytest.mark.parametrize(
    ("parallel", "match"),
    [
        ({"replicate": 0}, "replicate"),
        ({"replicate": 10**9}, "more than"),
        ({"replicate": 1}, "one device"),
    ],
)
def test_replicate_is_checked_before_anything_is_built(parallel: Any, match: str) -> None:
    with pytest.raises(OptionError, match=match):
        mw.analyze(nn.Linear(4, 4), (2, 4), mode="training", parallel=parallel)
