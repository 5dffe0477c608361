"""``nn.MultiheadAttention`` called as ``mha(x, x, x)`` in inference, ``need_weights`` left at
its default (``True``): PyTorch still runs the fused ``_native_multi_head_attention`` kernel (its
fast-path conditions in ``MultiheadAttention.forward`` do not look at ``need_weights``; the
profiler shows the kernel), whose math branch keeps the scores alive through the output
projection and returns them. The peak is checked against the CPU allocator (issue 36, 12a)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.profiler import profile
from truth import allocator_peak

import meta_widget as mw


class SelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int, options: dict[str, Any]) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.options = options

    def forward(self, x: torch.Tensor) -> Any:
        out, weights = self.attn(x, x, x, **self.options)
        return out if weights is None else (out, weights)


OPTIONS = {
    "default": {},
    "per-head": {"need_weights": True, "average_attn_weights": False},
    "no-weights": {"need_weights": False},
}


def test_the_default_need_weights_runs_the_fused_kernel() -> None:
    model, x = SelfAttention(32, 2, {}).eval(), torch.randn(2, 8, 32)
    with profile() as prof, torch.no_grad():
        model(x)
    assert "aten::_native_multi_head_attention" in {e.name for e in prof.events()}


@pytest.mark.parametrize("name", list(OPTIONS))
@pytest.mark.parametrize(
    "dim, heads, batch, tokens",
    [(256, 8, 8, 197), (32, 2, 4, 300)],  # more tokens than width: the averaged weights count
)
def test_attention_weights_peak_is_the_cpu_allocators(
    name: str, dim: int, heads: int, batch: int, tokens: int
) -> None:
    torch.manual_seed(0)
    model, x = SelfAttention(dim, heads, OPTIONS[name]).eval(), torch.randn(batch, tokens, dim)
    allocator_peak(model, (x,))  # a warm-up
    truth = allocator_peak(model, (x,))
    a = mw.analyze(model, input_data=(x,), device="cpu")
    assert a.error is None, a.error
    assert a.peak_bytes == truth
    with torch.no_grad():
        real = model(x)
    real = real if isinstance(real, tuple) else (real,)
    assert [info.shape for _, info in a.calls[0].outputs] == [tuple(t.shape) for t in real]
