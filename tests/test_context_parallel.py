"""Context parallelism: why ``cp`` is refused, held against PyTorch's own ``context_parallel``.

``torch.distributed.tensor.experimental.context_parallel`` (torch 2.13) replaces SDPA by ring
attention for the CUDA kernels only (flash, efficient, cudnn). A parallel trace stands for CPU
ranks (its truths are real gloo ranks), where SDPA is
``_scaled_dot_product_flash_attention_for_cpu``: PyTorch's CP cannot run there, so there is no
real rank to hold a CP trace against. The first test fails the day PyTorch's CP runs on a CPU
mesh (then ``cp`` can be traced and checked).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from parallel_truth import (
    no_process_group_left,  # noqa: F401  (an autouse fixture)
    tiny_llama_config,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.experimental import context_parallel
from torch.testing._internal.distributed.fake_pg import FakeStore

import meta_widget as mw
from meta_widget.distributed.decisions import forget_meshes


def test_pytorchs_context_parallel_cannot_shard_cpu_attention() -> None:
    dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
    try:
        mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("cp",))
        q, k, v = (torch.randn(1, 4, 128, 32, requires_grad=True) for _ in range(3))
        buffers = [t.detach() for t in (q, k, v)]
        with (
            pytest.raises(NotImplementedError, match="flash_attention_for_cpu"),
            context_parallel(mesh, buffers=buffers, buffer_seq_dims=[2, 2, 2]),
        ):
            F.scaled_dot_product_attention(q, k, v, is_causal=True)
        # the ring's own kernels have no CPU implementation either
        with pytest.raises(NotImplementedError, match="CPU"):
            torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True)
    finally:
        dist.destroy_process_group()
        forget_meshes()
    # context_parallel put SDPA back
    assert F.scaled_dot_product_attention.__module__ == "torch._C._nn"


@pytest.mark.parametrize("layout", [{"cp": 2}, {"fsdp": 2, "cp": 2}, {"pp": 2, "cp": 2}])
def test_cp_is_a_layout_error_saying_why(layout: dict[str, Any]) -> None:
    x = torch.randint(0, 32000, (2, 128))
    with pytest.raises(mw.LayoutError, match=r"context_parallel .* CUDA attention") as raised:
        mw.analyze(tiny_llama_config(), input_data=x, mode="training", parallel=layout)
    assert "\n" not in str(raised.value)
