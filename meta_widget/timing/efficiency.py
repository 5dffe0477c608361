"""What fraction of a datasheet figure a kernel reaches, from what the trace knows of it: one
table, every number with its source (``docs/speed-model.md``, "The efficiencies").

- **Matrix multiplies** (``("mm", M, N, K, batch)``): the best a GEMM reaches on the part and
  precision (the *Maximum Achievable Matmul FLOPS* a search over shapes found, ``GEMM_BEST``),
  divided by how well its best shape fills the GPU, times how well this shape does:
  :func:`tiles_fraction`, the output's ``128 x 128`` tiles over the GPU's SMs (padding of
  partial tiles, and wave quantization when there are more tiles than SMs: a last wave that runs
  part full; fewer tiles than SMs are taken to be split along ``K``, as cuBLAS does).
- **Fused attention** (``("attn", kernel, direction, heads, Lq, Lk, D, causal)``): the kernel's
  measured rate at long sequences for its direction and head dim (``ATTENTION_BEST``; the
  nearest head dim measured), times ``span / (span + 128 w)`` with ``span`` the keys a query
  tile visits (``Lk``, half of it when causal) and ``w`` the outputs a tile writes (forward:
  ``O``, 1; backward: ``dK`` and ``dV``, 2): each costs about one key block's time. Checked
  against the same tables at 512 to 8k keys (``benchmarks/published``).
- **Memory-bound work**: ``HBM_FRACTION`` of the datasheet bandwidth.
- **Collectives**: ``NVLINK_FRACTION`` of one direction of NVLink, ``NETWORK_FRACTION`` of a
  GPU's network share, as NCCL's bus bandwidth measures them; an all-reduce inside an H100 or
  H200 node ``NVLS_FRACTION`` (NVLink SHARP: the switch reduces).
- **Launch**: in eager PyTorch no op takes less than ``EAGER_OP_S`` of host time; replayed CUDA
  graphs (``launch="graphs"``: servers, ``torch.compile(mode="reduce-overhead")``) pay none.

Where no figure was read for a part or a precision (float32 without tensor cores, TF32, a GPU of
your own), ``FALLBACK_COMPUTE`` stands in: the model's former constant, an assumption.
"""

from __future__ import annotations

import math
from typing import Any

from .gpus import GPU, GPUS

__all__ = [
    "ATTENTION_BEST",
    "EAGER_OP_S",
    "FALLBACK_COMPUTE",
    "GEMM_BEST",
    "HBM_FRACTION",
    "NETWORK_FRACTION",
    "NVLINK_FRACTION",
    "NVLS_FRACTION",
    "NVLS_PARTS",
    "SAME_FRACTION",
    "TILE",
    "attention_fraction",
    "compute_fraction",
    "gemm_fraction",
    "tiles_fraction",
]

_MAMF = (
    "Stas Bekman, Machine Learning Engineering, 'Maximum Achievable Matmul FLOPS comparison "
    "table' (mamf-finder.py), https://github.com/stas00/ml-engineering/blob/master/compute/"
    "accelerator/README.md"
)
_FA3 = (
    "FlashAttention-3 paper (arXiv:2407.08608), 'Attention forward speed, head dim 128 (H100 "
    "80GB SXM5)', FlashAttention-2 bars at seq 16k, as transcribed at https://subtext.edge."
    "nugit.net/image/e27582d2db385c9bac87ebc92343d2452b7c01d5d934e596c90172b346d00d42 "
    "(non-causal) and .../4ec6690918d4df7a49f27715412cc425602eb075dfe3f7821cddc4a74f058ca1 "
    "(causal)"
)

#: the output tile of cuBLAS's large GEMM kernels on Ampere and Hopper (the kernels pytorch
#: issue 181718 names: ``..._bf16_128x128_...``), and of FlashAttention's query blocks
TILE = 128

#: best GEMM rate measured, by (GPU name of ``mw.gpus()``, peak class): (TFLOP/s, the shape
#: M, N, K it was reached at or None, source)
GEMM_BEST: dict[tuple[str, str], tuple[float, tuple[int, int, int] | None, str]] = {
    ("H100", "bf16"): (794.5, (2048, 2048, 13312), _MAMF + ", H100 SXM, torch 2.7.0+cu126"),
    ("H100", "fp8"): (1402.6, (1024, 9216, 14336), _MAMF + ", H100 SXM, float8_e4m3fn"),
    ("A100-80GB", "bf16"): (271.2, (1024, 10240, 5120), _MAMF + ", A100 SXM, torch 2.6.0"),
    ("MI300X", "bf16"): (668.4, (10240, 15360, 8192), _MAMF + ", PYTORCH_TUNABLEOP_ENABLED=1"),
    ("H200", "fp8"): (1453.4, (1280, 4096, 12032), _MAMF + ", H200 SXM, torch 2.7.1+cu128"),
    ("B200", "bf16"): (1745.0, (1792, 16128, 3072), _MAMF + ", B200 SXM, torch 2.7.1+cu128"),
    ("B200", "fp8"): (3432.5, (15360, 4096, 3072), _MAMF + ", B200 SXM, float8_e4m3fn"),
}
#: parts and precisions that take another entry's figure: (name, peak) -> (name, peak)
_SAME_AS = {
    ("H200", "bf16"): ("H100", "bf16"),  # the same GH100 die and peaks ('H200 is the same')
    ("A100-40GB", "bf16"): ("A100-80GB", "bf16"),
}
#: parts no figure was read for, the same die as another at a lower clock (their peaks are
#: lower in the same ratio): taken to reach the same *fraction* of their own peaks as that
#: part, GEMMs and attention alike (an assumption; the PCIe parts run at 350-600 W)
SAME_FRACTION = {"H100-NVL": "H100", "H200-NVL": "H200", "H100-PCIe-NVLink": "H100-PCIe"}

