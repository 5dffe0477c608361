"""``mw.measure`` leaves the process's random number generators as it found them (issue 36,
item 10), on success and when the model raises, and counts the bytes held before the run per
storage, not per tensor (two tensors sharing one storage hold its bytes once)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from truth import allocator_peak

import meta_widget as mw


class Noisy(nn.Module):
    """Draws from the global generator in its forward (dropout and an explicit draw)."""

    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.drop = nn.Dropout(0.5)
        self.fail = fail

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.drop(self.fc(x)) + torch.rand_like(x)
        if self.fail and not y.is_meta:
            raise ValueError("the model's own failure")
        return y


@pytest.mark.parametrize("mode", ["inference", "training"])
def test_measure_leaves_the_generator_as_it_was(mode: str) -> None:
    torch.manual_seed(123)
    model = Noisy()
    before = torch.random.get_rng_state()
    expected = torch.rand(4)  # what the user's next draw would be without measure
    torch.random.set_rng_state(before)
    mw.measure(model, input_size=(4, 16), mode=mode)  # random inputs, dropout, rand_like
    assert torch.equal(torch.random.get_rng_state(), before)
    assert torch.equal(torch.rand(4), expected)


def test_measure_of_a_fresh_build_leaves_the_generator() -> None:
    torch.manual_seed(5)
    before = torch.random.get_rng_state()
    mw.measure(lambda: nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 4)), input_size=(2, 16))
    assert torch.equal(torch.random.get_rng_state(), before)  # the weights' initialization


def test_measure_of_a_raising_model_leaves_the_generator() -> None:
    torch.manual_seed(7)
    model = Noisy(fail=True)
    before = torch.random.get_rng_state()
    with pytest.raises(mw.MeasureError, match="the model's own failure") as info:
        mw.measure(model, input_size=(4, 16))
    assert isinstance(info.value.__cause__, ValueError)
    assert torch.equal(torch.random.get_rng_state(), before)


class SharedBuffers(nn.Module):
    """Two buffers that are views of one 1 MiB storage, and an input passed twice: the
    storage is held once."""

    def __init__(self) -> None:
        super().__init__()
        base = torch.randn(2, 128, 1024)
        self.register_buffer("a", base[0])
        self.register_buffer("b", base[1])
        self.fc = nn.Linear(1024, 8)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.fc(x + self.a[:1] + self.b[:1]) + y.sum()


def test_measured_peak_counts_a_shared_storage_once() -> None:
    model, x = SharedBuffers().eval(), torch.randn(4, 1024)
    allocator_peak(model, (x, x))  # a warm-up
    truth = allocator_peak(model, (x, x))  # per storage: the buffers' 1 MiB once, x once
    measured = mw.measure(model, input_data=(x, x))
    # per tensor, the buffers would count 2 MiB and x twice: 1 MiB + 16 KiB more
    assert measured.peak_bytes == pytest.approx(truth, abs=64 * 1024)
