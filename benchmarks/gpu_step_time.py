"""Real step times on a GPU against ``analyze(..., gpu=...)``, measured once and kept as JSON.

    python benchmarks/gpu_step_time.py --measure step_time.json   # on a machine with a CUDA GPU
    python benchmarks/gpu_step_time.py --compare benchmarks/results/gpu_step_time_h200.json
    python benchmarks/gpu_step_time.py --measure /tmp/dry.json --device cpu --quick   # dry run

``--measure`` runs each case of :data:`CASES` for real: a few warm-up steps, then the median of
``--repeats`` timed steps (``torch.cuda.synchronize`` around each), with the torch version and
the device's name. A training step is forward, the loss, backward and ``AdamW.step()`` (its
default, multi-tensor implementation on CUDA, as ``analyze`` traces it); a one-token forward is
one forward pass on a (1, 1) batch of token ids, timed eagerly and as a replayed CUDA graph (the
kernels alone, without PyTorch's per-op launch cost, which the roofline does not model).
``--compare`` needs no GPU: it predicts each case with ``mw.analyze(..., gpu=<the measured
device>)`` on meta and prints predicted over measured. The issue's goals: within 25 % where
compute-bound (the training steps), within 15 % for a one-token forward (graphed).
``--device cpu --quick`` runs the measuring code on the CPU at small sizes, to check it before
device time is spent; its times mean nothing.

``tests/test_gpu_step_time.py`` checks the stored ratios of
``benchmarks/results/gpu_step_time_h200.json`` once it exists (no device was lent to measure it
yet).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from meta_widget.trace.passes import default_loss

GOALS = {"training": 0.25, "one-token forward": 0.15}


def decoder(hidden: int, layers: int, mlp: int, kv_heads: int, vocab: int = 32000) -> Any:
    """A Llama-shaped decoder config (grouped-query attention, SwiGLU), built without a download."""
    import transformers

    return transformers.LlamaConfig(
        hidden_size=hidden, intermediate_size=mlp, num_hidden_layers=layers,
        num_attention_heads=hidden // 128, num_key_value_heads=kv_heads, vocab_size=vocab,
        max_position_embeddings=4096, use_cache=False, architectures=["LlamaForCausalLM"],
    )  # fmt: skip


def small() -> Any:
    return decoder(1024, 8, 2816, 4)


def medium() -> Any:
    return decoder(2048, 16, 5632, 4)


def llama3_8b() -> Any:
    return decoder(4096, 32, 14336, 8, 128256)


class ConvNet(nn.Module):
    """A ResNet-like CNN: a stem, four stages of two 3x3 conv-BN-ReLU blocks, a classifier."""

    def __init__(self, width: int = 64, classes: int = 1000) -> None:
        super().__init__()
        layers: list[nn.Module] = [
            nn.Conv2d(3, width, 7, 2, 3, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.MaxPool2d(3, 2, 1),
        ]
        channels = width
        for stage in range(4):
            out = width * 2**stage
            for block in range(2):
                stride = 2 if stage and not block else 1
                layers += [nn.Conv2d(channels, out, 3, stride, 1, bias=False), nn.BatchNorm2d(out)]
                layers += [nn.ReLU()]
                channels = out
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean((2, 3)))


@dataclass(frozen=True)
class Case:
    """One measured configuration: a model, its input, and how it runs."""

    name: str
    kind: str  # "training" or "one-token forward"
    build: Callable[[], Any]  # a transformers config or an nn.Module class
    input_size: tuple[int, ...]
    quick_size: tuple[int, ...]
    param_dtype: str | None = None  # the parameters' dtype (pure bf16), else float32
    autocast: str | None = None  # forward and loss under torch.autocast

    def options(self) -> dict[str, Any]:
        """``analyze``'s options for this case (besides the input size and the GPU)."""
        mode = "training" if self.kind == "training" else "inference"
        out: dict[str, Any] = {"mode": mode, "device": "cuda"}
        if self.param_dtype:
            out["param_dtype"] = self.param_dtype
        if self.autocast:
            out["autocast"] = self.autocast
        return out


CASES = [
    Case("small decoder, fp32", "training", small, (8, 1024), (1, 16)),
    Case("small decoder, bf16", "training", small, (8, 1024), (1, 16), "bfloat16"),
    Case("medium decoder, bf16", "training", medium, (4, 1024), (1, 16), "bfloat16"),
    Case("CNN, fp32", "training", lambda: ConvNet, (64, 3, 224, 224), (2, 3, 64, 64)),
    Case("CNN, autocast bf16", "training", lambda: ConvNet, (64, 3, 224, 224), (2, 3, 64, 64),
         autocast="bfloat16"),
    Case("medium decoder, bf16", "one-token forward", medium, (1, 1), (1, 1), "bfloat16"),
    Case("Llama-3-8B, bf16", "one-token forward", llama3_8b, (1, 1), (1, 1), "bfloat16"),
]  # fmt: skip


# -- measuring, on the device --------------------------------------------------------------------