#: fused attention at 16k keys (its plateau), by (kernel, GPU name, direction, head dim):
#: (TFLOP/s non-causal, causal or None, source)
ATTENTION_BEST: dict[tuple[str, str, str, int], tuple[float, float | None, str]] = {
    ("flash", "H100", "fwd", 64): (
        324.0,
        None,
        "FlashAttention-3 paper, 'Attention forward speed, head dim 64 (H100 80GB SXM5)', "
        "FlashAttention-2 bar at 16k, as transcribed at https://subtext.edge.nugit.net/image/"
        "55f47a106c25f22983b2741a7e8bcdbaec8521b6a583d130c6f92b94e0f65924",
    ),
    ("flash", "H100", "fwd", 128): (370.0, 335.0, _FA3),
    ("flash", "H100", "fwd", 256): (
        298.0,
        None,
        "FlashAttention-3 paper, 'Attention forward speed, head dim 256 (H100 80GB SXM5)', "
        "FlashAttention-2 bar at 16k, as transcribed at https://subtext.edge.nugit.net/image/"
        "662fef77d03ef90933e0bf349be79e2e8ba39c73aa1f09020aee8016df309aba",
    ),
    ("flash", "H100", "bwd", 128): (
        322.0,
        None,
        "FlashAttention-3 paper, 'Attention backward speed, head dim 128 (H100 80GB SXM5)', "
        "FlashAttention-2 bar at 16k, as transcribed at https://subtext.edge.nugit.net/image/"
        "f60142e2221e7ea9f80b7017987fabedaaa04df4adeb1a9e7b0a3defac28a701",
    ),
}
#: a causal kernel where only the non-causal rate was read: FlashAttention-2's forward ratio at
#: head dim 128 (335 / 370), an assumption
_CAUSAL_RATIO = 335.0 / 370.0

#: decode reaches this fraction of the datasheet HBM bandwidth
HBM_FRACTION = 0.77
HBM_SOURCE = (
    "John Musgrave, 'vLLM throughput-latency sweep on NVIDIA A100' (https://johnmusgrave.com/p/"
    "vllm-throughput-latency-sweep-on): Llama-3.1-8B decode at batch 1 'roughly 77% of the "
    "GPU's memory-bandwidth ceiling'"
)
#: NCCL's bus bandwidth over NVLink: 370 of NVLink 4's 450 GB/s one way
NVLINK_FRACTION = 370 / 450
NVLINK_SOURCE = (
    "NVIDIA/nccl-tests issue 212 (NCCL maintainer): 'effective NVLink bandwidth of 370GB/s'"
)
#: all-reduce inside an NVSwitch node of these parts runs NVLink SHARP (NCCL's NVLS, the switch
#: reduces): a bus bandwidth of ~480 GB/s on 8 GPUs, past the ring's 370 (of 450 one way)
NVLS_PARTS = frozenset({"H100", "H200"})
NVLS_FRACTION = 480 / 450
NVLS_SOURCE = (
    "NVIDIA/nccl-tests issue 212 (NCCL maintainer): 'allreduce uses NVLink SHARP by default... "
    "On 8 GPUs, you should reach a peak busBw of ~480GB/s'"
)
#: NCCL's ring bus bandwidth over the network: 47 of a 400 Gb/s (50 GB/s) NIC
NETWORK_FRACTION = 47 / 50
NETWORK_SOURCE = (
    "NVIDIA/nccl-tests issue 290 (NCCL maintainer): 'For NDR @ 400Gbps you should see "
    "46-48GB/s per NIC'"
)
#: eager PyTorch's host time per op: the lower end of '~5-25 us of CPU-side work per op'
EAGER_OP_S = 5e-6
EAGER_SOURCE = (
    "'From PyTorch op to kernel launch', https://jiahuanglin.xyz/all_lessons/gpu_kernel_serving/"
    "18_pytorch_to_kernel.html: the before-kernel total is ~5-25 us of CPU-side work per op"
)
#: where no figure was read: an assumption (the model's constant before issue 37)
FALLBACK_COMPUTE = 0.75


