"""The time model (``meta_widget.timing``) pinned to hand formulas from the H100's cited
figures (``mw.gpus()``: the H100 SXM5 whitepaper's dense peaks, 3.35 TB/s HBM3, NVLink 900 GB/s,
DGX H100's 8 x 400 Gb/s network, 132 SMs) and the published figures of
``meta_widget.timing.efficiency`` (written out here, not imported: a one-line change of the table
fails): the best H100 BF16 GEMM measured, 794.5 TFLOP/s at 2048 x 2048 x 13312 (MAMF table);
FlashAttention-2 on H100 at 16k (FlashAttention-3 paper): forward 370 TFLOP/s at head dim 128
(335 causal), 324 at 64; backward 322 at 128;
decode at 0.77 of HBM (vLLM on A100); NCCL at 370 of NVLink's 450 GB/s, 480 with NVLink SHARP,
47 of a 50 GB/s NIC; eager PyTorch's 5 us per op; 0.75 of a peak where no figure was read; 10 us
a collective. FLOPs from ``FlopCounterMode``.

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
FALLBACK, MEMORY, COLLECTIVE_S, EAGER_S = 0.75, 0.77, 10e-6, 5e-6
NVLINK, NVLS, NETWORK = 370 / 450, 480 / 450, 47 / 50
MAMF_H100 = 794.5e12  # at M, N = 2048, 2048: 256 tiles of 128 x 128 over 132 SMs, 2 waves
BEST_H100 = MAMF_H100 / (256 / 264)  # the rate a GEMM reaches when it fills every wave
FA2_H100, FA2_H100_CAUSAL = 370e12, 335e12  # forward, head dim 128
FA2_H100_D64, FA2_H100_BWD = 324e12, 322e12  # forward at head dim 64; backward at 128
T = transformers


def flops_of(model: nn.Module, *inputs: torch.Tensor) -> int:
    """FlopCounterMode's count of one forward of ``model`` on meta."""
    with FlopCounterMode(display=False) as counter:
        model(*inputs)
    return counter.get_total_flops()


def _matmul_s(
    m: int, n: int, k: int, gpu: str | mw.GPU = "H100", dtype: torch.dtype = torch.bfloat16
) -> float:
    with torch.device("meta"):
        model = nn.Linear(k, n, bias=False, dtype=dtype)
        x = torch.empty(m, k, dtype=dtype)
    a = mw.analyze(model, input_data=x, gpu=gpu)
    assert a.total_flops == flops_of(model, x) == 2 * m * n * k and a.time is not None
    return a.time.forward_s


def test_a_compute_bound_matmul_runs_at_the_measured_best_gemm_rate() -> None:
    # 2048 x 4096: 512 tiles, 4 waves of 132 SMs (528 slots)
    flops = 2 * 2048 * 4096 * 4096
    assert _matmul_s(2048, 4096, 4096) == pytest.approx(flops / (BEST_H100 * 512 / 528), rel=1e-9)
    # the best shape itself runs at the published rate
    assert _matmul_s(2048, 2048, 13312) == pytest.approx(
        2 * 2048 * 2048 * 13312 / MAMF_H100, rel=1e-9
    )


def test_one_tile_past_a_full_wave_costs_a_second_wave() -> None:
    # 11 x 12 = 132 tiles of 128 x 128 fill the H100's 132 SMs once; 7 x 19 = 133 need a
    # second, nearly empty wave: about twice the time for a FLOP more
    full = _matmul_s(128 * 11, 128 * 12, 16384)
    over = _matmul_s(128 * 7, 128 * 19, 16384)
    assert full == pytest.approx(2 * 128 * 11 * 128 * 12 * 16384 / BEST_H100, rel=1e-9)
    assert over == pytest.approx(2 * 128 * 7 * 128 * 19 * 16384 / (BEST_H100 * 133 / 264))


def test_a_matmul_pays_for_its_partly_filled_tiles() -> None:
    # 320 rows fill 3 tiles of 128 to 320 / 384; 3 x 32 tiles are fewer than the SMs (split K)
    assert _matmul_s(320, 4096, 16384) == pytest.approx(
        2 * 320 * 4096 * 16384 / (BEST_H100 * 320 / 384), rel=1e-9
    )


