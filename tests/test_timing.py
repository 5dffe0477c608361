"""The time model (``analyze(..., gpu=)``, ``mw.gpus()``, ``mw.GPU``) against independent truths.

Truths: the datasheets' figures written here by hand; ``FlopCounterMode`` counting the same
model on meta; bytes of parameters summed from the model; each op's time recomputed here from
the recorded costs with the documented formula; PyTorch's own device table
(``torch/_inductor/analysis/device_info.py``) where it agrees with the datasheets.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import meta_widget as mw
from meta_widget.timing.gpus import resolve_gpu

GIB = 2**30

#: the datasheet figures, written from the datasheets (not from the table): name -> column ->
#: value. NVIDIA prints Tensor Core FLOPS "with sparsity" since Hopper: halved here.
DATASHEETS: dict[str, dict[str, float]] = {
    # NVIDIA H100 datasheet, SXM: "BF16 Tensor Core 1,979 teraFLOPS*" (*with sparsity),
    # "FP8 3,958", "TF32 989", "GPU memory 80GB", "bandwidth 3.35TB/s", "NVLink 900GB/s"
    "H100": {
        "bf16_flops": 1979e12 / 2,
        "fp16_flops": 1979e12 / 2,
        "fp8_flops": 3958e12 / 2,
        "tf32_flops": 989e12 / 2,
        "fp32_flops": 67e12,
        "memory_bytes": 80 * GIB,
        "hbm_bytes_per_s": 3.35e12,
        "nvlink_bytes_per_s": 900e9,
    },
    # NVIDIA A100 datasheet: "BF16 312 TFLOPS | 624*", "TF32 156 | 312*", "FP32 19.5",
    # 80GB HBM2e SXM "2,039GB/s"; 40GB HBM2 "1,555GB/s"; NVLink 600GB/s
    "A100-80GB": {
        "bf16_flops": 312e12,
        "tf32_flops": 156e12,
        "fp32_flops": 19.5e12,
        "memory_bytes": 80 * GIB,
        "hbm_bytes_per_s": 2039e9,
        "nvlink_bytes_per_s": 600e9,
    },
    "A100-40GB": {"memory_bytes": 40 * GIB, "hbm_bytes_per_s": 1555e9, "bf16_flops": 312e12},
    # NVIDIA H200 datasheet: 141GB HBM3e, 4.8TB/s, the H100's Tensor Core figures
    "H200": {"memory_bytes": 141 * GIB, "hbm_bytes_per_s": 4.8e12, "bf16_flops": 1979e12 / 2},
    # NVIDIA H100 datasheet, H100 NVL column: "BF16 1,671*", "FP8 3,341*", "TF32 835*", "FP32
    # 60", 94GB, 3.9TB/s, NVLink 600GB/s (a bridged pair)
    "H100-NVL": {
        "bf16_flops": 1671e12 / 2,
        "fp8_flops": 3341e12 / 2,
        "tf32_flops": 835e12 / 2,
        "fp32_flops": 60e12,
        "memory_bytes": 94 * GIB,
        "hbm_bytes_per_s": 3.9e12,
        "nvlink_bytes_per_s": 600e9,
        "gpus_per_node": 2,
    },
    # NVIDIA H200 datasheet, H200 NVL column: the H100 NVL's Tensor Core figures, 141GB,
    # 4.8TB/s, "2- or 4-way NVIDIA NVLink bridge: 900GB/s per GPU"
    "H200-NVL": {
        "bf16_flops": 1671e12 / 2,
        "fp8_flops": 3341e12 / 2,
        "memory_bytes": 141 * GIB,
        "hbm_bytes_per_s": 4.8e12,
        "nvlink_bytes_per_s": 900e9,
        "gpus_per_node": 4,
    },
    # the H100 PCIe with its NVLink bridges: "NVLink 600GB/s" joining a pair, the PCIe card's
    # peaks ("BF16 1,513*")
    "H100-PCIe-NVLink": {
        "bf16_flops": 1513e12 / 2,
        "nvlink_bytes_per_s": 600e9,
        "gpus_per_node": 2,
        "hbm_bytes_per_s": 2e12,
    },
    # NVIDIA L4 datasheet: "BF16 242 teraFLOPS*" (*with sparsity), "FP8 485*", 24GB, 300GB/s
    "L4": {
        "bf16_flops": 242e12 / 2,
        "fp8_flops": 485e12 / 2,
        "fp32_flops": 30.3e12,
        "memory_bytes": 24 * GIB,
        "hbm_bytes_per_s": 300e9,
    },
    # AMD Instinct MI300X data sheet: FP16/BF16 1307.4 TFLOPS (dense), FP8 2614.9, 192GB HBM3,
    # 5.3TB/s
    "MI300X": {
        "bf16_flops": 1307.4e12,
        "fp8_flops": 2614.9e12,
        "memory_bytes": 192 * GIB,
        "hbm_bytes_per_s": 5.3e12,
    },
}

#: the documented efficiencies (docs/speed-model.md), written here, not read from the code;
#: the fraction of a peak a GEMM or an attention kernel reaches by its shape is
#: ``meta_widget.timing.efficiency``'s, pinned to its cited figures in test_time_pins.py
MEMORY, KERNEL_S = 0.77, 5e-6


def close(a: float, b: float, rel: float = 2e-3) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b))


# -- the table ----------------------------------------------------------------------------------


def test_the_table_has_every_named_accelerator_and_column() -> None:
    table = mw.gpus()
    for name in (
        "A100-40GB",
        "A100-80GB",
        "H100",
        "H100-PCIe",
        "H200",
        "H100-NVL",
        "H200-NVL",
        "H100-PCIe-NVLink",
        "B200",
        "L4",
        "L40S",
        "RTX-4090",
        "MI300X",
    ):
        assert name in table.index
    for column in (
        "memory_bytes",
        "hbm_bytes_per_s",
        "fp32_flops",
        "tf32_flops",
        "bf16_flops",
        "fp16_flops",
        "fp8_flops",
        "nvlink_bytes_per_s",
        "network_bytes_per_s",
        "source",
    ):
        assert column in table.columns
    assert table["source"].map(bool).all()


@pytest.mark.parametrize("name", sorted(DATASHEETS))
def test_table_rows_match_their_cited_figures(name: str) -> None:
    row = mw.gpus().loc[name]
    for column, cited in DATASHEETS[name].items():
        assert close(float(row[column]), cited), (name, column, row[column], cited)


def test_dense_never_sparse() -> None:
    # H100 SXM BF16 dense is 989.4 TFLOPS; 1,979 is the figure with 2:4 sparsity
    assert mw.gpus().loc["H100", "bf16_flops"] < 1.0e15


#: where PyTorch's table (its dense figure: ``tops / tops_sparsity_factor``) differs from the
#: datasheets by more than 0.5 %, as docs/speed-model.md lists them
PYTORCH_DIFFERS = {
    ("NVIDIA H100", "float32"),  # 67 halved as if sparse: 33.5; the datasheet's 67 is dense
    ("NVIDIA L4", "bfloat16"),  # the "with sparsity" 242, not halved
    ("NVIDIA L4", "float16"),
    ("NVIDIA L4", "tf32"),
    ("NVIDIA L4", "float8_e5m2"),
    ("NVIDIA L4", "bandwidth"),  # 3,350 GB/s (the H100's); the L4 has 300 GB/s
}


def test_pytorch_table_agrees_except_where_documented() -> None:
    info = pytest.importorskip("torch._inductor.analysis.device_info")
    ours = {"NVIDIA H100": "H100", "NVIDIA A100": "A100-80GB", "NVIDIA L4": "L4"}
    ours["AMD MI300X"] = "MI300X"
    columns = {
        torch.float32: "fp32_flops",
        "torch.tf32": "tf32_flops",
        torch.bfloat16: "bf16_flops",
        torch.float16: "fp16_flops",
        torch.float8_e5m2: "fp8_flops",
    }
    table = mw.gpus()
    differs = set()
    for device, name in ours.items():
        entry = info.lookup_device_info(device)
        if entry is None:
            continue
        for dtype, column in columns.items():
            if dtype not in entry.tops or table.loc[name, column] is None:
                continue
            theirs = entry.tops[dtype] * 1e12 / entry.tops_sparsity_factor
            if not close(theirs, float(table.loc[name, column]), 5e-3):
                differs.add((device, str(dtype).removeprefix("torch.")))
        if not close(entry.dram_bw_gbs * 1e9, float(table.loc[name, "hbm_bytes_per_s"]), 5e-3):
            differs.add((device, "bandwidth"))
    assert differs == PYTORCH_DIFFERS


def test_an_unknown_name_is_an_option_error_listing_the_known_ones() -> None:
    with pytest.raises(mw.OptionError, match=r"H100.*MI300X"):
        mw.analyze(nn.Linear(4, 4), input_size=(2, 4), gpu="H1000")
    with pytest.raises(mw.OptionTypeError):
        mw.analyze(nn.Linear(4, 4), input_size=(2, 4), gpu=3)
    with pytest.raises(mw.OptionError, match="hbm_bytes_per_s"):
        mw.GPU(name="broken", memory_bytes=GIB, hbm_bytes_per_s=-1.0, fp32_flops=1e12)


def test_names_are_read_in_any_spelling() -> None:
    a = mw.analyze(nn.Linear(4, 4), input_size=(2, 4), gpu="h100 sxm")
    assert a.time is not None and a.time.gpu.name == "H100"


def test_a_gpu_of_ones_own_is_accepted_where_a_name_is() -> None:
    model, size = _mlp, (64, 512)
    h100 = mw.analyze(model, input_size=size, gpu="H100", mode="training")
    mine = mw.GPU(
        name="my H100",
        memory_bytes=80 * GIB,
        hbm_bytes_per_s=3.35e12,
        fp32_flops=66.9e12,
        tf32_flops=494.7e12,
        bf16_flops=989.4e12,
        fp16_flops=989.4e12,
        fp8_flops=1978.9e12,
        nvlink_bytes_per_s=900e9,
        network_bytes_per_s=50e9,
    )
    a = mw.analyze(model, input_size=size, gpu=mine, mode="training")
    assert a.time is not None and h100.time is not None
    assert a.time.gpu is mine
    assert close(a.time.step_s, h100.time.step_s, 1e-9)
    slower = dataclasses.replace(mine, name="half", fp32_flops=mine.fp32_flops / 2)
    assert mw.analyze(model, input_size=size, gpu=slower, mode="training").time.step_s > (
        a.time.step_s
    )


def test_without_gpu_there_is_no_time() -> None:
    a = mw.analyze(_mlp, input_size=(4, 512))
    assert a.time is None
    df = a.to_dataframe()
    assert df["time_s"].isna().all() and df["bound"].isna().all()


# -- the bounds a step can never beat -------------------------------------------------------------


def _mlp() -> nn.Module:
    return nn.Sequential(
        nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 2048), nn.GELU(), nn.Linear(2048, 512)
    )


def _counted_flops(make: Any, size: tuple[int, ...], training: bool, **kw: Any) -> int:
    """FlopCounterMode over the model's forward (and backward) on meta."""
    with torch.device("meta"):
        model = make()
    x = torch.randn(*size, device="meta")
    with FlopCounterMode(display=False) as counter:
        with torch.autocast("cpu", torch.bfloat16, enabled=kw.get("autocast") is not None):
            out = model(x)
        if training:
            out.sum().backward()
    return int(counter.get_total_flops())


