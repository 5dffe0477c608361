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


def _user_model() -> tuple[torch.nn.Module, list[str]]:
    with torch.device("meta"):
        net = Net()
    net.train()
    net.blocks[0].norm.eval()
    net.head.weight.grad = torch.zeros_like(net.head.weight)  # a meta grad the user set
    net.blocks[2].lin.bias.requires_grad_(False)
    seen: list[str] = []
    net.head.register_forward_hook(lambda m, a, o: seen.append("head"))
    block = net.blocks[1]

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
