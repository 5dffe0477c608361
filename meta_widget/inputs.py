"""Model inputs, following torchinfo's conventions, turned into meta tensors.

The arguments are checked by ``meta_widget.options`` (the checks ``%meta`` and the command
share); ``InputError`` is defined there and re-exported here.

- ``input_size``: one shape ``(1, 3, 224, 224)`` or a list of shapes ``[(1, 16), (1, 16)]``, batch
  dimension included; each becomes a meta tensor of the matching ``dtypes`` entry.
- ``input_data``: a tensor, a tuple/list (positional arguments) or a dict (keyword arguments),
  nested freely; every tensor in it is replaced by a meta tensor of the same shape, stride, dtype
  and ``requires_grad``; other values pass through.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

import torch

from .known import remember
from .options import InputError, check_bytes, input_dtypes, input_shapes


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
    dtypes: Any = None,
) -> MetaInputs:
    """Meta ``args`` and ``kwargs`` for ``module`` from torchinfo-style arguments."""
    if input_size is not None and input_data is not None:
        raise InputError("Pass either input_size or input_data, not both.")
    if input_size is None:
        input_dtypes(dtypes, 0)  # dtypes without input_size: refused with its message
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
    if isinstance(value, torch.Tensor):
        if value.is_meta:
            return value
        t = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
        remember(t, value)  # a small mask's values: a few kernels allocate by them
        return t.requires_grad_(value.requires_grad) if value.is_floating_point() else t
    if isinstance(value, dict):
        return type(value)({k: to_meta_value(v) for k, v in value.items()})
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # namedtuple
        return type(value)(*(to_meta_value(v) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(to_meta_value(v) for v in value)
    return value


def _from_sizes(module: torch.nn.Module, input_size: Any, dtypes: Any) -> MetaInputs:
    shapes = input_shapes(input_size)
    given = input_dtypes(dtypes, len(shapes))
    notes: list[str] = []
    chosen = given if given is not None else [torch.float32] * len(shapes)
    if given is None:
        reason = _takes_token_ids(module)
        if reason:
            chosen[0] = torch.long
            notes.append(
                f"Input 0 was given dtype torch.long because {reason}; pass "
                "dtypes=[torch.float32] (or another dtype) to override."
            )
    for shape, dtype in zip(shapes, chosen, strict=True):
        check_bytes(shape, dtype)
    args = tuple(
        torch.empty(s, dtype=dt, device="meta") for s, dt in zip(shapes, chosen, strict=True)
    )
    return MetaInputs(args, {}, notes)


_ID_NAMES = ("input_ids", "ids", "tokens", "token_ids", "idx", "indices")


def _takes_token_ids(module: torch.nn.Module) -> str:
    """Why the first input should be integer ids, or ``""`` when nothing says so."""
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
