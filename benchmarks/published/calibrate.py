"""Reproduce every published measurement of ``measurements.toml`` with ``mw.analyze`` on the CPU
and print predicted / measured (issue 37's calibration set).

    python benchmarks/published/calibrate.py            # every row: ratios, median and worst
    python benchmarks/published/calibrate.py --kind serving

Each ratio is the predicted *time* over the measured one (a rate's ratio is measured over
predicted): above 1 the model is too slow, below 1 too fast. A training step or a decode step is
traced at a few decoder layers and taken to the model's depth by the per-layer rule ``plan``
uses (``meta_widget.explore.depth``; a decode step: each further layer adds what the third
added). A GEMM, an
attention call and a collective are timed alone (the last with ``collective_seconds``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomllib
import torch
import transformers
from torch import nn
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's meta_widget

import meta_widget as mw
from meta_widget.data.records import CallRecord
from meta_widget.explore import depth
from meta_widget.timing.gpus import resolve_gpu
from meta_widget.timing.model import collective_seconds, op_seconds, step_time

TABLE = Path(__file__).with_name("measurements.toml")
KINDS = ("training", "kernel", "serving")
DEPTHS = (2, 3)


def rows(path: Path = TABLE) -> list[dict[str, Any]]:
    """The table's rows, as the TOML file holds them."""
    with path.open("rb") as f:
        return list(tomllib.load(f)["row"])


@dataclass(frozen=True)
class Result:
    id: str
    kind: str
    predicted_s: float
    measured_s: float
    defines: str = ""

    @property
    def ratio(self) -> float:
        """Predicted time over measured time."""
        return self.predicted_s / self.measured_s


def _config(run: dict[str, Any], layers: int) -> Any:
    transformers.logging.set_verbosity_error()
    d, heads = run["d"], run["heads"]
    if run.get("model") == "mpt":  # MPT's widths as a GPT-NeoX (MPT itself runs eager attention)
        return transformers.GPTNeoXConfig(
            vocab_size=50368, hidden_size=d, num_hidden_layers=layers, num_attention_heads=heads,
            intermediate_size=4 * d, hidden_act="gelu", use_parallel_residual=False,
            max_position_embeddings=run.get("seq", 2048), use_cache=False,
            tie_word_embeddings=True,
        )  # fmt: skip
    return transformers.LlamaConfig(
        hidden_size=d, intermediate_size=run["ffn"], num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=run.get("kv_heads", heads),
        vocab_size=run["vocab"], max_position_embeddings=max(run.get("seq", 0), 8192),
        use_cache=run["type"] != "train", architectures=["LlamaForCausalLM"],
    )  # fmt: skip


def _by_depth(run: dict[str, Any], measure: Callable[[int], float]) -> float:
    """``measure`` at the row's depth from its values at 2 and 3 layers."""
    two, three = (measure(n) for n in DEPTHS)
    return two + (run["layers"] - DEPTHS[0]) * (three - two)


def _parallel(run: dict[str, Any]) -> dict[str, Any] | None:
    """The row's layout; FSDP in mixed precision: parameters gathered in bfloat16, gradients
    reduced in the row's ``reduce`` dtype (float32: torchtitan's, and Composer's DEFAULT mode
    that llm-foundry's tables ran; its PURE mode would be bfloat16)."""
    layout: dict[str, Any] = {k: run[k] for k in ("fsdp", "tp") if run.get(k, 1) > 1}
    if run["type"] == "train" and "fsdp" in layout:
        layout["mp"] = {"param_dtype": "bfloat16", "reduce_dtype": run.get("reduce", "float32")}
    return layout or None


def _train(run: dict[str, Any]) -> float:
    """One rank's step at the row's depth: traced at 3 and 4 layers and extended by
    ``plan``'s rule (``meta_widget.explore.depth``: costs and collectives per layer, the overlap
    of communication applied at full depth)."""
    checkpointing = run.get("checkpointing", False)
    samples = []
    for layers in depth.DEPTHS:
        a = mw.analyze(
            _config(run, layers), input_size=(run["batch"], run["seq"]), mode="training",
            autocast=None if run.get("fsdp", 1) > 1 else torch.bfloat16, device="cuda",
            activation_checkpointing=checkpointing, parallel=_parallel(run), gpu=run["gpu"],
        )  # fmt: skip
        assert a.error is None and a.time is not None, a.error
        samples.append(depth.sample(a, layers))
    return _extended_step(samples, run["layers"], resolve_gpu(run["gpu"]), run.get("fsdp", 1))


