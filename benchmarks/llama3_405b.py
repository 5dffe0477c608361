"""Llama 3 405B on 16,384 H100s in the Llama 3 paper's layout, traced per pipeline rank.

    python benchmarks/llama3_405b.py                # full depth, 126 layers (401 s on one core)
    python benchmarks/llama3_405b.py --layers 32    # same widths and mesh, a layer a stage: 8 min
    python benchmarks/llama3_405b.py --no-ac        # without activation checkpointing
    python benchmarks/llama3_405b.py --sequence-parallel   # Megatron's SP over the 8 TP ranks
    python benchmarks/llama3_405b.py --plan         # mw.plan over layouts without a pipeline
    python benchmarks/llama3_405b.py --default-plan # plan's default space, less its pipelines
    python benchmarks/llama3_405b.py --default-plan --cp 1 2 4  # and with context parallelism
    python benchmarks/llama3_405b.py --pipelines 2 [--full-depth]  # plan PP 2 and PP 4
    python benchmarks/llama3_405b.py --interleaved [--full-depth] [--no-ac]  # PP 2 x 3 stages
    python benchmarks/llama3_405b.py --on-64        # pipelines on 64 H100s, over the budget

The model: transformers' ``LlamaConfig`` with Llama 3 405B's shape (hidden 16384, 126 layers,
128 heads, 8 key/value heads, intermediate 53248, vocab 128256), built on meta. The layout:
"The Llama 3 Herd of Models" (arXiv 2407.21783), Table 4, the 16,384-GPU row at 8K context:
TP 8, CP 1, PP 16, DP 128, sequence 8,192, 16 sequences per DP rank (16M tokens a batch),
400 TFLOPs/GPU, 41 % BF16 MFU (the paper gives 38-43 % over its three layouts). As traced:

- ``mw.Parallel(pp=16, tp=8, fsdp=128)``: a fake process group of 16,384 ranks; each of the
  16 pipeline ranks traced in turn (rank ``r * 1024``), its stages ``parallelize_module``-d by
  the config's tensor-parallel plan (8 ranks) and ``fully_shard``-ed over its 128 DP ranks
  (FSDP2 with bf16 parameters and fp32 gradient reduction, the paper's "FSDP" sharding of
  model, optimizer and gradients over DP);
- PyTorch's ``ScheduleInterleaved1F1B``, 2 stages a rank (32 stages), 16 micro-batches of one
  8,192-token sequence; the paper's balancing: the first and the last stage one layer fewer
  (3 where the others hold 4: ``stage_boundaries`` 3, 7, ..., 123);
- AdamW, two steps (the steady one's peak), timed on ``gpu="H100"``.

Where it departs from the paper (each printed with the table): PyTorch's interleaved 1F1B, not
the paper's own schedule (which sets the number of contiguous micro-batches N and deallocates
pipeline buffers early); transformers' tensor-parallel plan, which has no sequence
parallelism (the residual stream is replicated on the 8 TP ranks; ``--sequence-parallel``
shards it, Megatron's way: every rank then fits at full depth, see
``benchmarks/results/llama3_405b.md``); FSDP2's default
reshard-after-forward; activation checkpointing of every layer (``--no-ac`` to trace without:
the paper trained at 8K without it, and PyTorch's schedule keeps all 16 micro-batches of its
first 8 ranks in flight, which does not fit; see the printed peaks).

MFU: the job's model FLOPs (each rank's traced FLOPs without recomputation, summed over the 16
pipeline ranks) over the step (the slowest rank's, its bubble included) times 16 x the H100's
dense bf16 peak; FLOPs as PyTorch's ``FlopCounterMode`` counts them on the traced ops.
"""

from __future__ import annotations

import argparse
import dataclasses
import resource
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import transformers  # noqa: E402

import meta_widget as mw  # noqa: E402

GIB = 2**30
#: the paper's Table 4, 16,384 GPUs at 8K: TFLOPs/GPU and BF16 MFU
PAPER = {"tflops": 400, "mfu": 0.41, "range": (0.38, 0.43)}
HBM = 80 * 10**9  # an H100 SXM's 80 GB


def config(layers: int = 126) -> Any:
    """Llama 3 405B's shape (Llama 3.1's ``config.json`` values), ``layers`` deep, trained as
    training stacks run it: without transformers' KV cache (``use_cache=False``; the
    ``config.json`` says True, for generation). With it, each checkpointed layer of a layout
    without a pipeline writes its keys and values into the cache and the cache holds them through
    backward: 45 GB more a GPU at FSDP 128 x TP 8 (a pipeline's stages are handed no cache)."""
    return transformers.LlamaConfig(
        hidden_size=16384, intermediate_size=53248, num_hidden_layers=layers,
        num_attention_heads=128, num_key_value_heads=8, vocab_size=128256,
        max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5,
        architectures=["LlamaForCausalLM"], use_cache=False,
    )  # fmt: skip


