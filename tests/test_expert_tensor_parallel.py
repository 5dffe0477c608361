"""Expert parallelism beside tensor parallelism (``ep`` borrowing the tensor-parallel ranks,
torchtitan's expert tensor parallelism 1) traced per rank against a real CPU rank
(``parallel_truth.real_rank_peak``).

Truth: a tiny Mixtral built for real and wrapped by hand as torchtitan's ``apply_moe_ep_tp``
does: attention tensor-parallel with sequence parallelism (``llama_sp_plan`` without its MLP
entries), each MoE block taking the tokens replicated and handing back partial sums
reduce-scattered along the sequence, its router computed whole on each rank (``NoParallel``),
each tensor-parallel rank routing its half of the tokens to the experts over the ``ep`` ranks
(``ReordererSequenceParallel``) and adding its outputs into a zero output of every token; FSDP2
over the rest. Three AdamW steps of rank 0 under the fake process group, measured by the CPU
allocator.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import transformers
from parallel_truth import (
    llama_sp_plan,
    no_process_group_left,  # noqa: F401  (an autouse fixture)
    real_rank_peak,
)
from test_expert_parallel import TOLERANCE, _ep_forward, tiny_mixtral
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_module
from torch.distributed.tensor.parallel import (
    ParallelStyle,
    PrepareModuleInputOutput,
    parallelize_module,
)

import meta_widget as mw


class NoParallel(ParallelStyle):
    """torchtitan's ``NoParallel``, by hand: the module's parameters replicated DTensors, its
    input taken as replicated, its outputs local."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        def inputs(_: nn.Module, args: Any, mesh: DeviceMesh) -> Any:
            return tuple(DTensor.from_local(x, mesh, [Replicate()], run_check=False) for x in args)

        def outputs(_: nn.Module, out: Any, mesh: DeviceMesh) -> Any:
            return tuple(o.to_local() for o in out)

        return distribute_module(module, device_mesh, None, inputs, outputs)


