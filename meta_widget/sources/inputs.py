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

from ..options import InputError, check_bytes, input_dtypes, input_shapes
from .known import remember


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
        shared = MetaStorages()  # one for all the inputs: they may share storages
        if isinstance(input_data, dict):
            return MetaInputs((), {k: to_meta_value(v, shared) for k, v in input_data.items()})
        if isinstance(input_data, (tuple, list)):
            return MetaInputs(tuple(to_meta_value(v, shared) for v in input_data), {})
        return MetaInputs((to_meta_value(input_data, shared),), {})
    if input_size is None:
        return MetaInputs((), {})
    return _from_sizes(module, input_size, dtypes)


class MetaStorages:
    """The meta stand-ins made so far for real tensors and their storages, so that inputs
    sharing a storage (``x`` and ``x[1]``, one tensor passed twice) share one meta storage of
    the real one's size: the inputs' bytes then count each real storage once, as a real run
    holds it."""

    def __init__(self) -> None:
        #: key of a real storage -> its meta stand-in (the same number of bytes)
        self.storages: dict[int, torch.UntypedStorage] = {}
        #: id of a real tensor -> its meta stand-in (the real tensors outlive this map)
        self.tensors: dict[int, torch.Tensor] = {}

    def stand_in(self, value: torch.Tensor) -> torch.Tensor:
        """A meta tensor of ``value``'s shape, stride, dtype and storage offset, on the meta
        storage standing for ``value``'s (made once per real storage)."""
        known = self.tensors.get(id(value))
        if known is not None:
            return known
        try:
            real = value.untyped_storage()
            key, nbytes, offset = real._cdata, real.nbytes(), value.storage_offset()
        except (RuntimeError, NotImplementedError, TypeError):  # no storage to share
            t = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
        else:
            storage = self.storages.get(key)
            if storage is None:
                storage = torch.empty(nbytes, dtype=torch.uint8, device="meta").untyped_storage()
                self.storages[key] = storage
            t = torch.empty(0, dtype=value.dtype, device="meta")
            t.set_(storage, offset, value.shape, value.stride())
        self.tensors[id(value)] = t
        return t


def to_meta_value(value: Any, shared: MetaStorages | None = None) -> Any:
    """``value`` with every tensor inside replaced by a meta tensor (no data is copied).

    Real tensors sharing a storage get meta tensors sharing one meta storage of the same size
    (``shared``: the stand-ins made so far, across calls; a new map when None).
    """
    if isinstance(value, torch.Tensor):
        if value.is_meta:
            return value
        t = (shared if shared is not None else MetaStorages()).stand_in(value)
        remember(t, value)  # a small mask's values: a few kernels allocate by them
        return t.requires_grad_(value.requires_grad) if value.is_floating_point() else t
    shared = shared if shared is not None else MetaStorages()
    if isinstance(value, dict):
        return type(value)({k: to_meta_value(v, shared) for k, v in value.items()})
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # namedtuple
        return type(value)(*(to_meta_value(v, shared) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(to_meta_value(v, shared) for v in value)
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
