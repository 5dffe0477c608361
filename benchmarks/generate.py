"""How long ``analyze(..., mode="generate")`` takes: Llama-3-70B from its config, a prompt of
32,768 tokens, 1,000 new tokens (the goal: 10 s on a laptop-class CPU).

    python benchmarks/generate.py                    # the goal's sizes
    python benchmarks/generate.py --new-tokens 20    # fewer decode steps

Prints the wall time of the analysis, the time of the trace alone, the time per decode step
(the trace's time past the prefill over the decode steps), the KV cache and the peak.
"""

from __future__ import annotations

import argparse
import time

import torch
import transformers

import meta_widget as mw


def llama_3_70b() -> transformers.LlamaConfig:
    """Llama-3-70B's shapes (its config.json), built with its causal-LM head."""
    return transformers.LlamaConfig(
        hidden_size=8192,
        intermediate_size=28672,
        num_hidden_layers=80,
        num_attention_heads=64,
        num_key_value_heads=8,
        vocab_size=128256,
        max_position_embeddings=131072,
        rope_theta=500000.0,
        torch_dtype="bfloat16",
        architectures=["LlamaForCausalLM"],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt", type=int, default=32768)
    parser.add_argument("--new-tokens", type=int, default=1000)
    parser.add_argument("--cache", default=None, help="cache_implementation, e.g. static")
    args = parser.parse_args()
    transformers.logging.set_verbosity_error()
    config = llama_3_70b()
    mw.analyze(config, input_size=(1, 8), mode="generate", new_tokens=2)  # imports, warm-up
    start = time.perf_counter()
    a = mw.analyze(
        lambda: transformers.LlamaForCausalLM(config).to(torch.bfloat16),
        input_size=(1, args.prompt),
        mode="generate",
        new_tokens=args.new_tokens,
        cache_implementation=args.cache,
        gpu="H100",
    )
    wall = time.perf_counter() - start
    assert a.error is None, a.error
    assert a.kv_cache is not None and a.time is not None
    roots = [c for c in a.calls if c.parent < 0]
    print(
        f"Llama-3-70B, prompt {args.prompt:,}, {args.new_tokens:,} new tokens "
        f"(cache {a.kv_cache.cache_type}): analyze {wall:.2f} s "
        f"({len(roots)} forward passes, {len(a.calls):,} calls)"
    )
    print(f"  KV cache {a.kv_cache.bytes / 2**30:.2f} GiB, peak {a.peak_bytes / 2**30:.2f} GiB")
    print(
        f"  on H100: prefill {a.time.prefill_s * 1e3:.1f} ms, "
        f"{(a.time.per_token_s or 0) * 1e3:.2f} ms per output token"
    )
    print("  goal: 10 s" + (" (met)" if wall <= 10 else f" (not met: {wall / 10:.1f}x)"))


if __name__ == "__main__":
    main()