def _half_of_the_tokens(forward: Any, rank: int, ranks: int) -> Any:
    """``forward`` on this tensor-parallel rank's share of the tokens, added into a zero output
    of every token (torchtitan's ``ReordererSequenceParallel`` and ``scatter_add``)."""

    def run(x: torch.Tensor, index: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        n = x.shape[0] // ranks
        rows = torch.arange(rank * n, (rank + 1) * n)
        mine = forward(x[rows], index[rows], weights[rows])
        return torch.zeros_like(x).index_add(0, rows, mine)

    return run


def ep_tp_wrap(model: nn.Module, mesh: DeviceMesh, ep: int) -> None:
    """torchtitan's layout on a ``dp`` x ``tp`` mesh: ``ep`` = every tp rank and ``ep / tp``
    dp ranks (the innermost); the experts FSDP-sharded over the dp ranks holding the same ones."""
    tp = mesh["tp"]
    plan = {k: v for k, v in llama_sp_plan().items() if ".mlp." not in k}
    plan["model.layers.*.mlp"] = PrepareModuleInputOutput(
        input_layouts=(Replicate(),),
        desired_input_layouts=(Replicate(),),
        use_local_input=True,
        output_layouts=(Partial(),),
        desired_output_layouts=(Shard(1),),
        use_local_output=False,
    )
    plan["model.layers.*.mlp.gate"] = NoParallel()
    parallelize_module(model, tp, plan)
    assert ep in (tp.size(), mesh.size())  # the tp ranks, or every rank (dp 2 x tp 2 here)
    group = tp.get_group() if ep == tp.size() else mesh._flatten("ep_all").get_group()
    kept: set[nn.Parameter] = set()
    for layer in model.model.layers:  # type: ignore[union-attr]
        experts = layer.mlp.experts
        n = experts.gate_up_proj.shape[0] // ep
        for name in ("gate_up_proj", "down_proj"):
            mine = nn.Parameter(getattr(experts, name).detach()[:n].clone())
            setattr(experts, name, mine)
            kept.add(mine)
        experts.forward = _half_of_the_tokens(_ep_forward(experts, group), 0, tp.size())
        if ep == tp.size():  # the dp ranks hold the same experts: FSDP2 shards them
            fully_shard(experts, mesh=mesh["dp"])
    ignored = kept if ep > tp.size() else None
    for layer in model.model.layers:  # type: ignore[union-attr]
        fully_shard(layer, mesh=mesh["dp"], ignored_params=ignored)
    fully_shard(model, mesh=mesh["dp"], ignored_params=ignored)


@pytest.mark.parametrize("ep", [2, 4])
def test_ep_with_tp_is_a_real_ranks_peak_and_all_to_alls(ep: int) -> None:
    """fsdp 2 x tp 2 with sequence parallelism: ep 2 (the tp ranks; the experts FSDP-sharded
    over the dp ranks) and ep 4 (every rank one expert). Each tp rank routes half the tokens,
    so the all-to-alls carry half the bytes of ep without tp, and the MoE block's partial sums
    are reduce-scattered over tp."""
    config = tiny_mixtral()
    torch.manual_seed(0)
    x = torch.randint(0, 32000, (2, 128))
    truth = real_rank_peak(
        lambda: transformers.MixtralForCausalLM(config),
        x,
        fsdp=2,
        tp=2,
        wrap=lambda model, mesh: ep_tp_wrap(model, mesh, ep),
        steps=3,
    )
    layout = {"fsdp": 2, "tp": 2, "ep": ep, "sequence_parallel": True}
    a = mw.analyze(config, input_data=x, mode="training", device="cpu", parallel=layout)
    assert a.error is None, a.error
    assert a.peak_bytes == pytest.approx(truth["Steady"], rel=TOLERANCE)
    assert a.memory.first_step_peak_bytes == pytest.approx(truth["Total"], rel=TOLERANCE)
    comms = a.comms.groupby(["collective", "group"]).bytes.sum().to_dict()
    # dispatch and combine, forward and back, 2 MoE layers: half of 2 x 128 tokens x top-2
    assert comms[("all_to_all", "ep")] == 8 * 128 * 2 * 256 * 4
    # a layer's reduce-scatters over tp: the attention's and the MoE block's outputs forward,
    # the gradients of its two gathered norms backward; each the whole 2 x 128 x 256 floats
    assert comms[("reduce_scatter", "tp")] == 2 * 4 * 2 * 128 * 256 * 4
    full = transformers.MixtralForCausalLM(config)
    expert = sum(p.numel() for n, p in full.named_parameters() if ".experts." in n)
    assert a.param_bytes < 4 * sum(p.numel() for p in full.parameters()) / 2
    assert a.param_bytes > 4 * expert / 4  # a quarter of the experts at least


@pytest.mark.parametrize(
    ("config", "layout", "error", "match"),
    [
        ("mixtral", {"fsdp": 4, "tp": 2, "ep": 3}, mw.OptionError, "a multiple of tp"),
        ("mixtral", {"fsdp": 2, "tp": 2, "ep": 8}, mw.OptionError, "dividing fsdp x cp x tp"),
        ("qwen", {"fsdp": 2, "tp": 2, "ep": 2}, mw.LayoutError, "shared_expert"),
        ("mixtral", {"fsdp": 2, "tp": 2, "sequence_parallel": True}, mw.LayoutError, "ep=2"),
        (
            "mixtral",
            {"fsdp": 2, "tp": 2, "ep": 2, "tp_plan": {"model.layers.*.mlp": "rowwise"}},
            mw.LayoutError,
            "leave the MoE blocks out of tp_plan",
        ),
    ],
)
def test_an_ep_with_tp_the_layout_or_model_cannot_take_is_refused(
    config: str, layout: dict[str, Any], error: type[Exception], match: str
) -> None:
    """ep not a multiple of tp, or more ranks than fsdp x tp: refused when the layout is made;
    an MoE block with a shared expert beside the router (Qwen-MoE), a tensor-parallel plan that
    places the MoE blocks itself, or sequence parallelism on a Mixtral without ep (its router
    would meet the gathered sequence): a layout error, before any process group."""
    model = tiny_mixtral() if config == "mixtral" else _tiny_qwen_moe()
    with pytest.raises(error, match=match):
        mw.analyze(model, input_size=(2, 128), mode="training", parallel=layout)


def _tiny_qwen_moe() -> Any:
    return transformers.Qwen2MoeConfig(
        hidden_size=128, intermediate_size=256, moe_intermediate_size=64,
        shared_expert_intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=1000, num_experts=4, num_experts_per_tok=2,
    )  # fmt: skip


def test_ep_with_plain_tp_all_reduces_the_blocks_partial_sums() -> None:
    """Without sequence parallelism the MoE block's partial sums are all-reduced over tp (the
    residual stream is whole on each rank), and the all-to-alls still carry half the tokens."""
    x = torch.randint(0, 32000, (2, 128))
    a = mw.analyze(
        tiny_mixtral(), input_data=x, mode="training", parallel={"fsdp": 2, "tp": 2, "ep": 2}
    )
    assert a.error is None, a.error
    comms = a.comms.groupby(["collective", "group"]).bytes.sum().to_dict()
    assert comms[("all_to_all", "ep")] == 8 * 128 * 2 * 256 * 4
    assert ("reduce_scatter", "tp") not in comms
