"""Autocast on a real GPU: predicted peaks and dtypes against ``torch.autocast("cuda", ...)``.

    python benchmarks/autocast_gpu.py

1. Op by op: the dtype each op returns under ``torch.autocast("cuda", torch.bfloat16)`` on the GPU,
   against ``meta_widget.trace.autocast.Autocast("cuda", torch.bfloat16)`` on meta tensors.
2. The corpus of ``memory_accuracy.py``, in inference and for one AdamW step, the forward pass and
   the loss under ``torch.autocast("cuda", dtype)``: ``mw.analyze(..., device="cuda",
   autocast=dtype)`` against ``torch.cuda.max_memory_allocated`` (from a reset, parameters and
   inputs on the device; the warm-up pass beforehand makes the cuBLAS workspace part of the
   baseline, as it is of any real run after its first step). Target: within 10%.

Without a CUDA device it says so and exits 0.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch
from memory_accuracy import CORPUS, _call
from torch import nn

import meta_widget as mw
from meta_widget.trace.autocast import Autocast
from meta_widget.trace.passes import default_loss

OPS: dict[str, Callable[[Callable[..., torch.Tensor]], torch.Tensor]] = {
    "linear": lambda t: nn.functional.linear(t(4, 8), nn.Parameter(t(8, 8))),
    "matmul": lambda t: t(4, 8) @ t(8, 8),
    "bmm": lambda t: torch.bmm(t(2, 4, 8), t(2, 8, 4)),
    "conv2d": lambda t: nn.functional.conv2d(t(1, 3, 8, 8), t(4, 3, 3, 3)),
    "sdpa": lambda t: nn.functional.scaled_dot_product_attention(
        t(1, 2, 8, 16), t(1, 2, 8, 16), t(1, 2, 8, 16), is_causal=True
    ),
    "softmax of bf16": lambda t: t(4, 8, dtype=torch.bfloat16).softmax(-1),
    "log_softmax of bf16": lambda t: nn.functional.log_softmax(t(4, 8, dtype=torch.bfloat16), -1),
    "sum of bf16": lambda t: t(4, 8, dtype=torch.bfloat16).sum(),
    "exp of bf16": lambda t: t(4, dtype=torch.bfloat16).exp(),
    "pow of bf16": lambda t: t(4, dtype=torch.bfloat16).pow(2),
    "layer_norm of bf16": lambda t: nn.functional.layer_norm(t(4, 8, dtype=torch.bfloat16), (8,)),
    "rms_norm of bf16": lambda t: nn.functional.rms_norm(t(4, 8, dtype=torch.bfloat16), (8,)),
    "mse_loss of bf16": lambda t: nn.functional.mse_loss(
        t(4, dtype=torch.bfloat16), t(4, dtype=torch.bfloat16)
    ),
    "cross_entropy of bf16": lambda t: nn.functional.cross_entropy(
        t(4, 10, dtype=torch.bfloat16), t(4, dtype=torch.long)
    ),
    "addcmul bf16, fp32": lambda t: torch.addcmul(t(4, dtype=torch.bfloat16), t(4), t(4)),
    "cat bf16, fp32": lambda t: torch.cat([t(4, dtype=torch.bfloat16), t(4)]),
    "gelu of bf16": lambda t: nn.functional.gelu(t(4, dtype=torch.bfloat16)),
    "add bf16 + fp32": lambda t: t(4, dtype=torch.bfloat16) + t(4),
}


def dtypes_on(device: str, mode: Any) -> dict[str, torch.dtype]:
    def t(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.zeros(shape, device=device, dtype=dtype)

    with mode:
        return {name: op(t).dtype for name, op in OPS.items()}


def measured_peak(
    model: nn.Module, inputs: dict[str, Any], training: bool, dtype: torch.dtype
) -> int:
    device = torch.device("cuda")
    model = model.to(device).train(training)
    inputs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, foreach=False) if training else None

    def step() -> None:
        with torch.set_grad_enabled(training):
            with torch.autocast("cuda", dtype=dtype):
                out = _call(model, inputs)
                loss = default_loss(out) if training else None
            if loss is not None and optimizer is not None:
                loss.backward()
                del loss
                optimizer.step()
        del out

    step()  # warm-up: cuBLAS workspaces and kernels loaded
    if optimizer is not None:
        optimizer.zero_grad(set_to_none=True)
        optimizer.state.clear()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    tensors = [*model.parameters(), *model.buffers()]
    tensors += [v for v in inputs.values() if isinstance(v, torch.Tensor)]
    # what stays allocated beyond parameters, buffers and inputs (cuBLAS workspaces)
    base_extra = torch.cuda.memory_allocated() - sum(t.numel() * t.element_size() for t in tensors)
    step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base_extra
    return int(peak)


def predicted_peak(
    model: nn.Module, inputs: dict[str, Any], training: bool, dtype: torch.dtype
) -> int:
    data: Any = (inputs["x"],) if "x" in inputs else inputs
    a = mw.analyze(
        model, input_data=data, mode="training" if training else "inference", device="cuda",
        autocast=dtype,
    )  # fmt: skip
    if a.error is not None:
        raise RuntimeError(str(a.error))
    return a.peak_bytes


def main() -> int:
    if not torch.cuda.is_available():
        print("autocast_gpu: no CUDA device here; nothing to compare (skipped).")
        return 0
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}\n")
    real = dtypes_on("cuda", torch.autocast("cuda", dtype=torch.bfloat16))
    meta = dtypes_on("meta", Autocast("cuda", torch.bfloat16))
    print("| op (autocast bfloat16) | CUDA autocast | meta_widget on meta | same |")
    print("|---|---|---|---|")
    for name in OPS:
        same = "yes" if real[name] == meta[name] else "NO"
        print(f"| {name} | {real[name]} | {meta[name]} | {same} |")
    print("\nPeak MiB; the inputs and parameters, as on the device, are in both.\n")
    print(
        "| model | mode | autocast | predicted (meta) | measured (max_memory_allocated) | ratio |"
    )
    print("|---|---|---|---|---|---|")
    worst = 0.0
    for name, build in CORPUS.items():
        for training in (False, True):
            for dtype in (torch.bfloat16, torch.float16):
                model, inputs = build()
                mode = "training (AdamW)" if training else "inference"
                try:
                    predicted = predicted_peak(model, inputs, training, dtype)
                except RuntimeError as exc:  # a trace this PyTorch cannot run: say so, go on
                    print(f"| {name} | {mode} | {dtype} | error: {str(exc).splitlines()[0]} |")
                    continue
                model, inputs = build()
                measured = measured_peak(model, inputs, training, dtype)
                ratio = predicted / measured
                worst = max(worst, abs(ratio - 1))
                print(
                    f"| {name} | {mode} | {str(dtype).removeprefix('torch.')} "
                    f"| {predicted / 2**20:.2f} | {measured / 2**20:.2f} | {ratio:.3f} |"
                )
    print(f"\nLargest deviation: {worst * 100:.1f}% (target: within 10% on every row).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
