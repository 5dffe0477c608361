"""The errors of a bad option, and the bounds every option is held to."""

from __future__ import annotations

from typing import Any

from ..errors import MetaWidgetError

#: the largest element count or byte count a tensor can have (PyTorch sizes are int64)
INT64_MAX = 2**63 - 1
#: the most micro-batches one analysis traces: each is a whole forward, loss and backward
MAX_MICRO_BATCHES = 1024
#: the most ranks (``fsdp * tp``) a ``parallel=`` trace stands for: the largest published
#: training jobs (16,384 GPUs); FSDP2 splits every parameter into one piece per rank, so the
#: trace's work grows with the world size
MAX_RANKS = 16384


class OptionError(MetaWidgetError, ValueError):
    """An argument of ``analyze``, ``%meta`` or ``meta-widget`` that cannot be used."""


class OptionTypeError(OptionError, TypeError):
    """An argument of the wrong type (also a ``TypeError``)."""


class LayoutError(OptionError):
    """A ``parallel=`` layout the model cannot take (a ``tp`` that does not divide its heads,
    an ``fsdp`` past the rows of its largest parameter), found before any process group."""


class InputError(OptionError):
    """The inputs given to ``analyze`` cannot be turned into model arguments."""


def show(value: Any, limit: int = 80) -> str:
    """``repr(value)``, shortened to one line of at most ``limit`` characters."""
    try:
        text = " ".join(repr(value).split())
    except ValueError:  # an int past Python's 4,300 digits of str()
        text = f"<an int of {value.bit_length():,} bits>"
    return text if len(text) <= limit else text[: limit - 3] + "..."
