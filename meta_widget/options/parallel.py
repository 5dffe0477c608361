"""``parallel["mp"]`` checked: FSDP2's mixed precision (the arguments of
``torch.distributed.fsdp.MixedPrecisionPolicy``); the layout itself is ``layout.Parallel``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import heavy

if TYPE_CHECKING:
    import torch

from .errors import OptionError, OptionTypeError, show
from .shapes import parse_dtype

#: ``MixedPrecisionPolicy``'s arguments: the dtypes, and whether forward inputs are cast
MP_DTYPES = ("param_dtype", "reduce_dtype", "output_dtype")
MP_KEYS = (*MP_DTYPES, "cast_forward_inputs")


@dataclass(frozen=True)
class MixedPrecision:
    """``parallel["mp"]`` checked: the arguments of FSDP2's
    ``torch.distributed.fsdp.MixedPrecisionPolicy``, which ``fully_shard`` takes as
    ``mp_policy`` (``param_dtype``: the dtype parameters are all-gathered and computed in, the
    sharded parameters keeping theirs; ``reduce_dtype``: the dtype gradients are
    reduce-scattered in; ``output_dtype``: the dtype of the module's floating outputs;
    ``cast_forward_inputs``: floating inputs cast to ``param_dtype``)."""

    param_dtype: torch.dtype | None = None
    reduce_dtype: torch.dtype | None = None
    output_dtype: torch.dtype | None = None
    cast_forward_inputs: bool = True

    def label(self) -> str:
        """``"mp bfloat16 params, float32 reduce"``: the dtypes given, for the badge."""
        given = [
            f"{str(dtype).removeprefix('torch.')} {key.removesuffix('_dtype')}"
            for key in MP_DTYPES
            if (dtype := getattr(self, key)) is not None
        ]
        return "mp " + (", ".join(given) or "default")

    def arguments(self) -> str:
        """``param_dtype=torch.bfloat16, ...``: the policy's arguments that are not defaults."""
        given = [f"{key}={getattr(self, key)}" for key in MP_DTYPES if getattr(self, key)]
        return ", ".join(
            given + ([] if self.cast_forward_inputs else ["cast_forward_inputs=False"])
        )


def mixed_precision(mp: Any) -> MixedPrecision | None:
    """``parallel["mp"]``: None, a dict of ``MixedPrecisionPolicy``'s arguments (dtypes as
    ``torch.dtype`` or by name) or a ``MixedPrecisionPolicy`` itself."""
    if mp is None or isinstance(mp, MixedPrecision):
        return mp
    if type(mp).__name__ == "MixedPrecisionPolicy":  # FSDP2's own: its fields, read
        mp = {key: getattr(mp, key) for key in MP_KEYS}
    if not isinstance(mp, Mapping):
        raise OptionTypeError(
            f"parallel['mp'] must be a dict of MixedPrecisionPolicy's arguments or a "
            f'MixedPrecisionPolicy, not {show(mp)}: e.g. {{"param_dtype": "bfloat16", '
            '"reduce_dtype": "float32"}.'
        )
    unknown = sorted(set(map(str, mp)) - set(MP_KEYS))
    if unknown:
        raise OptionError(
            f"parallel['mp'] has unknown keys {unknown}: MixedPrecisionPolicy takes "
            f"{', '.join(MP_KEYS)}."
        )
    dtypes = {key: _floating(mp[key], key) for key in MP_DTYPES if mp.get(key) is not None}
    cast = mp.get("cast_forward_inputs", True)
    if not isinstance(cast, bool):
        raise OptionTypeError(
            f"parallel['mp']['cast_forward_inputs'] must be True or False, not {show(cast)}."
        )
    return MixedPrecision(**dtypes, cast_forward_inputs=cast)


def _floating(value: Any, key: str) -> torch.dtype:
    """A floating dtype, given as a ``torch.dtype`` or its name."""
    torch = heavy.torch()
    dtype = value
    if isinstance(value, str):
        try:
            dtype = parse_dtype(value)
        except OptionError:
            dtype = None
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise OptionError(
            f"parallel['mp'][{key!r}] must be a floating dtype (torch.bfloat16, 'float32'...), "
            f"not {show(value)}."
        )
    return dtype
