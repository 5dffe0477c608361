"""Accelerators: :class:`GPU` (one accelerator's datasheet figures) and the table ``gpus()``.

Every figure is the vendor's, *dense* (NVIDIA's datasheets since Hopper print Tensor Core FLOPS
"with sparsity", twice the dense rate a normal matmul can reach: those are halved here), in base
units: bytes, bytes per second, FLOPs per second. ``docs/speed-model.md`` lists the sources and
where PyTorch's own table (``torch/_inductor/analysis/device_info.py``) differs.

- ``memory_bytes``: the datasheet's memory, whose "GB" are binary for HBM and GDDR (an "80GB"
  A100 reports 81,920 MiB): ``GB * 2**30``. A little of it is never free (the CUDA context).
- ``hbm_bytes_per_s``: memory bandwidth (decimal: "3.35 TB/s" is ``3.35e12``).
- ``fp32_flops`` (no tensor cores), ``tf32_flops``, ``bf16_flops``, ``fp16_flops`` (with FP32
  accumulation, as PyTorch's matmuls run), ``fp8_flops`` (None: no FP8 units).
- ``sms``: streaming multiprocessors (132 on H100 SXM and H200, 108 on A100: the SM counts of
  the caches table of Machine Learning Engineering, compute/accelerator/README.md; 114 on H100
  PCIe: the H100 whitepaper's table as HPC Tech reprints it, archive-lib.hpctech.co.jp/
  gpuproduct/nvidia-h100.html); None where none was read.
- ``nvlink_bytes_per_s``: GPU-to-GPU bandwidth inside a node as the datasheet gives it (both
  directions together; the PCIe bandwidth for cards without an NVLink switch);
  ``network_bytes_per_s``: one GPU's share of the node's network (a DGX-like server's NICs).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any

from .. import heavy
from ..options import MAX_BUDGET_BYTES, OptionError, OptionTypeError, show

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["GPU", "GPUS", "gpus", "resolve_gpu"]

T = 1e12
G = 1e9
GIB = 2**30


def _finite(value: float) -> bool:
    """Whether ``value`` is a finite number (an int past float's range is not)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


@dataclass(frozen=True)
class GPU:
    """One accelerator: its memory, bandwidths and dense peak FLOPs per second (base units).

    ``mw.GPU(name="my-card", memory_bytes=..., hbm_bytes_per_s=..., bf16_flops=..., ...)`` is a
    spec of your own, accepted wherever a name of :func:`gpus` is (``analyze(..., gpu=...)``).
    A peak left out falls back: ``tf32_flops`` to ``fp32_flops``, ``fp16_flops`` to
    ``bf16_flops``, ``fp8_flops`` to ``fp16_flops``; ``fp32_flops`` is required.

    Parameters
    ----------
    name
        What tables and figures call it.
    memory_bytes
        The memory of one device, in bytes.
    hbm_bytes_per_s
        Memory bandwidth, bytes per second.
    fp32_flops, tf32_flops, bf16_flops, fp16_flops, fp8_flops
        Dense peak FLOPs per second of each precision (never the "with sparsity" figure).
    nvlink_bytes_per_s
        GPU-to-GPU bandwidth inside a node, both directions together (the datasheet's figure).
    network_bytes_per_s
        One GPU's share of the network between nodes, one direction.
    gpus_per_node
        GPUs a node links with ``nvlink_bytes_per_s`` (8 in a DGX / HGX server).
    sms
        Streaming multiprocessors (compute units): how many GEMM tiles run at once
        (``meta_widget.timing.efficiency``); None: not known, no wave quantization.
    source
        Where the figures come from.
    """

    name: str
    memory_bytes: int
    hbm_bytes_per_s: float
    fp32_flops: float
    tf32_flops: float | None = None
    bf16_flops: float | None = None
    fp16_flops: float | None = None
    fp8_flops: float | None = None
    nvlink_bytes_per_s: float = 64 * G
    network_bytes_per_s: float = 12.5 * G
    gpus_per_node: int = 8
    sms: int | None = None
    source: str = "given by the user"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise OptionTypeError(f"GPU name must be a non-empty string, not {show(self.name)}.")
        required = ("memory_bytes", "hbm_bytes_per_s", "fp32_flops", "nvlink_bytes_per_s")
        for f in fields(self):
            if f.name in ("name", "source"):
                continue
            value = getattr(self, f.name)
            if value is None and f.name not in required:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise OptionTypeError(
                    f"GPU({self.name!r}).{f.name} must be a number, not {show(value)}."
                )
            if f.name == "memory_bytes" and value > MAX_BUDGET_BYTES:
                raise OptionError(
                    f"GPU({self.name!r}).memory_bytes={show(value)} is past 16 EiB (2**64 "
                    "bytes, all a 64-bit address space can name): give one device's memory."
                )
            if not (_finite(value) and value > 0):
                raise OptionError(
                    f"GPU({self.name!r}).{f.name} must be a positive finite number (base units: "
                    f"bytes, bytes/s, FLOPs/s), not {show(value)}."
                )
        if self.sms is not None and (
            not isinstance(self.sms, int) or isinstance(self.sms, bool) or self.sms < 1
        ):
            raise OptionError(
                f"GPU({self.name!r}).sms must be a whole number of SMs (1 or more) or None, not "
                f"{show(self.sms)}."
            )
        if not isinstance(self.gpus_per_node, int) or self.gpus_per_node > 1_000_000:
            raise OptionError(
                f"GPU({self.name!r}).gpus_per_node must be a whole number of GPUs (1 to "
                f"1,000,000), not {show(self.gpus_per_node)}."
            )

    def peak(self, kind: str) -> float:
        """The dense peak FLOPs per second for a peak class of ``meta_widget.trace.costs``:
        ``"fp32"``, ``"tf32"``, ``"bf16"``, ``"fp16"``, ``"fp8"``, ``"int8"`` (the FP8 rate),
        ``"fp64"`` (the FP32 rate: no FP64 figure is kept); the fallbacks of the class
        docstring where a figure is missing."""
        bf16 = self.bf16_flops or self.fp16_flops or self.fp32_flops
        fp16 = self.fp16_flops or bf16
        if kind in ("bf16", ""):
            return bf16
        if kind == "fp16":
            return fp16
        if kind in ("fp8", "int8"):
            return self.fp8_flops or fp16
        if kind == "tf32":
            return self.tf32_flops or self.fp32_flops
        return self.fp32_flops


_NV_A100 = (
    "NVIDIA A100 Tensor Core GPU datasheet (SXM4; dense Tensor Core figures); NVLink 600 GB/s; "
    "network: DGX A100, 8x 200 Gb/s HDR per 8 GPUs"
)
_NV_H100 = (
    "NVIDIA H100 Tensor Core GPU Architecture whitepaper, H100 SXM5 column (dense; the "
    "datasheet's 1,979 TFLOPS BF16 is 'with sparsity'); HBM3 3.35 TB/s, NVLink 900 GB/s; "
    "network: DGX H100, 8x 400 Gb/s per 8 GPUs"
)

#: the table :func:`gpus` shows, by name
GPUS: dict[str, GPU] = {
    g.name: g
    for g in (
        GPU("A100-40GB", 40 * GIB, 1555 * G, 19.5 * T, 156 * T, 312 * T, 312 * T, None,
            600 * G, 25 * G, sms=108, source=_NV_A100 + "; 40GB HBM2 at 1,555 GB/s"),
        GPU("A100-80GB", 80 * GIB, 2039 * G, 19.5 * T, 156 * T, 312 * T, 312 * T, None,
            600 * G, 25 * G, sms=108, source=_NV_A100 + "; 80GB HBM2e at 2,039 GB/s"),
        GPU("H100", 80 * GIB, 3350 * G, 66.9 * T, 494.7 * T, 989.4 * T, 989.4 * T,
            1978.9 * T, 900 * G, 50 * G, sms=132, source=_NV_H100),
        GPU("H100-PCIe", 80 * GIB, 2000 * G, 51.2 * T, 378 * T, 756 * T, 756 * T, 1513 * T,
            128 * G, 50 * G, sms=114,
            source="NVIDIA H100 whitepaper, H100 PCIe column (dense; 114 SMs); HBM2e 2 TB/s; "
            "between GPUs PCIe Gen5 x16 128 GB/s (its 600 GB/s NVLink bridge joins pairs only); "
            "network assumed 400 Gb/s per GPU"),
        GPU("H100-PCIe-NVLink", 80 * GIB, 2000 * G, 51.2 * T, 378 * T, 756 * T, 756 * T,
            1513 * T, 600 * G, 50 * G, gpus_per_node=2, sms=114,
            source="NVIDIA H100 whitepaper, H100 PCIe column (dense; 114 SMs); HBM2e 2 TB/s; a "
            "pair joined by NVLink bridges: 600 GB/s (the datasheet's NVLink figure for the "
            "PCIe card), so an NVLink group is 2 GPUs; network assumed 400 Gb/s per GPU"),
        GPU("H100-NVL", 94 * GIB, 3900 * G, 60 * T, 417.5 * T, 835.5 * T, 835.5 * T, 1670.5 * T,
            600 * G, 50 * G, gpus_per_node=2, sms=132,
            source="NVIDIA H100 datasheet, H100 NVL column (350-400 W PCIe card; Tensor Core "
            "figures 'with sparsity' halved: TF32 835, BF16/FP16 1,671, FP8 3,341; FP32 60 TF); "
            "94GB HBM3 at 3.9 TB/s; NVLink bridge 600 GB/s joining pairs; 132 SMs (the full "
            "GH100 of the SXM part at a lower clock: 835.5 / 989.4 of its peaks); network "
            "assumed 400 Gb/s per GPU"),
        GPU("H200-NVL", 141 * GIB, 4800 * G, 60 * T, 417.5 * T, 835.5 * T, 835.5 * T, 1670.5 * T,
            900 * G, 50 * G, gpus_per_node=4, sms=132,
            source="NVIDIA H200 datasheet, H200 NVL column (up to 600 W PCIe card; Tensor Core "
            "figures 'with sparsity' halved: TF32 835, BF16/FP16 1,671, FP8 3,341; FP32 60 TF); "
            "141GB HBM3e at 4.8 TB/s; 2- or 4-way NVLink bridge 900 GB/s per GPU (a group of "
            "4 taken); 132 SMs as the H100 NVL; network assumed 400 Gb/s per GPU"),
        GPU("H200", 141 * GIB, 4800 * G, 66.9 * T, 494.7 * T, 989.4 * T, 989.4 * T,
            1978.9 * T, 900 * G, 50 * G, sms=132,
            source="NVIDIA H200 datasheet (SXM): 141GB HBM3e at 4.8 TB/s, Tensor Core figures "
            "those of the H100 SXM5 (the datasheet's are 'with sparsity'); NVLink 900 GB/s; "
            "network: DGX H200, 8x 400 Gb/s per 8 GPUs"),
        GPU("B200", 180 * GIB, 8000 * G, 75 * T, 1125 * T, 2250 * T, 2250 * T, 4500 * T,
            1800 * G, 50 * G,
            source="NVIDIA DGX B200 datasheet, per GPU (totals / 8: 1,440GB HBM3e, 64 TB/s; "
            "Tensor Core figures 'with sparsity' halved: FP8 72 PF, BF16 36 PF, TF32 18 PF; FP32 "
            "600 TF); NVLink 5 1.8 TB/s; 8x 400 Gb/s per 8 GPUs"),
        GPU("L4", 24 * GIB, 300 * G, 30.3 * T, 60 * T, 121 * T, 121 * T, 242.5 * T, 64 * G,
            12.5 * G,
            source="NVIDIA L4 datasheet (Tensor Core figures 'with sparsity' halved: TF32 120, "
            "BF16/FP16 242, FP8 485); 24GB GDDR6 at 300 GB/s; PCIe Gen4 x16 64 GB/s; network "
            "assumed 100 Gb/s per GPU"),
        GPU("L40S", 48 * GIB, 864 * G, 91.6 * T, 183 * T, 362.05 * T, 362.05 * T, 733 * T,
            64 * G, 12.5 * G,
            source="NVIDIA L40S datasheet (dense figures: TF32 183, BF16/FP16 362.05, FP8 733); "
            "48GB GDDR6 at 864 GB/s; PCIe Gen4 x16 64 GB/s; network assumed 100 Gb/s per GPU"),
        GPU("RTX-4090", 24 * GIB, 1008 * G, 82.6 * T, 82.6 * T, 165.2 * T, 165.2 * T,
            330.3 * T, 64 * G, 12.5 * G,
            source="NVIDIA Ada Lovelace architecture whitepaper, GeForce RTX 4090 (dense, FP32 "
            "accumulate: FP16/BF16 165.2, FP8 330.3; FP16 accumulate would be twice); 24GB "
            "GDDR6X at 1,008 GB/s; PCIe Gen4 x16 64 GB/s; network assumed 100 Gb/s"),
        GPU("MI300X", 192 * GIB, 5300 * G, 163.4 * T, 653.7 * T, 1307.4 * T, 1307.4 * T,
            2614.9 * T, 896 * G, 50 * G,
            source="AMD Instinct MI300X data sheet (dense: FP32 matrix 163.4, TF32 653.7, "
            "BF16/FP16 1,307.4, FP8 2,614.9 TFLOPS); 192GB HBM3 at 5.3 TB/s; Infinity Fabric "
            "7x 128 GB/s = 896 GB/s; network assumed 400 Gb/s per GPU"),
    )
}  # fmt: skip


def _normal(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum())


#: other spellings of the table's names (normalized: lower case, letters and digits only)
_ALIASES = {
    "h100sxm": "H100",
    "h100sxm5": "H100",
    "h100pcie80gb": "H100-PCIe",
    "h100pcienvlink": "H100-PCIe-NVLink",
    "h100pcienvlinkbridge": "H100-PCIe-NVLink",
    "h100nvl94gb": "H100-NVL",
    "h200sxm": "H200",
    "a10040gbsxm": "A100-40GB",
    "a10080gbsxm": "A100-80GB",
    "geforcertx4090": "RTX-4090",
    "4090": "RTX-4090",
    "instinctmi300x": "MI300X",
    "amdinstinctmi300x": "MI300X",
}


def resolve_gpu(gpu: Any, argument: str = "gpu") -> GPU:
    """The :class:`GPU` a name of :func:`gpus` (any case, with or without ``-``) or a ``GPU``
    stands for; an :class:`~meta_widget.OptionError` listing the known names otherwise."""
    if isinstance(gpu, GPU):
        return gpu
    if not isinstance(gpu, str):
        raise OptionTypeError(
            f"{argument} must be a name of mw.gpus() or an mw.GPU(...), not "
            f"{type(gpu).__name__} {show(gpu)}."
        )
    by_normal = {_normal(n): n for n in GPUS}
    key = _normal(gpu)
    name = by_normal.get(key) or _ALIASES.get(key)
    if name is None:
        raise OptionError(
            f"{argument}={gpu!r} is not a known accelerator. Known: {', '.join(GPUS)}. For "
            "another one, pass its figures: mw.GPU(name=..., memory_bytes=..., "
            "hbm_bytes_per_s=..., fp32_flops=..., bf16_flops=..., ...)."
        )
    return GPUS[name]


def gpus() -> pd.DataFrame:
    """The accelerators ``analyze(..., gpu=NAME)`` knows, one row each, indexed by name.

    Columns, in base units (bytes, bytes per second, FLOPs per second, all *dense* peaks):
    ``memory_bytes``, ``hbm_bytes_per_s``, ``fp32_flops``, ``tf32_flops``, ``bf16_flops``,
    ``fp16_flops``, ``fp8_flops`` (None: no FP8 units), ``nvlink_bytes_per_s`` (inside a node,
    both directions), ``network_bytes_per_s`` (one GPU's share, between nodes),
    ``gpus_per_node`` and ``source`` (the datasheet). ``docs/speed-model.md`` says where
    PyTorch's own table differs.

    Returns
    -------
    pandas.DataFrame
        One row per accelerator; ``mw.GPU(...)`` makes one of your own.
    """
    pd = heavy.pandas()
    rows = [{k: v for k, v in asdict(g).items() if k != "name"} for g in GPUS.values()]
    return pd.DataFrame(rows, index=pd.Index(list(GPUS), name="name"))
