"""Analyzer speed and memory against peers, measured in one process, the min of several runs.

    python benchmarks/analyzer.py [--runs 5] [--seq 4096] [--blocks 5000] [--modules 100000]

Table 1 (against peers): a Llama-3-70B-shaped ``LlamaForCausalLM`` built from
``transformers.LlamaConfig`` in code, at ``input_ids`` (1, seq); a model of 5,000 blocks (Linear,
ReLU, LayerNorm, Dropout); with ``--modules N``, one of N modules (N/5 such blocks). Columns: the
bare meta forward, ``FlopCounterMode``, ``torchinfo.summary`` on meta, ``meta_widget.analyze``
and ``analyze(fast=False)`` (the op cache off), each with its ratio to the bare forward; then
``analyze / torchinfo`` and the op cache's hit rate (hits / aten ops seen).

Table 2 (against the model itself): a whole 70B training step (forward, sum of the logits,
backward, AdamW step) bare on meta against ``analyze(mode="training")``; GPT-2 small from its
config, end to end (build on meta + analyze) against a bare forward of the already-built model.

``--only large --modules N``: the N-module model's bare forward against ``mw.analyze`` alone
(part of the full run when ``--modules`` is given).

Runs are interleaved (A B C D A B C D ...) so that a noisy machine hits every tool alike, and the
minimum of each is kept (the least disturbed run). In fresh subprocesses: the peak RSS of "build +
analyze" of the 70B model and of the N-module one, and the first analysis of a small MLP after
``import meta_widget`` (the time a fresh kernel waits).
"""

from __future__ import annotations

import argparse
import runpy
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


def interleaved(tools: dict[str, Callable[[], object]], runs: int) -> dict[str, float]:
    """The least disturbed time of each tool: one warm-up each, then ``runs`` rounds A B C ..."""
    samples: dict[str, list[float]] = {k: [] for k in tools}
    for fn in tools.values():
        fn()
    for _ in range(runs):
        for name, fn in tools.items():
            t = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - t)
    return {k: min(v) for k, v in samples.items()}


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

    def analyze_slow() -> None:
        mw.analyze(model, input_data=x, fast=False)

    return interleaved(
        {
            "bare meta forward": bare,
            "FlopCounterMode": flop_counter,
            "torchinfo.summary": torchinfo_summary,
            "mw.analyze": analyze,
            "fast=False": analyze_slow,
        },
        runs,
    )


def training_step(model: nn.Module, x: torch.Tensor) -> None:
    """A bare training step on meta: forward, the sum of the logits, backward, AdamW."""
    model.train()
    model(x).logits.sum().backward()
    opt = torch.optim.AdamW(model.parameters(), foreach=False)
    opt.step()
    model.zero_grad(set_to_none=True)
    model.eval()


def gpt2_small() -> object:
    import transformers

    return transformers.GPT2Config(architectures=["GPT2LMHeadModel"])


def against_the_model(runs: int, seq: int) -> list[tuple[str, dict[str, float], float]]:
    """Table 2's rows: (label, times, hit rate)."""
    import transformers

    rows = []
    model = llama_70b()
    x = torch.zeros(1, seq, dtype=torch.long, device="meta")
    t = interleaved(
        {
            "bare": lambda: training_step(model, x),
            "mw.analyze": lambda: mw.analyze(model, input_data=x, mode="training"),
            "fast=False": lambda: mw.analyze(model, input_data=x, mode="training", fast=False),
        },
        runs,
    )
    hit = _hit_rate(mw.analyze(model, input_data=x, mode="training"))
    rows.append((f"70B training step (AdamW), input_ids (1, {seq})", t, hit))
    config = gpt2_small()
    with torch.device("meta"):
        built = transformers.GPT2LMHeadModel(config)
    ids = torch.zeros(1, 1024, dtype=torch.long, device="meta")

    def bare() -> None:
        with torch.no_grad():
            built(ids)

    t = interleaved(
        {
            "bare": bare,
            "mw.analyze": lambda: mw.analyze(config, input_data=ids),
            "fast=False": lambda: mw.analyze(config, input_data=ids, fast=False),
        },
        runs,
    )
    hit = _hit_rate(mw.analyze(config, input_data=ids))
    rows.append(("GPT-2 small from its config (build + analyze), (1, 1024)", t, hit))
    return rows


def _hit_rate(a: mw.Analysis) -> float:
    return a.fast_path.hit_rate if a.fast_path is not None else 0.0


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


_MODULES_RSS_SCRIPT = """
import sys, torch, meta_widget as mw
sys.path.insert(0, {here!r})
from analyzer import blocks
def peak_mib():
    with open("/proc/self/status") as f:
        return int(next(x for x in f if x.startswith("VmHWM:")).split()[1]) / 1024
before = peak_mib()
model = blocks({n})
a = mw.analyze(model, input_data=torch.zeros(8, 64, device="meta"))
assert a.error is None, a.error
print(before, peak_mib())
"""

