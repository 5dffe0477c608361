"""Recurrent layers as the CPU runs them (``meta_widget/trace/rnn.py``). ``nn.LSTM`` inference runs
oneDNN's RNN kernel a layer at a time: the trace lands just under the CPU allocator's peak (all
but oneDNN's own state buffers, which oneDNN sizes at run time). ``nn.GRU`` takes PyTorch's
CPU-only branch: exact."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from truth import allocator_peak, real_peak

import meta_widget as mw

LSTMS: list[tuple[dict[str, Any], tuple[int, ...]]] = [
    ({"input_size": 64, "hidden_size": 128, "num_layers": 2, "batch_first": True}, (4, 50, 64)),
    ({"input_size": 32, "hidden_size": 256}, (100, 8, 32)),
    ({"input_size": 64, "hidden_size": 128, "num_layers": 3, "bias": False}, (30, 16, 64)),
    (
        {"input_size": 64, "hidden_size": 128, "num_layers": 2, "bidirectional": True},
        (50, 4, 64),
    ),
]


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="a build without oneDNN")
@pytest.mark.parametrize("options, shape", LSTMS)
def test_lstm_inference_is_the_cpu_allocators_peak_but_onednns_state_buffers(
    options: dict[str, Any], shape: tuple[int, ...]
) -> None:
    torch.manual_seed(0)
    model, x = nn.LSTM(**options).eval(), torch.randn(*shape)
    a = mw.analyze(model, input_data=(x,), device="cpu")
    assert a.error is None, a.error
    assert "aten.mkldnn_rnn_layer" in {op for _, _, op in a.memory.timeline}
    ratio = a.peak_bytes / allocator_peak(model, (x,))
    assert 0.9 < ratio <= 1.0  # the cell's decomposition, traced before, was 0.59x
    # the same FLOPs as the cell's decomposition: the gate matmuls of every step
    assert a.total_flops == mw.analyze(model, input_data=(x,), device="math").total_flops


def test_lstm_training_and_other_devices_keep_the_cells_decomposition() -> None:
    model, x = nn.LSTM(16, 32, batch_first=True), torch.randn(2, 5, 16)
    training = mw.analyze(model, input_data=(x,), mode="training", optimizer=None, device="cpu")
    cuda = mw.analyze(model, input_data=(x,), device="cuda")
    for a in (training, cuda):
        assert a.error is None, a.error
        assert "aten.mkldnn_rnn_layer" not in {op for _, _, op in a.memory.timeline}


class LastGRU(nn.Module):
    def __init__(self, **options: Any) -> None:
        super().__init__()
        self.rnn = nn.GRU(**options)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.rnn(x)[0]  # type: ignore[no-any-return]


GRUS: list[tuple[dict[str, Any], tuple[int, ...]]] = [
    ({"input_size": 64, "hidden_size": 128, "num_layers": 2, "batch_first": True}, (4, 50, 64)),
    ({"input_size": 32, "hidden_size": 256}, (100, 8, 32)),
    ({"input_size": 64, "hidden_size": 128, "num_layers": 3, "bias": False}, (30, 16, 64)),
]


@pytest.mark.parametrize("options, shape", GRUS)
def test_gru_projects_the_whole_sequence_first_as_the_cpu_does(
    options: dict[str, Any], shape: tuple[int, ...]
) -> None:
    """The CPU-only branch of PyTorch's RNN code: inference equals the allocator's peak, training
    MemTracker's, to the byte (the decomposition on meta was 0.78x in inference)."""
    torch.manual_seed(0)
    model, x = LastGRU(**options).eval(), torch.randn(*shape)
    a = mw.analyze(model, input_data=(x,), device="cpu")
    assert a.error is None, a.error
    assert a.peak_bytes == allocator_peak(model, (x,))
    assert a.total_flops == mw.analyze(model, input_data=(x,), device="math").total_flops
    training = mw.analyze(model, input_data=(x,), mode="training", optimizer=None, device="cpu")
    assert training.error is None, training.error
    assert training.memory.first_step_peak_bytes == real_peak(model, (x,), training=True)
