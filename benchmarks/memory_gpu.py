"""Predicted peak memory against ``torch.cuda.max_memory_allocated`` on a real GPU.

    python benchmarks/memory_gpu.py

The corpus of ``memory_accuracy.py``, each model in inference and for one AdamW step: the peak
``mw.analyze(..., device="cuda")`` predicts on meta, against the CUDA caching allocator's peak of
allocated bytes for the same pass (measured from a reset, parameters and inputs already on the
device). Target: within 10%. Without a CUDA device it says so and exits 0.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from memory_accuracy import CORPUS, _call, predicted_peak_for

from meta_widget.passes import default_loss


def measured_peak(model: torch.nn.Module, inputs: dict[str, Any], training: bool) -> int:
    device = torch.device("cuda")
    model = model.to(device).train(training)
    inputs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    optimizer = torch.optim.AdamW(model.parameters(), foreach=False) if training else None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    if not training:
        with torch.no_grad():
            out = _call(model, inputs)
    else:
        assert optimizer is not None
        out = _call(model, inputs)
        loss = default_loss(out)
        loss.backward()
        del loss
        optimizer.step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    del out, optimizer
    return int(peak)


def main() -> int:
    if not torch.cuda.is_available():
        print("memory_gpu: no CUDA device here; nothing to compare (skipped).")
        return 0
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}; peak MiB\n")
    print("| model | mode | predicted (meta, device='cuda') |", end="")
    print(" measured (max_memory_allocated) | ratio |")
    print("|---|---|---|---|---|")
    worst = 0.0
    for name, build in CORPUS.items():
        for training in (False, True):
            model, inputs = build()
            predicted = predicted_peak_for(model, inputs, training, device="cuda")
            model, inputs = build()
            measured = measured_peak(model, inputs, training)
            ratio = predicted / measured
            worst = max(worst, abs(ratio - 1))
            mode = "training (AdamW)" if training else "inference"
            print(
                f"| {name} | {mode} | {predicted / 2**20:.2f} | {measured / 2**20:.2f} "
                f"| {ratio:.3f} |"
            )
    print(f"\nLargest deviation: {worst * 100:.1f}% (target: within 10% on every row).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