@pytest.mark.parametrize("mode", ["inference", "training"])
@pytest.mark.parametrize("autocast", [None, torch.bfloat16])
@pytest.mark.parametrize("gpu", ["H100", "A100-80GB", "L4"])
def test_a_step_never_beats_flops_over_the_dense_peak(mode: str, autocast: Any, gpu: str) -> None:
    a = mw.analyze(_mlp, input_size=(256, 512), mode=mode, autocast=autocast, gpu=gpu)
    flops = _counted_flops(_mlp, (256, 512), mode == "training")
    assert a.total_flops == flops
    # the fastest peak the step could use: BF16 with autocast, FP32 (no TF32 for matmuls) else
    peak = DATASHEETS[gpu]["bf16_flops"] if autocast is not None else DATASHEETS[gpu]["fp32_flops"]
    assert a.time is not None
    assert a.time.step_s >= flops / peak
    assert a.time.step_s >= flops / DATASHEETS[gpu]["bf16_flops"]


def _llama(layers: int = 2, dtype: Any = None) -> Any:
    import transformers

    config = transformers.LlamaConfig(
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=layers,
        num_attention_heads=8,
        num_key_value_heads=8,
        vocab_size=4096,
        attn_implementation="sdpa",
    )
    if dtype is not None:
        config.torch_dtype = dtype
    return config


