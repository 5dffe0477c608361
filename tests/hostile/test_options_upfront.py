"""Every option checked before anything is built or traced, as the caller's mistake.

Issue 23, items 10 and 11: a checkpoint that is not a path, an unknown ``activation_checkpointing``
module, listeners that are not functions, a loss given by name, ``assume_nonzero="yes"``, a
million micro-batches, and a training analysis inside ``torch.inference_mode()`` are each an
``OptionError`` (``OptionTypeError`` for a wrong type) saying what to give instead, never an
error blamed on the model's forward pass nor a trace that runs for minutes.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import meta_widget as mw
from meta_widget import options
from meta_widget.options import OptionError, OptionTypeError

#: the documented bound (``options.MAX_MICRO_BATCHES``)
MAX_MICRO_BATCHES = 1024


class Counted(nn.Module):
    """Two blocks; counts its builds and forward passes."""

    built = 0
    forwards = 0

    def __init__(self) -> None:
        super().__init__()
        Counted.built += 1
        self.blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        Counted.forwards += 1
        if Counted.forwards > 8:  # a trace of unbounded micro-batches stops here, not minutes on
            raise RuntimeError("more than 8 forward passes")
        for block in self.blocks:
            x = block(x)
        return x


@pytest.fixture
def counted() -> Callable[[], tuple[int, int]]:
    Counted.built = Counted.forwards = 0
    return lambda: (Counted.built, Counted.forwards)


def refused(error: type[Exception], words: str, **options: Any) -> str:
    with pytest.raises(error) as info:
        mw.analyze(Counted, (2, 8), **options)
    message = str(info.value)
    assert words in message, message
    assert "\n" not in message
    return message


# -- item 10: explanations that misled --------------------------------------------------------


def test_training_inside_inference_mode_is_refused_saying_why(
    counted: Callable[[], tuple[int, int]],
) -> None:
    with torch.inference_mode():
        message = refused(OptionError, "inside torch.inference_mode()", mode="training")
        assert "returned none" not in message and "mw.analyze outside" in message
        assert counted() == (0, 0)  # before anything was built
        a = mw.analyze(Counted, (2, 8))  # inference is fine there
        assert a.error is None
    with torch.no_grad():  # the trace turns gradients on itself
        a = mw.analyze(Counted, (2, 8), mode="training")
        assert a.error is None and a.memory.optimizer_state_bytes > 0  # gradients were made


def test_a_loss_by_name_is_an_unknown_loss_with_what_is_accepted(
    counted: Callable[[], tuple[int, int]],
) -> None:
    message = refused(OptionError, "unknown loss 'mse'", mode="training", loss="mse")
    assert "loss=lambda out:" in message and "loss=None" in message
    assert "forward pass" not in message
    refused(OptionTypeError, "loss=3 is not a function", mode="training", loss=3)
    assert counted() == (0, 0)
    a = mw.analyze(Counted, (2, 8), mode="training", loss=lambda out: (out**2).mean())
    assert a.error is None
    with pytest.raises(OptionError, match="unknown loss 'mse'"):
        a.rerun(loss="mse")


# -- item 11: options checked up front ----------------------------------------------------------


@pytest.mark.parametrize(
    ("checkpoint", "error", "words"),
    [
        (123, OptionTypeError, "checkpoint=123 (int) is not a path"),
        (b"model.safetensors", OptionTypeError, "is a bytes path: give it as a str"),
        (["a.pt"], OptionTypeError, "is not a path"),
    ],
)
def test_a_checkpoint_that_is_not_a_path_is_refused_up_front(
    counted: Callable[[], tuple[int, int]], checkpoint: Any, error: type[Exception], words: str
) -> None:
    refused(error, words, checkpoint=checkpoint)
    assert counted() == (0, 0)


def test_a_pathlib_checkpoint_is_a_path(tmp_path: Path) -> None:
    path = tmp_path / "linear.pt"
    torch.save(nn.Linear(3, 2).state_dict(), path)
    a = mw.analyze(nn.Linear(3, 2), (2, 3), checkpoint=path)
    assert a.error is None and a.checkpoint_diff is not None


def test_an_unknown_checkpointing_module_is_an_option_error_before_tracing(
    counted: Callable[[], tuple[int, int]],
) -> None:
    refused(
        OptionError,
        "activation_checkpointing=['nothing'] matches no module path or class name of Counted",
        mode="training",
        activation_checkpointing="nothing",
    )
    assert counted() == (1, 0)  # built to be checked against, never traced
    a = mw.analyze(Counted, (2, 8), mode="training", activation_checkpointing="blocks.1")
    assert a.error is None


@pytest.mark.parametrize(
    ("listeners", "words"),
    [
        ([1], "listeners[0] = 1 is not a function"),
        ([print, "x"], "listeners[1] = 'x' is not a function"),
        (print, "is not a list of functions"),
        ("print", "is not a list of functions"),
    ],
)
def test_listeners_that_are_not_functions_are_refused_up_front(
    counted: Callable[[], tuple[int, int]], listeners: Any, words: str
) -> None:
    refused(OptionTypeError, words, listeners=listeners)
    assert counted() == (0, 0)


def test_listeners_are_called_with_each_record() -> None:
    seen: list[str] = []
    a = mw.analyze(Counted, (2, 8), listeners=(lambda r: seen.append(r.path),))
    assert a.error is None and sorted(seen) == sorted(c.path for c in a.calls)  # as completed


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"assume_nonzero": "yes"}, "assume_nonzero must be True, False or None"),
        ({"assume_nonzero": 1}, "assume_nonzero must be True, False or None"),
        ({"strict": "yes"}, "strict must be True or False, not 'yes'"),
    ],
)
def test_flags_are_booleans(
    counted: Callable[[], tuple[int, int]], options: dict[str, Any], words: str
) -> None:
    refused(OptionTypeError, words, **options)
    assert counted() == (0, 0)
    for value in (True, False, None):
        assert mw.analyze(Counted, (2, 8), assume_nonzero=value).error is None


def test_micro_batches_have_an_upper_bound(counted: Callable[[], tuple[int, int]]) -> None:
    assert getattr(options, "MAX_MICRO_BATCHES", None) == MAX_MICRO_BATCHES
    for count in (10**6, MAX_MICRO_BATCHES + 1):
        message = refused(
            OptionError, f"is more than {MAX_MICRO_BATCHES}", mode="training", micro_batches=count
        )
        assert f"micro_batches={count}" in message
    assert counted() == (0, 0)  # not one forward pass
    a = mw.analyze(Counted, (2, 8), mode="training", micro_batches=3)
    assert a.error is None and counted() == (1, 6)  # two steps (first, steady) of three each
