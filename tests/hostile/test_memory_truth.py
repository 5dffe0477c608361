"""Memory and FLOP figures against truths the package does not compute (issue 23, blind spots).

Each test compares with something independent of meta_widget's bookkeeping: ``FlopCounterMode``
on a real CPU step, the distinct storages of the real inputs, the README's rule for categories
applied to tensors whose fate is known by construction (and checked on torch's own autograd),
an inference run of the same forward, and ``MemTracker`` on a real CPU run.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode
from truth import real_peak

import meta_widget as mw


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 64))


# -- FLOPs of ops outside any module ------------------------------------------------------------


def gram_loss(out: torch.Tensor) -> torch.Tensor:
    """A loss doing matmuls outside any module (forward and backward)."""
    return (out @ out.transpose(0, 1)).sum()


def test_training_flops_count_a_loss_outside_any_module() -> None:
    model, x = mlp(), torch.randn(16, 32)
    real = copy.deepcopy(model).train()
    with FlopCounterMode(display=False) as counter:  # a real step: forward, loss, backward
        gram_loss(real(x)).backward()
    truth = counter.get_total_flops()
    a = mw.analyze(
        model, input_data=x, mode="training", loss=gram_loss, optimizer=None, device="cpu"
    )
    assert a.error is None
    assert a.total_flops == truth
    # the loss's matmuls alone, counted for real: they are in the total, once
    out = torch.randn(16, 64, requires_grad=True)
    with FlopCounterMode(display=False) as loss_only:
        gram_loss(out).backward()
    assert 0 < loss_only.get_total_flops() < truth
    per_module = sum(c.flops + c.backward_flops for c in a.calls if c.parent == -1)
    assert a.total_flops - per_module == loss_only.get_total_flops()


# -- input bytes: each real storage once ---------------------------------------------------------


class TakesTwo(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a.sum() + b.sum()


def _distinct_storage_bytes(tensors: list[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind the real ``tensors`` (by their data's address)."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


def _pairs() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    x, y = torch.zeros(4, 16), torch.zeros(8, 16)
    return {
        "view": (x, x[1]),  # x[1] lies inside x's storage
        "same": (x, x),
        "transpose": (x, x.t()),
        "apart": (x, y),
    }


@pytest.mark.parametrize("pair", list(_pairs()))
def test_input_bytes_count_each_real_storage_once(pair: str) -> None:
    inputs = _pairs()[pair]
    a = mw.analyze(TakesTwo(), input_data=inputs)
    assert a.error is None
    assert a.memory.input_bytes == _distinct_storage_bytes(list(inputs))
    assert a.memory.baseline_bytes == a.memory.input_bytes  # no parameters, no buffers


def test_meta_inputs_sharing_a_storage_count_it_once() -> None:
    x = torch.zeros(4, 16, device="meta")
    a = mw.analyze(TakesTwo(), input_data=(x, x[1]))
    assert a.error is None
    assert a.memory.input_bytes == 4 * 16 * 4  # x's storage, once


def test_inputs_sharing_a_storage_share_it_in_the_trace() -> None:
    """The model sees ``x`` and ``x[1]`` as one storage, as in the real run, with the view's
    shape, strides and offset as they really are (meta storages have no address: they are
    told apart by their storage object)."""
    x = torch.zeros(4, 16)
    seen: list[tuple[bool, int, int, tuple[int, ...], tuple[int, ...]]] = []

    class Probe(nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            st = a.untyped_storage()
            same = st._cdata == b.untyped_storage()._cdata
            seen.append((same, st.nbytes(), b.storage_offset(), tuple(b.shape), b.stride()))
            return a + 1

    real = x[1]
    expected = (True, 256, real.storage_offset(), tuple(real.shape), real.stride())
    Probe()(x, real)  # the real run, for the record
    assert seen.pop() == expected
    mw.analyze(Probe(), input_data=(x, real))
    assert seen == [expected]


# -- the README's categories: a saved tensor freed in forward is an activation ------------------


class DropsABranch(nn.Module):
    """``h.repeat(4, 1)`` (not saved: its backward keeps only sizes) then ``exp`` of it (whose
    backward saves its result); the branch is dropped in the forward pass, which frees both."""

    def __init__(self, d: int = 64) -> None:
        super().__init__()
        self.fc = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        side = h.repeat(4, 1).exp()
        del side
        return h


def test_a_saved_tensor_freed_in_forward_is_an_activation() -> None:
    rows, d = 512, 64
    # torch's own autograd, on a real forward: of the new tensors, only exp's result is saved
    saved: list[tuple[int, ...]] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(tuple(t.shape))
        return t

    real = DropsABranch(d).train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        real(torch.randn(rows, d))
    assert saved.count((4 * rows, d)) == 1  # exp's result; repeat's output is not saved
    a = mw.analyze(DropsABranch(d), input_size=(rows, d), mode="training", optimizer=None)
    assert a.error is None
    h = rows * d * 4
    cats = a.memory.by_category()
    # the peak is exp's output, with repeat's still live: README, "training: what autograd
    # saved for backward (exp's result: 4h) and the outputs alive at the end of the forward
    # pass (h)" are activations; "temporaries (the rest)": repeat's output (4h)
    assert a.memory.peak_op == "aten.exp" and a.memory.peak_phase == "forward"
    assert cats["activations"] == h + 4 * h
    assert cats["temporaries"] == 4 * h
    assert sum(cats.values()) == a.peak_bytes


class DropsThenGrows(DropsABranch):
    """:class:`DropsABranch`, then a larger temporary (``h.repeat(10, 1)``, summed): the peak is
    there, after the dropped branch was freed."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = super().forward(x)
        return h + h.repeat(10, 1).sum()