def test_causal_attention_runs_half_its_flops_and_a_pass_still_never_beats_the_peak() -> None:
    import transformers

    config = _llama()
    size = (2, 1024)
    a = mw.analyze(config, input_size=size, autocast=torch.bfloat16, gpu="H100")
    # FlopCounterMode on meta (a forward counts the same on every attention path), the
    # attention ops apart: what flash attention's is_causal skips is half of them
    with torch.device("meta"):
        model = transformers.LlamaModel(config).eval()
    ids = torch.zeros(size, dtype=torch.long, device="meta")
    with (
        FlopCounterMode(display=False) as counter,
        torch.no_grad(),
        torch.autocast("cpu", torch.bfloat16),
    ):
        model(ids)
    # QK^T and PV: 2 matmuls of 2 * batch * heads * T * T * head_dim FLOPs, per layer
    batch, t = size
    attention = config.num_hidden_layers * 2 * 2 * batch * t * t * config.hidden_size
    assert a.total_flops == counter.get_total_flops()
    executed = sum(cost[1] * n for c in a.calls for cost, n in c.costs.items() if cost[0] == "bf16")
    assert executed == a.total_flops - attention // 2
    assert a.time is not None
    assert a.time.step_s >= executed / DATASHEETS["H100"]["bf16_flops"]
    # mfu counts FlopCounterMode's FLOPs, the causal half included
    assert close(a.time.mfu, a.total_flops / (a.time.step_s * DATASHEETS["H100"]["bf16_flops"]))


