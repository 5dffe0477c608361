"""The model zoo: small configs of real architectures, each run for real on the CPU and on meta.

``make zoo`` (or ``.venv-zoo/bin/python benchmarks/zoo.py``) builds every model below from a small
config (torchvision, timm, diffusers, transformers and plain torch; no weights are downloaded),
runs it for real on the CPU and analyzes it with ``mw.analyze(model, ..., device="cpu")``, and
prints one row per model:

- **shapes**: module calls whose output shapes equal the real forward's (hooks on every module),
  of all calls;
- **params**: ``a.total_params`` against ``sum(p.numel())`` of the real model (tied once);
- **FLOPs**: ``a.total_flops`` over ``FlopCounterMode`` on the real forward (attention forced to
  the math path, which FlopCounterMode can count: the forward FLOPs of every path are equal);
- **inference / training peak**: ``a.peak_bytes`` over ``MemTracker``'s peak of a real eval
  forward under ``no_grad`` / a real train forward + ``sum()`` of the output + backward (no
  optimizer step).

It needs torchvision, which from PyPI does not import beside the test environment's CPU torch, so
it runs in its own environment (``.venv-zoo``, made by ``make zoo``). ``--only NAME`` runs the
rows whose name contains ``NAME``, ``--family torch`` one family; ``--markdown PATH`` also
writes the table there.
"""

from __future__ import annotations

import argparse
import copy
import gc
import sys
import time
import traceback
from typing import Any

import torch
import zoo_transformers  # noqa: F401  (registers the transformers rows, after the others)
from torch import nn
from torch.distributed._tools.mem_tracker import MemTracker
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode
from zoo_models import CASES, Case, Inputs

import meta_widget as mw
from meta_widget.data.flatten import named_tensors

# ---------------------------------------------------------------------------------------------
# running a row


def real_forward(model: nn.Module, inputs: Inputs) -> tuple[list[Any], int, int]:
    """Output shapes of every module call, MemTracker's peak and FlopCounterMode's FLOPs of an
    eval forward under ``no_grad``."""
    args, kwargs = inputs
    model = model.eval()
    names = {id(m): n for n, m in model.named_modules()}
    shapes: list[Any] = []  # in call start order, as the analysis lists calls
    open_calls: list[int] = []

    def pre(m: nn.Module, a: Any) -> None:
        open_calls.append(len(shapes))
        shapes.append((names.get(id(m), "?"), None))

    def post(m: nn.Module, a: Any, out: Any) -> None:
        i = open_calls.pop()
        found = named_tensors(out, caches=not open_calls)
        shapes[i] = (
            shapes[i][0],
            [("nested",) if t.is_nested else tuple(t.shape) for _, t in found],
        )

    handles = [m.register_forward_pre_hook(pre) for m in model.modules()]
    handles += [m.register_forward_hook(post) for m in model.modules()]
    try:
        with torch.no_grad():
            model(*args, **kwargs)
    finally:
        for h in handles:
            h.remove()
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as fc:
        model(*args, **kwargs)
    return shapes, _peak(model, inputs, training=False), int(fc.get_total_flops())


def _peak(model: nn.Module, inputs: Inputs, training: bool, loss: Any = None) -> int:
    args, kwargs = inputs
    model = copy.deepcopy(model).train(training)
    tracker = MemTracker()
    tensors = [t for _, t in named_tensors((args, kwargs))]
    frozen = [p for p in model.parameters() if not p.requires_grad]
    if frozen and training:
        raise RuntimeError("MemTracker cannot track a training step with frozen parameters")
    for p in frozen:  # MemTracker hooks every parameter's grad (no effect under no_grad)
        p.requires_grad_(True)
    tracker.track_external(model, *tensors)
    with tracker, torch.set_grad_enabled(training):
        out = model(*args, **kwargs)
        if training:
            value = (loss or mw_loss)(out)
            value.backward()
            del value
        peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]
    del out
    return int(peak["Total"])


def mw_loss(out: Any) -> torch.Tensor:
    from meta_widget.trace.passes import default_loss

    return default_loss(out)


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.3f}" if b else ("1.000" if not a else "—")


def run_case(c: Case) -> dict[str, str]:
    torch.manual_seed(0)
    model = c.build()
    inputs = c.inputs()
    params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    shapes, infer_peak, flops = real_forward(model, inputs)
    a = mw.analyze(model, input_data=_as_data(inputs), device="cpu", assume=c.assume or None)
    row = {"model": c.name, "family": c.family}
    if a.error is not None:
        row["note"] = f"inference: {a.error.title}: {str(a.error.message).splitlines()[0][:120]}"
        return row
    mine = [
        (x.path, [info.shape for _, info in x.outputs]) for x in a.calls if x.phase == "forward"
    ]
    same = sum(1 for m, r in zip(mine, shapes, strict=False) if m == r)
    row["calls"] = f"{same}/{len(shapes)}" + (
        "" if len(mine) == len(shapes) else f" (ours {len(mine)})"
    )
    row["params"] = "=" if a.total_params == params else f"{a.total_params}≠{params}"
    row["flops"] = _ratio(a.total_flops, flops)
    row["inference"] = _ratio(a.peak_bytes, infer_peak)
    row["assumed"] = str(len(a.assumptions)) if a.assumptions else ""
    if c.no_training is not None:
        row["training"] = "—"
        row["note"] = c.no_training
        return row
    b = mw.analyze(
        model,
        input_data=_as_data(inputs),
        mode="training",
        optimizer=None,
        device="cpu",
        loss=c.loss,
        assume=c.assume or None,
    )
    if b.error is not None:
        row["training"] = "error"
        row["note"] = f"training: {b.error.title}"
        return row
    try:
        real = _peak(model, inputs, training=True, loss=c.loss)
    except RuntimeError as exc:  # the truth cannot be measured: say why
        row["training"], row["note"] = "—", str(exc)
        return row
    row["training"] = _ratio(b.peak_bytes, real)
    return row


def _as_data(inputs: Inputs) -> Any:
    args, kwargs = inputs
    if kwargs and not args:
        return kwargs
    if kwargs:
        raise ValueError("a zoo row passes positional or keyword inputs, not both")
    return args


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="run the rows whose name contains this")
    parser.add_argument("--family", default="", help="run one family (torch, timm, ...)")
    parser.add_argument("--markdown", default="", help="also write the table to this file")
    opts = parser.parse_args(argv)
    cols = ["model", "calls", "params", "flops", "inference", "training", "assumed", "note"]
    head = [
        "model",
        "shapes (calls equal)",
        "params",
        "FLOPs ratio",
        "inference peak ratio",
        "training peak ratio",
        "assumptions",
        "note",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    print(f"torch {torch.__version__}", file=sys.stderr)
    for c in CASES:
        if (opts.only and opts.only not in c.name) or (opts.family and opts.family != c.family):
            continue
        start = time.perf_counter()
        try:
            row = run_case(c)
        except Exception as exc:  # a row that cannot run says why, and the zoo goes on
            traceback.print_exc()
            row = {
                "model": c.name,
                "note": f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}",
            }
        gc.collect()
        line = "| " + " | ".join(row.get(k, "") for k in cols) + " |"
        lines.append(line)
        print(line, f"({time.perf_counter() - start:.1f} s)", file=sys.stderr, flush=True)
    table = "\n".join(lines)
    print(table)
    if opts.markdown:
        with open(opts.markdown, "w") as f:
            f.write(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
