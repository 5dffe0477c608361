"""The fixed sets of names the package and the front end share: modes, phases, devices,
optimizers. Each is defined here once; ``js/`` is checked against them by the front end's tests
(``tests/make_fixtures.py`` writes them into ``js/fixtures/choices.json``).

Members are strings (``Mode.TRAINING == "training"``, ``f"{Mode.TRAINING}"`` is
``"training"``), so the public API keeps taking plain strings and payloads stay the same bytes.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, TypeVar

__all__ = ["Device", "Mode", "Optimizer", "Phase", "choose"]


class _Choice(str, Enum):
    """A str enum whose ``str()`` and ``format()`` are its value (``enum.StrEnum`` of 3.11)."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class Mode(_Choice):
    """What one analysis runs: one forward pass, or a whole training step."""

    INFERENCE = "inference"
    TRAINING = "training"


class Phase(_Choice):
    """The phases of a training step, in order (inference has only the forward pass)."""

    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"


class Device(_Choice):
    """The device the memory numbers are for; it picks the attention kernel (``kernels.py``)."""

    CUDA = "cuda"
    CPU = "cpu"
    MATH = "math"


class Optimizer(_Choice):
    """The optimizers a training step can take (``None`` for none)."""

    ADAMW = "adamw"
    ADAM = "adam"
    SGD = "sgd"
    SGD_MOMENTUM = "sgd-momentum"


_C = TypeVar("_C", bound=_Choice)


def choose(kind: type[_C], value: Any, argument: str) -> _C:
    """``value`` as a member of ``kind``, or a ``ValueError`` that lists the choices."""
    try:
        return kind(value)
    except ValueError:
        names = ", ".join(repr(m.value) for m in kind)
        raise ValueError(f"{argument} must be one of {names}, not {value!r}") from None
