"""Whether a model's decoder layers are alike: what ``plan``'s per-layer rule needs of them
(:func:`meta_widget.explore.depth.depth_of`)."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["alike_layers"]

#: module attributes that may differ between alike layers (the layer's own index)
_INDEX_NAMES = frozenset({"layer_idx", "layer_id", "layer_number", "idx", "index"})


def alike_layers(module: torch.nn.Module, layers: int) -> bool:
    """Whether ``module`` has a ModuleList of ``layers`` alike modules (every submodule's type,
    parameter and buffer shapes and dtypes, and plain attributes other than an index)."""
    lists = [m for m in module.modules() if isinstance(m, torch.nn.ModuleList) and len(m) == layers]
    return any(len({_signature(layer) for layer in found}) == 1 for found in lists)


def _signature(layer: torch.nn.Module) -> tuple[Any, ...]:
    parts: list[Any] = []
    for name, m in layer.named_modules():
        plain = sorted(
            (k, repr(v))
            for k, v in vars(m).items()
            if not k.startswith("_")
            and k not in _INDEX_NAMES
            and isinstance(v, (int, float, str, bool, type(None), tuple))
        )
        tensors = [
            (k, tuple(t.shape), t.dtype)
            for k, t in [*m.named_parameters(recurse=False), *m.named_buffers(recurse=False)]
        ]
        parts.append((name, type(m).__qualname__, tuple(plain), tuple(tensors)))
    return tuple(parts)
