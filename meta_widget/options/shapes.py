"""Input shapes and dtypes, as ``input_size`` and ``dtypes`` give them (torchinfo's conventions)."""

from __future__ import annotations

import operator
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .. import heavy

if TYPE_CHECKING:
    import torch

from .errors import INT64_MAX, InputError, OptionError, OptionTypeError, show

# -- shapes ----------------------------------------------------------------------------------

_SHAPE_EXAMPLES = (
    "Examples: input_size=(1, 3, 224, 224), or input_size=[(1, 16), (1, 16)] for two inputs."
)


def _is_dim(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    try:
        operator.index(value)  # int, numpy integers, 0-dim integer tensors
    except TypeError:
        return False
    return True


def _is_shape(value: Any) -> bool:
    return (
        isinstance(value, Sequence)
        and not isinstance(value, (str, bytes))
        and all(_is_dim(d) for d in value)
    )


def check_shape(shape: Sequence[Any]) -> tuple[int, ...]:
    """``shape`` as a tuple of Python ints: non-negative, and few enough elements for int64."""
    dims = tuple(operator.index(d) for d in shape)
    if any(d < 0 for d in dims):
        raise InputError(f"the input shape {dims} has a negative dimension: sizes are 0 or more.")
    numel = 1
    for d in dims:
        numel *= d
    if numel > INT64_MAX:
        raise InputError(
            f"the input shape {dims} has {numel:.3g} elements, more than a tensor can hold "
            "(2**63 - 1): check the dimensions (a missing comma joins two numbers)."
        )
    return dims


def input_shapes(input_size: Any) -> list[tuple[int, ...]]:
    """``input_size`` (one shape or a list of shapes) as a list of int tuples."""
    if _is_shape(input_size):
        return [check_shape(input_size)]
    if (
        isinstance(input_size, Sequence)
        and not isinstance(input_size, (str, bytes))
        and input_size
        and all(_is_shape(s) for s in input_size)
    ):
        return [check_shape(s) for s in input_size]
    raise InputError(
        f"input_size={show(input_size)} is not a shape or a list of shapes (of integers). "
        + _SHAPE_EXAMPLES
    )


def check_bytes(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    """Refuse a shape whose tensor of ``dtype`` would need more bytes than int64 counts."""
    numel = 1
    for d in shape:
        numel *= d
    if numel * dtype.itemsize > INT64_MAX:
        raise InputError(
            f"the input shape {shape} of {dtype} needs {numel * dtype.itemsize:.3g} bytes, more "
            "than a tensor can address (2**63 - 1): check the dimensions."
        )


_FIELD = re.compile(r"[,x]")


def parse_shape(text: str) -> tuple[int, ...]:
    """``"1,3,224,224"`` (or ``"1x3x224x224"``) -> ``(1, 3, 224, 224)``; empty fields refused."""
    fields = _FIELD.split(text.replace(" ", ""))
    if not text.strip() or any(f == "" for f in fields):
        raise InputError(
            f"cannot read the shape {text!r}: a dimension is missing (empty field); write "
            "integers separated by commas, e.g. 1,3,224,224"
        )
    try:
        dims = tuple(int(f) for f in fields)
    except ValueError:
        raise InputError(
            f"cannot read the shape {text!r}: write integers separated by commas, e.g. 1,3,224,224"
        ) from None
    return check_shape(dims)


# -- dtypes ----------------------------------------------------------------------------------

_DTYPE_ALIASES = {"long": "int64", "int": "int32", "float": "float32", "half": "float16"}


def parse_dtype(text: str) -> torch.dtype:
    """``"long"``, ``"bfloat16"``, ``"torch.float16"`` -> the ``torch.dtype``."""
    torch = heavy.torch()

    name = text.strip().removeprefix("torch.")
    dtype = getattr(torch, _DTYPE_ALIASES.get(name, name), None) if name else None
    if not isinstance(dtype, torch.dtype):
        raise OptionError(f"unknown dtype {text!r}: use e.g. float32, bfloat16, long, int32")
    return dtype


def dtype_options(dtypes: list[torch.dtype]) -> torch.dtype | list[torch.dtype] | None:
    """Repeated ``--dtype`` options as ``analyze`` takes them: one given applies to every
    input, several are one per input."""
    if not dtypes:
        return None
    return dtypes[0] if len(dtypes) == 1 else dtypes


def _one_dtype(value: Any) -> torch.dtype:
    torch = heavy.torch()

    if isinstance(value, torch.dtype):
        return value
    if isinstance(value, str):
        return parse_dtype(value)
    raise OptionTypeError(
        f"dtypes holds {show(value)} ({type(value).__name__}), not a dtype: give torch dtypes "
        "such as torch.long, or their names ('long')."
    )


def input_dtypes(dtypes: Any, count: int) -> list[torch.dtype] | None:
    """One dtype per input shape: a list as long as ``count``, or one dtype for every input."""
    torch = heavy.torch()

    if dtypes is None:
        return None
    if count == 0:
        raise OptionError(
            "dtypes applies to the shapes of input_size, and none was given: pass input_size, "
            "or give input_data tensors of the dtypes you want."
        )
    if isinstance(dtypes, (torch.dtype, str)):
        return [_one_dtype(dtypes)] * count
    if not isinstance(dtypes, Sequence):
        raise OptionTypeError(
            f"dtypes={show(dtypes)} is not a dtype or a list of dtypes: e.g. dtypes=[torch.long]."
        )
    chosen = [_one_dtype(d) for d in dtypes]
    if len(chosen) != count:
        raise InputError(
            f"{len(chosen)} dtypes (dtypes= / --dtype) for {count} input shapes (input_size= / "
            "--input): give one dtype per input, in the same order, or one dtype for all."
        )
    return chosen