def test_a_one_token_forward_never_beats_weight_bytes_over_hbm() -> None:
    import transformers

    config = _llama(layers=4)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())  # tied: once
    for gpu in ("H100", "A100-80GB", "MI300X", "L4"):
        a = mw.analyze(model, input_size=(1, 1), gpu=gpu)
        assert a.time is not None
        assert a.time.step_s >= weights / DATASHEETS[gpu]["hbm_bytes_per_s"]


def test_mfu_is_flops_over_step_time_times_the_peak() -> None:
    a = mw.analyze(
        _mlp, input_size=(512, 512), mode="training", autocast=torch.bfloat16, gpu="H100"
    )
    flops = _counted_flops(_mlp, (512, 512), True)
    assert a.time is not None
    assert close(a.time.mfu, flops / (a.time.step_s * DATASHEETS["H100"]["bf16_flops"]))
    fp32 = mw.analyze(_mlp, input_size=(512, 512), mode="training", gpu="H100")
    assert fp32.time is not None
    assert close(fp32.time.mfu, flops / (fp32.time.step_s * DATASHEETS["H100"]["fp32_flops"]))


class _Blocks(nn.Module):
    """Residual MLP blocks in a ModuleList: what ``activation_checkpointing=True`` picks."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList(
            nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)) for _ in range(3)
        )
        self.head = nn.Linear(64, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = x + layer(x)
        return self.head(x)


def _real_step_flops(model: nn.Module, x: Any, checkpointed: bool) -> int:
    """FlopCounterMode over a real CPU forward and backward on ``x`` (a tensor, or keyword
    arguments), every child of the model's ModuleLists run by ``torch.utils.checkpoint``
    (non-reentrant) when ``checkpointed``: the counter then sees the recomputed forwards too."""
    from torch.utils.checkpoint import checkpoint

    for m in list(model.modules()) if checkpointed else ():
        for block in m if isinstance(m, nn.ModuleList) else ():
            forward = block.forward

            def run(*args: Any, forward: Any = forward, **kwargs: Any) -> Any:
                return checkpoint(forward, *args, use_reentrant=False, **kwargs)

            block.forward = run  # type: ignore[method-assign]
    with FlopCounterMode(display=False) as counter:
        out = model(**x) if isinstance(x, dict) else model(x)
        (out.logits if hasattr(out, "logits") else out).sum().backward()
    return int(counter.get_total_flops())


def _eager_llama() -> tuple[nn.Module, dict[str, Any]]:
    """A tiny Llama whose attention is matmuls (FlopCounterMode counts no CPU SDPA kernel),
    trained without a KV cache (a checkpointed layer would append its keys again)."""
    from models import llama_config, real

    config = llama_config()
    config._attn_implementation = "eager"
    return real(config).train(), {"input_ids": torch.randint(0, 100, (2, 16)), "use_cache": False}


@pytest.mark.parametrize("case", ["blocks", "llama"])
def test_mfu_leaves_out_the_recomputation_and_hfu_counts_it(case: str) -> None:
    """MFU as PaLM defines it counts the model's FLOPs (forward and backward), HFU every FLOP the
    step executes, activation checkpointing's recomputed forwards included. Truth, by hand:
    FlopCounterMode over a real CPU step with the same modules checkpointed (it counts the
    recomputation) and without (it does not): hfu / mfu is their ratio, and without
    checkpointing mfu == hfu."""
    model, x = (_Blocks(), torch.randn(32, 64)) if case == "blocks" else _eager_llama()
    with_recompute = _real_step_flops(copy.deepcopy(model), x, True)
    without = _real_step_flops(copy.deepcopy(model), x, False)
    assert with_recompute > without

    def timed(checkpointing: bool) -> Any:
        a = mw.analyze(
            model, input_data=x, mode="training", gpu="H100",
            activation_checkpointing=checkpointing,
        )  # fmt: skip
        assert a.error is None and a.time is not None, a.error
        return a.time

    t = timed(True)
    assert t.flops == with_recompute and t.model_flops == without
    assert t.hfu / t.mfu == pytest.approx(with_recompute / without, rel=1e-12)
    assert t.mfu == pytest.approx(without / (t.step_s * t.peak_flops), rel=1e-12)
    assert "HFU" in repr(t)
    plain = timed(False)
    assert plain.recompute_flops == 0 and plain.mfu == plain.hfu
    assert plain.flops == without
    assert "HFU" not in repr(plain)


# -- per op, per module ---------------------------------------------------------------------------


def _op_time(cost: tuple[Any, ...], gpu: str, floor: float = KERNEL_S) -> float:
    """The documented formula, from the datasheet figures written above."""
    from meta_widget.timing.efficiency import compute_fraction

    kind, flops, nbytes, shape = cost
    peak = DATASHEETS[gpu]["bf16_flops" if kind == "bf16" else "fp32_flops"]
    fraction = compute_fraction(resolve_gpu(gpu), kind, shape)
    return max(
        flops / (peak * fraction),
        nbytes / (DATASHEETS[gpu]["hbm_bytes_per_s"] * MEMORY),
        floor,
    )


def test_per_module_time_adds_up_to_the_total() -> None:
    a = mw.analyze(
        _llama(), input_size=(2, 256), mode="training", autocast=torch.bfloat16, gpu="H100"
    )
    assert a.time is not None
    calls = a.to_dataframe(per="call")
    own = {
        c.index: sum(
            _op_time(cost, "H100") * n
            for table in (c.costs, c.backward_costs)
            for cost, n in table.items()
        )
        for c in a.calls
    }
    children: dict[int, list[int]] = {}
    for c in a.calls:
        children.setdefault(c.parent, []).append(c.index)
    for c in a.calls:
        expected = own[c.index] + sum(calls.time_s[k] for k in children.get(c.index, []))
        assert close(calls.time_s[c.index], expected, 1e-9)
    outside = sum(
        _op_time(cost, "H100", 0.0 if phase == "optimizer" else KERNEL_S) * n
        for phase, table in a.orphan_costs.items()
        for cost, n in table.items()
    )
    roots = [c.index for c in a.calls if c.parent < 0]
    total = sum(calls.time_s[k] for k in roots) + outside
    assert close(total, a.time.forward_s + a.time.backward_s + a.time.optimizer_s, 1e-9)
    assert a.time.comm_s == 0 and close(a.time.step_s, total, 1e-9)
    modules = a.to_dataframe()
    assert close(modules.time_s[0], sum(calls.time_s[k] for k in roots), 1e-9)
    assert set(modules.bound.dropna()) <= {"compute", "memory", "comm"}


def test_a_linear_costs_its_inputs_and_output_bytes_and_its_flops() -> None:
    a = mw.analyze(nn.Linear(64, 32), input_size=(8, 64), gpu="H100")
    (call,) = a.calls
    # aten.t is a view (free); addmm(bias, x, w.t()) reads 32 + 8x64 + 64x32 floats, writes 8x32;
    # its shape: M 8, N 32, K 64, one matrix
    nbytes = 4 * (32 + 8 * 64 + 64 * 32 + 8 * 32)
    assert call.costs == {("fp32", 2 * 8 * 64 * 32, nbytes, ("mm", 8, 32, 64, 1)): 1}


def test_an_embedding_lookup_costs_the_rows_it_reads_not_the_table() -> None:
    """A gather reads of its table only the rows it outputs: a 3-token lookup in a 100,000 x
    1,024 float32 table moves the 3 int64 indices, the 3 rows read and the 3 rows written, not
    the table's 400 MB (which a one-token forward would otherwise wait 0.1 ms for on an H100)."""
    a = mw.analyze(nn.Embedding(100_000, 1024), input_data=torch.tensor([[1, 2, 3]]), gpu="H100")
    (call,) = a.calls
    assert call.costs == {("", 0, 8 * 3 + 2 * 3 * 1024 * 4, ()): 1}
    assert a.time is not None and a.time.step_s < 100_000 * 1024 * 4 / 3.35e12


