"""The time model (``meta_widget.timing``) pinned to hand formulas from the H100's cited
figures (``mw.gpus()``: the H100 SXM5 whitepaper's dense peaks, 3.35 TB/s HBM3, NVLink 900 GB/s,
DGX H100's 8 x 400 Gb/s network) and the efficiencies ``EFFICIENCY`` documents (0.75 of a
peak, 0.85 of HBM, 0.80 of a link, 10 us a collective), FLOPs from ``FlopCounterMode``.

Each test fails on a plausible one-line slip that the rest of the suite let through (issue 36):
the compute efficiency dropped, NVLink chosen by ``<`` instead of ``<=``, a replica group's
stride without tensor parallelism, float32 convolutions off the TF32 peak, the peak class
blind to how often a cost repeats, every fused attention halved, parallel costs of whole
tensors instead of a rank's shards, the decode rate off its step, the prefill taken as the
last forward pass.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
import torch
import transformers
from torch import nn
from torch.nn import functional as F
from torch.utils.flop_counter import FlopCounterMode

import meta_widget as mw
from meta_widget.timing.gpus import resolve_gpu
from meta_widget.timing.model import step_time

H100 = resolve_gpu("H100")
COMPUTE, MEMORY, LINK, COLLECTIVE_S = 0.75, 0.85, 0.80, 10e-6
T = transformers


def flops_of(model: nn.Module, *inputs: torch.Tensor) -> int:
    """FlopCounterMode's count of one forward of ``model`` on meta."""
    with FlopCounterMode(display=False) as counter:
        model(*inputs)
    return counter.get_total_flops()


def test_a_compute_bound_matmul_runs_at_three_quarters_of_the_bf16_peak() -> None:
    with torch.device("meta"):
        model = nn.Linear(4096, 4096, bias=False, dtype=torch.bfloat16)
        x = torch.empty(2048, 4096, dtype=torch.bfloat16)
    a = mw.analyze(model, input_data=x, gpu="H100")
    flops = flops_of(model, x)
    assert a.total_flops == flops == 2 * 2048 * 4096 * 4096
    assert a.time is not None
    assert a.time.forward_s == pytest.approx(flops / (H100.bf16_flops * COMPUTE), rel=1e-9)


def test_a_float32_convolution_runs_at_the_tf32_peak() -> None:
    with torch.device("meta"):
        model = nn.Conv2d(64, 64, 3, padding=1, bias=False)
        x = torch.empty(32, 64, 64, 64)
    a = mw.analyze(model, input_data=x, gpu="H100")
    flops = flops_of(model, x)
    assert a.time is not None and a.total_flops == flops
    assert a.time.forward_s == pytest.approx(flops / (H100.tf32_flops * COMPUTE), rel=1e-9)


class Attention(nn.Module):
    def __init__(self, causal: bool) -> None:
        super().__init__()
        self.causal = causal

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)


@pytest.mark.parametrize("causal", [False, True])
def test_only_causal_fused_attention_skips_half_its_flops(causal: bool) -> None:
    shape = (8, 16, 2048, 128)  # compute-bound: 275 GFLOPs over 268 MB
    q, k, v = (torch.empty(shape, dtype=torch.bfloat16, device="meta") for _ in range(3))
    model = Attention(causal)
    a = mw.analyze(model, input_data=(q, k, v), device="cuda", gpu="H100")
    flops = flops_of(model, q, k, v)
    assert a.total_flops == flops == 4 * 8 * 16 * 2048 * 2048 * 128  # counted in full
    executed = flops // 2 if causal else flops
    assert a.time is not None
    assert a.time.forward_s == pytest.approx(executed / (H100.bf16_flops * COMPUTE), rel=1e-9)


