"""Real CUDA peaks for the accuracy corpus, measured once on a GPU and kept as a JSON file.

    python benchmarks/gpu_truth.py --measure gpu_truth.json     # on a machine with a CUDA device
    python benchmarks/gpu_truth.py --compare benchmarks/results/gpu_truth_h200.json   # anywhere

``--measure`` runs every case of :data:`CASES` for real on the GPU and writes, per case, the peak
of ``torch.cuda.max_memory_allocated`` over the pass minus what was allocated before the model
was moved there (the cuBLAS workspace is warmed up first, so it is not counted in any case), with
the torch version and device name. ``--compare`` needs no GPU: it predicts each case with
``mw.analyze(..., device="cuda")`` on meta and prints predicted against measured. A case whose
options this version of meta_widget does not accept is shown as such, not skipped silently.

The cases: the corpus of ``memory_accuracy.py`` in inference and for one AdamW step (fp32), the
same step under ``torch.autocast("cuda", bf16 / fp16)`` with fp32 master weights (forward and loss
inside autocast, backward and step outside, as people write it; the output is kept until after
the step, as ``out = model(x)`` keeps it and as ``mw.analyze`` records it), bf16 inference under
autocast, pure bf16 training (parameters and AdamW state in bf16), gradient accumulation over four
micro-batches (each on the whole inputs, the loss divided by four, as ``micro_batches=4``
runs), and PyTorch's fused inference fast paths (``nn.TransformerEncoder`` with and without a
padding mask, ``nn.MultiheadAttention``, stacked LSTM / GRU).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from memory_accuracy import CORPUS, _call
from torch import nn

from meta_widget.trace.passes import default_loss

Build = Callable[[], tuple[nn.Module, dict[str, Any]]]


def encoder(mask: bool) -> Build:
    def build() -> tuple[nn.Module, dict[str, Any]]:
        layer = nn.TransformerEncoderLayer(128, 4, dim_feedforward=512, batch_first=True)
        model = nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=True)
        inputs: dict[str, Any] = {"src": torch.randn(8, 128, 128)}
        if mask:
            padding = torch.zeros(8, 128, dtype=torch.bool)
            padding[:, 96:] = True  # the last quarter of every sequence is padding
            inputs["src_key_padding_mask"] = padding
        return model, inputs

    return build


def mha() -> tuple[nn.Module, dict[str, Any]]:
    class SelfAttention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn = nn.MultiheadAttention(256, 8, batch_first=True)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.attn(x, x, x, need_weights=False)[0]

    return SelfAttention(), {"x": torch.randn(8, 197, 256)}


def recurrent(cls: type[nn.RNNBase]) -> Build:
    def build() -> tuple[nn.Module, dict[str, Any]]:
        class Last(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.rnn = cls(128, 256, num_layers=2, batch_first=True)

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return self.rnn(x)[0]

        return Last(), {"x": torch.randn(16, 64, 128)}

    return build


@dataclass(frozen=True)
class Case:
    """One measured pass: a model, how it runs, and the ``analyze`` options that describe it."""

    build: Build
    training: bool
    autocast: torch.dtype | None = None
    pure_dtype: torch.dtype | None = None
    micro_batches: int = 1
    options: dict[str, Any] = field(default_factory=dict)


def _cases() -> dict[str, Case]:
    cases: dict[str, Case] = {}
    for name, build in CORPUS.items():
        cases[f"{name} | inference"] = Case(build, False)
        cases[f"{name} | training"] = Case(build, True)
        for dtype, short in ((torch.bfloat16, "bf16"), (torch.float16, "fp16")):
            cases[f"{name} | training, autocast {short}"] = Case(
                build, True, autocast=dtype, options={"autocast": dtype}
            )
        cases[f"{name} | inference, autocast bf16"] = Case(
            build, False, autocast=torch.bfloat16, options={"autocast": torch.bfloat16}
        )
        cases[f"{name} | training, pure bf16"] = Case(
            build, True, pure_dtype=torch.bfloat16, options={"param_dtype": torch.bfloat16}
        )
        cases[f"{name} | training, 4 micro-batches"] = Case(
            build, True, micro_batches=4, options={"micro_batches": 4}
        )
    cases["TransformerEncoder | inference"] = Case(encoder(False), False)
    cases["TransformerEncoder, padding mask | inference"] = Case(encoder(True), False)
    cases["MultiheadAttention | inference"] = Case(mha, False)
    cases["LSTM x2 | inference"] = Case(recurrent(nn.LSTM), False)
    cases["GRU x2 | inference"] = Case(recurrent(nn.GRU), False)
    return cases


CASES = _cases()
#: real training steps a measurement runs: the first, then steady ones (``steady_peak_bytes``)
STEPS = 3


def measure(case: Case) -> dict[str, int]:
    """The case run for real on the GPU: peak allocated bytes over the pass, net of what was
    allocated before the model and its inputs were moved there."""
    device = torch.device("cuda")
    model, inputs = case.build()
    if case.pure_dtype is not None:
        model = model.to(case.pure_dtype)
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    model = model.to(device).train(case.training)
    moved = {}
    for key, value in inputs.items():
        if isinstance(value, torch.Tensor):
            value = value.to(device)
            if case.pure_dtype is not None and value.is_floating_point():
                value = value.to(case.pure_dtype)
        moved[key] = value
    optimizer = torch.optim.AdamW(model.parameters(), foreach=False) if case.training else None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    autocast = torch.autocast("cuda", dtype=case.autocast, enabled=case.autocast is not None)
    if not case.training:
        with torch.no_grad(), autocast:
            out = _call(model, moved)
        del out
    else:
        assert optimizer is not None
        steady = 0
        for step in range(STEPS):  # the first step, then the steady ones (zero_grad first)
            optimizer.zero_grad()
            for _ in range(case.micro_batches):  # each on the whole inputs, as analyze() does
                with autocast:
                    out = _call(model, moved)  # kept through backward, as `out = model(x)` does
                    loss = default_loss(out) / case.micro_batches
                loss.backward()
                del loss
            optimizer.step()
            del out
            torch.cuda.synchronize()
            if step == 0:
                first = torch.cuda.max_memory_allocated()
            else:
                steady = max(steady, torch.cuda.max_memory_allocated())
            torch.cuda.reset_peak_memory_stats()
    torch.cuda.synchronize()
    if case.training:
        result = {
            "peak_bytes": first - before,
            "steady_peak_bytes": steady - before,
            "start_bytes": start - before,
        }
    else:
        peak = torch.cuda.max_memory_allocated()
        result = {"peak_bytes": peak - before, "start_bytes": start - before}
    del model, moved, optimizer
    return result


def warm_up() -> None:
    """cuBLAS / cuBLASLt workspaces and cuDNN handles, allocated once per process, so that no
    case pays for them (without the biased ``Linear``, the first case measured carried 1 MiB of
    cuBLASLt workspace)."""
    device = torch.device("cuda")
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        a = torch.randn(256, 256, device=device, dtype=dtype, requires_grad=True)
        (a @ a).sum().backward()
        linear = nn.Linear(256, 256).to(device, dtype)  # addmm with a bias: cuBLASLt's workspace
        linear(a).sum().backward()
        with torch.no_grad():
            linear(a)
        conv = nn.Conv2d(3, 8, 3).to(device, dtype)
        conv(torch.randn(2, 3, 16, 16, device=device, dtype=dtype)).sum().backward()
        for rnn in (nn.LSTM, nn.GRU):
            r = rnn(8, 8, batch_first=True).to(device, dtype)
            r(torch.randn(2, 4, 8, device=device, dtype=dtype))[0].sum().backward()
    torch.cuda.synchronize()


def snapshot(case: Case) -> list[tuple[str, int, str]]:
    """The caching allocator's events over the case: (action, bytes, innermost Python frames)."""
    torch.cuda.memory._record_memory_history(max_entries=100_000, stacks="python")
    try:
        measure(case)
        trace = torch.cuda.memory._snapshot()["device_traces"][0]
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    events = []
    for e in trace:
        if e["action"] not in ("alloc", "free_requested"):
            continue
        frames = [
            f"{f['filename'].rsplit('/', 2)[-1]}:{f['line']} {f['name']}" for f in e["frames"]
        ]
        frames = [f for f in frames if "gpu_truth" not in f and "memory_accuracy" not in f]
        events.append((e["action"], int(e["size"]), " < ".join(frames[:4])))
    return events