def _model(case: Case, device: str, quick: bool) -> tuple[nn.Module, torch.Tensor]:
    built = case.build()
    if quick and not isinstance(built, type):
        built = decoder(128, 2, 256, 1)
    with torch.device(device):
        if isinstance(built, type):
            model: nn.Module = built()
        else:
            import transformers

            model = transformers.AutoModelForCausalLM.from_config(built)
    if case.param_dtype:
        model = model.to(getattr(torch, case.param_dtype))
    size = case.quick_size if quick else case.input_size
    if isinstance(built, type):
        data = torch.randn(size, device=device)
    else:
        vocab = model.config.vocab_size
        data = torch.randint(0, vocab, size, device=device)
    return model, data


def _timed(step: Callable[[], Any], device: str, warmup: int, repeats: int) -> float:
    """The median seconds of ``repeats`` calls of ``step`` after ``warmup`` calls."""

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    for _ in range(warmup):
        step()
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure_case(case: Case, device: str, quick: bool, repeats: int) -> dict[str, Any]:
    model, data = _model(case, device, quick)
    cast = getattr(torch, case.autocast) if case.autocast else None
    if case.kind == "training":
        model.train()
        opt = torch.optim.AdamW(model.parameters())

        def step() -> None:
            with torch.autocast(device, cast, enabled=cast is not None):
                value = default_loss(model(data))
            value.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        return {"step_s": _timed(step, device, 3, repeats)}
    model.eval()

    @torch.no_grad()
    def forward() -> Any:
        return model(data)

    eager = _timed(forward, device, 3, repeats)
    out: dict[str, Any] = {"step_s": eager, "eager_s": eager}
    if device == "cuda":  # the kernels alone: the forward captured once, replayed
        try:
            out["step_s"] = out["graphed_s"] = _graphed(forward, repeats)
        except Exception as e:  # a forward that syncs with the host cannot be captured
            out["graph_error"] = f"{type(e).__name__}: {e}"[:300]
    return out


def _graphed(forward: Callable[[], Any], repeats: int) -> float:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            forward()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        forward()
    return _timed(graph.replay, "cuda", 3, repeats)


def measure(path: str, device: str, quick: bool, repeats: int) -> None:
    if device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device here: nothing measured")
        return
    found: dict[str, Any] = {
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu (dry run)",
        "cases": {},
    }
    for case in CASES:
        key = f"{case.name} | {case.kind}"
        start = time.perf_counter()
        try:
            found["cases"][key] = measure_case(case, device, quick, repeats)
        except Exception as e:  # e.g. out of memory: said in the file, the other cases still run
            found["cases"][key] = {"error": f"{type(e).__name__}: {e}"[:300]}
        print(f"{key}: {found['cases'][key]} ({time.perf_counter() - start:.1f} s)", flush=True)
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
        with open(path, "w") as f:  # each case as it lands: a run cut short keeps what it has
            json.dump(found, f, indent=1)


# -- predicting, anywhere ------------------------------------------------------------------------


GPU_NAMES = {"NVIDIA H200": "H200", "NVIDIA H100 80GB HBM3": "H100"}


def predicted(case: Case, gpu: str) -> Any:
    """``analyze``'s time of ``case`` on ``gpu`` (its ``StepTime``)."""
    import meta_widget as mw

    a = mw.analyze(case.build(), case.input_size, gpu=gpu, **case.options())
    if a.error is not None or a.time is None:
        raise RuntimeError(f"{case.name}: {a.error}")
    return a.time


def compare(path: str, gpu: str | None = None) -> list[dict[str, Any]]:
    """Predicted against measured for every case of the file at ``path``, on ``gpu`` (a name of
    ``mw.gpus()``; by default the measured device's)."""
    with open(path) as f:
        found = json.load(f)
    gpu = gpu or GPU_NAMES.get(found["device"], found["device"])
    rows = []
    for case in CASES:
        key = f"{case.name} | {case.kind}"
        if key not in found["cases"]:
            continue
        if "step_s" not in found["cases"][key]:
            continue  # it failed on the device: the file says why
        measured = found["cases"][key]["step_s"]
        time_ = predicted(case, gpu)
        rows.append(
            {"case": key, "kind": case.kind, "predicted_s": time_.step_s, "measured_s": measured,
             "ratio": time_.step_s / measured, "mfu": time_.mfu}
        )  # fmt: skip
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--measure", metavar="OUT.json")
    parser.add_argument("--compare", metavar="IN.json")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="small sizes (a dry run)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--gpu", default=None, help="predict for this GPU (default: as measured)")
    args = parser.parse_args()
    if args.measure:
        measure(args.measure, args.device, args.quick, args.repeats)
    if args.compare:
        for row in compare(args.compare, args.gpu):
            goal = GOALS[row["kind"]]
            ok = abs(row["ratio"] - 1) <= goal
            print(
                f"{row['case']:<42} predicted {row['predicted_s'] * 1e3:9.3f} ms  measured "
                f"{row['measured_s'] * 1e3:9.3f} ms  ratio {row['ratio']:.3f} "
                f"({'within' if ok else 'OUTSIDE'} ±{goal:.0%})"
            )
    if not (args.measure or args.compare):
        parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
