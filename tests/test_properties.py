"""Property test: random nested module trees with reuse, checked against a real CPU run."""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn
from torch.nn.modules import module as module_globals
from torch.utils.flop_counter import FlopCounterMode

import meta_widget as mw

WIDTH = 6
LEAVES = {
    "linear": lambda: nn.Linear(WIDTH, WIDTH),
    "relu": nn.ReLU,
    "gelu": nn.GELU,
    "tanh": nn.Tanh,
    "norm": lambda: nn.LayerNorm(WIDTH),
}


class Composite(nn.Module):
    """Holds children in a Sequential, ModuleList or ModuleDict; calls them in ``order``."""

    def __init__(self, children: list[nn.Module], holder: str, order: list[int]) -> None:
        super().__init__()
        self.kind = holder
        self.order = order
        if holder == "sequential":
            self.body: nn.Module = nn.Sequential(*children)
        elif holder == "list":
            self.body = nn.ModuleList(children)
        else:
            self.body = nn.ModuleDict({f"m{i}": c for i, c in enumerate(children)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "sequential":
            x = self.body(x)
            items = list(self.body)
        else:
            items = list(self.body.values()) if self.kind == "dict" else list(self.body)
        for i in self.order:  # extra calls: modules reused within the forward
            x = items[i % len(items)](x)
        return x


def _leaf() -> st.SearchStrategy[Any]:
    return st.sampled_from(sorted(LEAVES)).map(lambda k: LEAVES[k]())


def _tree() -> st.SearchStrategy[Any]:
    return st.recursive(
        _leaf(),
        lambda inner: st.builds(
            Composite,
            st.lists(inner, min_size=1, max_size=4),
            st.sampled_from(["sequential", "list", "dict"]),
            st.lists(st.integers(0, 3), max_size=3),
        ),
        max_leaves=12,
    )


def _cpu_call_count(model: nn.Module, x: torch.Tensor) -> dict[str, int]:
    names = {id(m): n for n, m in model.named_modules()}
    counts: dict[str, int] = {}

    def hook(mod: nn.Module, _args: Any, _out: Any) -> None:
        counts[names[id(mod)]] = counts.get(names[id(mod)], 0) + 1

    handles = [m.register_forward_hook(hook) for m in model.modules()]
    try:
        model(x)
    finally:
        for h in handles:
            h.remove()
    return counts


def _hook_count(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model=_tree(), batch=st.integers(1, 3))
def test_random_trees_one_record_per_call_and_consistent_totals(
    model: nn.Module, batch: int
) -> None:
    model.eval()
    x = torch.randn(batch, WIDTH)
    a = mw.analyze(model, input_data=x)
    assert a.error is None
    recorded: dict[str, int] = {}
    for c in a.calls:
        recorded[c.path] = recorded.get(c.path, 0) + 1
    with torch.no_grad():
        assert recorded == _cpu_call_count(model, x)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(x)
    assert a.total_flops == counter.get_total_flops()
    assert sum(c.self_flops for c in a.calls) == a.total_flops
    assert sum(n.flops for n in a.modules if n.depth == 0) == a.total_flops
    assert a.total_params == sum(p.numel() for p in model.parameters())
    assert _hook_count(model) == 0
    assert not module_globals._global_forward_hooks
    assert not module_globals._global_forward_pre_hooks
