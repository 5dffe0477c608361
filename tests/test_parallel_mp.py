"""FSDP2's mixed precision (``parallel={"fsdp": N, "mp": {...}}``) against real CPU ranks.

Truth (``parallel_truth``): the same model built for real, wrapped by hand with PyTorch's
``fully_shard(..., mp_policy=MixedPrecisionPolicy(...))`` (each block, then the root) under the
fake process group, three AdamW steps of rank 0 (``real_rank_peak``: the first step's peak by
MemTracker, the steady steps' by the CPU allocator); and the all-gather sizes from FSDP2's
padding rule (each parameter's dim 0 padded to a multiple of N) in the gathered dtype.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.distributed as dist
from parallel_truth import (
    DeepMLP,
    default_wrap,
    no_process_group_left,  # noqa: F401  (an autouse fixture)
    real_rank_peak,
    tiny_llama_config,
)
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy

import meta_widget as mw

TOLERANCE = 0.02
BF16 = {"param_dtype": torch.bfloat16, "reduce_dtype": torch.float32}


def wrapped_with(**policy: Any) -> Any:
    """``fully_shard`` on each block, then the root, with ``MixedPrecisionPolicy(**policy)``."""

    def wrap(model: nn.Module, mesh: DeviceMesh) -> None:
        default_wrap(model, mesh, mp_policy=MixedPrecisionPolicy(**policy))

    return wrap


def agree(a: mw.Analysis, truth: dict[str, int]) -> None:
    """The steady peak is a real rank's from step 2, the first step's its first step's."""
    assert a.peak_bytes == pytest.approx(truth["Steady"], rel=TOLERANCE)
    assert a.memory.first_step_peak_bytes == pytest.approx(truth["Total"], rel=TOLERANCE)


def analyze_rank(model: Any, x: torch.Tensor, **parallel: Any) -> mw.Analysis:
    a = mw.analyze(model, input_data=x, mode="training", device="cpu", parallel=parallel)
    assert a.error is None, a.error
    return a


def gathered_bytes(model: nn.Module, n: int, element_size: int) -> int:
    """What FSDP2 all-gathers for ``model``'s parameters: dim 0 padded to a multiple of n."""
    return sum(
        math.ceil(p.shape[0] / n) * n * math.prod(p.shape[1:]) * element_size
        for p in model.parameters()
    )


@pytest.mark.parametrize("n", [2, 4])
def test_mixed_precision_peak_per_rank_is_a_real_ranks_peak(n: int) -> None:
    x = torch.randn(1024, 256)  # activations large enough for the peak to be in backward
    plain = analyze_rank(DeepMLP, x, fsdp=n)
    bf16 = analyze_rank(DeepMLP, x, fsdp=n, mp=BF16)
    plain_truth = real_rank_peak(DeepMLP, x, fsdp=n, steps=3)
    truth = real_rank_peak(DeepMLP, x, fsdp=n, wrap=wrapped_with(**BF16), steps=3)
    agree(plain, plain_truth)
    agree(bf16, truth)
    assert truth["Steady"] < 0.8 * plain_truth["Steady"]  # bf16 compute: the policy matters
    # the sharded parameters stay float32 (what the optimizer updates): the same shards
    assert bf16.param_bytes == plain.param_bytes
    comms = bf16.comms
    gathers = comms[comms.collective == "all_gather"]
    plain_gathers = plain.comms[plain.comms.collective == "all_gather"]
    # bf16 all-gathers: half the bytes, each what FSDP2's padding gives in bf16
    assert gathers.bytes.sum() * 2 == plain_gathers.bytes.sum()
    assert gathers.bytes.sum() == 2 * gathered_bytes(DeepMLP(), n, 2)  # forward and backward
    # reduce_dtype=float32: the gradients reduce-scattered at full width
    scatters = comms[comms.collective == "reduce_scatter"]
    plain_scatters = plain.comms[plain.comms.collective == "reduce_scatter"]
    assert scatters.bytes.sum() == plain_scatters.bytes.sum()


def test_param_dtype_alone_reduces_in_that_dtype_as_fsdp2_does() -> None:
    """FSDP2's default ``reduce_dtype`` is ``param_dtype``: bf16 reduce-scatters too. Given as
    PyTorch's own ``MixedPrecisionPolicy`` object."""
    x = torch.randn(64, 256)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16)
    a = analyze_rank(DeepMLP, x, fsdp=2, mp=policy)
    plain = analyze_rank(DeepMLP, x, fsdp=2)
    truth = real_rank_peak(
        DeepMLP, x, fsdp=2, wrap=wrapped_with(param_dtype=torch.bfloat16), steps=3
    )
    agree(a, truth)
    for kind in ("all_gather", "reduce_scatter"):
        ours = a.comms[a.comms.collective == kind].bytes.sum()
        assert 2 * ours == plain.comms[plain.comms.collective == kind].bytes.sum()