def _extended_step(samples: list[depth.Sample], layers: int, gpu: Any, dp: int) -> float:
    """The time half of ``depth.extend``: costs and collectives grown by what the fourth layer
    adds, timed at full depth; the memory events, which ``extend`` also checks, play no part
    in the time."""
    extra = layers - samples[0].layers
    phases = sorted({p for s in samples for p in s.costs})
    costs = {p: depth._linear([s.costs.get(p, Counter()) for s in samples], extra) for p in phases}
    comms = depth._linear([s.comms for s in samples], extra)
    assert comms is not None and all(c is not None for c in costs.values()), "layers not alike"
    call = CallRecord(0, "", "", -1, -1, 0, [], costs=dict(costs.get("forward") or {}))
    call.backward_costs = dict(costs.get("backward") or {})
    outside = {
        p.removeprefix("outside "): dict(c or {})
        for p, c in costs.items()
        if p.startswith("outside ")
    }
    three, four = samples
    assert three.edges == four.edges, "edges not alike"
    records = depth.comm_records(comms, three.edges)
    tokens = None if three.tokens is None else three.tokens // dp
    batch = None if three.samples is None else three.samples // dp
    flops = three.flops + extra * (four.flops - three.flops)
    return step_time([call], outside, records, gpu, flops, tokens, batch, data_parallel=dp).step_s


def _decode(run: dict[str, Any]) -> float:
    def per_token(layers: int) -> float:
        a = mw.analyze(
            _config(run, layers), input_size=(run["batch"], run["prompt"]), dtypes="long",
            param_dtype="bfloat16", mode="generate", new_tokens=run["new_tokens"],
            parallel=_parallel(run), device="cuda", gpu=run["gpu"],
        )  # fmt: skip
        assert a.error is None and a.time is not None and a.time.per_token_s, a.error
        return a.time.per_token_s

    return _by_depth(run, per_token)


def _prefill(run: dict[str, Any]) -> float:
    """The time to the first token: the prompt's forward pass, CUDA graphs' launch (a server's
    engine pays no per-op host time), at the row's depth."""

    def forward(layers: int) -> float:
        a = mw.analyze(
            _config(run, layers), input_size=(run["batch"], run["prompt"]), dtypes="long",
            param_dtype="bfloat16", mode="inference", device="cuda", gpu=run["gpu"],
            launch="graphs",
        )  # fmt: skip
        assert a.error is None and a.time is not None, a.error
        return a.time.step_s

    return _by_depth(run, forward)


class _Matmul(nn.Module):
    def __init__(self, k: int, n: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(k, n, dtype=dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight


def _gemm(run: dict[str, Any]) -> float:
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.float8_e4m3fn}
    m, n, k = run["m"], run["n"], run["k"]
    if run["dtype"] == "fp8":  # no meta matmul of float8: its cost, at the FP8 peak
        cost = ("fp8", 2 * m * n * k, m * k + k * n + 2 * m * n, ("mm", m, n, k, 1))
        return op_seconds(cost, resolve_gpu(run["gpu"]))[0]
    with torch.device("meta"):
        model = _Matmul(k, n, dtype[run["dtype"]])
        x = torch.empty(m, k, dtype=dtype[run["dtype"]])
    a = mw.analyze(model, input_data=x, gpu=run["gpu"])
    assert a.time is not None
    return a.time.forward_s


class _Attention(nn.Module):
    def __init__(self, causal: bool) -> None:
        super().__init__()
        self.causal = causal
        self.scale = nn.Parameter(torch.ones((), dtype=torch.bfloat16))  # for AdamW to step

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q * self.scale, k, v, is_causal=self.causal)


def _attention(run: dict[str, Any]) -> float:
    """The attention kernel's own time (forward, or backward from a training step)."""
    shape = (run["batch"], run["heads"], run["seq"], run["head_dim"])
    direction = run.get("direction", "fwd")
    grad = direction == "bwd"
    q, k, v = (
        torch.empty(shape, dtype=torch.bfloat16, device="meta", requires_grad=grad)
        for _ in range(3)
    )
    with torch.device("meta"):
        model = _Attention(run["causal"])
    mode = "training" if grad else "inference"
    a = mw.analyze(model, input_data=(q, k, v), mode=mode, device="cuda", gpu=run["gpu"])
    assert a.error is None, a.error
    costs = [
        cost
        for c in a.calls
        for table in (c.costs, c.backward_costs)
        for cost in table
        if cost[3][:1] == ("attn",) and cost[3][2] == direction
    ]
    assert len(costs) == 1, costs
    return op_seconds(costs[0], resolve_gpu(run["gpu"]), floor=0.0)[0]