def layout(
    layers: int = 126, pp: int = 16, tp: int = 8, dp: int = 128, sp: bool = False
) -> mw.Parallel:
    """The paper's 16,384-GPU layout: 2 stages a rank, the first and last stage a layer fewer
    than the others (when the layers allow it: 126 = 32 x 4 - 2); ``sp``: with sequence
    parallelism over the 8 TP ranks."""
    stages = 2 * pp
    bounds = None
    if (layers + 2) % stages == 0:
        size = (layers + 2) // stages
        bounds = tuple(size - 1 + size * i for i in range(stages - 1))
    return mw.Parallel(
        pp=pp, tp=tp, fsdp=dp, schedule="interleaved-1F1B", virtual_stages=2,
        microbatches=16, stage_boundaries=bounds,
        mp={"param_dtype": "bfloat16", "reduce_dtype": "float32"}, sequence_parallel=sp,
    )  # fmt: skip


def trace(layers: int = 126, ac: bool = True, seq: int = 8192, sp: bool = False) -> mw.Analysis:
    """One DP rank's step: 16 sequences of ``seq`` tokens through the 16-rank pipeline."""
    return mw.analyze(
        config(layers), input_size=(16, seq), mode="training", gpu="H100",
        parallel=layout(layers, sp=sp), activation_checkpointing=ac,
    )  # fmt: skip


def job_mfu(a: mw.Analysis) -> tuple[float, float, float]:
    """(MFU, TFLOPs per GPU, step seconds) of the job: the ranks' model FLOPs over the slowest
    rank's step, bubble included, and the GPUs' dense bf16 peak (see the module docstring)."""
    step = max(s.step_s for s in a.stages if s.step_s is not None)
    times = [s.analysis.time for s in a.stages]
    per_gpu = sum(t.model_flops for t in times) / len(times) / step
    return per_gpu / times[0].peak_flops, per_gpu / 1e12, step


def report(a: mw.Analysis, seconds: float) -> str:
    lines = [
        f"{'rank':>4}  {'stages':>8}  {'layers':>6}  {'peak GiB':>8}  {'< 80 GB':>7}  "
        f"{'bubble':>6}  {'step s':>6}  {'sent MiB':>8}  {'recv MiB':>8}"
    ]
    for s in a.stages:
        layers = sum(m.startswith("model.layers.") for m in s.modules)
        lines.append(
            f"{s.rank:>4}  {list(s.stages)!s:>8}  {layers:>6}  {s.peak_bytes / GIB:>8.2f}  "
            f"{'yes' if s.peak_bytes < HBM else 'NO':>7}  {s.bubble:>6.3f}  "
            f"{s.step_s or 0:>6.2f}  {s.send_bytes / 2**20:>8.0f}  {s.recv_bytes / 2**20:>8.0f}"
        )
    worst = max(a.stages, key=lambda s: s.peak_bytes)
    mfu, tflops, step = job_mfu(a)
    lo, hi = PAPER["range"]
    lines += [
        f"worst stage: rank {worst.rank}, {worst.peak_bytes / GIB:.2f} GiB "
        f"({worst.peak_bytes / 1e9:.1f} GB of 80)",
        f"step {step:.2f} s for 16 x 8,192 tokens a DP rank; predicted MFU {mfu:.1%} "
        f"({tflops:.0f} TFLOPs/GPU); the paper: {PAPER['mfu']:.0%} ({PAPER['tflops']} "
        f"TFLOPs/GPU), {lo:.0%}-{hi:.0%} over its layouts",
        f"traced in {seconds:.0f} s, peak RSS "
        f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB",
    ]
    return "\n".join(lines)


#: ``--plan``'s layouts of the same 16,384 GPUs without a pipeline: HSDP (16 replicas of the
#: paper's DP-128 sharding) and FSDP over all 2,048 data-parallel ranks, each with TP 8, with
#: and without sequence parallelism
PLAN_LAYOUTS = [
    {"replicate": 16, "fsdp": 128, "tp": 8},
    {"replicate": 16, "fsdp": 128, "tp": 8, "sequence_parallel": True},
    {"fsdp": 2048, "tp": 8},
    {"fsdp": 2048, "tp": 8, "sequence_parallel": True},
]