class Mixed(nn.Module):
    """One bf16 matmul run eight times in one call (one cost, counted 8 times) and one float32
    matmul with more FLOPs than one of them, fewer than all eight: the step's peak class is
    bf16."""

    def __init__(self) -> None:
        super().__init__()
        self.small = nn.Parameter(torch.empty(256, 256, dtype=torch.bfloat16))
        self.big = nn.Linear(256, 512, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(8):
            x = x @ self.small
        return self.big(x.float())


def test_the_peak_class_counts_every_repeat_of_a_cost() -> None:
    with torch.device("meta"):
        model = Mixed()
        x = torch.empty(1024, 256, dtype=torch.bfloat16)
    a = mw.analyze(model, input_data=x, gpu="H100")
    bf16, fp32 = 8 * 2 * 1024 * 256 * 256, 2 * 1024 * 256 * 512
    assert a.total_flops == bf16 + fp32 and bf16 > fp32 > bf16 // 8
    assert a.time is not None and a.time.peak_flops == H100.bf16_flops
    assert a.time.mfu == pytest.approx(a.total_flops / (a.time.step_s * H100.bf16_flops))


@dataclass
class Comm:
    """A collective as the time model reads it (``distributed.comms.CommRecord``'s fields)."""

    collective: str
    bytes: int
    group: str
    group_size: int
    module: str
    phase: str = "forward"


def ring(share: float, nbytes: int, bandwidth: float) -> float:
    return share * nbytes / (bandwidth * LINK) + COLLECTIVE_S


def test_a_group_that_fills_a_node_exactly_runs_on_nvlink() -> None:
    n = 2**30
    comms = [Comm("all_gather", n, "fsdp", 8, "gather")]  # 8 ranks, 8 GPUs a node
    t = step_time([], {}, comms, H100, 0)
    assert t.comm_s == pytest.approx(ring(7 / 8, n, H100.nvlink_bytes_per_s / 2), rel=1e-12)
    nine = step_time([], {}, [Comm("all_gather", n, "fsdp", 16, "gather")], H100, 0)
    assert nine.comm_s == pytest.approx(ring(15 / 16, n, H100.network_bytes_per_s), rel=1e-12)


def test_a_replica_group_spans_the_fsdp_and_tp_ranks_between_its_members() -> None:
    # replicate 2 x fsdp 2 x tp 2 on 4 GPUs a node: a replica's ranks are 4 apart, on two
    # nodes (the network); the fsdp pair (2 apart) and the tp pair share a node
    gpu = replace(H100, gpus_per_node=4)
    n = 2**28
    comms = [
        Comm("all_reduce", n, "replicate", 2, "replica"),
        Comm("reduce_scatter", n, "fsdp", 2, "fsdp"),
        Comm("all_reduce", n, "tp", 2, "tp"),
    ]
    t = step_time([], {}, comms, gpu, 0)
    nvlink = gpu.nvlink_bytes_per_s / 2
    assert t.comm_by_module["replica"] == pytest.approx(
        ring(2 * 1 / 2, n, gpu.network_bytes_per_s), rel=1e-12
    )
    assert t.comm_by_module["fsdp"] == pytest.approx(ring(1 / 2, n, nvlink), rel=1e-12)
    assert t.comm_by_module["tp"] == pytest.approx(ring(2 * 1 / 2, n, nvlink), rel=1e-12)


def test_a_tensor_parallel_rank_moves_the_bytes_of_its_shard() -> None:
    # the gate projection, column-wise over tp=2, is memory-bound at 8 tokens: each rank reads
    # the replicated input and its half of the weight, and writes its half of the features
    config = T.LlamaConfig(
        hidden_size=1024, intermediate_size=16384, num_hidden_layers=1, num_attention_heads=8,
        num_key_value_heads=2, vocab_size=128,
    )  # fmt: skip
    a = mw.analyze(config, input_size=(1, 8), parallel={"tp": 2}, gpu="H100")
    assert a.error is None, a.error
    frame = a.to_dataframe()
    gate = frame[frame.module == "layers.0.mlp.gate_proj"].time_s.item()
    per_rank = (8 * 1024 + 1024 * (16384 // 2) + 8 * (16384 // 2)) * 4  # float32
    assert gate == pytest.approx(per_rank / (H100.hbm_bytes_per_s * MEMORY), rel=1e-9)


@pytest.fixture(scope="module")
def generated() -> mw.Analysis:
    config = T.LlamaConfig(
        hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=256, architectures=["LlamaForCausalLM"],
    )  # fmt: skip
    T.logging.set_verbosity_error()
    a = mw.analyze(config, input_size=(3, 2048), mode="generate", new_tokens=6, gpu="H100")
    assert a.error is None and a.time is not None
    return a


def test_the_decode_rate_is_the_batch_over_a_decode_step(generated: mw.Analysis) -> None:
    t = generated.time
    assert t is not None and t.prefill_s is not None and t.per_token_s is not None
    assert t.per_token_s == pytest.approx((t.step_s - t.prefill_s) / (6 - 1), rel=1e-12)
    assert t.decode_tokens_per_s == pytest.approx(3 / t.per_token_s, rel=1e-12)
    assert t.tokens_per_s == pytest.approx(3 * 6 / t.step_s, rel=1e-12)


def test_the_prefill_is_the_prompts_forward_pass(generated: mw.Analysis) -> None:
    # the prefill: the first forward pass, over 2048 prompt tokens (its logits for the last
    # position only, as generate() asks); a decode step runs over one token
    t = generated.time
    assert t is not None and t.prefill_s is not None and t.per_token_s is not None
    config = generated.source_model.module.config  # type: ignore[union-attr]
    ids = torch.zeros(3, 2048, dtype=torch.long, device="meta")
    alone = mw.analyze(config, input_data={"input_ids": ids, "logits_to_keep": 1}, gpu="H100")
    assert alone.time is not None
    assert t.prefill_s == pytest.approx(alone.time.step_s, rel=0.05)
    assert t.prefill_s > 2 * t.per_token_s
