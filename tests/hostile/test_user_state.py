"""A user's own meta module is left exactly as it was after ``mode="training"`` (issue 10.9 and
the blind spot "not restoring .grad on a user's meta module").

The truth is the module itself, read before the analysis with torch's accessors: the same
parameter objects, ``.grad`` (None, or the meta grad the user set), ``requires_grad``,
``training`` flags, the user's hooks (and no others), and a ``forward`` the user set on an
instance, kept as the same object.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import meta_widget as mw


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)
        self.norm = torch.nn.LayerNorm(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.lin(x)).relu()


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block() for _ in range(3)])
        self.head = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _snapshot(model: torch.nn.Module) -> dict[str, Any]:
    return {
        "params": [
            (n, p, p.grad, p.requires_grad)
            for n, p in model.named_parameters(remove_duplicate=False)
        ],
        "training": [(n, m.training) for n, m in model.named_modules()],
        "hooks": [
            (n, dict(m._forward_hooks), dict(m._forward_pre_hooks), dict(m._backward_hooks))
            for n, m in model.named_modules()
        ],
        "forwards": [(n, vars(m).get("forward")) for n, m in model.named_modules()],
    }


def _same(before: dict[str, Any], after: dict[str, Any]) -> None:
    for (n, p, g, rg), (n2, p2, g2, rg2) in zip(before["params"], after["params"], strict=True):
        assert n == n2 and p2 is p, f"parameter {n} replaced"
        assert g2 is g, f"{n}.grad was {g!r}, is {g2!r}"
        assert rg2 == rg, f"{n}.requires_grad changed"
    assert after["training"] == before["training"]
    assert after["hooks"] == before["hooks"]
    for (n, f), (_, f2) in zip(before["forwards"], after["forwards"], strict=True):
        assert f2 is f, f"{n!r}.forward was {f!r}, is {f2!r}"


def _user_model(instance_forward: bool = True) -> tuple[torch.nn.Module, list[str]]:
    with torch.device("meta"):
        net = Net()
    net.train()
    net.blocks[0].norm.eval()
    net.head.weight.grad = torch.zeros_like(net.head.weight)  # a meta grad the user set
    net.blocks[2].lin.bias.requires_grad_(False)
    seen: list[str] = []
    net.head.register_forward_hook(lambda m, a, o: seen.append("head"))
    block = net.blocks[1]
    if not instance_forward:
        return net, seen

    def wrapped(x: torch.Tensor) -> torch.Tensor:  # an instance-level forward of the user's
        seen.append("wrapped")
        return Block.forward(block, x)

    block.forward = wrapped  # type: ignore[method-assign]
    return net, seen


@pytest.mark.parametrize("optimizer", ["adamw", "sgd-momentum"])
def test_training_leaves_the_users_meta_module_as_it_was(optimizer: str) -> None:
    net, seen = _user_model()
    before = _snapshot(net)
    a = mw.analyze(
        net,
        input_size=(2, 16),
        mode="training",
        optimizer=optimizer,
        activation_checkpointing=True,
    )
    assert a.error is None
    assert a.memory.gradient_bytes > 0  # gradients were made, so there was something to restore
    assert "wrapped" in seen and "head" in seen  # the user's forward and hook ran in the trace
    _same(before, _snapshot(net))
    # the user's instance forward still works as theirs
    seen.clear()
    net.blocks[1](torch.empty(2, 16, device="meta"))
    assert seen == ["wrapped"]


def test_checkpointing_by_path_keeps_the_instance_forward() -> None:
    net, _ = _user_model()
    forward = net.blocks[1].forward
    mw.analyze(net, input_size=(2, 16), mode="training", activation_checkpointing=["blocks.1"])
    assert vars(net.blocks[1])["forward"] is forward


def test_a_failing_training_step_leaves_it_as_it_was_too() -> None:
    net, _ = _user_model()
    before = _snapshot(net)
    a = mw.analyze(
        net,
        input_size=(2, 16),
        mode="training",
        loss=lambda out: out.sum() + torch.ones(3, device="meta"),  # not a scalar: backward fails
        activation_checkpointing=True,
    )
    assert a.error is not None
    _same(before, _snapshot(net))


def _dtypes(model: torch.nn.Module) -> list[tuple[str, torch.Tensor, torch.dtype]]:
    """Each parameter and buffer of ``model``, as its own accessors give it, with its dtype."""
    tensors = [*model.named_parameters(), *model.named_buffers()]
    return [(n, t, t.dtype) for n, t in tensors]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_param_dtype_leaves_the_users_meta_module_in_its_dtypes(dtype: str) -> None:
    """Blind spot of issue 23: ``param_dtype`` cast the user's own meta module, so a later
    analysis of it saw bf16 parameters (its peak halved). The truth: the module's parameters
    and buffers, their dtypes read before; and bytes counted from them by hand."""
    # (no instance forward: a closure over the user's block runs that block, not the copy's)
    net, _ = _user_model(instance_forward=False)
    net.to(getattr(torch, dtype))
    net.register_buffer("scale", torch.ones(16, device="meta", dtype=getattr(torch, dtype)))
    before, snapshot = _dtypes(net), _snapshot(net)
    first = mw.analyze(net, input_size=(2, 16), mode="training")
    bf16 = mw.analyze(net, input_size=(2, 16), mode="training", param_dtype=torch.bfloat16)
    assert bf16.error is None and first.error is None
    for (n, t, d), (n2, t2, d2) in zip(before, _dtypes(net), strict=True):
        assert (n2, d2) == (n, d), f"{n} was {d}, is {d2}"
        assert t2 is t, f"{n} replaced"
    _same(snapshot, _snapshot(net))
    # the bf16 analysis counted 2 bytes a parameter, the user's module its own dtype's
    numel = sum(p.numel() for p in net.parameters())
    assert bf16.param_bytes == 2 * numel
    assert first.param_bytes == sum(p.numel() * p.element_size() for p in net.parameters())
    second = mw.analyze(net, input_size=(2, 16), mode="training")
    assert second.param_bytes == first.param_bytes
    assert second.peak_bytes == first.peak_bytes
