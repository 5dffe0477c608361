"""Speed of ``mw.plan``: Llama-3-70B training at (1, 4096) on 8 H100s (``--model 16l``: the
16-layer, 2048-wide Llama of docs/explore.md, whose every candidate fits, so the rule rejects
none and each is traced at full depth; issue 39).

    python benchmarks/plan.py [--model 70b|16l] [--layouts N] [--layers N] [--workers N]
                              [--full-depth] [--check]

The issue's goal: a plan over at least 64 candidates in at most 60 s on a 2-core machine. The
default space on 8 devices is 10 layouts (replicate x fsdp x tp) x checkpointing (2) x
precision (3) x micro-batches (2) = 120 candidates, each traced per rank under FSDP2 / TP on a
fake process group: by default at 3 and 4 layers and extended by the per-layer rule
(``meta_widget.explore.depth``), with ``--full-depth`` at all 80. ``--layouts N`` plans over
the first N layouts only (12 candidates each) and prints the seconds per candidate, so a
shorter run says what the whole plan costs: the "whole plan" line is then that rate times the
120 candidates, marked as projected. ``--check`` traces the best candidate at full depth and
prints both peaks, both figures on the GPU and both step times. ``--workers N`` sets
``plan``'s processes (default: one per core: this process and a local
``ProcessPoolExecutor``'s children, ``meta_widget.explore.workers``); ``--workers 1`` is the
plan in one process. ``benchmarks/plan_cluster.py`` runs it on a Dask
cluster.

Beside the wall time it prints the CPU time of the plan's processes, the wall time over the CPU
time a process (1.0: no process waited; it compares across runs where the VM's speed moved),
and the load average before and after (other work on the machine slows a plan down): this VM
runs long two-core work up to 1.8x slower after sustained load (the same plan took 87 to 100 s
of CPU time rested, 132 to 155 s after a test run), so the CPU time says which machine a wall
time was measured on.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import resource
import time
import warnings
from typing import Any

import meta_widget as mw
from meta_widget.explore.candidates import Space
from meta_widget.explore.layouts import Layout
from meta_widget.explore.workers import default_workers
from meta_widget.timing.gpus import resolve_gpu

GOAL_S, GOAL_CANDIDATES = 60.0, 64


def llama_70b(layers: int) -> Any:
    import transformers

    return transformers.LlamaConfig(
        hidden_size=8192, intermediate_size=28672, num_hidden_layers=layers,
        num_attention_heads=64, num_key_value_heads=8, vocab_size=128256,
        max_position_embeddings=131072, architectures=["LlamaForCausalLM"], use_cache=False,
    )  # fmt: skip


def llama_16(layers: int) -> Any:
    """The 16-layer, 2048-wide Llama of docs/explore.md ("The fastest configuration that fits"):
    small enough that every candidate fits, so the rule rejects none."""
    import transformers

    return transformers.LlamaConfig(
        hidden_size=2048, intermediate_size=8192, num_hidden_layers=layers,
        num_attention_heads=16, num_key_value_heads=8, vocab_size=128256,
        architectures=["LlamaForCausalLM"], use_cache=False,
    )  # fmt: skip


MODELS = {"70b": (llama_70b, 80), "16l": (llama_16, 16)}


def _cpu_seconds() -> float:
    """User and system CPU time of this process and its children that ended (``plan``'s)."""
    usage = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(u.ru_utime + u.ru_stime for u in usage)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layouts", type=int, default=None, help="only the first N layouts")
    parser.add_argument("--model", choices=sorted(MODELS), default="70b")
    parser.add_argument("--layers", type=int, default=None, help="default: the model's own")
    parser.add_argument("--workers", type=int, default=None, help="processes (default per core)")
    parser.add_argument("--full-depth", action="store_true", help="trace all layers")
    parser.add_argument("--check", action="store_true", help="trace the best at full depth")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")  # FSDP2's view-output warning, once per candidate
    space = Space.checked(8, "training", resolve_gpu("H100"), None, None, None, None)
    default = dataclasses.asdict(Layout())
    layouts = [
        {k: v for k, v in dataclasses.asdict(layout).items() if v != default[k]}
        for layout in space.layouts[: args.layouts]
    ]
    load = os.getloadavg()[0]
    start, cpu = time.perf_counter(), _cpu_seconds()
    build, depth = MODELS[args.model]
    p = mw.plan(
        build(args.layers or depth),
        (1, 4096),
        gpu="H100",
        devices=8,
        layouts=layouts,
        progress=True,
        full_depth=args.full_depth,
        workers=args.workers,
    )
    rows = p.candidates
    seconds = time.perf_counter() - start
    cpu = _cpu_seconds() - cpu
    ruled = sum(bool(c.traced_layers) for c in rows)
    per = seconds / max(1, len(rows))
    total = len(space.candidates())
    print(
        f"\n{len(rows)} candidates ({ruled} by the per-layer rule, {p.traces} traces) in "
        f"{seconds:.1f} s: {per:.1f} s per candidate; {cpu:.0f} s of CPU time (its processes); "
        f"load average {load:.1f} before, {os.getloadavg()[0]:.1f} after, on {os.cpu_count()} cores"
    )
    # the VM's speed swings by a fifth within an hour: the wall time over the CPU time a
    # process compares across runs where the wall time alone does not (1.0: no process waited)
    processes = args.workers or default_workers(len(rows))
    print(f"wall time over CPU time a process ({processes}): {seconds / (cpu / processes):.3f}")
    whole = per * total
    kind = "measured" if len(rows) == total else "projected"
    print(
        f"whole plan: {total} candidates, {whole:.0f} s ({kind}); goal >= {GOAL_CANDIDATES} "
        f"in <= {GOAL_S:.0f} s: {'met' if whole <= GOAL_S else 'NOT met'}"
    )
    if p.candidates and any(c.fits for c in p.candidates):
        best = p.best
        print(f"best: {best}")
        if args.check and best.traced_layers:
            start = time.perf_counter()
            a = best.analysis
            assert a is not None and a.time is not None
            print(
                f"best at full depth ({time.perf_counter() - start:.1f} s): peak "
                f"{a.peak_bytes:,} B (rule {best.peak_bytes:,} B), on the GPU "
                f"{a.footprint_bytes:,} B (rule {best.device_bytes:,} B), step "
                f"{a.time.step_s:.6g} s (rule {best.step_s:.6g} s)"
            )


if __name__ == "__main__":
    main()