def tiles_fraction(gpu: GPU, m: int, n: int, batch: int = 1) -> float:
    """How well an ``m x n`` output (``batch`` of them) fills ``gpu``: the useful part of its
    ``TILE x TILE`` tiles, times the filled part of its waves over the SMs (1 when the GPU's SM
    count is not known, or when there are fewer tiles than SMs: cuBLAS then splits ``K``)."""
    if m <= 0 or n <= 0 or batch <= 0:
        return 1.0
    tiles = math.ceil(m / TILE) * math.ceil(n / TILE) * batch
    useful = m * n * batch / (tiles * TILE * TILE)
    sms = gpu.sms
    if not sms or tiles < sms:
        return useful
    return useful * tiles / (math.ceil(tiles / sms) * sms)


def _reference(gpu: GPU) -> GPU:
    """The part whose measured figures stand for ``gpu``'s, as fractions of its peaks: the
    part itself, or the one of ``SAME_FRACTION``."""
    name = SAME_FRACTION.get(gpu.name)
    return gpu if name is None else GPUS[name]


def _gemm_best(gpu: GPU, peak: str) -> tuple[float, tuple[int, int, int] | None] | None:
    ref = _reference(gpu)
    key = (ref.name, "bf16" if peak == "fp16" else peak)
    entry = GEMM_BEST.get(_SAME_AS.get(key, key))
    if entry is None:
        return None
    return entry[0] * 1e12 / ref.peak(peak), entry[1]


def gemm_fraction(
    gpu: GPU, peak: str, m: int, n: int, k: int, batch: int = 1,
    fallback: float = FALLBACK_COMPUTE,
) -> float:  # fmt: skip
    """The fraction of ``gpu``'s dense ``peak`` a GEMM of this shape reaches (module docstring);
    ``fallback`` where no figure was read for the part and precision."""
    best = _gemm_best(gpu, peak)
    if best is None:
        return fallback
    fraction, shape = best
    if shape is not None:
        fraction /= tiles_fraction(gpu, shape[0], shape[1])
    return min(1.0, fraction) * tiles_fraction(gpu, m, n, batch)


def attention_fraction(
    gpu: GPU, peak: str, shape: tuple[Any, ...], fallback: float = FALLBACK_COMPUTE
) -> float:
    """The fraction of ``gpu``'s dense ``peak`` a fused attention kernel of ``shape`` reaches
    (module docstring). A kernel or part with no figure is taken to reach the share of the
    part's best GEMM that FlashAttention-2 reaches of the H100's (an assumption)."""
    _, kernel, direction, _, _, keys, head_dim, causal = shape
    ref = _reference(gpu)
    rate = _attention_rate(kernel, ref.name, direction, head_dim, bool(causal))
    if rate is None:
        rate = _attention_rate(kernel, _alias(ref), direction, head_dim, bool(causal))
    if rate is not None:
        best = rate * 1e12 / ref.peak(peak)
    else:
        h100 = _attention_rate("flash", "H100", direction, head_dim, bool(causal))
        assert h100 is not None
        share = h100 / GEMM_BEST[("H100", "bf16")][0]
        gemm = _gemm_best(gpu, peak)
        best = share * (gemm[0] if gemm is not None else fallback)
    span = keys / 2 if causal else keys
    writes = 2 if direction == "bwd" else 1
    return best * span / (span + TILE * writes) if span > 0 else best


def _attention_rate(
    kernel: str, gpu: str, direction: str, head_dim: int, causal: bool
) -> float | None:
    """The plateau TFLOP/s of ``ATTENTION_BEST`` for the nearest head dim measured in that
    direction (the forward's where the direction has none), or None."""
    for way in (direction, "fwd"):
        dims = [d for (k, g, w, d) in ATTENTION_BEST if (k, g, w) == (kernel, gpu, way)]
        if dims:
            near = min(dims, key=lambda d: (abs(math.log2(max(head_dim, 1) / d)), d))
            plain, masked, _ = ATTENTION_BEST[(kernel, gpu, way, near)]
            if not causal:
                return plain
            return masked if masked is not None else plain * _CAUSAL_RATIO
    return None


def _alias(gpu: GPU) -> str:
    return _SAME_AS.get((gpu.name, "bf16"), (gpu.name, ""))[0]


def compute_fraction(
    gpu: GPU, peak: str, shape: tuple[Any, ...], fallback: float = FALLBACK_COMPUTE
) -> float:
    """The fraction of ``gpu``'s dense ``peak`` an op of ``shape`` (``meta_widget.trace.costs``)
    reaches: a GEMM's, a fused attention's, else the part's best GEMM's (``fallback`` where no
    figure was read)."""
    if shape and shape[0] == "mm":
        _, m, n, k, batch = shape
        return gemm_fraction(gpu, peak, m, n, k, batch, fallback)
    if shape and shape[0] == "attn":
        return attention_fraction(gpu, peak, shape, fallback)
    best = _gemm_best(gpu, peak)
    return fallback if best is None else min(1.0, best[0])