@dataclass(frozen=True)
class _Comm:
    collective: str
    bytes: int
    group: str
    group_size: int
    module: str = ""
    phase: str = "backward"


#: nccl-tests' bus bandwidth: the bytes a rank moves per byte of the whole tensor
_BUS = {"all_reduce": lambda p: 2 * (p - 1) / p, "all_gather": lambda p: (p - 1) / p}


def _collective(run: dict[str, Any]) -> float:
    comm = _Comm(run["collective"], run["bytes"], "fsdp", run["ranks"])
    return collective_seconds(comm, resolve_gpu(run["gpu"]))


def measured_seconds(row: dict[str, Any]) -> float:
    """The measured time of the row's work, from its published figure."""
    run, value = row["run"], float(row["measured"])
    kind = run["type"]
    if kind == "train":
        return run["batch"] * run["seq"] / value  # tokens/s per GPU -> one rank's step
    if kind == "prefill":
        return value / 1e3  # ms to the first token
    if kind == "decode":
        if row["unit"].startswith("ms per output token"):
            return value / 1e3
        return run["batch"] / value  # tokens/s at batch b -> one decode step
    if kind == "gemm":
        if row["unit"] == "s":  # a time as published
            return value
        return 2 * run["m"] * run["n"] * run["k"] / (value * 1e12)
    if kind == "attention":
        b, h, s, d = run["batch"], run["heads"], run["seq"], run["head_dim"]
        flops = 4 * b * h * s * s * d // (2 if run["causal"] else 1)  # FA papers' count
        if run.get("direction") == "bwd":
            flops = flops * 5 // 2  # the backward's 5 matmuls to the forward's 2
        return flops / (value * 1e12)
    if kind == "collective":
        p = run["ranks"]
        return run["bytes"] * _BUS[run["collective"]](p) / (value * 1e9)
    raise ValueError(f"{row['id']}: unknown run type {kind!r}")


_PREDICT: dict[str, Callable[[dict[str, Any]], float]] = {
    "train": _train,
    "decode": _decode,
    "prefill": _prefill,
    "gemm": _gemm,
    "attention": _attention,
    "collective": _collective,
}


def reproduce(row: dict[str, Any]) -> Result:
    """The row's predicted and measured times."""
    predicted = _PREDICT[row["run"]["type"]](row["run"])
    return Result(row["id"], row["kind"], predicted, measured_seconds(row), row.get("defines", ""))


def summary(
    results: Iterable[Result], checked: bool = False
) -> dict[str, tuple[float, float, int]]:
    """Per kind: (median |ratio - 1|, worst |ratio - 1|, rows); ``checked``: only the rows
    that are no constant's source (``defines``), whose ratio the model predicts."""
    results = [r for r in results if not (checked and r.defines)]
    out = {}
    for kind in KINDS:
        errors = [abs(r.ratio - 1) for r in results if r.kind == kind]
        if errors:
            out[kind] = (statistics.median(errors), max(errors), len(errors))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=KINDS)
    args = parser.parse_args(argv)
    results = []
    print(f"{'row':<36} {'kind':<9} {'predicted':>11} {'measured':>11} {'ratio':>6}")
    for row in rows():
        if args.kind and row["kind"] != args.kind:
            continue
        r = reproduce(row)
        results.append(r)
        mark = "  (defines " + r.defines + ")" if r.defines else ""
        print(
            f"{r.id:<36} {r.kind:<9} {r.predicted_s * 1e3:>9.3f}ms {r.measured_s * 1e3:>9.3f}ms "
            f"{r.ratio:>6.2f}{mark}"
        )
    for checked in (False, True):
        which = "rows no constant comes from" if checked else "all rows"
        for kind, (median, worst, n) in summary(results, checked).items():
            print(f"{kind:<9} {n:>2} {which}: median |ratio-1| {median:6.1%}, worst {worst:6.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
