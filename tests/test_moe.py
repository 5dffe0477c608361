"""Mixture of experts: ``active_params`` is what one token uses, the shared parameters plus
``k/E`` of the routed experts' parameters, computed here from the real (CPU, tiny) model's own
named parameters, for Mixtral, Qwen3-MoE and DeepSeek-V3 (shared experts, a dense first
layer); a dense model's active parameters are all of them."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
import transformers

import meta_widget as mw

#: a routed expert's parameter (``shared_experts`` / ``shared_expert`` are not routed)
ROUTED = re.compile(r"(^|\.)experts\.")

COMMON: dict[str, Any] = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=120,
    num_experts_per_tok=2,
)


def mixtral() -> Any:
    return transformers.MixtralConfig(**COMMON, intermediate_size=96, num_local_experts=8)


def qwen3_moe() -> Any:
    return transformers.Qwen3MoeConfig(
        **{**COMMON, "head_dim": 16},
        intermediate_size=128,
        moe_intermediate_size=32,
        num_experts=6,
    )


def deepseek_v3() -> Any:
    return transformers.DeepseekV3Config(
        **{**COMMON, "num_key_value_heads": 4},
        intermediate_size=128,
        moe_intermediate_size=32,
        n_routed_experts=8,
        n_shared_experts=1,
        first_k_dense_replace=1,
        n_group=2,
        topk_group=1,
        q_lora_rank=32,
        kv_lora_rank=16,
        qk_nope_head_dim=8,
        qk_rope_head_dim=8,
        v_head_dim=8,
    )


def experts_of(config: Any) -> int:
    for name in ("num_local_experts", "num_experts", "n_routed_experts"):
        if isinstance(getattr(config, name, None), int):
            return int(getattr(config, name))
    raise AssertionError("no expert count in the config")


def truth(model: torch.nn.Module, k: int, experts: int, under: str = "") -> int:
    """shared + k/E x routed-expert parameters, from the real model's named parameters."""
    named = dict(model.named_parameters())  # each tensor once (tied weights once)
    if under:
        named = {n: p for n, p in named.items() if n.startswith(f"{under}.")}
    routed = sum(p.numel() for n, p in named.items() if ROUTED.search(n))
    shared = sum(p.numel() for n, p in named.items() if not ROUTED.search(n))
    assert routed % experts == 0
    return shared + routed * k // experts


@pytest.mark.parametrize("make", [mixtral, qwen3_moe, deepseek_v3], ids=lambda f: f.__name__)
def test_active_params_are_shared_plus_k_over_e_of_the_experts(make: Callable[[], Any]) -> None:
    config = make()
    torch.manual_seed(0)
    real = transformers.AutoModel.from_config(config)  # on the CPU, for its parameters
    k, experts = config.num_experts_per_tok, experts_of(config)
    a = mw.analyze(config)
    total = sum(p.numel() for p in real.parameters())
    assert a.total_params == total
    assert a.active_params == truth(real, k, experts)
    assert a.active_params < total
    assert any("routing was assumed balanced" in n for n in a.notes)
    # per module: each decoder layer and its MoE block, as the real model's parameters say
    frame = a.to_dataframe().set_index("module")
    for layer in range(config.num_hidden_layers):
        for path in (f"layers.{layer}", f"layers.{layer}.mlp"):
            assert frame.loc[path, "active_params"] == truth(real, k, experts, path), path
    assert frame.loc["", "active_params"] == a.active_params


def test_deepseek_dense_first_layer_and_shared_experts_are_all_active() -> None:
    config = deepseek_v3()
    real = transformers.AutoModel.from_config(config)
    rows = {r["module"]: r for r in mw.analyze(config).to_dataframe().to_dict("records")}
    dense = sum(p.numel() for n, p in real.named_parameters() if n.startswith("layers.0."))
    shared = sum(
        p.numel() for n, p in real.named_parameters() if n.startswith("layers.1.mlp.shared_")
    )
    assert rows["layers.0"]["active_params"] == rows["layers.0"]["params"] == dense
    assert rows["layers.1.mlp.shared_experts"]["active_params"] == shared


def test_traced_mixtral_keeps_active_params() -> None:
    config = mixtral()
    real = transformers.AutoModel.from_config(config)
    a = mw.analyze(config, input_size=(2, 16))
    assert a.error is None and a.traced
    assert a.active_params == truth(real, 2, 8)


def test_dense_model_active_params_equal_its_params() -> None:
    config = transformers.LlamaConfig(**{**COMMON, "intermediate_size": 128})
    a = mw.analyze(config)
    real = transformers.AutoModel.from_config(config)
    assert a.active_params == a.total_params == sum(p.numel() for p in real.parameters())
    frame = a.to_dataframe()
    assert frame["active_params"].tolist() == frame["params"].tolist()
    assert not any("routing" in n for n in a.notes)


def test_a_hand_written_moe_with_a_module_list_of_experts() -> None:
    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.top_k = 2
            self.gate = torch.nn.Linear(16, 4, bias=False)
            self.experts = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = self.gate(x).sum() + x
            for e in self.experts:
                out = out + e(x)
            return out

    block = Block()
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), block)
    a = mw.analyze(model, input_size=(3, 16))
    expert = sum(p.numel() for p in block.experts.parameters())
    shared = sum(p.numel() for p in model.parameters()) - expert
    assert a.active_params == shared + expert * 2 // 4


@pytest.mark.parametrize("mode", ["inference", "training"])
def test_expert_flops_are_counted_where_flop_counter_mode_counts_none(mode: str) -> None:
    """transformers runs the experts with ``torch._grouped_mm``, which ``FlopCounterMode``
    counts as 0. The truth: FlopCounterMode's count of a real CPU run (everything but the
    experts) plus the experts' matmuls written out here: every token meets ``k`` experts,
    each a gate/up (H x 2I) and a down (I x H) projection, ``6 H I`` FLOPs forward; backward
    twice that (the input's gradient and the weights')."""
    from torch.utils.flop_counter import FlopCounterMode

    config = mixtral()
    config._attn_implementation = "eager"  # attention as matmuls FlopCounterMode counts on CPU
    torch.manual_seed(0)
    model = transformers.MixtralForCausalLM(config)
    x = torch.randint(0, config.vocab_size, (2, 8))
    counter = FlopCounterMode(display=False)
    with counter:
        out = model(x).logits
        if mode == "training":
            out.float().sum().backward()
    grouped = [n for n in counter.get_flop_counts().get("Global", {}) if "grouped_mm" in str(n)]
    assert grouped == [] or all(counter.get_flop_counts()["Global"][n] == 0 for n in grouped)
    h, i = config.hidden_size, config.intermediate_size
    k, layers = config.num_experts_per_tok, config.num_hidden_layers
    expert_forward = x.numel() * k * 6 * h * i * layers
    expected = counter.get_total_flops() + expert_forward * (3 if mode == "training" else 1)
    a = mw.analyze(
        lambda: transformers.MixtralForCausalLM(config), input_data=x, mode=mode, optimizer=None
    )
    assert a.error is None, a.error
    assert a.total_flops == expected
