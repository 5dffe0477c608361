"""Independent truths for the tests: what plain hooks see in a real CPU forward."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

import meta_widget as mw
from meta_widget.data.flatten import named_tensors


def cpu_calls(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    """(path, output shapes) of every module call of a real CPU forward, seen by plain hooks."""
    names = {id(m): n for n, m in model.named_modules()}
    seen: list[tuple[str, list[tuple[int, ...]]]] = []
    handles = [
        m.register_forward_hook(
            lambda mod, _a, out: seen.append(
                (names[id(mod)], [tuple(t.shape) for _, t in named_tensors(out, caches=False)])
            )
        )
        for m in model.modules()
    ]
    try:
        with torch.no_grad():
            model(*args, **kwargs)
    finally:
        for h in handles:
            h.remove()
    return seen


def recorded_calls(a: mw.Analysis) -> list[Any]:
    """The same (path, output shapes) from the analysis, in completion (post-) order."""
    children: dict[int, list[Any]] = {}
    for c in a.calls:
        children.setdefault(c.parent, []).append(c)
    done: list[Any] = []

    def visit(c: Any) -> None:
        for k in children.get(c.index, []):
            visit(k)
        done.append(c)

    for top in children.get(-1, []):
        visit(top)
    return [(c.path, [info.shape for _, info in c.outputs if _not_cache(_)]) for c in done]


def _not_cache(name: str) -> bool:
    return "cache" not in name and "past_key_values" not in name
