"""Model inputs, following torchinfo's conventions, turned into meta tensors.

- ``input_size``: one shape ``(1, 3, 224, 224)`` or a list of shapes ``[(1, 16), (1, 16)]``, batch
  dimension included; each becomes a meta tensor of the matching ``dtypes`` entry.
- ``input_data``: a tensor, a tuple/list (positional arguments) or a dict (keyword arguments),
  nested freely; every tensor in it is replaced by a meta tensor of the same shape, stride, dtype
  and ``requires_grad``; other values pass through.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


class InputError(ValueError):
    """The inputs given to ``analyze`` cannot be turned into model arguments."""


@dataclass
class MetaInputs:
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    notes: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.args and not self.kwargs


def make_inputs(
    module: torch.nn.Module,
    input_size: Any = None,
    input_data: Any = None,
    dtypes: Sequence[torch.dtype] | None = None,
) -> MetaInputs:
    """Meta ``args`` and ``kwargs`` for ``module`` from torchinfo-style arguments."""
    if input_size is not None and input_data is not None:
        raise InputError("Pass either input_size or input_data, not both.")
    if input_data is not None:
        if isinstance(input_data, dict):
            return MetaInputs((), {k: to_meta_value(v) for k, v in input_data.items()})
        if isinstance(input_data, (tuple, list)):
            return MetaInputs(tuple(to_meta_value(v) for v in input_data), {})
        return MetaInputs((to_meta_value(input_data),), {})
    if input_size is None:
        return MetaInputs((), {})
    return _from_sizes(module, input_size, dtypes)


def to_meta_value(value: Any) -> Any:
    """``value`` with every tensor inside replaced by a meta tensor (no data is copied)."""
    import torch

    if isinstance(value, torch.Tensor):
        if value.is_meta:
            return value
        t = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
        return t.requires_grad_(value.requires_grad) if value.is_floating_point() else t
    if isinstance(value, dict):
        return type(value)({k: to_meta_value(v) for k, v in value.items()})
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # namedtuple
        return type(value)(*(to_meta_value(v) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(to_meta_value(v) for v in value)
    return value


def _is_shape(value: Any) -> bool:
    return isinstance(value, Sequence) and all(
        isinstance(d, int) and not isinstance(d, bool) for d in value
    )


def _from_sizes(
    module: torch.nn.Module, input_size: Any, dtypes: Sequence[torch.dtype] | None
) -> MetaInputs:
    import torch

    if _is_shape(input_size):
        shapes = [tuple(input_size)]
    elif isinstance(input_size, Sequence) and all(_is_shape(s) for s in input_size):
        shapes = [tuple(s) for s in input_size]
    else:
        raise InputError(
            f"input_size={input_size!r} is not a shape or a list of shapes. Examples: "
            "input_size=(1, 3, 224, 224), or input_size=[(1, 16), (1, 16)] for two inputs."
        )
    if any(d < 0 for s in shapes for d in s):
        raise InputError(f"input_size={input_size!r} has a negative dimension.")
    if dtypes is not None and len(dtypes) != len(shapes):
        raise InputError(
            f"dtypes has {len(dtypes)} entries but input_size has {len(shapes)} shapes; "
            "give one dtype per input."
        )
    notes: list[str] = []
    chosen = list(dtypes) if dtypes is not None else [torch.float32] * len(shapes)
    if dtypes is None:
        reason = _takes_token_ids(module)
        if reason:
            chosen[0] = torch.long
            notes.append(
                f"Input 0 was given dtype torch.long because {reason}; pass "
                "dtypes=[torch.float32] (or another dtype) to override."
            )
    args = tuple(
        torch.empty(s, dtype=dt, device="meta") for s, dt in zip(shapes, chosen, strict=True)
    )
    return MetaInputs(args, {}, notes)


_ID_NAMES = ("input_ids", "ids", "tokens", "token_ids", "idx", "indices")


def _takes_token_ids(module: torch.nn.Module) -> str:
    """Why the first input should be integer ids, or ``""`` when nothing says so."""
    import torch

    try:
        params = [
            p
            for p in inspect.signature(module.forward).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        params = []
    if params and params[0].name.lower() in _ID_NAMES:
        return f"the first argument of {type(module).__name__}.forward is named {params[0].name!r}"
    for name, sub in module.named_modules():
        if next(sub.parameters(recurse=False), None) is None:
            continue
        if isinstance(sub, (torch.nn.Embedding, torch.nn.EmbeddingBag)):
            return f"the first layer with weights, {name!r}, is an nn.{type(sub).__name__}"
        break
    return ""
