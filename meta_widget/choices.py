"""The fixed sets of names the package and the front end share: modes, phases, devices,
optimizers, memory categories, the precision switch, payload statuses, the exploration views'
kinds and the message types of each direction. Each is defined here once; ``js/`` is checked
against them by the front end's tests (``tests/make_fixtures.py`` writes them into
``js/fixtures/choices.json``).

Members are strings (``Mode.TRAINING == "training"``, ``f"{Mode.TRAINING}"`` is
``"training"``), so the public API keeps taking plain strings and payloads stay the same bytes.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, TypeVar

__all__ = [
    "Device",
    "ExploreKind",
    "KernelMessage",
    "MemoryCategory",
    "Mode",
    "Optimizer",
    "Phase",
    "Precision",
    "Status",
    "ViewMessage",
    "WaitState",
    "choose",
]


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


#: ``mode="generate"``: transformers' own ``generate()`` traced (``meta_widget.trace.generate``);
#: not a member of :class:`Mode`, the modes the widget switches between
GENERATE = "generate"
#: every mode ``analyze`` (and the command, and ``%meta``) takes
MODES = (*(m.value for m in Mode), GENERATE)


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


class MemoryCategory(_Choice):
    """What live bytes are for (``meta_widget.memory.report``), in the order the widget stacks them.

    Parameters, buffers and inputs are live from start to end (the static part); gradients and
    optimizer state belong to a training step; activations are what the forward pass keeps for
    later, temporaries what is freed within its phase.
    """

    PARAMETERS = "parameters"
    BUFFERS = "buffers"
    INPUTS = "inputs"
    GRADIENTS = "gradients"
    OPTIMIZER_STATE = "optimizer state"
    ACTIVATIONS = "activations"
    TEMPORARIES = "temporaries"


class Precision(_Choice):
    """The widget's precision switch, besides "recorded" (``protocol.PRECISION_CHOICES`` maps
    each to its ``what_if`` arguments)."""

    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"
    INT8 = "int8"
    INT4 = "int4"


class Status(_Choice):
    """Where a payload's analysis stands (``payload["status"]``)."""

    STRUCTURAL = "structural"
    RUNNING = "running"
    DONE = "done"
    ERROR = "error"


class ExploreKind(_Choice):
    """The views of the exploration widget (``explore_view.ExploreView.kind``)."""

    FIT = "fit"
    COMPARE = "compare"
    PLAN = "plan"


class KernelMessage(_Choice):
    """The custom messages the kernel sends the view (``meta_widget.views.protocol`` documents
    each)."""

    START = "start"
    CALLS = "calls"
    PHASE = "phase"
    DONE = "done"
    ERROR = "error"
    READY = "ready"
    WAITING = "waiting"


class WaitState(_Choice):
    """What a running analysis waits for (the ``waiting`` message's ``state``): the warm-up
    ``%load_ext`` started, the model's build on meta, the trace, the analysis of the trace."""

    WARM_UP = "warm-up"
    BUILD = "build"
    TRACE = "trace"
    ANALYZE = "analyze"


class ViewMessage(_Choice):
    """The custom messages the view sends the kernel; ``widget.MESSAGE_HANDLERS`` has one
    handler for each."""

    HELLO = "hello"
    SELECT = "select"
    RERUN = "rerun"


_C = TypeVar("_C", bound=_Choice)


def choose(kind: type[_C], value: Any, argument: str) -> _C:
    """``value`` as a member of ``kind``, or a ``ValueError`` that lists the choices."""
    try:
        return kind(value)
    except ValueError:
        names = ", ".join(repr(m.value) for m in kind)
        raise ValueError(f"{argument} must be one of {names}, not {value!r}") from None
