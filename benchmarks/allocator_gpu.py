"""What the GPU holds: the caching-allocator replay against a real CUDA device.

    python benchmarks/allocator_gpu.py --measure benchmarks/results/allocator_h200.json  # GPU
    python benchmarks/allocator_gpu.py --compare benchmarks/results/allocator_h200.json  # anywhere
    python benchmarks/allocator_gpu.py --predict                                          # anywhere

``--measure`` runs each case of :data:`NAMES` (a pass of ``gpu_truth.py``'s corpus: the model
moved to the GPU, then one forward, or one AdamW step) in a fresh Python process, so that the
allocator starts empty and pays for its own cuBLAS workspaces as ``mw.analyze`` assumes, and
stores per case ``torch.cuda.max_memory_reserved()``, ``max_memory_allocated()``, the reserved
bytes at the end, the device's used memory as ``nvidia-smi`` reports it at the end (nothing is
released, so the reserved peak is still held) and right after CUDA started (the context), beside
meta_widget's predictions for the same pass (``reserved_bytes``, ``device_bytes``,
``peak_bytes``), computed on the CPU from a meta trace. ``--compare`` prints predicted over
measured from such a file; the replay is meant to be within 3 % of ``max_memory_reserved()``.
``--predict`` prints the predictions alone (no GPU needed; ``tests/test_allocator.py`` runs it).
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's meta_widget, wherever the script is run from
sys.path.insert(0, str(ROOT / "benchmarks"))

from gpu_truth import CASES, Case  # noqa: E402
from memory_accuracy import _call  # noqa: E402

import meta_widget as mw  # noqa: E402
from meta_widget.trace.passes import default_loss  # noqa: E402

#: the cases measured: an MLP, a CNN, GPT-2 and Llama (tiny), inference and training
NAMES = (
    "MLP | inference",
    "MLP | training",
    "CNN (BatchNorm) | training",
    "GPT-2 tiny, SDPA | training",
    "Llama tiny, SDPA | inference",
    "Llama tiny, SDPA | training",
    "Llama tiny, SDPA | training, autocast bf16",
)


def prediction(case: Case) -> dict[str, int]:
    """meta_widget's figures for ``case``, from a meta trace on the CPU (as ``gpu_truth``'s
    ``predict``: the measurement's optimizer is AdamW(foreach=False))."""
    model, inputs = case.build()
    data: Any = (inputs["x"],) if "x" in inputs else inputs
    a = mw.analyze(
        model,
        input_data=data,
        mode="training" if case.training else "inference",
        device="cuda",
        **({"foreach": False} if case.training else {}),
        **case.options,
    )
    if a.error is not None:
        raise RuntimeError(str(a.error))
    return {
        "predicted_reserved_bytes": a.memory.reserved_bytes,
        "predicted_device_bytes": a.memory.device_bytes,
        "predicted_peak_bytes": a.peak_bytes,
    }


def used_bytes() -> int:
    """The device's used memory as nvidia-smi reports it (all processes: run alone)."""
    try:
        return int(torch.cuda.device_memory_used())
    except Exception:  # no pynvml: ask nvidia-smi itself (MiB)
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
            capture_output=True,
            text=True,
            check=True,
        )
        return int(out.stdout.split()[0]) * 2**20