_FIRST_SCRIPT = """
import time, torch
start = time.perf_counter()
import meta_widget as mw
imported = time.perf_counter()
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
mw.analyze(model, input_size=(16, 32))
first = time.perf_counter()
mw.analyze(model, input_size=(16, 32))
print(imported - start, first - imported, time.perf_counter() - first)
"""


def _subprocess(script: str) -> list[float]:
    out = subprocess.run(
        [sys.executable, "-c", script], check=True, capture_output=True, text=True
    ).stdout.split()
    return [float(v) for v in out]


def peak_rss_mib(seq: int) -> tuple[float, float]:
    before, after = _subprocess(_RSS_SCRIPT.format(seq=seq, example=str(EXAMPLE)))
    return before, after


def first_analysis() -> tuple[float, float, float]:
    """Seconds to import meta_widget, of the first small analysis after it, of the second."""
    imported, first, second = _subprocess(_FIRST_SCRIPT)
    return imported, first, second


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--blocks", type=int, default=5000)
    parser.add_argument("--modules", type=int, default=0, help="add a model of this many modules")
    parser.add_argument("--only", choices=["peers", "model", "fresh", "large"], default=None)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, min of {args.runs} interleaved runs, seconds\n")
    if args.only in (None, "peers"):
        peers(args)
    if args.only in (None, "model"):
        print("\n| against the model itself | bare | mw.analyze | fast=False | cache hits |")
        print("|---|---|---|---|---|")
        for label, t, hit in against_the_model(args.runs, args.seq):
            bare = t["bare"]
            print(
                f"| {label} | {bare:.3f} (1.00×) | {t['mw.analyze']:.3f} "
                f"({t['mw.analyze'] / bare:.2f}×) | {t['fast=False']:.3f} "
                f"({t['fast=False'] / bare:.2f}×) | {hit:.0%} |"
            )
    if args.only == "large" or (args.only is None and args.modules):
        large(args.modules or 100_000, args.runs)
    if args.only in (None, "fresh"):
        imported, first, second = first_analysis()
        print(
            f"\nFresh process: import meta_widget {imported:.3f} s, first analysis of a small "
            f"MLP {first:.3f} s, the next {second:.3f} s."
        )
        before, after = peak_rss_mib(args.seq)
        print(
            f"Build + analyze of the 70B model from its config (fresh process): peak RSS "
            f"{after:.0f} MiB ({before:.0f} MiB after imports)."
        )
        if args.modules:
            here = str(Path(__file__).resolve().parent)
            before, after = _subprocess(_MODULES_RSS_SCRIPT.format(n=args.modules // 5, here=here))
            print(
                f"Build + analyze of the {args.modules:,}-module model (fresh process): peak RSS "
                f"{after:.0f} MiB ({before:.0f} MiB after imports)."
            )


def large(n: int, runs: int) -> None:
    """The N-module model, bare forward against ``mw.analyze`` only: its peers take minutes a
    run at this size (``--only peers --modules N`` times them too)."""
    model = blocks(n // 5)
    x = torch.zeros(8, 64, device="meta")

    def bare() -> None:
        with torch.no_grad():
            model(x)

    t = interleaved({"bare": bare, "analyze": lambda: mw.analyze(model, input_data=x)}, runs)
    print(
        f"\n{n:,} modules ({n // 5:,} blocks), bare meta forward {t['bare']:.2f} s, mw.analyze "
        f"{t['analyze']:.2f} s ({t['analyze'] / t['bare']:.3f}×)."
    )


def peers(args: argparse.Namespace) -> None:
    rows = [
        (
            f"Llama-3-70B shape, input_ids (1, {args.seq})",
            llama_70b,
            torch.zeros(1, args.seq, dtype=torch.long, device="meta"),
        ),
        (
            f"{args.blocks:,} blocks (Linear, ReLU, LayerNorm, Dropout)",
            lambda: blocks(args.blocks),
            torch.zeros(8, 64, device="meta"),
        ),
    ]
    if args.modules:
        rows.append(
            (
                f"{args.modules:,} modules ({args.modules // 5:,} such blocks)",
                lambda: blocks(args.modules // 5),
                torch.zeros(8, 64, device="meta"),
            )
        )
    print(
        "| model | bare meta forward | FlopCounterMode | torchinfo | mw.analyze | fast=False |",
        end="",
    )
    print(" analyze/torchinfo | cache hits |")
    print("|---|---|---|---|---|---|---|---|")
    for label, build, x in rows:
        model = build()
        t = timings(model, x, args.runs)
        bare = t["bare meta forward"]

        def cell(name: str, t: dict[str, float] = t, bare: float = bare) -> str:
            return f"{t[name]:.3f} ({t[name] / bare:.2f}×)"

        ratio = t["mw.analyze"] / t["torchinfo.summary"]
        hit = _hit_rate(mw.analyze(model, input_data=x))
        print(
            f"| {label} | {bare:.3f} (1.00×) | {cell('FlopCounterMode')} | "
            f"{cell('torchinfo.summary')} | {cell('mw.analyze')} | {cell('fast=False')} | "
            f"{ratio:.2f}× | {hit:.0%} |"
        )
        del model


if __name__ == "__main__":
    main()
