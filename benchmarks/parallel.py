"""Per-rank traces of FSDP2 and tensor parallelism: accuracy against real CPU ranks, and a 70B.

    python benchmarks/parallel.py            # the accuracy table (a few minutes on a laptop)
    python benchmarks/parallel.py --big      # + Llama 70B, {"fsdp": 8} and {"fsdp": 64}

Accuracy: for a tiny Llama (transformers ``LlamaConfig``, 4 layers, hidden 256, vocab 32000,
batch 2 x 128) and a 4-block MLP, one AdamW step of rank 0. ``traced`` is
``mw.analyze(..., mode="training", device="cpu", parallel=...)``; ``measured`` is PyTorch's
``MemTracker`` on the same step run for real on the CPU, the model wrapped by hand with
``fully_shard`` / ``parallelize_module`` under the fake process group (``tests/parallel_truth.py``);
``estimate`` is the ZeRO-3 (or TP) formula of ``a.distributed()`` (``meta_widget.views.estimates``)
applied to the single-device trace, for comparison.

``--big``: Llama-3-70B's shape (80 layers, hidden 8192, GQA 64/8, vocab 128256, float32 weights,
AdamW), one training step of 1 x 4096 tokens per rank on ``device="cuda"``, each size in a fresh
subprocess: seconds, the process's peak RSS, and the rank's peak by category.
"""

from __future__ import annotations

import argparse
import json
import resource
import runpy
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from parallel_truth import DeepMLP, llama_tp_plan, real_rank_peak, tiny_llama_config  # noqa: E402

import meta_widget as mw  # noqa: E402
from meta_widget.views.estimates import (  # noqa: E402
    distributed,
    largest_block_bytes,
    root_unit_bytes,
    tp_fraction,
)

MIB = 2**20
GIB = 2**30


def llama_70b() -> Any:
    """The Llama-3-70B-shaped config of ``examples/llama_70b.py`` (the one every benchmark uses)."""
    return runpy.run_path(str(ROOT / "examples" / "llama_70b.py"))["config"]


def estimate(single: mw.Analysis, fsdp: int, tp: int) -> int | None:
    """The formula's per-device bytes for the same layout (one dimension only)."""
    if tp == 1:
        return distributed(
            single.memory,
            fsdp,
            "zero3",
            largest_unit_bytes=largest_block_bytes(single),
            root_unit_bytes=root_unit_bytes(single),
        )["total"]
    if fsdp == 1:
        return distributed(single.memory, tp, "tp", tp_fraction=tp_fraction(single))["total"]
    return None


def accuracy() -> list[dict[str, Any]]:
    import transformers

    config = tiny_llama_config()
    ids = torch.randint(0, config.vocab_size, (2, 128))
    x = torch.randn(64, 256)
    cases: list[tuple[str, Any, Callable[[], torch.nn.Module], torch.Tensor, int, int]] = [
        ("MLP", DeepMLP, DeepMLP, x, n, 1) for n in (2, 4, 8)
    ]
    cases += [
        ("tiny Llama", config, lambda: transformers.LlamaForCausalLM(config), ids, fsdp, tp)
        for fsdp, tp in ((2, 1), (4, 1), (8, 1), (1, 2), (4, 2))
    ]
    singles: dict[str, mw.Analysis] = {}
    rows = []
    for name, model, make, inputs, fsdp, tp in cases:
        if name not in singles:
            singles[name] = mw.analyze(model, input_data=inputs, mode="training", device="cpu")
        plan = llama_tp_plan() if tp > 1 else None
        measured = real_rank_peak(make, inputs, fsdp=fsdp, tp=tp, tp_plan=plan)["Total"]
        start = time.perf_counter()
        a = mw.analyze(
            model,
            input_data=inputs,
            mode="training",
            device="cpu",
            parallel={"fsdp": fsdp, "tp": tp},
        )
        seconds = time.perf_counter() - start
        assert a.error is None, a.error
        est = estimate(singles[name], fsdp, tp)
        rows.append(
            {
                "model": name,
                "layout": f"fsdp {fsdp} x tp {tp}",
                "traced": a.peak_bytes,
                "measured": measured,
                "ratio": a.peak_bytes / measured,
                "estimate ratio": est / measured if est is not None else None,
                "seconds": seconds,
            }
        )
        print(_row(rows[-1]), flush=True)
    return rows


def _row(r: dict[str, Any]) -> str:
    est = f"{r['estimate ratio']:.3f}" if r["estimate ratio"] is not None else "-"
    return (
        f"| {r['model']} | {r['layout']} | {r['traced'] / MIB:.2f} | {r['measured'] / MIB:.2f} | "
        f"{r['ratio']:.3f} | {est} | {r['seconds']:.1f} |"
    )


def big(n: int) -> dict[str, Any]:
    """One 70B trace in this process (run by ``--one N`` in a fresh subprocess)."""
    start = time.perf_counter()
    a = mw.analyze(llama_70b(), input_size=(1, 4096), mode="training", parallel={"fsdp": n})
    seconds = time.perf_counter() - start
    assert a.error is None, a.error
    totals = a.comms_per_step()
    return {
        "fsdp": n,
        "seconds": round(seconds, 1),
        "rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "peak_gib": round(a.peak_bytes / GIB, 2),
        "peak_phase": a.memory.peak_phase,
        "categories_gib": {k: round(v / GIB, 2) for k, v in a.memory.categories.items() if v},
        "comm_gib_per_step": round(int(totals.bytes.sum()) / GIB, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--big", action="store_true", help="also trace Llama 70B at 8 and 64")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(big(args.one)))
        return
    print(f"torch {torch.__version__}")
    print("| model | layout | traced, MiB | measured, MiB | ratio | estimate / measured | s |")
    print("|---|---|---|---|---|---|---|")
    accuracy()
    if args.big:
        for n in (8, 64):
            out = subprocess.run(
                [sys.executable, __file__, "--one", str(n)],
                capture_output=True,
                text=True,
                check=True,
            )
            print(out.stdout.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
