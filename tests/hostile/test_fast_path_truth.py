"""The fast path against independent truths (issue 23's blind spots).

- The op count an analysis reports (``a.fast_path.ops``: ops run, hit, bypassed, and replayed
  from a tape) is the number of aten ops a plain meta forward dispatches, counted here by a
  ``TorchDispatchMode`` of the test's own.
- A model that turns gradients on inside an inference forward (``with torch.enable_grad():``
  around taped functions) records what a ``fast=False`` run records: a replay would make outputs
  without autograd's graph and saved tensors.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from test_fast_path import assert_same
from torch import nn
from torch.nn import functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import meta_widget as mw


class _CountOps(TorchDispatchMode):
    """Counts every aten op dispatched while active."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        self.ops += 1
        return func(*args, **(kwargs or {}))


def dispatched_ops(model: nn.Module, x: torch.Tensor) -> int:
    """The aten ops a plain meta inference forward of ``model`` on ``x`` dispatches (the
    model and input moved to meta first, outside the count)."""
    meta = copy.deepcopy(model).to("meta").eval()
    inp = torch.empty(x.shape, dtype=x.dtype, device="meta")
    counter = _CountOps()
    with torch.no_grad(), counter:
        meta(inp)
    return counter.ops


class Block(nn.Module):
    """Taped functions of every kind (norms, linear, activations, matmul, softmax, conv)."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.rms = nn.RMSNorm(width)
        self.fc = nn.Linear(width, width)
        self.conv = nn.Conv1d(width, width, 3, padding=1)
        self.group = nn.GroupNorm(4, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.fc(self.norm(x)))
        s = torch.softmax(h @ h.transpose(-1, -2), -1)
        h = F.relu(s @ h) + F.silu(self.rms(x))
        c = self.group(self.conv(h.transpose(1, 2))).transpose(1, 2)
        return x + F.dropout(c, 0.1, self.training)


def blocks() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*(Block() for _ in range(6)))


@pytest.mark.parametrize("device", ["cuda", "cpu", "math"])
def test_the_op_count_is_the_aten_ops_a_plain_meta_forward_dispatches(device: str) -> None:
    """Replayed calls count the ops their first run dispatched, no more, no fewer."""
    model, x = blocks(), torch.randn(2, 5, 16)
    a = mw.analyze(model, input_data=(x,), device=device)
    assert a.error is None, a.error
    stats = a.fast_path
    assert stats is not None
    if device != "math":  # "math" runs no kernel routing, and so no replay
        assert stats.replayed > 0, stats
    truth = dispatched_ops(model, x)
    assert stats.ops == truth, (stats, truth)


class GradInside(nn.Module):
    """An inference forward that turns gradients on around taped functions (as code computing
    an input gradient, or a meta-learning inner step, does): autograd keeps what they save."""

    def __init__(self, width: int = 32, n: int = 4, grad: bool = True) -> None:
        super().__init__()
        self.grad = grad
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        with torch.set_grad_enabled(self.grad):
            for layer in self.layers:
                h = F.relu(layer(x))
                q = h.view(b, t, 4, d // 4).transpose(1, 2)
                y = F.scaled_dot_product_attention(q, q, q)
                x = x + y.transpose(1, 2).reshape(b, t, d)
        return x.detach()


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_gradients_turned_on_inside_an_inference_forward_record_as_without_the_fast_path(
    device: str,
) -> None:
    a = assert_same(GradInside, min_hits=0, device=device, input_size=(2, 8, 32))
    assert a.error is None, a.error
    slow = mw.analyze(GradInside(), device=device, input_size=(2, 8, 32), fast=False)
    assert a.peak_bytes == slow.peak_bytes
    # autograd kept what the layers saved: more than the same forward with gradients off
    plain = mw.analyze(GradInside(grad=False), device=device, input_size=(2, 8, 32), fast=False)
    assert slow.peak_bytes > plain.peak_bytes