def test_a_dropped_branch_is_freed_in_forward_as_in_a_real_run() -> None:
    """A saved output whose graph dies in the forward pass is freed there, as in a real run
    (MemTracker): the trace's saved tensors hold no reference cycle that outlives the branch."""
    torch.manual_seed(0)
    model, x = DropsThenGrows(64), torch.randn(512, 64)
    a = mw.analyze(model, input_data=x, mode="training", optimizer=None, device="cpu")
    assert a.error is None
    assert a.peak_bytes == real_peak(model, (x,), training=True)
    assert a.memory.peak_op == "aten.sum"  # its scalar made while the repeat is live


# -- a call's alloc_bytes in training: its forward only ------------------------------------------


def test_training_forward_alloc_bytes_are_the_inference_forwards() -> None:
    batch = 64
    infer = mw.analyze(mlp(), input_size=(batch, 32))
    train = mw.analyze(mlp(), input_size=(batch, 32), mode="training", optimizer=None)
    assert infer.error is None and train.error is None
    per_call = [(c.path, c.alloc_bytes) for c in infer.calls]
    assert [(c.path, c.alloc_bytes) for c in train.calls] == per_call
    # and the inference forward's own bytes, from the shapes: each layer allocates its output
    assert per_call == [
        ("", 0),
        ("0", batch * 128 * 4),
        ("1", batch * 128 * 4),
        ("2", batch * 64 * 4),
    ]


# -- device=None is no device --------------------------------------------------------------------


class DeviceNone(nn.Module):
    """A forward that passes ``device=None`` explicitly: PyTorch's default device, like none."""

    def __init__(self, d: int = 64) -> None:
        super().__init__()
        self.fc = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = torch.ones(x.shape[0], x.shape[1], device=None)
        return self.fc(x) + bias


class ScratchNone(nn.Module):
    """A scratch buffer made with ``device=None`` and never mixed with the input: live while
    the layer runs, so it is in the peak."""

    def __init__(self, d: int = 64) -> None:
        super().__init__()
        self.fc = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scratch = torch.empty(x.shape[0], 4 * x.shape[1], device=None)
        y = self.fc(x)
        del scratch
        return y


@pytest.mark.parametrize("mode", ["inference", "training"])
@pytest.mark.parametrize("make", [DeviceNone, ScratchNone])
def test_device_none_counts_like_a_real_cpu_run(mode: str, make: type[nn.Module]) -> None:
    # torch's own meaning: device=None is the default device
    with torch.device("meta"):
        assert torch.ones(1, device=None).is_meta
    torch.manual_seed(0)
    model, x = make(), torch.randn(2048, 64)
    training = mode == "training"
    a = mw.analyze(model, input_data=x, mode=mode, optimizer=None, device="cpu")
    assert a.error is None
    assert a.peak_bytes == real_peak(model, (x,), training=training)
    note = next(n for n in a.notes if "without a device" in n)
    assert note.startswith("1 tensor(s)") and " at test_memory_truth.py:" in note
