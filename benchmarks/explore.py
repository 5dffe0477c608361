"""Speed of ``mw.max_fit`` and ``mw.sweep``: traces per answer and seconds, against the plain ways.

    python benchmarks/explore.py [--layers 32]

max_fit rows: the largest sequence length of a Llama-3-8B-shaped ``LlamaForCausalLM`` (bf16
weights, ``--layers`` decoder layers) in 80 GiB, for inference and for a pure-bf16 training step;
the largest batch of a small CNN in 1 GiB; the longest prompts of a whole ``generate()`` (2 new
tokens, bf16 weights), as notebooks/08-serving asks. Peer: exponential then binary search (1, 2,
4, ... until a size does not fit, then halving), over the same traces. Both must give the same size.

sweep rows: four sequence lengths of the Llama config, and of GPT-2 small given as a real module
(124 M parameters on the CPU). Peer: one ``mw.analyze`` call per point, which builds the meta
model each time (``sweep`` builds it once and re-traces it). Medians of three interleaved runs.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
from torch import nn

import meta_widget as mw
from meta_widget.explore.sweeps import Tracer
from meta_widget.options import check_budget


def llama(layers: int, use_cache: bool = False) -> Any:
    import transformers

    return transformers.LlamaConfig(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers,
        num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
        max_position_embeddings=131072, architectures=["LlamaForCausalLM"], use_cache=use_cache,
    )  # fmt: skip


def gemma3_4b() -> Any:
    """Gemma 3 4B's text model: five sliding-window layers (1,024 positions) to one full."""
    import transformers

    return transformers.Gemma3TextConfig(
        hidden_size=2560, intermediate_size=10240, num_hidden_layers=34, num_attention_heads=8,
        num_key_value_heads=4, head_dim=256, vocab_size=262208, sliding_window=1024,
        max_position_embeddings=131072, architectures=["Gemma3ForCausalLM"],
    )  # fmt: skip


def cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 128, 3, padding=1), nn.BatchNorm2d(128), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 1000),
    )  # fmt: skip


def bisection(
    model: Any, input_size: Any, budget: str, vary: str, **options: Any
) -> tuple[int, int]:
    """The plain search, doubling until a size does not fit, then halving: (size, traces)."""
    tracer = Tracer(model, input_size, [vary], None, options)
    limit = check_budget(budget)
    peaks: dict[int, int] = {}

    def fits(n: int) -> bool:
        if n not in peaks:
            peaks[n] = tracer.analysis_at([n]).peak_bytes
        return peaks[n] <= limit

    lo, hi = 1, 2
    while fits(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo, tracer.traces


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=32, help="decoder layers of the Llama")
    args = parser.parse_args()
    bf16 = {"param_dtype": torch.bfloat16}
    serve = {**bf16, "dtypes": "long", "mode": "generate", "new_tokens": 2}
    fits = [
        ("Llama-3-8B shape, seq, inference", llama(args.layers), (1, 1024), "80GiB", "seq", bf16),
        (
            "Llama-3-8B shape, seq, pure bf16 step",
            llama(args.layers),
            (1, 1024),
            "80GiB",
            "seq",
            {**bf16, "mode": "training", "activation_checkpointing": True},
        ),
        ("CNN, batch, inference", cnn(), (1, 3, 224, 224), "1GiB", "batch", {}),
        # notebooks/08-serving's longest prompts for a whole generate() (2 new tokens)
        ("Llama-3-8B shape, seq, generate, 16 prompts", llama(args.layers, True), (16, 1024),
         "80GiB", "seq", serve),
        ("Gemma 3 4B, seq, generate, 1 prompt", gemma3_4b(), (1, 1024), "80GiB", "seq", serve),
    ]  # fmt: skip
    print(f"torch {torch.__version__}; {args.layers} Llama layers\n")
    print("| max_fit | size | traces | bisection's traces | seconds | bisection's | time ratio |")
    print("|---|---|---|---|---|---|---|")
    for name, model, size, budget, vary, options in fits:
        start = time.perf_counter()
        fit = mw.max_fit(model, size, budget=budget, vary=vary, **options)
        seconds = time.perf_counter() - start
        start = time.perf_counter()
        found, traces = bisection(model, size, budget, vary, **options)
        plain = time.perf_counter() - start
        assert found == fit.size, (name, found, fit.size)
        print(
            f"| {name} | {fit.size} | {fit.traces} | {traces} | {seconds:.1f} | {plain:.1f} "
            f"| {seconds / plain:.2f} |"
        )
    print("\n| sweep | points | seconds | separate analyze calls | ratio |")
    print("|---|---|---|---|---|")
    sweeps = [
        ("Llama-3-8B shape (a config)", llama(args.layers), [1024, 4096, 16384, 65536], bf16),
        ("GPT-2 small (a real nn.Module)", gpt2_small(), [128, 256, 512, 1024], {}),
    ]
    for name, model, seqs, options in sweeps:
        together, apart = [], []
        for _ in range(3):  # interleaved, medians: the machine is shared
            start = time.perf_counter()
            mw.sweep(model, (1, seqs[0]), vary={"seq": seqs}, progress=False, **options)
            together.append(time.perf_counter() - start)
            start = time.perf_counter()
            for n in seqs:
                mw.analyze(model, input_size=(1, n), **options)
            apart.append(time.perf_counter() - start)
        t, a = statistics.median(together), statistics.median(apart)
        print(f"| {name}, seq {seqs} | {len(seqs)} | {t:.1f} | {a:.1f} | {t / a:.2f} |")


def gpt2_small() -> nn.Module:
    import transformers

    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config())


if __name__ == "__main__":
    main()
