"""Analyzer speed and memory against peers, measured in one process, medians of several runs.

    python benchmarks/analyzer.py [--runs 5] [--seq 4096]

Rows: a Llama-3-70B-shaped ``LlamaForCausalLM`` built from ``transformers.LlamaConfig`` in code,
at ``input_ids`` (1, seq); and a model of 5,000 blocks (Linear, ReLU, LayerNorm, Dropout).
Columns: the bare meta forward, ``FlopCounterMode``, ``torchinfo.summary`` on meta, and
``meta_widget.analyze``, each with its ratio to the bare forward; then ``analyze / torchinfo``.
Runs are interleaved (A B C D A B C D ...) so that a noisy machine hits every tool alike.
The peak RSS of "build + analyze" of the 70B model is measured in a fresh subprocess.
"""

from __future__ import annotations

import argparse
import runpy
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

import meta_widget as mw

#: the Llama-3-70B shape of the example (one definition, used by every benchmark)
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "llama_70b.py"


def llama_70b() -> nn.Module:
    import transformers

    config = runpy.run_path(str(EXAMPLE))["config"]
    with torch.device("meta"):
        return transformers.LlamaForCausalLM(config)


def blocks(n: int = 5000, width: int = 64) -> nn.Module:
    with torch.device("meta"):
        return nn.Sequential(
            *(
                nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.LayerNorm(width), nn.Dropout())
                for _ in range(n)
            )
        )


def timings(model: nn.Module, x: torch.Tensor, runs: int) -> dict[str, float]:
    import torchinfo
    from torch.utils.flop_counter import FlopCounterMode

    def bare() -> None:
        with torch.no_grad():
            model(x)

    def flop_counter() -> None:
        with torch.no_grad(), FlopCounterMode(display=False):
            model(x)

    def torchinfo_summary() -> None:
        torchinfo.summary(model, input_data=x, device="meta", verbose=0)

    def analyze() -> None:
        mw.analyze(model, input_data=x)

    tools: dict[str, Callable[[], None]] = {
        "bare meta forward": bare,
        "FlopCounterMode": flop_counter,
        "torchinfo.summary": torchinfo_summary,
        "mw.analyze": analyze,
    }
    samples: dict[str, list[float]] = {k: [] for k in tools}
    for fn in tools.values():  # warm-up
        fn()
    for _ in range(runs):
        for name, fn in tools.items():
            t = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in samples.items()}


_RSS_SCRIPT = """
import runpy, torch, transformers, meta_widget as mw
def peak_mib():  # this process's own high-water mark (ru_maxrss would inherit the parent's)
    with open("/proc/self/status") as f:
        return int(next(x for x in f if x.startswith("VmHWM:")).split()[1]) / 1024
config = runpy.run_path({example!r})["config"]
before = peak_mib()
a = mw.analyze(config, input_size=(1, {seq}))
assert a.error is None, a.error
print(before, peak_mib())
"""


def peak_rss_mib(seq: int) -> tuple[float, float]:
    out = subprocess.run(
        [sys.executable, "-c", _RSS_SCRIPT.format(seq=seq, example=str(EXAMPLE))],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    return float(out[-2]), float(out[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--blocks", type=int, default=5000)
    args = parser.parse_args()

    rows = [
        (
            f"Llama-3-70B shape, input_ids (1, {args.seq})",
            llama_70b(),
            torch.zeros(1, args.seq, dtype=torch.long, device="meta"),
        ),
        (
            f"{args.blocks:,} blocks (Linear, ReLU, LayerNorm, Dropout)",
            blocks(args.blocks),
            torch.zeros(8, 64, device="meta"),
        ),
    ]
    print(f"torch {torch.__version__}, medians of {args.runs} interleaved runs, seconds\n")
    print("| model | bare meta forward | FlopCounterMode | torchinfo | mw.analyze |", end="")
    print(" analyze/torchinfo |")
    print("|---|---|---|---|---|---|")
    for label, model, x in rows:
        t = timings(model, x, args.runs)
        bare = t["bare meta forward"]

        def cell(name: str, t: dict[str, float] = t, bare: float = bare) -> str:
            return f"{t[name]:.3f} ({t[name] / bare:.2f}×)"

        ratio = t["mw.analyze"] / t["torchinfo.summary"]
        print(
            f"| {label} | {bare:.3f} (1.00×) | {cell('FlopCounterMode')} | "
            f"{cell('torchinfo.summary')} | {cell('mw.analyze')} | {ratio:.2f}× |"
        )
    before, after = peak_rss_mib(args.seq)
    print(
        f"\nBuild + analyze of the 70B model from its config (fresh process): peak RSS "
        f"{after:.0f} MiB ({before:.0f} MiB after imports)."
    )


if __name__ == "__main__":
    main()
