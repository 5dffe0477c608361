"""A meta module and its inputs as fake tensors on a device: what a parallel trace runs on
(``parallel.World.prepare``, ``pipelining``, ``wrapped``)."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["fake_like", "on_fake"]


def fake_like(t: torch.Tensor, memo: dict[int, torch.Tensor], device: str = "cpu") -> torch.Tensor:
    """A fake tensor like ``t`` on ``device`` (called under the world's ``FakeTensorMode``)."""
    found = memo.get(id(t))
    if found is None:
        found = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device)
        if isinstance(t, nn.Parameter):
            found = nn.Parameter(found, requires_grad=t.requires_grad)
        memo[id(t)] = found
    return found


def on_fake(copied: nn.Module, device: str = "cpu") -> None:
    """Replace the parameters, buffers and tensor attributes of ``copied`` (meta_widget's own
    copy) by fake tensors on ``device``, tied tensors staying tied (under the world's mode)."""
    memo: dict[int, torch.Tensor] = {}
    for m in copied.modules():
        for name, p in m._parameters.items():
            if p is not None:
                m._parameters[name] = fake_like(p, memo, device)  # type: ignore[assignment]
        for name, b in m._buffers.items():
            if b is not None:
                m._buffers[name] = fake_like(b, memo, device)
        for name, v in list(vars(m).items()):
            if isinstance(v, torch.Tensor) and name not in ("_parameters", "_buffers"):
                setattr(m, name, fake_like(v, memo, device))