def test_the_op_cache_and_replay_record_what_running_again_would() -> None:
    config = _llama(layers=3)
    for kw in ({}, {"mode": "training"}):
        fast = mw.analyze(config, input_size=(2, 64), fast=True, **kw)
        slow = mw.analyze(config, input_size=(2, 64), fast=False, **kw)
        assert fast.fast_path is not None
        assert fast.fast_path.hits + fast.fast_path.replayed > 0
        assert [c.costs for c in fast.calls] == [c.costs for c in slow.calls]
        assert [c.backward_costs for c in fast.calls] == [c.backward_costs for c in slow.calls]


def test_tokens_per_s_counts_the_batch_times_the_sequence() -> None:
    a = mw.analyze(_llama(), input_size=(4, 256), mode="training", micro_batches=2, gpu="H100")
    assert a.time is not None and a.time.tokens_per_s is not None
    assert close(a.time.tokens_per_s, 4 * 256 * 2 / a.time.step_s)
    images = mw.analyze(_mlp, input_size=(16, 512), gpu="H100")
    assert images.time is not None and images.time.tokens_per_s is None
    assert close(images.time.samples_per_s or 0.0, 16 / images.time.step_s)


# -- collectives ----------------------------------------------------------------------------------

#: one direction of NVLink (900 GB/s both ways) and a DGX H100's 400 Gb/s NIC per GPU, each at
#: the documented link efficiency; the documented latency of one collective
#: (NCCL: 370 of NVLink's 450 GB/s one way, 480 with NVLink SHARP for an all-reduce; 47 of a
#: 50 GB/s NIC)
NVLINK_ONE_WAY, NETWORK, COLLECTIVE_S = 900e9 / 2, 400e9 / 8, 10e-6
NVLINK, NVLS, NIC = 370 / 450, 480 / 450, 47 / 50