def run_measure(path: str, snapshots: list[str]) -> int:
    if not torch.cuda.is_available():
        print("gpu_truth: no CUDA device here; nothing to measure.")
        return 1
    warm_up()
    results: dict[str, Any] = {
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(),
        "cases": {},
    }
    for name, case in CASES.items():
        try:
            results["cases"][name] = measure(case)
        except Exception as exc:  # a case that cannot run on this GPU is reported, not fatal
            results["cases"][name] = {"error": f"{type(exc).__name__}: {exc}"}
        print(f"{name}: {results['cases'][name]}", flush=True)
    with open(path, "w") as f:
        json.dump(results, f, indent=1)
    if snapshots:
        traces = {name: snapshot(CASES[name]) for name in snapshots}
        with open(path.replace(".json", "_events.json"), "w") as f:
            json.dump(traces, f)
    return 0


def predict(case: Case) -> int:
    import meta_widget as mw

    model, inputs = case.build()
    data: Any = (inputs["x"],) if "x" in inputs else inputs
    a = mw.analyze(
        model,
        input_data=data,
        mode="training" if case.training else "inference",
        device="cuda",
        # the measurement's optimizer: AdamW(foreach=False), not PyTorch's CUDA default
        **({"foreach": False} if case.training else {}),
        **case.options,
    )
    if a.error is not None:
        raise RuntimeError(str(a.error))
    # ``peak_bytes`` measured one training step (the first); ``steady_peak_bytes``, measured
    # from the next device run on, is ``predict_steady``'s truth
    return a.memory.first_step_peak_bytes