def test_a_gpu_of_your_own_has_no_waves_unless_given_its_sms() -> None:
    # no GEMM figure for a GPU of your own: the fallback fraction, and without ``sms`` no tiles
    # over SMs; a wrong SM count is the user's error, said in one line
    mine = mw.GPU(name="mine", memory_bytes=2**36, hbm_bytes_per_s=4e12, fp32_flops=60e12,
                  bf16_flops=900e12)  # fmt: skip
    assert _matmul_s(128 * 7, 128 * 19, 16384, gpu=mine) == pytest.approx(
        2 * 128 * 7 * 128 * 19 * 16384 / (900e12 * FALLBACK), rel=1e-9
    )
    with pytest.raises(mw.OptionError, match=r"GPU\('bad'\)\.sms must be"):
        mw.GPU(name="bad", memory_bytes=2**36, hbm_bytes_per_s=4e12, fp32_flops=60e12, sms=0)
    with pytest.raises(mw.OptionError, match=r"GPU\('bad'\)\.sms must be"):
        mw.GPU(name="bad", memory_bytes=2**36, hbm_bytes_per_s=4e12, fp32_flops=60e12, sms=1.5)


def test_a_float32_matmul_falls_back_where_no_figure_was_read() -> None:
    flops = 2 * 4096 * 4096 * 4096
    seconds = _matmul_s(4096, 4096, 4096, dtype=torch.float32)
    assert seconds == pytest.approx(flops / (H100.fp32_flops * FALLBACK), rel=1e-9)


def test_an_a100_gemm_runs_at_the_a100s_measured_best() -> None:
    # MAMF A100 SXM: 271.2 TFLOP/s at 1024 x 10240 (640 tiles, 6 waves of 108 SMs: 648 slots)
    best = 271.2e12 / (640 / 648)
    flops = 2 * 4096 * 4096 * 4096  # 1024 tiles, 10 waves: 1080 slots
    seconds = _matmul_s(4096, 4096, 4096, gpu="A100-80GB")
    assert seconds == pytest.approx(flops / (best * 1024 / 1080), rel=1e-9)


def test_a_float32_convolution_runs_at_the_tf32_peak() -> None:
    with torch.device("meta"):
        model = nn.Conv2d(128, 128, 3, padding=1, bias=False)
        x = torch.empty(32, 128, 64, 64)  # compute-bound: 154 GFLOPs over 134 MB
    a = mw.analyze(model, input_data=x, gpu="H100")
    flops = flops_of(model, x)
    assert a.time is not None and a.total_flops == flops
    assert a.time.forward_s == pytest.approx(flops / (H100.tf32_flops * FALLBACK), rel=1e-9)


class Attention(nn.Module):
    def __init__(self, causal: bool) -> None:
        super().__init__()
        self.causal = causal

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attention_runs_at_flashattention2s_rate_for_its_keys(causal: bool) -> None:
    # FlashAttention-2's long-sequence rate, times span / (span + 128): each 128-query tile
    # pays about one key block to load its queries and write its output; a causal tile visits
    # half the keys on average, and executes half the FLOPs
    shape = (8, 16, 2048, 128)  # compute-bound: 275 GFLOPs over 268 MB
    q, k, v = (torch.empty(shape, dtype=torch.bfloat16, device="meta") for _ in range(3))
    model = Attention(causal)
    a = mw.analyze(model, input_data=(q, k, v), device="cuda", gpu="H100")
    flops = flops_of(model, q, k, v)
    assert a.total_flops == flops == 4 * 8 * 16 * 2048 * 2048 * 128  # counted in full
    executed = flops // 2 if causal else flops
    rate = FA2_H100_CAUSAL * 1024 / 1152 if causal else FA2_H100 * 2048 / 2176
    assert a.time is not None
    assert a.time.forward_s == pytest.approx(executed / rate, rel=1e-9)