@pytest.mark.parametrize(
    "parallel",
    [
        {"fsdp": 2},
        {"fsdp": 16},
        {"fsdp": 2, "tp": 2, "tp_plan": {"layers.*.0": "colwise", "layers.*.2": "rowwise"}},
    ],
)
def test_collectives_take_ring_time_and_fsdp_overlaps_with_compute(parallel: Any) -> None:
    from parallel_truth import DeepMLP

    a = mw.analyze(DeepMLP, input_size=(8, 256), mode="training", parallel=parallel, gpu="H100")
    assert a.time is not None and a.error is None
    tp = parallel.get("tp", 1)
    total = 0.0
    overlapped: dict[str, float] = {}
    exposed = 0.0
    # FSDP's schedule: its first collective of the forward (before any layer runs) and its last
    # of the backward (the optimizer step waits for it) have no compute beside them
    fsdp = a.comms[a.comms.group != "tp"]
    first = fsdp.index[fsdp.phase == "forward"][0]
    last = fsdp.index[fsdp.phase == "backward"][-1]
    for row in a.comms.itertuples():
        p = row.group_size
        ranks_apart = tp if row.group == "fsdp" else 1
        if p * ranks_apart <= 8:
            sharp = row.collective == "all_reduce"  # an H100 node reduces in the switch
            bandwidth = NVLINK_ONE_WAY * (NVLS if sharp else NVLINK)
        else:
            bandwidth = NETWORK * NIC
        share = {"all_reduce": 2 * (p - 1) / p}.get(row.collective, (p - 1) / p)
        t = share * row.bytes / bandwidth + COLLECTIVE_S
        total += t
        if row.group == "tp" or row.Index in (first, last):
            exposed += t
        else:
            overlapped[row.phase] = overlapped.get(row.phase, 0.0) + t
    assert total > 0 and close(a.time.comm_s, total, 1e-9)
    compute = {
        "forward": a.time.forward_s,
        "backward": a.time.backward_s,
        "optimizer": a.time.optimizer_s,
    }
    exposed += sum(max(0.0, t - compute[phase]) for phase, t in overlapped.items())
    assert close(a.time.exposed_comm_s, exposed, 1e-9)
    assert close(a.time.step_s, sum(compute.values()) + exposed, 1e-9)
    # the job's samples: one rank's batch times the data-parallel ranks
    assert close(a.time.samples_per_s or 0.0, 8 * parallel["fsdp"] / a.time.step_s)
    bounds = a.to_dataframe().set_index("module").bound
    if parallel["fsdp"] == 16:  # 16 ranks span two nodes: the network is the bottleneck
        assert bounds["layers.0"] == "comm"


def test_the_same_trace_times_on_any_gpu_without_tracing_again() -> None:
    a = mw.analyze(_mlp, input_size=(256, 512), mode="training", gpu="H100")
    b = mw.analyze(_mlp, input_size=(256, 512), mode="training", gpu="A100-80GB")
    assert a.time is not None and b.time is not None
    again = a.time_on("A100-80GB")
    assert again.step_s == b.time.step_s and again.mfu == b.time.mfu
    assert a.time_on("H100") == a.time
