"""Backward FLOPs per module: each autograd node is credited to the module call that created it.

Truth: ``FlopCounterMode`` on a real CPU training step, whose module tracker credits backward
FLOPs per module too, for models where its tracker is exact (GPT-2, a CNN); for Llama (its
tracker misplaces the backward of grouped-query attention) the invariants a Linear must meet.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from models import SmallCNN, gpt2_config, llama_config, real
from test_analyzer import CASES
from torch.utils.flop_counter import FlopCounterMode

import meta_widget as mw


def real_step_counts(model: torch.nn.Module, x: torch.Tensor) -> dict[str, int]:
    """FLOPs by module path of a real forward + backward (FlopCounterMode's module names)."""
    model.train()
    counter = FlopCounterMode(display=False)
    with counter:
        out = model(x)
        (out.logits if hasattr(out, "logits") else out).sum().backward()
    root = type(model).__name__
    return {
        "" if name == root else name.removeprefix(root + "."): sum(ops.values())
        for name, ops in counter.get_flop_counts().items()
        if name == root or name.startswith(root + ".")
    }


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: (real(gpt2_config()), torch.randint(0, 100, (2, 16))), id="gpt2"),
        pytest.param(lambda: (SmallCNN(), torch.randn(4, 3, 16, 16)), id="cnn"),
    ],
)
def test_forward_plus_backward_per_module_match_a_real_step(make: Any) -> None:
    torch.manual_seed(0)
    model, x = make()
    a = mw.analyze(model, input_data=x, mode="training", optimizer=None, device="math")
    truth = real_step_counts(model, x)
    ours = {n.path: n.flops + n.backward_flops for n in a.modules}
    assert {k: v for k, v in ours.items() if v or k in truth} == truth
    assert a.root.backward_flops > a.root.flops > 0
    assert a.total_flops == a.root.flops + a.root.backward_flops  # nothing left unattributed


def test_every_linear_backward_is_one_or_two_matmuls_of_its_forward() -> None:
    a = mw.analyze(llama_config(), input_size=(2, 16), mode="training", optimizer=None)
    linears = [c for c in a.calls if c.type == "Linear"]
    assert linears and all(c.backward_flops == 2 * c.flops for c in linears)
    # attention's own backward (not in a Linear) lands on the attention module
    attn = next(c for c in a.calls if c.type == "LlamaAttention")
    own = attn.backward_flops - sum(c.backward_flops for c in a.calls if c.parent == attn.index)
    assert own > 0
    assert a.total_flops == a.calls[0].flops + a.calls[0].backward_flops
    frame = a.to_dataframe()
    assert frame["backward_flops"].iloc[0] == a.calls[0].backward_flops
    assert "Bwd FLOPs" in a.summary()


def test_the_training_peak_names_the_module_whose_backward_allocates() -> None:
    a = mw.analyze(llama_config(), input_size=(2, 16), mode="training", optimizer=None)
    assert a.memory.peak_phase == "backward"
    assert a.memory.peak_module is not None
    assert f"in the backward of {a.memory.peak_module}" in a.summary()


def test_inference_has_no_backward_and_sends_no_column() -> None:
    a = mw.analyze(gpt2_config(), input_size=(1, 8))
    assert all(c.backward_flops == 0 for c in a.calls)
    assert "backward_ops" not in a.to_payload()["calls"]
    assert "Bwd FLOPs" not in a.summary()
    t = mw.analyze(gpt2_config(), input_size=(1, 8), mode="training")
    # own-body ops only on the wire: the front end sums each call's subtree
    column = t.to_payload()["calls"]["backward_ops"]
    assert sum(n for ops in column for _, n in ops) == t.calls[0].backward_flops > 0


def test_checkpointed_layers_count_their_recomputation_as_backward() -> None:
    plain = mw.analyze(llama_config(), input_size=(2, 16), mode="training", optimizer=None)
    a = mw.analyze(
        llama_config(),
        input_size=(2, 16),
        mode="training",
        optimizer=None,
        activation_checkpointing=True,
    )
    # the recomputation inside backward is no new call: the same calls as without checkpointing
    assert [(c.path, c.flops) for c in a.calls] == [(c.path, c.flops) for c in plain.calls]
    # each layer's backward grows by the forward work it repeats, and nothing is left out
    extra = a.total_flops - plain.total_flops
    layers = [c for c in a.calls if c.type == "LlamaDecoderLayer"]
    plain_layers = [c for c in plain.calls if c.type == "LlamaDecoderLayer"]
    grown = [x.backward_flops - y.backward_flops for x, y in zip(layers, plain_layers, strict=True)]
    assert all(0 < g <= x.flops for g, x in zip(grown, layers, strict=True))
    assert sum(grown) == extra > 0
    assert a.total_flops == a.calls[0].flops + a.calls[0].backward_flops
    assert a.memory.peak_phase == "backward" and a.memory.peak_module is not None


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_model_credits_its_whole_backward_to_modules(name: str) -> None:
    """GPT-2, Llama, BERT, T5 (kwargs), a CNN, an LSTM, a module called 3x, dict in/out."""
    model, args, kwargs = CASES[name]()
    a = mw.analyze(model, input_data=kwargs if kwargs else args, mode="training", optimizer=None)
    assert a.error is None
    top = [c for c in a.calls if c.parent == -1]
    assert a.total_flops == sum(c.flops + c.backward_flops for c in top)
    assert a.orphan_ops == {}
    for c in a.calls:  # a Linear's backward: grad of the weight, and of the input if it needs one
        if c.type == "Linear":
            assert c.backward_flops in (c.flops, 2 * c.flops), c.path
    assert a.memory.peak_module is not None  # the peak of these steps is in backward
    for c in a.calls:  # by op, own body: adds up to the backward of the body
        assert sum(c.backward_ops.values()) == c.backward_self_flops, c.path


class _Double(torch.autograd.Function):
    """Its backward calls a module: a module call that only ever happens inside backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, helper: torch.nn.Module) -> torch.Tensor:
        ctx.helper = helper
        return x * 2

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return ctx.helper(grad), None


class _BackwardHelper(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.helper = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Double.apply(self.lin(x), self.helper)


def test_a_module_called_only_in_backward_is_no_call_and_loses_nothing() -> None:
    a = mw.analyze(_BackwardHelper(), input_size=(4, 8), mode="training")
    assert a.error is None
    assert [c.path for c in a.calls] == ["", "lin"]
    assert a.total_flops == a.calls[0].flops + a.calls[0].backward_flops
    assert a.calls[0].backward_flops > a.calls[1].backward_flops  # the helper's matmul is there


def test_a_peak_in_the_optimizer_step_says_so() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    a = mw.analyze(model, input_size=(16, 32), mode="training", optimizer="adamw")
    assert a.memory.peak_phase == "optimizer" and a.memory.peak_module is None
    assert a.memory.peak_owner == "the optimizer step"
    assert "in the optimizer step (aten." in a.summary()
    peak = next(d for d in a.figure("timeline").data if d.name == "peak")
    assert "in the optimizer step" in peak.text[0]
