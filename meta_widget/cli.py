"""``meta-widget``: analyze a model from the terminal, print the summary, write an HTML report.

meta-widget examples/llama_70b.py:config --input 1,4096 --html llama.html
meta-widget torch.nn:Transformer --input 10,2,512 --input 12,2,512
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from collections.abc import Sequence
from typing import Any


class UsageError(ValueError):
    """A command-line argument the CLI cannot use."""


def parse_shape(text: str) -> tuple[int, ...]:
    """``"1,3,224,224"`` (or ``1x3x224x224``) -> ``(1, 3, 224, 224)``."""
    parts = [p for p in text.replace("x", ",").replace(" ", "").split(",") if p]
    try:
        shape = tuple(int(p) for p in parts)
    except ValueError:
        raise UsageError(
            f"cannot read the shape {text!r}: write integers separated by commas, e.g. 1,3,224,224"
        ) from None
    if not shape or any(d < 0 for d in shape):
        raise UsageError(f"cannot read the shape {text!r}: dimensions must be non-negative")
    return shape


def parse_dtype(text: str) -> Any:
    import torch

    aliases = {"long": "int64", "int": "int32", "float": "float32", "half": "float16"}
    dtype = getattr(torch, aliases.get(text, text), None)
    if not isinstance(dtype, torch.dtype):
        raise UsageError(f"unknown dtype {text!r}: use e.g. float32, bfloat16, long, int32")
    return dtype


def load_object(spec: str) -> Any:
    """``package.module:attr`` or ``path/to/file.py:attr`` -> the object."""
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr:
        raise UsageError(f"{spec!r} is not of the form module:attr (e.g. mypkg.models:Net)")
    if target.endswith(".py") or os.sep in target:
        if not os.path.exists(target):
            raise UsageError(f"no file {target!r}")
        module_spec = importlib.util.spec_from_file_location("_meta_widget_target", target)
        if module_spec is None or module_spec.loader is None:
            raise UsageError(f"cannot import {target!r}")
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as exc:
            raise UsageError(f"cannot import {target!r}: {exc}") from exc
    value: Any = module
    for part in attr.split("."):
        if not hasattr(value, part):
            raise UsageError(f"{target!r} has no attribute {attr!r}")
        value = getattr(value, part)
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="meta-widget",
        description="Analyze a PyTorch model on the meta device: tree, shapes, FLOPs, memory.",
    )
    parser.add_argument("model", help="module:attr of an nn.Module, class, factory or config")
    parser.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="SHAPE",
        help="an input shape, batch included, e.g. 1,3,224,224 (repeat for several inputs)",
    )
    parser.add_argument(
        "--dtype",
        action="append",
        default=[],
        metavar="DTYPE",
        help="dtype of each input (float32, long, ...); default float32, long for token ids",
    )
    parser.add_argument("--mode", choices=["inference", "training"], default="inference")
    parser.add_argument("--depth", type=int, default=3, help="depth of the printed tree")
    parser.add_argument("--html", metavar="PATH", help="write a standalone HTML report here")
    parser.add_argument("--json", metavar="PATH", help="write the analysis as JSON here")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        model = load_object(args.model)
        shapes = [parse_shape(s) for s in args.input]
        dtypes = [parse_dtype(d) for d in args.dtype] or None
        if dtypes is not None and len(dtypes) != len(shapes):
            raise UsageError("give one --dtype per --input, or none")
    except UsageError as exc:
        parser.error(str(exc))
    from .analysis import analyze

    analysis = analyze(
        model,
        input_size=(shapes if len(shapes) != 1 else shapes[0]) if shapes else None,
        dtypes=dtypes,
        mode=args.mode,
    )
    print(analysis.summary(args.depth))
    if args.html:
        analysis.to_html(args.html)
        print(f"\nWrote {args.html}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            f.write(analysis.to_json())
        print(f"Wrote {args.json}")
    return 1 if analysis.error is not None else 0


if __name__ == "__main__":
    sys.exit(main())