class ScaledAttention(nn.Module):
    """Attention after a learned scale (a parameter for the optimizer to step)."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones((), dtype=torch.bfloat16))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q * self.scale, k, v)


def _attention_kernel_s(head_dim: int, direction: str) -> tuple[float, int]:
    """(time, executed FLOPs) of the flash kernel of ``direction`` in a training step of
    attention over 2048 keys with 16 heads of ``head_dim``."""
    from meta_widget.timing.model import op_seconds

    shape = (4, 16, 2048, head_dim)
    q, k, v = (
        torch.empty(shape, dtype=torch.bfloat16, device="meta", requires_grad=True)
        for _ in range(3)
    )
    with torch.device("meta"):
        model = ScaledAttention()
    a = mw.analyze(model, input_data=(q, k, v), mode="training", device="cuda", gpu="H100")
    assert a.error is None, a.error
    (cost,) = [
        cost
        for c in a.calls
        for table in (c.costs, c.backward_costs)
        for cost in table
        if cost[3][:3] == ("attn", "flash", direction)
    ]
    return op_seconds(cost, H100, floor=0.0)[0], cost[1]


def test_flash_backward_runs_at_its_own_rate_writing_two_outputs_a_tile() -> None:
    seconds, flops = _attention_kernel_s(128, "bwd")
    assert flops == 5 * 2 * 4 * 16 * 2048 * 2048 * 128  # FlopCounterMode's five matmuls
    assert seconds == pytest.approx(flops / (FA2_H100_BWD * 2048 / (2048 + 256)), rel=1e-9)


def test_flash_attention_takes_the_rate_of_its_head_dim() -> None:
    seconds, flops = _attention_kernel_s(64, "fwd")
    assert seconds == pytest.approx(flops / (FA2_H100_D64 * 2048 / 2176), rel=1e-9)


def test_eager_ops_take_the_hosts_launch_time_and_graphs_none() -> None:
    with torch.device("meta"):
        model = nn.ReLU()
        x = torch.empty(256, dtype=torch.bfloat16)  # 1 KB: far under a microsecond of HBM
    eager = mw.analyze(model, input_data=x, gpu="H100")
    graphs = mw.analyze(model, input_data=x, gpu="H100", launch="graphs")
    assert eager.time is not None and graphs.time is not None
    assert eager.time.launch == "eager" and graphs.time.launch == "graphs"
    assert eager.time.forward_s == pytest.approx(EAGER_S, rel=1e-12)
    assert graphs.time.forward_s == pytest.approx(2 * 512 / (H100.hbm_bytes_per_s * MEMORY))
    with pytest.raises(mw.OptionError, match="launch"):
        mw.analyze(model, input_data=x, gpu="H100", launch="compiled")


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
    return share * nbytes / bandwidth + COLLECTIVE_S


def test_a_group_that_fills_a_node_exactly_runs_on_nvlink() -> None:
    n = 2**30
    comms = [Comm("all_gather", n, "fsdp", 8, "gather")]  # 8 ranks, 8 GPUs a node
    t = step_time([], {}, comms, H100, 0)
    nvlink = H100.nvlink_bytes_per_s / 2 * NVLINK
    assert t.comm_s == pytest.approx(ring(7 / 8, n, nvlink), rel=1e-12)
    nine = step_time([], {}, [Comm("all_gather", n, "fsdp", 16, "gather")], H100, 0)
    network = H100.network_bytes_per_s * NETWORK
    assert nine.comm_s == pytest.approx(ring(15 / 16, n, network), rel=1e-12)


def test_an_all_reduce_inside_an_h100_node_runs_nvlink_sharp() -> None:
    n = 2**30
    reduce = [Comm("all_reduce", n, "tp", 8, "reduce")]
    sharp = step_time([], {}, reduce, H100, 0).comm_s
    assert sharp == pytest.approx(ring(2 * 7 / 8, n, H100.nvlink_bytes_per_s / 2 * NVLS))
    a100 = resolve_gpu("A100-80GB")  # no NVLink SHARP: the ring
    assert step_time([], {}, reduce, a100, 0).comm_s == pytest.approx(
        ring(2 * 7 / 8, n, a100.nvlink_bytes_per_s / 2 * NVLINK)
    )


def test_fsdps_schedule_exposes_the_first_gather_and_the_last_reduce_scatter() -> None:
    # PyTorch's FSDP: the root unit's all-gather runs before any layer (nothing to hide it),
    # each layer's gather is prefetched during the layer before, each reduce-scatter runs
    # during the next layer's backward, the root's last one before the optimizer step (which
    # waits for it); the middle ones hide under a phase's compute as far as it lasts
    n = 2**28
    comms = [
        Comm("all_gather", 4 * n, "fsdp", 8, "", "forward"),  # the root's: first
        Comm("all_gather", n, "fsdp", 8, "layers.0", "forward"),
        Comm("all_gather", n, "fsdp", 8, "layers.0", "backward"),
        Comm("reduce_scatter", n, "fsdp", 8, "layers.0", "backward"),
        Comm("reduce_scatter", 8 * n, "fsdp", 8, "", "backward"),  # the root's: last
    ]
    nvlink = H100.nvlink_bytes_per_s / 2 * NVLINK
    first, last = ring(7 / 8, 4 * n, nvlink), ring(7 / 8, 8 * n, nvlink)
    layer = ring(7 / 8, n, nvlink)
    # a phase of memory-bound work taking 10 ms: more than any middle collective
    work = 10e-3 * H100.hbm_bytes_per_s * MEMORY
    outside = {p: {("bf16", 0, round(work), ()): 1} for p in ("forward", "backward")}
    t = step_time([], outside, comms, H100, 0)
    assert t.forward_s == pytest.approx(10e-3) and t.backward_s == pytest.approx(10e-3)
    assert t.comm_s == pytest.approx(first + last + 3 * layer, rel=1e-12)
    assert t.exposed_comm_s == pytest.approx(first + last, rel=1e-12)
    # the same collectives in another order: the edges are whichever ran first and last
    flipped = [comms[1], comms[0], *comms[2:4], comms[4]]
    assert step_time([], outside, flipped, H100, 0).exposed_comm_s == pytest.approx(
        layer + last, rel=1e-12
    )
    # tensor parallelism's (tp 2 inside FSDP 8: 16 GPUs a node here, all on NVLink) are
    # exposed whole and are no edge of FSDP's schedule
    tp = [Comm("all_reduce", n, "tp", 2, "layers.0.mlp", "forward"), *comms]
    sharp = ring(2 * 1 / 2, n, H100.nvlink_bytes_per_s / 2 * NVLS)
    node16 = replace(H100, gpus_per_node=16)
    assert step_time([], outside, tp, node16, 0).exposed_comm_s == pytest.approx(
        sharp + first + last, rel=1e-12
    )
    # so are expert parallelism's all-to-alls (the experts wait for their tokens): ep 8 is
    # one node's ranks, on NVLink, however much compute its phase has
    ep = [*comms[:2], Comm("all_to_all", n, "ep", 8, "layers.0.mlp.experts", "forward"), *comms[2:]]
    assert step_time([], outside, ep, H100, 0).exposed_comm_s == pytest.approx(
        ring(7 / 8, n, nvlink) + first + last, rel=1e-12
    )


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
        ring(2 * 1 / 2, n, gpu.network_bytes_per_s * NETWORK), rel=1e-12
    )
    assert t.comm_by_module["fsdp"] == pytest.approx(ring(1 / 2, n, nvlink * NVLINK), rel=1e-12)
    assert t.comm_by_module["tp"] == pytest.approx(ring(2 * 1 / 2, n, nvlink * NVLS), rel=1e-12)


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
    alone = mw.analyze(
        config, input_data={"input_ids": ids, "logits_to_keep": 1}, gpu="H100", launch="graphs"
    )  # generate()'s numbers assume CUDA graphs, as servers run
    assert alone.time is not None and t.launch == alone.time.launch == "graphs"
    summary = " ".join(generated.summary().split())  # as read, whatever the line breaks
    assert "CUDA graphs" in summary[summary.index("Time on H100") :] and "launch graphs" in repr(t)
    assert t.prefill_s == pytest.approx(alone.time.step_s, rel=0.05)
    assert t.prefill_s > 2 * t.per_token_s


# -- GPU variants (issue 37): datasheet peaks, and the measured fraction of a sibling part -------

H100_PEAK, NVL_PEAK = 989.4e12, 835.5e12  # H100 SXM; H100 NVL / H200 NVL (1,671 'sparse' / 2)


def test_an_nvl_card_reaches_the_sxm_parts_fraction_of_its_own_lower_peak() -> None:
    # no GEMM was measured on the NVL cards: the same GH100 at a lower clock reaches the SXM
    # part's 794.5 / 989.4 (its best shape's 256 tiles over 264 slots divided out) of 835.5
    # TFLOP/s; 4096 x 4096 is 1024 tiles, 8 waves of 132 SMs (1056 slots)
    flops = 2 * 4096**3
    best = MAMF_H100 / H100_PEAK / (256 / 264)
    for name in ("H100-NVL", "H200-NVL"):
        seconds = _matmul_s(4096, 4096, 4096, gpu=name)
        assert seconds == pytest.approx(flops / (NVL_PEAK * best * 1024 / 1056), rel=1e-9), name


def test_an_nvl_cards_flash_attention_is_the_h100s_share_of_its_peak() -> None:
    from meta_widget.timing.efficiency import attention_fraction

    shape = ("attn", "flash", "fwd", 16, 16384, 16384, 128, False)
    fraction = attention_fraction(resolve_gpu("H100-NVL"), "bf16", shape)
    assert fraction == pytest.approx(FA2_H100 / H100_PEAK * 16384 / (16384 + 128), rel=1e-9)


def test_h200_fp8_and_b200_gemms_run_at_their_own_measured_best() -> None:
    from meta_widget.timing.model import op_seconds

    # MAMF: H200 SXM FP8 1,453.4 TFLOP/s at 1280 x 4096 x 12032 (not the H100's 1,402.6)
    m, n, k = 1280, 4096, 12032
    cost = ("fp8", 2 * m * n * k, m * k + k * n + 2 * m * n, ("mm", m, n, k, 1))
    assert op_seconds(cost, resolve_gpu("H200"))[0] == pytest.approx(
        2 * m * n * k / 1453.4e12, rel=1e-9
    )
    # B200 SXM BF16 1,745 TFLOP/s at 1792 x 16128 x 3072 (whole tiles; no SM count: no waves)
    assert _matmul_s(1792, 16128, 3072, gpu="B200") == pytest.approx(
        2 * 1792 * 16128 * 3072 / 1745e12, rel=1e-9
    )
    assert _matmul_s(4096, 4096, 4096, gpu="B200") == pytest.approx(2 * 4096**3 / 1745e12)


def test_a_bridged_pcie_pair_talks_over_nvlink_and_a_third_rank_over_the_network() -> None:
    # H100 PCIe with NVLink bridges: 600 GB/s both ways between the two cards of a pair, no
    # NVLink SHARP (no switch): the ring at 370/450 of one direction
    pair = resolve_gpu("H100-PCIe-NVLink")
    n = 2**30
    two = step_time([], {}, [Comm("all_reduce", n, "fsdp", 2, "pair")], pair, 0).comm_s
    assert two == pytest.approx(ring(2 * 1 / 2, n, 300e9 * NVLINK), rel=1e-12)
    four = step_time([], {}, [Comm("all_reduce", n, "fsdp", 4, "quad")], pair, 0).comm_s
    assert four == pytest.approx(ring(2 * 3 / 4, n, 50e9 * NETWORK), rel=1e-12)
    plain = resolve_gpu("H100-PCIe")  # without the bridge: PCIe Gen5, 128 GB/s both ways
    assert step_time([], {}, [Comm("all_reduce", n, "fsdp", 2, "pcie")], plain, 0).comm_s == (
        pytest.approx(ring(2 * 1 / 2, n, 64e9 * NVLINK), rel=1e-12)
    )