def plan_without_a_pipeline() -> None:
    """``mw.plan`` of the 405B on 16,384 H100s, global batch 2,048 sequences of 8,192 tokens
    (the paper's 16M tokens), over :data:`PLAN_LAYOUTS`, every layer checkpointed, bf16
    parameters: each candidate by the per-layer rule (3- and 4-layer traces), and one that
    may fit at full depth. Printed beside the paper's layout as traced here (the results
    file)."""
    start = time.perf_counter()
    p = mw.plan(
        config(), gpu="H100", devices=16384, global_batch=2048, seq_len=8192,
        layouts=PLAN_LAYOUTS, activation_checkpointing=[True], precisions=["param_dtype bf16"],
        micro_batches=[1], progress=True,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    print(f"\n{len(p.candidates)} candidates, {p.traces} traces, {seconds:.0f} s")
    print(f"{'layout':<44}  {'GB a GPU':>8}  {'fits':>4}  {'step s':>6}  {'MFU':>6}")
    for c in p.candidates:
        assert c.layout is not None and c.peak_bytes is not None and c.step_s is not None
        print(
            f"{c.layout.label():<44}  {c.device_bytes / 1e9:>8.1f}  "
            f"{'yes' if c.fits else 'NO':>4}  {c.step_s:>6.2f}  {c.mfu:>6.1%}"
        )
    print(
        f"the paper: TP 8 x PP 16 x DP 128, {PAPER['mfu']:.0%} MFU measured; as traced here "
        "(--sequence-parallel, PyTorch's interleaved 1F1B): see benchmarks/results/llama3_405b.md"
    )


def default_plan_without_pipelines(cps: tuple[int, ...] = (1,)) -> None:
    """``mw.plan``'s default space of the 405B on 16,384 H100s, global batch 2,048 x 8,192,
    less its pipelines (each traced rank by rank: minutes a candidate): every
    ``replicate x fsdp x tp`` with tp in a node, tp sharding the sequence as the default does,
    x checkpointing x 3 precisions x 2 micro-batch counts; with ``cps`` beyond 1, the same
    again for each context-parallel degree (``replicate x fsdp x tp`` over ``16,384 / cp``
    devices). Prints the candidates, those traced (the rest cannot take the batch: 2,048
    sequences over more data-parallel ranks), the traces, the wall and CPU seconds and the
    best."""
    import resource

    from meta_widget.explore.layouts import default_layouts
    from meta_widget.timing.gpus import resolve_gpu

    layouts = [
        dataclasses.replace(x, sequence_parallel=x.tp > 1, cp=cp).parallel()
        for cp in cps
        for x in default_layouts(16384 // cp, resolve_gpu("H100"))
    ]
    start = time.perf_counter()
    p = mw.plan(
        config(), gpu="H100", devices=16384, global_batch=2048, seq_len=8192, layouts=layouts,
        progress=True,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    usage = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    cpu = sum(u.ru_utime + u.ru_stime for u in usage)
    traced = [c for c in p.candidates if c.error is None]
    pruned = [c for c in p.candidates if c.error is not None and c.error.startswith("Cannot fit")]
    print(
        f"\n{len(layouts)} layouts, {len(p.candidates)} candidates: {len(traced)} traced, "
        f"{len(pruned)} pruned by a traced bound, the rest refused; {p.traces} traces, "
        f"{seconds:.0f} s ({cpu:.0f} s of CPU)"
    )
    best = p.best
    assert best.layout is not None and best.step_s is not None
    by_cp = {cp: sum(c.layout.cp == cp for c in traced) for cp in cps}  # type: ignore[union-attr]
    print(f"traced by cp: {by_cp}")
    print(
        f"best: {best.layout.label()}, checkpointing {best.activation_checkpointing}, "
        f"{best.precision}, {best.micro_batches} micro-batches: "
        f"{best.device_bytes / 1e9:.1f} GB a GPU, {best.step_s:.2f} s, {best.mfu:.1%} MFU"
    )


#: ``--pipelines``' layouts: the default 1F1B pipelines of 16,384 GPUs whose data-parallel ranks
#: take the 2,048 sequences whole (one a micro-batch) and whose stages hold more than 9 layers
#: (the per-layer rule's, rank by rank), each with TP 8 sharding the sequence
PIPELINES = [
    {"fsdp": 1024, "tp": 8, "pp": 2, "schedule": "1F1B", "microbatches": 2},
    {"fsdp": 512, "tp": 8, "pp": 4, "schedule": "1F1B", "microbatches": 4},
    {"fsdp": 256, "tp": 8, "pp": 8, "schedule": "1F1B", "microbatches": 8},
]

#: ``--interleaved``'s layout: PP 2 with 3 stages a rank (6 stages of 21 layers: the fewest
#: virtual stages that split the 126 layers evenly), as ``PIPELINES``' first otherwise
INTERLEAVED = {
    "fsdp": 1024, "tp": 8, "pp": 2, "schedule": "interleaved-1F1B", "virtual_stages": 3,
    "microbatches": 2,
}  # fmt: skip


def plan_pipelines(full_depth: bool, layouts: list[dict[str, Any]], ac: bool = True) -> None:
    """``mw.plan`` of the 405B over ``layouts`` (:data:`PIPELINES`' first few or
    :data:`INTERLEAVED`; sequence parallel, every layer checkpointed unless not ``ac``, bf16
    parameters, global batch 2,048 x 8,192): by the per-layer rule rank by rank
    (``explore.depth_stages``), or with ``full_depth`` every rank at its layers a stage (63, 32
    or 16; 21 interleaved). Prints each candidate's numbers and the seconds."""
    start = time.perf_counter()
    p = mw.plan(
        config(), gpu="H100", devices=16384, global_batch=2048, seq_len=8192,
        layouts=[{**x, "sequence_parallel": True} for x in layouts],
        activation_checkpointing=[ac], precisions=["param_dtype bf16"], progress=True,
        full_depth=full_depth,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    print(f"\n{len(p.candidates)} candidates, {p.traces} traces, {seconds:.0f} s")
    for c in p.candidates:
        assert c.layout is not None and c.peak_bytes is not None and c.step_s is not None
        print(
            f"{c.layout.label():<36} layers {c.row()['traced_layers']:<8} peak "
            f"{c.peak_bytes:,} B, on the GPU {c.device_bytes:,} B, fits {c.fits}, step "
            f"{c.step_s:.9g} s, MFU {c.mfu:.2%}"
        )


ON_64 = [
    {"pp": 2, "fsdp": 4, "tp": 8, "sequence_parallel": True, "schedule": "1F1B"},
    {"pp": 4, "fsdp": 2, "tp": 8, "sequence_parallel": True, "schedule": "1F1B"},
]


def plan_on_64() -> None:
    """``mw.plan`` of the 405B on 64 H100s over :data:`ON_64` as given (float32 AdamW), with
    and without checkpointing, 4 sequences of 8,192 tokens a step: no rank of either pipeline
    can hold its parameters, gradients and optimizer state in 80 GB, which its traces at 2 and
    3 layers a stage show (``depth_stages.held_by_ranks``), and the plan traces no more."""
    start = time.perf_counter()
    p = mw.plan(
        config(), (4, 8192), gpu="H100", devices=64, layouts=ON_64, precisions=["as given"],
        activation_checkpointing=[False, True], progress=True,
    )  # fmt: skip
    print(
        f"\n{len(p.candidates)} candidates, {p.traces} traces, {time.perf_counter() - start:.0f} s"
    )
    for c in p.candidates:
        assert c.layout is not None
        print(
            f"{c.layout.label():<28} checkpointing {c.activation_checkpointing!s:<5} layers "
            f"{c.row()['traced_layers']:<8} on the GPU {c.device_bytes:,} B, fits {c.fits}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=126)
    parser.add_argument("--no-ac", action="store_true", help="no activation checkpointing")
    parser.add_argument(
        "--sequence-parallel", action="store_true", help="sequence parallelism over the TP ranks"
    )
    parser.add_argument("--plan", action="store_true", help="plan layouts without a pipeline")
    parser.add_argument(
        "--default-plan", action="store_true", help="plan's default space less its pipelines"
    )
    parser.add_argument(
        "--cp", type=int, nargs="+", default=[1], help="--default-plan: context-parallel degrees"
    )
    parser.add_argument("--pipelines", type=int, default=0, help="plan the first N pipelines")
    parser.add_argument(
        "--interleaved", action="store_true", help="plan PP 2 interleaved, 3 stages a rank"
    )
    parser.add_argument("--full-depth", action="store_true", help="--pipelines at full depth")
    parser.add_argument("--on-64", action="store_true", help="pipelines on 64 H100s, pruned")
    args = parser.parse_args()
    if args.on_64:
        plan_on_64()
        return
    if args.pipelines or args.interleaved:
        layouts = [INTERLEAVED] if args.interleaved else PIPELINES[: args.pipelines]
        plan_pipelines(args.full_depth, layouts, ac=not args.no_ac)
        return
    if args.plan:
        plan_without_a_pipeline()
        return
    if args.default_plan:
        default_plan_without_pipelines(tuple(args.cp))
        return
    start = time.perf_counter()
    a = trace(args.layers, ac=not args.no_ac, sp=args.sequence_parallel)
    if a.error is not None:
        raise SystemExit(f"the trace failed: {a.error}")
    print(f"Llama 3 405B shape, {args.layers} layers, {a.options.parallel.label()}, "
          f"activation checkpointing {'off' if args.no_ac else 'every layer'}")  # fmt: skip
    print(report(a, time.perf_counter() - start))


if __name__ == "__main__":
    main()