def measure_one(case: Case) -> dict[str, int]:
    """``case`` run for real in this (fresh) process: the allocator's and the device's figures."""
    device = torch.device("cuda")
    torch.zeros(1, device=device)  # CUDA starts: the context, and one 2 MiB segment
    torch.cuda.synchronize()
    context = used_bytes() - torch.cuda.memory_reserved()
    model, inputs = case.build()
    if case.pure_dtype is not None:
        model = model.to(case.pure_dtype)
    model = model.to(device).train(case.training)
    moved = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    if case.pure_dtype is not None:
        moved = {
            k: v.to(case.pure_dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v
            for k, v in moved.items()
        }
    autocast = torch.autocast("cuda", dtype=case.autocast, enabled=case.autocast is not None)
    if not case.training:
        with torch.no_grad(), autocast:
            out = _call(model, moved)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), foreach=False)
        for _ in range(case.micro_batches):
            with autocast:
                out = _call(model, moved)
                loss = default_loss(out) / case.micro_batches
            loss.backward()
            del loss
        optimizer.step()
    torch.cuda.synchronize()
    gc.collect()
    return {
        "max_memory_reserved": torch.cuda.max_memory_reserved(),
        "max_memory_allocated": torch.cuda.max_memory_allocated(),
        "reserved_at_end": torch.cuda.memory_reserved(),
        "nvidia_smi_used_at_end": used_bytes(),
        "context_bytes": context,
    }


def run_measure(path: str) -> int:
    if not torch.cuda.is_available():
        print("allocator_gpu: no CUDA device here; nothing to measure.")
        return 1
    results: dict[str, Any] = {
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(),
        "capability": list(torch.cuda.get_device_capability()),
        "cases": {},
    }
    here = str(ROOT / "benchmarks")
    for name in NAMES:
        row: dict[str, Any] = {}
        done = subprocess.run(
            [sys.executable, __file__, "--one", name], capture_output=True, text=True, cwd=here
        )
        if done.returncode == 0:
            row.update(json.loads(done.stdout.strip().splitlines()[-1]))
        else:
            row["error"] = done.stderr.strip().splitlines()[-1] if done.stderr else "failed"
        try:
            row.update(prediction(CASES[name]))
        except Exception as exc:  # an option this version lacks is a row, not a crash
            row["prediction_error"] = f"{type(exc).__name__}: {exc}"
        results["cases"][name] = row
        print(f"{name}: {row}", flush=True)
    with open(path, "w") as f:
        json.dump(results, f, indent=1)
    return 0


def run_compare(path: str) -> int:
    with open(path) as f:
        measured = json.load(f)
    print(f"measured: torch {measured['torch']} on {measured['device']}; MiB\n")
    print("| case | reserved predicted / measured | device predicted / nvidia-smi |")
    print("|---|---|---|")
    for case, row in measured["cases"].items():
        name = case.replace("|", "\\|")  # a table cell
        if "max_memory_reserved" not in row or "predicted_reserved_bytes" not in row:
            print(f"| {name} | {row.get('error', row.get('prediction_error', '?'))} | |")
            continue
        r = row["predicted_reserved_bytes"] / row["max_memory_reserved"]
        d = row["predicted_device_bytes"] / row["nvidia_smi_used_at_end"]
        print(
            f"| {name} | {row['predicted_reserved_bytes'] / 2**20:.1f} / "
            f"{row['max_memory_reserved'] / 2**20:.1f} ({r:.3f}) | "
            f"{row['predicted_device_bytes'] / 2**20:.1f} / "
            f"{row['nvidia_smi_used_at_end'] / 2**20:.1f} ({d:.3f}) |"
        )
    return 0


def run_predict(names: tuple[str, ...] = NAMES) -> dict[str, dict[str, int]]:
    """The predictions of ``names``, printed and returned (no GPU needed)."""
    out = {name: prediction(CASES[name]) for name in names}
    for name, row in out.items():
        print(f"{name}: " + ", ".join(f"{k} {v / 2**20:.2f} MiB" for k, v in row.items()))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--measure", metavar="JSON", help="measure on this machine's GPU")
    group.add_argument("--compare", metavar="JSON", help="compare a measurement's rows")
    group.add_argument("--predict", action="store_true", help="predictions only, no GPU")
    group.add_argument("--one", metavar="CASE", help=argparse.SUPPRESS)  # a --measure worker
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure_one(CASES[args.one])))
        return 0
    if args.predict:
        run_predict()
        return 0
    return run_measure(args.measure) if args.measure else run_compare(args.compare)


if __name__ == "__main__":
    sys.exit(main())
