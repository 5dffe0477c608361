"""``mw.measure``: a real run under the recorder, checked against the CPU allocator measured here
(``torch.profiler`` memory events of a plain run, ``truth.allocator_peak``, or a training step
written out below), and ``mw.compare(predicted, measured)`` on small models of the zoo's kinds."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile
from truth import allocator_peak

import meta_widget as mw

transformers = pytest.importorskip("transformers")


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))


def cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 10),
    )


def llama() -> Any:
    return transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
    )


def gpt2() -> Any:
    return transformers.GPT2Config(
        n_embd=64, n_layer=2, n_head=4, vocab_size=128, n_positions=64, bos_token_id=0,
        eos_token_id=0,
    )  # fmt: skip


def training_allocator_peak(model: nn.Module, x: torch.Tensor) -> int:
    """The CPU allocator's peak of one plain training step (train(), forward, the sum of the
    output, backward, AdamW's step) of ``model`` on ``x``: parameters, buffers and input, plus
    the largest running sum of the profiler's allocation events."""
    model = copy.deepcopy(model).train()
    held = [*model.parameters(), *model.buffers(), x]
    base = sum(
        {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in held}.values()
    )
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = model(x)
        out.sum().backward()
        opt = torch.optim.AdamW(model.parameters(), foreach=False)
        opt.step()
        del out, opt
    events = []
    pending = list(prof.profiler.kineto_results.experimental_event_tree())
    while pending:
        node = pending.pop()
        if node.tag == _EventType.Allocation:
            events.append((node.start_time_ns, node.extra_fields.alloc_size))
        pending.extend(node.children)
    live = peak = 0
    for _, size in sorted(events):
        live += size
        peak = max(peak, live)
    return base + peak


@pytest.mark.parametrize("make", [mlp, cnn])
def test_measured_peak_is_the_cpu_allocators(make: Any) -> None:
    torch.manual_seed(0)
    model = make().eval()
    x = torch.randn(8, 64) if make is mlp else torch.randn(4, 3, 32, 32)
    allocator_peak(model, (x,))  # a warm-up: kernels' one-off allocations out of the truth
    truth = allocator_peak(model, (x,))
    measured = mw.measure(model, input_data=x)
    assert isinstance(measured, mw.Analysis)
    assert measured.peak_bytes == pytest.approx(truth, rel=0.01)


def test_measured_training_peak_is_the_cpu_allocators() -> None:
    torch.manual_seed(0)
    model, x = mlp(), torch.randn(8, 64)
    before = [p.detach().clone() for p in model.parameters()]
    training_allocator_peak(model, x)
    truth = training_allocator_peak(model, x)
    measured = mw.measure(model, input_data=x, mode="training")
    assert measured.peak_bytes == pytest.approx(truth, rel=0.01)
    assert measured.memory.gradient_bytes == sum(p.numel() * 4 for p in model.parameters())
    # the user's model is not stepped: a copy ran
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))
    assert all(p.grad is None for p in model.parameters())


def _relative(a: int, b: int) -> float:
    return abs(a - b) / max(a, b, 1)


@pytest.mark.parametrize(
    ("make", "size"),
    [(mlp, (8, 64)), (cnn, (4, 3, 32, 32)), (llama, (1, 16)), (gpt2, (1, 16))],
    ids=["mlp", "cnn", "llama", "gpt2"],
)
@pytest.mark.parametrize("mode", ["inference", "training"])
def test_prediction_matches_the_real_run(make: Any, size: tuple[int, ...], mode: str) -> None:
    torch.manual_seed(0)
    model = make()
    predicted = mw.analyze(model, input_size=size, mode=mode, device="cpu")
    measured = mw.measure(model, input_size=size, mode=mode)
    table = mw.compare(predicted, measured).to_dataframe()
    assert not table.only_in.notna().any()
    assert (table.params_diff == 0).all()
    worst = max(
        _relative(a, b)
        for a, b in zip(table.activation_bytes_a, table.activation_bytes_b, strict=True)
    )
    assert worst <= 0.02
    assert _relative(predicted.peak_bytes, measured.peak_bytes) <= 0.02
    assert measured.total_params == predicted.total_params


def test_wall_time_per_module() -> None:
    model, x = mlp(), torch.randn(8, 64)
    frame = mw.measure(model, input_data=x).to_dataframe()
    assert (frame.wall_s > 0).all()
    assert frame.wall_s[0] >= frame.wall_s[1:].max()  # the root holds its children


def test_refuses_past_the_cap() -> None:
    with pytest.raises(mw.MeasureError, match="max_bytes") as info:
        mw.measure(mlp(), input_size=(8, 64), max_bytes=1000)
    assert "\n" not in str(info.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this PyTorch sees a CUDA device")
def test_cuda_without_a_device_is_one_line() -> None:
    with pytest.raises(mw.MeasureError, match="device='cpu'"):
        mw.measure(mlp(), input_size=(8, 64), device="cuda")
