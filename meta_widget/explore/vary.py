"""Which input dimensions a varied size changes, for ``sweep`` and ``max_fit``.

- ``"batch"``: dimension 0 of every input.
- ``"seq"``: dimension 1 of every *token* input (an integer tensor of two dimensions or more,
  e.g. ``input_ids`` of shape ``(batch, seq)``). When no input holds integers, ``"seq"`` is
  ambiguous: dimension 1 of every input of two dimensions or more is taken, and a note says so.
- Any name, ``"batch"`` and ``"seq"`` included, can be given explicitly with ``dims={name: d}``
  (dimension ``d`` of every input that has it) or ``dims={name: [(input, d), ...]}``.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..options import OptionError, OptionTypeError, input_shapes

__all__ = ["Axis", "resized", "resolve_axes"]


@dataclass(frozen=True)
class Axis:
    """A varied size: its name and the (input index, dimension) pairs it sets."""

    name: str
    dims: tuple[tuple[int, int], ...]
    note: str = ""


def resolve_axes(
    names: Sequence[str],
    input_size: Any,
    dtypes: Sequence[torch.dtype],
    dims: Mapping[str, Any] | None,
) -> list[Axis]:
    """The :class:`Axis` of each varied name, for inputs of ``input_size`` and ``dtypes``."""
    shapes = input_shapes(input_size)
    given = dict(dims or {})
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise OptionError(
            f"dims names {unknown}, which are not varied (varied: {list(names)}): give dims "
            "only for the names in vary."
        )
    axes = []
    for name in names:
        if name in given:
            axes.append(Axis(name, _explicit(name, given[name], shapes)))
        elif name == "batch":
            axes.append(Axis(name, tuple((i, 0) for i, s in enumerate(shapes) if s)))
        elif name == "seq":
            axes.append(_seq(shapes, dtypes))
        else:
            raise OptionError(
                f"vary names {name!r}, which is not 'batch' or 'seq': say which input dimensions "
                f"it sets, e.g. dims={{{name!r}: [(0, 2), (0, 3)]}} (input 0, dimensions 2 and "
                "3) or dims={name!r: 1} (dimension 1 of every input)."
            )
        if not axes[-1].dims:
            raise OptionError(
                f"{name!r} sets no dimension of the inputs {shapes}: give dims={{{name!r}: "
                "[(input, dimension)]}}."
            )
    return axes


def _seq(shapes: list[tuple[int, ...]], dtypes: Sequence[torch.dtype]) -> Axis:
    tokens = [
        (i, 1)
        for i, (s, dt) in enumerate(zip(shapes, dtypes, strict=True))
        if len(s) >= 2 and not dt.is_floating_point and not dt.is_complex
    ]
    if tokens:
        return Axis("seq", tuple(tokens))
    every = tuple((i, 1) for i, s in enumerate(shapes) if len(s) >= 2)
    note = (
        "'seq' is ambiguous here: no input holds token ids (integers), so dimension 1 of every "
        f"input of two dimensions or more was taken ({[i for i, _ in every]}); give "
        "dims={'seq': [(input, dimension)]} to choose."
    )
    return Axis("seq", every, note)


def _explicit(name: str, value: Any, shapes: list[tuple[int, ...]]) -> tuple[tuple[int, int], ...]:
    if isinstance(value, int) and not isinstance(value, bool):
        pairs = [(i, value) for i, s in enumerate(shapes) if -len(s) <= value < len(s)]
    elif isinstance(value, Sequence) and not isinstance(value, str):
        try:
            pairs = [(operator.index(i), operator.index(d)) for i, d in value]
        except (TypeError, ValueError):
            raise OptionTypeError(
                f"dims[{name!r}]={value!r} is not a list of (input, dimension) pairs of ints."
            ) from None
    else:
        raise OptionTypeError(
            f"dims[{name!r}] must be a dimension (int) or a list of (input, dimension) pairs, "
            f"not {value!r}."
        )
    for i, d in pairs:
        if not 0 <= i < len(shapes) or not -len(shapes[i]) <= d < len(shapes[i]):
            raise OptionError(
                f"dims[{name!r}] names dimension {d} of input {i}, which the inputs {shapes} "
                "do not have."
            )
    return tuple((i, d % len(shapes[i])) for i, d in pairs)


def resized(input_size: Any, axes: Sequence[Axis], values: Sequence[int]) -> list[tuple[int, ...]]:
    """The shapes of ``input_size`` with each axis's dimensions set to its value."""
    shapes = [list(s) for s in input_shapes(input_size)]
    for axis, value in zip(axes, values, strict=True):
        for i, d in axis.dims:
            shapes[i][d] = value
    return [tuple(s) for s in shapes]
