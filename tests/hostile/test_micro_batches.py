"""Gradient accumulation (``micro_batches > 1``): each micro-batch's forward pass is a forward pass
(issue 23, the micro-batch phase bug).

Each event's own phase is known here without the phase bookkeeping under test: the module
hooks record each call of the root module as a span of timeline events (``start_event`` to
``end_event``), one call per micro-batch, so the events of every span are forward events, and
the events between one span and the next hold that micro-batch's backward. The category of an
allocation follows the README's rule within its own micro-batch: ``x * 2`` below is allocated in
the forward pass, never saved by autograd and freed before the forward pass ends, so it is a
temporary in every micro-batch, as it is in a ``micro_batches=1`` run.
"""

from __future__ import annotations

from itertools import pairwise

import pytest
import torch
from torch import nn

import meta_widget as mw
from meta_widget.data.records import CallRecord


class Doubling(nn.Module):
    """``x * 2``, a temporary (freed in the forward pass, never saved), then a linear layer on
    its ``relu`` (saved by the linear layer for its weight's gradient: an activation)."""

    def __init__(self, d: int = 64, out: int = 64) -> None:
        super().__init__()
        self.fc = nn.Linear(d, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x * 2
        y = self.fc(t.relu())
        del t
        return y


def _train(model: nn.Module, shape: tuple[int, int], micro_batches: int) -> mw.Analysis:
    a = mw.analyze(
        model,
        input_size=shape,
        mode="training",
        device="cpu",
        optimizer=None,
        micro_batches=micro_batches,
    )
    assert a.error is None
    return a


def _root_spans(a: mw.Analysis) -> list[range]:
    """The timeline events of each call of the root module, as its hooks recorded them."""
    roots: list[CallRecord] = [c for c in a.calls if c.parent == -1]
    return [range(c.start_event, c.end_event) for c in roots]


@pytest.mark.parametrize("micro_batches", [2, 3])
def test_every_micro_batch_forward_is_labelled_forward(micro_batches: int) -> None:
    a = _train(Doubling(), (32, 64), micro_batches)
    phases = a.memory.timeline_phases()
    spans = _root_spans(a)
    assert len(spans) == micro_batches  # one forward per micro-batch, as the hooks saw
    for k, span in enumerate(spans):
        labels = {phases[i] for i in span}
        assert labels == {"forward"}, f"micro-batch {k + 1}'s forward labelled {labels}"
    # between two forward passes runs the earlier micro-batch's backward (its weight gradient,
    # an mm): those events are backward, not forward
    ops = [op for _, _, op in a.memory.timeline]
    for before, after in pairwise(spans):
        between = range(before.stop, after.start)
        mms = [i for i in between if ops[i] == "aten.mm"]
        assert mms and all(phases[i] == "backward" for i in mms)


@pytest.mark.parametrize("micro_batches", [2, 3])
def test_a_forward_temporary_is_a_temporary_in_every_micro_batch(micro_batches: int) -> None:
    shape = (32, 64)
    t_bytes = 32 * 64 * 4  # x * 2, float32
    one = _train(Doubling(), shape, 1)
    many = _train(Doubling(), shape, micro_batches)
    temps_one = one.memory.timeline_categories["temporaries"]
    (span_one,) = _root_spans(one)
    expected = [temps_one[i] for i in span_one]
    mul_one = [i for i in span_one if one.memory.timeline[i][2] == "aten.mul"]
    assert [temps_one[i] for i in mul_one] == [t_bytes]  # the rule, in a single micro-batch
    temps = many.memory.timeline_categories["temporaries"]
    for k, span in enumerate(_root_spans(many)):
        # each micro-batch's forward is the single run's forward: the same temporaries
        assert [temps[i] for i in span] == expected, f"micro-batch {k + 1}"


def test_a_peak_in_a_later_micro_batch_keeps_its_temporary_apart() -> None:
    """The peak falls in micro-batch 2's forward pass (micro-batch 1's gradients are live by
    then), just after its linear layer: ``x * 2`` (1 MiB, freed in forward: a temporary), its
    ``relu`` (1 MiB, saved for the weight's gradient: an activation) and the layer's output
    are live, with micro-batch 1's output (kept by the loop's ``output`` variable until it is
    assigned again, as in a user's loop: alive when its forward pass ended, an activation)."""
    rows, d, out = 256, 1024, 8
    a = _train(Doubling(d, out), (rows, d), 2)
    mem = a.memory
    spans = _root_spans(a)
    peak = max(range(len(mem.timeline)), key=lambda i: mem.timeline[i][0])
    assert peak in spans[1]  # in the second micro-batch's forward pass
    assert mem.timeline_phases()[peak] == "forward"
    assert mem.peak_phase == "forward"
    big = rows * d * 4
    grads = (d * out + out) * 4  # micro-batch 1's gradients of the weight and bias
    cats = mem.by_category()
    assert cats["temporaries"] == big
    assert cats["activations"] == big + 2 * rows * out * 4
    assert cats["gradients"] == grads
    assert sum(cats.values()) == mem.peak_bytes