def predict_steady(case: Case) -> int:
    """The steady training step's peak (``Analysis.peak_bytes``) of a training case."""
    import meta_widget as mw

    model, inputs = case.build()
    data: Any = (inputs["x"],) if "x" in inputs else inputs
    options = {"foreach": False, **case.options}
    a = mw.analyze(model, input_data=data, mode="training", device="cuda", **options)
    if a.error is not None:
        raise RuntimeError(str(a.error))
    return a.peak_bytes


def run_compare(path: str) -> int:
    with open(path) as f:
        measured = json.load(f)
    print(f"measured: torch {measured['torch']} on {measured['device']}; MiB\n")
    print("| case | predicted (meta, device='cuda') | measured (max_memory_allocated) | ratio |")
    print("|---|---|---|---|")
    for name, case in CASES.items():
        truth = measured["cases"].get(name, {})
        if "peak_bytes" not in truth:
            print(f"| {name} | | {truth.get('error', 'not measured')} | |")
            continue
        try:
            predicted = predict(case)
        except Exception as exc:  # an option this version does not have is a row, not a crash
            print(
                f"| {name} | {type(exc).__name__}: {str(exc)[:60]} | "
                f"{truth['peak_bytes'] / 2**20:.2f} | |"
            )
            continue
        ratio = predicted / truth["peak_bytes"]
        print(
            f"| {name} | {predicted / 2**20:.2f} | {truth['peak_bytes'] / 2**20:.2f} "
            f"| {ratio:.3f} |"
        )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--measure", metavar="JSON", help="measure on this machine's GPU")
    group.add_argument("--compare", metavar="JSON", help="predict and compare with a measurement")
    parser.add_argument(
        "--events",
        nargs="*",
        default=[],
        help="with --measure: cases whose allocator events to keep",
    )
    args = parser.parse_args()
    return run_measure(args.measure, args.events) if args.measure else run_compare(args.compare)


if __name__ == "__main__":
    sys.exit(main())
