"""How long ``analyze(..., mode="generate")`` takes: Llama-3-70B from its config, a prompt of
32,768 tokens, 1,000 new tokens (the goal: 10 s on a laptop-class CPU).

    python benchmarks/generate.py                    # the goal's sizes
    python benchmarks/generate.py --new-tokens 20    # fewer decode steps

Prints the wall time of the analysis and its CPU time (the machine is shared: the wall time
grows with the load, the CPU time does not), the forward passes traced (the decode steps given
by the per-step rule are not traced one by one, ``meta_widget.trace.decode_skip``), the KV cache
and the peak; ``--every-step`` traces every decode step, as ``fast=False`` does.
"""

from __future__ import annotations

import argparse
import time

import torch
import transformers

import meta_widget as mw
from meta_widget.trace import decode_skip


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
    parser.add_argument("--every-step", action="store_true", help="trace every decode step")
    args = parser.parse_args()
    decode_skip.ENABLED = not args.every_step
    transformers.logging.set_verbosity_error()
    config = llama_3_70b()
    mw.analyze(config, input_size=(1, 8), mode="generate", new_tokens=2)  # imports, warm-up
    start, cpu = time.perf_counter(), time.process_time()
    a = mw.analyze(
        lambda: transformers.LlamaForCausalLM(config).to(torch.bfloat16),
        input_size=(1, args.prompt),
        mode="generate",
        new_tokens=args.new_tokens,
        cache_implementation=args.cache,
        gpu="H100",
    )
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    assert a.error is None, a.error
    assert a.kv_cache is not None and a.time is not None
    stretches = sum(1 for _, _, op in a.memory.timeline if op == decode_skip.SKIPPED)
    traced = len([c for c in a.calls if c.parent < 0]) - stretches
    print(
        f"Llama-3-70B, prompt {args.prompt:,}, {args.new_tokens:,} new tokens "
        f"(cache {a.kv_cache.cache_type}): analyze {wall:.2f} s, {cpu:.2f} s of CPU "
        f"({traced} forward passes traced, {stretches} stretch(es) of decode steps by the rule; "
        f"{len(a.calls):,} records)"
    )
    print(f"  KV cache {a.kv_cache.bytes / 2**30:.2f} GiB, peak {a.peak_bytes / 2**30:.2f} GiB")
    print(
        f"  on H100: prefill {a.time.prefill_s * 1e3:.1f} ms, "
        f"{(a.time.per_token_s or 0) * 1e3:.2f} ms per output token"
    )
    print("  goal: 10 s" + (" (met)" if wall <= 10 else f" (not met: {wall / 10:.1f}x)"))
    notes = [n for n in a.notes if "every step was traced again" in n]
    if notes:
        print("  " + notes[0])


if __name__ == "__main__":
    main()
