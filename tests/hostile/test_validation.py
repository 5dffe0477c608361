"""``analyze``'s arguments, each wrong in the ways a user gets them wrong.

A mistake is reported before anything is traced, as the caller's mistake (``OptionError``, a
``ValueError``; ``OptionTypeError`` is also a ``TypeError``), never as the model's error; the
friendlier readings documented in ``meta_widget.options`` are accepted.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch
from torch import nn

import meta_widget as mw
from meta_widget.options import InputError, OptionError, OptionTypeError


class TwoIds(nn.Module):
    """Two inputs of token ids."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.emb(a) + self.emb(b)


class Blocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)) for _ in range(3)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


class Reads(nn.Module):
    """Reads a value (.item()) from a meta tensor: a site ``assume`` can answer."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = int(x.sum())
        return self.fc(x)[:n]


def _site() -> str:
    lines, start = inspect.getsourcelines(Reads.forward)
    return f"test_validation.py:{start + next(i for i, t in enumerate(lines) if 'int(x' in t)}"


SITE = _site()  # where Reads.forward reads a value


class NeedsArgs(nn.Module):
    def __init__(self, width: int, depth: int = 2) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


def input_dtypes(a: mw.Analysis) -> list[str]:
    return [info.dtype for _, info in a.calls[0].inputs]


# -- dtypes ----------------------------------------------------------------------------------


def test_one_dtype_applies_to_every_input() -> None:
    for dtypes in (torch.long, "long", [torch.long, torch.long], ["int64", torch.int64]):
        a = mw.analyze(TwoIds(), [(2, 3), (2, 3)], dtypes=dtypes)
        assert a.error is None, a.error
        assert input_dtypes(a) == ["int64", "int64"], dtypes
    a = mw.analyze(nn.Linear(3, 2), (2, 3), dtypes=torch.float16)
    assert input_dtypes(a) == ["float16"]


@pytest.mark.parametrize(
    ("dtypes", "error", "words"),
    [
        (3, OptionTypeError, "dtypes=3 is not a dtype or a list of dtypes"),
        ([torch.long, 3], OptionTypeError, "dtypes holds 3 (int), not a dtype"),
        ("quarter", OptionError, "unknown dtype 'quarter'"),
        ([torch.long] * 3, InputError, "3 dtypes (dtypes= / --dtype) for 2 input shapes"),
    ],
)
def test_wrong_dtypes_are_the_callers_mistake(
    dtypes: object, error: type[Exception], words: str
) -> None:
    with pytest.raises(error) as info:
        mw.analyze(TwoIds(), [(2, 3), (2, 3)], dtypes=dtypes)  # type: ignore[arg-type]
    assert words in str(info.value) and "\n" not in str(info.value)


def test_dtypes_without_input_size_is_refused() -> None:
    with pytest.raises(OptionError, match="dtypes applies to the shapes of input_size"):
        mw.analyze(nn.Linear(3, 2), input_data=torch.ones(2, 3), dtypes=[torch.long])


# -- shapes ----------------------------------------------------------------------------------


def test_numpy_and_other_integer_dims_are_shapes() -> None:
    for size in (
        (np.int64(2), np.int32(3)),
        [np.int64(2), 3],
        torch.Size([2, 3]),
        [(np.int16(2), 3)],
    ):
        a = mw.analyze(nn.Linear(3, 2), size)
        assert a.error is None
        assert a.calls[0].inputs[0][1].shape == (2, 3), size
        assert all(type(d) is int for d in a.calls[0].inputs[0][1].shape)


@pytest.mark.parametrize(
    ("size", "words"),
    [
        ((True, 3), "is not a shape or a list of shapes"),
        ((2.0, 3), "is not a shape or a list of shapes"),
        ("2,3", "is not a shape or a list of shapes"),
        ([(2, 3), "2,3"], "is not a shape or a list of shapes"),
        ((2, -3), "the input shape (2, -3) has a negative dimension"),
        ((2**63, 1), "more than a tensor can hold"),
        ((2**40, 2**40), "more than a tensor can hold"),
        ((2**61, 3), "of torch.float32 needs"),
    ],
)
def test_bad_and_overflowing_shapes_are_one_clear_error(size: object, words: str) -> None:
    with pytest.raises(InputError) as info:
        mw.analyze(nn.Linear(3, 2), size)
    assert words in str(info.value) and "\n" not in str(info.value)


# -- the other options -------------------------------------------------------------------------


def test_a_string_activation_checkpointing_is_one_name() -> None:
    def flops(which: object) -> int:
        a = mw.analyze(Blocks, (32, 64), mode="training", activation_checkpointing=which)
        assert a.error is None
        return a.total_flops

    as_list, none = flops(["blocks.1"]), flops(False)
    assert as_list > none  # checkpointing blocks.1 recomputes its forward
    assert flops("blocks.1") == as_list
    assert flops("Sequential") == flops(True) > as_list  # a class name: every block
    with pytest.raises(OptionError, match=r"activation_checkpointing=\[.nothing.\] matches no"):
        flops("nothing")
    with pytest.raises(OptionTypeError, match=r"must be True, False, .selective., or module paths"):
        flops([1, 2])


def test_assume_keys_and_values_are_checked_before_tracing() -> None:
    a = mw.analyze(Reads(), (3, 4), assume={SITE: 2})
    assert a.error is None and a.calls[0].outputs[0][1].shape == (2, 4)
    for assume, words in (
        ({51: 2}, "assume key 51 is not a site"),
        ({("test_validation.py", 51): 2}, "is not a site"),
        ({SITE: "two"}, f"assume[{SITE!r}] = 'two' is not a"),
        ([(SITE, 2)], "assume must be a dict"),
    ):
        with pytest.raises(OptionTypeError) as info:
            mw.analyze(Reads(), (3, 4), assume=assume)  # type: ignore[arg-type]
        assert words in str(info.value), info.value
        assert isinstance(info.value, TypeError)
    a = mw.analyze(Reads(), (3, 4), assume={SITE: np.int64(1)})
    assert a.calls[0].outputs[0][1].shape == (1, 4)


def test_an_optimizer_given_in_inference_is_noted_as_unused() -> None:
    def unused(a: mw.Analysis) -> list[str]:
        return [n for n in a.notes if "was not used" in n]

    assert unused(mw.analyze(nn.Linear(3, 2), (2, 3))) == []
    assert unused(mw.analyze(nn.Linear(3, 2), (2, 3), optimizer=None)) == []
    (note,) = unused(mw.analyze(nn.Linear(3, 2), (2, 3), optimizer="sgd"))
    assert note.startswith("optimizer='sgd' was not used") and "mode='training'" in note
    (note,) = unused(mw.analyze(nn.Linear(3, 2), (2, 3), optimizer="adamw"))
    assert note.startswith("optimizer='adamw'")
    trained = mw.analyze(nn.Linear(3, 2), (2, 3), mode="training", optimizer="sgd")
    assert unused(trained) == [] and trained.memory.optimizer_state_bytes == 0
    adamw = mw.analyze(nn.Linear(3, 2), (2, 3), mode="training")  # the default: AdamW
    assert adamw.memory.optimizer_state_bytes == 2 * 4 * (3 * 2 + 2)  # exp_avg, exp_avg_sq
    with pytest.raises(OptionError, match="optimizer must be one of 'adamw', 'adam'"):
        mw.analyze(nn.Linear(3, 2), (2, 3), mode="training", optimizer="lion")


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"mode": "train"}, OptionError, "mode must be one of 'inference', 'training', not"),
        ({"mode": 1}, OptionTypeError, "mode must be one of"),
        ({"device": "gpu"}, OptionError, "device must be one of 'cuda', 'cpu', 'math'"),
        ({"depth": -1}, OptionError, "depth must be 0 or more, not -1"),
        ({"depth": "3"}, OptionTypeError, "depth must be an integer"),
    ],
)
def test_bad_choices_are_one_clear_error(
    kwargs: dict[str, object], error: type[Exception], words: str
) -> None:
    with pytest.raises(error) as info:
        mw.analyze(nn.Linear(3, 2), (2, 3), **kwargs)  # type: ignore[arg-type]
    assert words in str(info.value)


def test_a_class_or_function_that_needs_arguments_is_named() -> None:
    with pytest.raises(OptionTypeError) as info:
        mw.analyze(NeedsArgs, (2, 3))
    message = str(info.value)
    assert "the class NeedsArgs needs arguments to build the model (width)" in message
    assert "mw.analyze(lambda: NeedsArgs(width=...))" in message
    with pytest.raises(
        OptionTypeError, match=r"the function build needs arguments to build the model \(n\)"
    ):

        def build(n: int) -> nn.Module:
            return nn.Linear(n, n)

        mw.analyze(build)
    # what the message suggests works
    a = mw.analyze(lambda: NeedsArgs(width=3), (2, 3))
    assert a.error is None and a.total_params == 3 * 3 + 3


def test_the_widgets_switches_do_not_note_the_optimizer_they_always_send() -> None:
    from meta_widget.views.widget import MetaWidget

    a = mw.analyze(nn.Linear(3, 2), (2, 3), mode="training", optimizer="sgd")
    view = MetaWidget()
    view.analysis = a
    # what js/switches.ts sends when the device changes in inference: the optimizer too
    view._on_message(view, {"type": "rerun", "mode": "inference", "optimizer": "sgd"}, [])
    inference = view.analysis
    assert inference is not None and inference.mode == "inference"
    assert not [n for n in inference.notes if "was not used" in n]
    # nor does a re-run that carries the optimizer over; one that gives it again does
    assert not [n for n in a.rerun(mode="inference").notes if "was not used" in n]
    assert [n for n in a.rerun(mode="inference", optimizer="sgd").notes if "was not used" in n]
    view._on_message(view, {"type": "rerun", "mode": "training"}, [])
    assert view.analysis is not None and view.analysis.memory.optimizer_state_bytes == 0  # sgd