@pytest.mark.slow
def test_mixed_precision_on_a_tiny_llama_is_a_real_ranks_peak() -> None:
    import transformers

    # a small vocabulary: the real ranks run their matmuls in bf16, slow on a CPU, and the
    # output layer's over 32,000 tokens were most of their time
    config = tiny_llama_config(vocab=2048)
    x = torch.randint(0, 2048, (2, 128))

    def make() -> nn.Module:
        return transformers.LlamaForCausalLM(config)

    truth = real_rank_peak(make, x, fsdp=2, wrap=wrapped_with(**BF16), steps=3)
    agree(analyze_rank(config, x, fsdp=2, mp=BF16), truth)


@pytest.mark.parametrize(
    ("mp", "error", "match"),
    [
        ({"param_dtype": "bf16x"}, mw.OptionError, "floating dtype"),
        ({"param_dtype": torch.long}, mw.OptionError, "floating dtype"),
        ({"params": "bfloat16"}, mw.OptionError, "unknown keys"),
        ({"cast_forward_inputs": "yes"}, mw.OptionTypeError, "True or False"),
        ("bfloat16", mw.OptionTypeError, "dict of MixedPrecisionPolicy"),
    ],
)
def test_mixed_precision_is_checked_before_anything_is_built(
    mp: Any, error: Any, match: str
) -> None:
    with pytest.raises(error, match=match):
        mw.analyze(DeepMLP, input_size=(8, 256), parallel={"fsdp": 2, "mp": mp})


def test_mixed_precision_needs_fsdp() -> None:
    with pytest.raises(mw.OptionError, match="shards nothing with FSDP2"):
        mw.analyze(
            DeepMLP, input_size=(8, 256),
            parallel={"tp": 2, "tp_plan": {"layers.*.0": "colwise"}, "mp": BF16},
        )  # fmt: skip


def test_the_badge_names_the_policy() -> None:
    from meta_widget.views.protocol import encode_settings

    a = mw.analyze(DeepMLP, input_size=(8, 256), mode="training", parallel={"fsdp": 2, "mp": BF16})
    label, tip = encode_settings(a.options)[0]
    assert label == "fsdp 2 · mp bfloat16 param, float32 reduce"
    assert "MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)" in tip


def sac_rank_peak(make: Any, x: torch.Tensor, fsdp: int, **policy: Any) -> int:
    """The CPU allocator's peak of one real step (no optimizer) of rank 0 of ``fsdp`` ranks:
    each block ``fully_shard``-ed (with ``MixedPrecisionPolicy(**policy)``), then the root,
    and each block's forward under torchtitan's selective checkpointing."""
    from test_selective_checkpointing import _profiled, titan_context, window_peak, wrap_blocks
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from meta_widget.distributed.decisions import forget_meshes

    dist.init_process_group("fake", rank=0, world_size=fsdp, store=FakeStore())
    try:
        torch.manual_seed(0)
        model = make().train()
        mesh = init_device_mesh("cpu", (fsdp, 1), mesh_dim_names=("dp", "tp"))
        default_wrap(model, mesh, mp_policy=MixedPrecisionPolicy(**policy))
        wrap_blocks(model, titan_context)
        held = [p.to_local() for p in model.parameters()] + [*model.buffers(), x]
        before = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in held}
        with _profiled() as prof:
            out = model(x)
            out.logits.sum().backward()
            del out
        return sum(before.values()) + window_peak(prof)
    finally:
        dist.destroy_process_group()
        forget_meshes()


@pytest.mark.parametrize("mp", [{}, BF16], ids=["fp32", "bf16"])
def test_selective_checkpointing_on_an_fsdp2_rank_is_a_real_ranks_peak(mp: dict[str, Any]) -> None:
    """torchtitan's recipe: FSDP2 (with or without its mixed precision) and op-level
    selective checkpointing of each block, on a tiny Llama (its KV cache off, see
    ``test_selective_checkpointing``)."""
    import transformers

    config = tiny_llama_config(vocab=1000)
    config.use_cache = False
    x = torch.randint(0, 1000, (2, 128))
    truth = sac_rank_peak(lambda: transformers.LlamaForCausalLM(config), x, 2, **mp)
    parallel = {"fsdp": 2, **({"mp": mp} if mp else {})}
    a = mw.analyze(
        config, input_data=x, mode="training", device="cpu", optimizer=None, parallel=parallel,
        activation_checkpointing="selective",
    )  # fmt: skip
    assert a.error is None, a.error
    assert a.peak_bytes == pytest.approx(truth, rel=TOLERANCE)
