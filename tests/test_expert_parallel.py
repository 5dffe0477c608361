"""Expert parallelism traced per rank against a real CPU rank (``parallel_truth.real_rank_peak``).

Truth: a tiny Mixtral built for real, each MoE layer's experts cut by hand to the rank's half and
its forward written here, torchtitan's way (each token copied per chosen expert, sent by
``all_to_all_single``, the local experts run on equal shares, the outputs sent back and summed
with the router's weights: balanced routing, the trace's assumption), the other parameters
``fully_shard``-ed with the experts left out; three AdamW steps of rank 0 under the fake process
group, measured by the CPU allocator; its all-to-alls counted at the dispatcher.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import transformers
from parallel_truth import (
    no_process_group_left,  # noqa: F401  (an autouse fixture)
    real_rank_peak,
    tiny_llama_config,
)
from torch import nn
from torch.distributed._functional_collectives import all_to_all_single_autograd
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard

import meta_widget as mw

TOLERANCE = 0.02


def tiny_mixtral() -> Any:
    return transformers.MixtralConfig(
        hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=4, vocab_size=32000, num_local_experts=4, num_experts_per_tok=2,
        architectures=["MixtralForCausalLM"],
    )  # fmt: skip


def _ep_forward(experts: Any, group: Any, factor: float | None = None) -> Any:
    count = experts.gate_up_proj.shape[0] * group.size()  # the model's experts

    def forward(x: torch.Tensor, index: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        k = index.shape[1]
        sent = x.repeat_interleave(k, dim=0)
        if factor is not None:  # every expert's buffer padded to its capacity, with zeros
            rows = count * math.ceil(x.shape[0] * k / count * factor)
            sent = torch.cat([sent, sent.new_zeros(rows - sent.shape[0], sent.shape[1])])
        got = all_to_all_single_autograd(sent, None, None, group)
        pieces = []
        for e, rows in enumerate(got.chunk(experts.gate_up_proj.shape[0])):
            gate, up = (rows @ experts.gate_up_proj[e].T).chunk(2, dim=-1)
            pieces.append((experts.act_fn(gate) * up) @ experts.down_proj[e].T)
        back = all_to_all_single_autograd(torch.cat(pieces), None, None, group)
        back = back[: x.shape[0] * k]
        return (back.view(x.shape[0], k, -1) * weights[..., None]).sum(1).to(x.dtype)

    return forward


def slice_experts(layers: Any, mesh: DeviceMesh, factor: float | None = None) -> set[nn.Parameter]:
    """Each MoE layer of ``layers`` made this rank's of ``mesh``'s ranks: its slice of the
    experts, reached by all-to-all (``_ep_forward``); returns the experts, for FSDP2 to leave
    alone."""
    rank, size = mesh.get_local_rank(), mesh.size()
    kept = set()
    for layer in layers:
        experts = layer.mlp.experts
        n = experts.gate_up_proj.shape[0] // size
        for name in ("gate_up_proj", "down_proj"):
            mine = nn.Parameter(getattr(experts, name).detach()[rank * n : (rank + 1) * n].clone())
            setattr(experts, name, mine)
            kept.add(mine)
        experts.forward = _ep_forward(experts, mesh.get_group(), factor)
    return kept


def ep_wrap(model: nn.Module, mesh: DeviceMesh, factor: float | None = None) -> None:
    """Rank 0's half of every MoE layer's experts, then FSDP2 on the rest."""
    dp = mesh["dp"]
    ignored = slice_experts(model.model.layers, dp, factor)  # type: ignore[union-attr]
    for layer in model.model.layers:  # type: ignore[union-attr]
        fully_shard(layer, mesh=dp, ignored_params=ignored)
    fully_shard(model, mesh=dp, ignored_params=ignored)


@pytest.mark.parametrize("factor", [None, 1.25])
def test_an_ep2_rank_is_a_real_ranks_peak_and_all_to_alls(factor: float | None) -> None:
    """Dropless, and with a capacity factor of 1.25: each of the 4 experts' buffers holds 160
    token copies where its balanced share is 128 (2 x 128 tokens x top-2 / 4), padded."""
    config = tiny_mixtral()
    torch.manual_seed(0)
    x = torch.randint(0, 32000, (2, 128))
    truth = real_rank_peak(
        lambda: transformers.MixtralForCausalLM(config),
        x,
        fsdp=2,
        wrap=lambda model, mesh: ep_wrap(model, mesh, factor),
        steps=3,
    )
    layout = {"fsdp": 2, "ep": 2, "capacity_factor": factor} if factor else {"fsdp": 2, "ep": 2}
    a = mw.analyze(config, input_data=x, mode="training", device="cpu", parallel=layout)
    assert a.error is None, a.error
    assert "balanced routing" in " ".join(a.notes)
    assert a.peak_bytes == pytest.approx(truth["Steady"], rel=TOLERANCE)
    assert a.memory.first_step_peak_bytes == pytest.approx(truth["Total"], rel=TOLERANCE)
    # dispatch and combine: tokens x top_k x hidden floats each, per MoE layer, forward and back
    moved = (160 * 4 if factor else 2 * 128 * 2) * 256 * 4
    all_to_all = a.comms[a.comms.collective == "all_to_all"]
    assert list(all_to_all.bytes) == [moved] * 8
    # the rank stores half the experts; FSDP2 shards the rest in half too
    full = sum(p.numel() for p in transformers.MixtralForCausalLM(config).parameters()) * 4
    assert a.param_bytes == pytest.approx(full / 2, rel=0.001)


def ep_within_fsdp(model: nn.Module, replicate: int, fsdp: int, ep: int) -> None:
    """torchtitan's layout, by hand: ``fsdp`` split into ``fsdp / ep`` x ``ep`` (the ep ranks
    innermost); rank 0's slice of the experts over the ``ep`` ranks, each experts module
    ``fully_shard``-ed over the ranks holding the same experts (and the replicas: HSDP), the
    rest of the model over ``replicate`` x ``fsdp`` as without experts."""
    split = init_device_mesh(
        "cpu", (replicate, fsdp // ep, ep), mesh_dim_names=("replicate", "efsdp", "ep")
    )
    whole = init_device_mesh("cpu", (replicate, fsdp), mesh_dim_names=("replicate", "dp"))
    group = split["ep"].get_group()
    same = split["replicate", "efsdp"] if replicate > 1 else split["efsdp"]
    rest = whole if replicate > 1 else whole["dp"]
    for layer in model.model.layers:  # type: ignore[union-attr]
        experts = layer.mlp.experts
        n = experts.gate_up_proj.shape[0] // ep
        for name in ("gate_up_proj", "down_proj"):
            setattr(experts, name, nn.Parameter(getattr(experts, name).detach()[:n].clone()))
        experts.forward = _ep_forward(experts, group)
        fully_shard(experts, mesh=same)
    for layer in model.model.layers:  # type: ignore[union-attr]
        fully_shard(layer, mesh=rest)
    fully_shard(model, mesh=rest)


@pytest.mark.parametrize(
    ("replicate", "fsdp", "ep"),
    [(1, 4, 2), (2, 2, 2), (2, 4, 2)],
)
def test_ep_within_fsdp_and_with_replicas_is_a_real_ranks_peak(
    replicate: int, fsdp: int, ep: int
) -> None:
    """ep below fsdp (the experts FSDP-sharded over the ranks that hold the same ones) and
    under HSDP (their gradients all-reduced over the replicas), against real ranks."""
    config = tiny_mixtral()
    torch.manual_seed(0)
    x = torch.randint(0, 32000, (2, 128))
    truth = real_rank_peak(
        lambda: transformers.MixtralForCausalLM(config),
        x,
        fsdp=replicate * fsdp,
        wrap=lambda model, _: ep_within_fsdp(model, replicate, fsdp, ep),
        steps=3,
    )
    layout = {"replicate": replicate, "fsdp": fsdp, "ep": ep}
    a = mw.analyze(config, input_data=x, mode="training", device="cpu", parallel=layout)
    assert a.error is None, a.error
    assert a.peak_bytes == pytest.approx(truth["Steady"], rel=TOLERANCE)
    assert a.memory.first_step_peak_bytes == pytest.approx(truth["Total"], rel=TOLERANCE)
    comms = a.comms.groupby(["collective", "group"]).bytes.sum().to_dict()
    assert comms[("all_to_all", "ep")] == 8 * 2 * 128 * 2 * 256 * 4  # as with ep = fsdp
    if fsdp > ep:  # the experts' own FSDP: gathered over the ranks holding the same ones
        assert ("all_gather", "efsdp") in comms and ("reduce_scatter", "efsdp") in comms
    if replicate > 1:
        assert ("all_reduce", "replicate") in comms
    # the rank's parameters: its experts' share, over fsdp / ep; the rest over fsdp
    full = transformers.MixtralForCausalLM(config)
    expert = sum(p.numel() for n, p in full.named_parameters() if ".experts." in n)
    other = sum(p.numel() for n, p in full.named_parameters() if ".experts." not in n)
    assert a.param_bytes == pytest.approx(4 * (expert / fsdp + other / fsdp), rel=0.001)


@pytest.mark.parametrize(
    ("model", "layout", "match"),
    [
        ("llama", {"fsdp": 2, "ep": 2}, "has no stacked experts"),
        ("mixtral", {"fsdp": 8, "ep": 8}, "does not divide the 4 experts"),
    ],
)
def test_an_ep_the_model_cannot_take_is_a_layout_error(
    model: str, layout: dict[str, Any], match: str
) -> None:
    config = tiny_llama_config() if model == "llama" else tiny_mixtral()
    with pytest.raises(mw.LayoutError, match=match):
        mw.analyze(config, input_size=(2, 128), mode="training", parallel=layout)


@pytest.mark.parametrize(
    ("layout", "match"),
    [
        ({"fsdp": 2, "capacity_factor": 1.25}, "ep=1 is none"),
        ({"fsdp": 2, "ep": 2, "capacity_factor": 0.5}, "a number from 1 to 64"),
        ({"fsdp": 2, "ep": 2, "capacity_factor": "1.25"}, "a number from 1 to 64"),
    ],
)
def test_a_capacity_factor_is_checked_when_the_layout_is_made(
    layout: dict[str, Any], match: str
) -> None:
    with pytest.raises(mw.OptionError, match=match) as raised:
        mw.Parallel(**layout)
    assert "\n" not in str(raised.value)
    assert mw.Parallel(fsdp=2, ep=2, capacity_factor=1.25).label().endswith("capacity 1.25")


def test_an_ep_rank_steps_a_multi_tensor_optimizer() -> None:
    """On CUDA, AdamW runs one foreach op over all a rank's parameters: the experts a rank
    holds are DTensors sharded over the ep ranks, as FSDP2's are (plain tensors beside DTensors
    were refused: "got mixed torch.Tensor and DTensor")."""
    x = torch.randint(0, 32000, (2, 128))
    a = mw.analyze(tiny_mixtral(), input_data=x, mode="training", parallel={"fsdp": 2, "ep": 2})
    assert a.error is None, a.error
    assert a.memory.optimizer_state_bytes > 0


def test_the_expert_ranks_share_a_node_and_the_ranks_holding_the_same_experts_do_not() -> None:
    """fsdp 16 as 4 x 4 on H100s (8 to a node): the all-to-all's 4 expert ranks are the
    innermost, on one node's NVLink; the experts' own FSDP group joins 4 ranks 4 apart, across
    the network, as the whole FSDP group does. Each collective is priced by its group's place."""
    from meta_widget.timing.gpus import resolve_gpu
    from meta_widget.timing.model import collective_seconds, mesh_strides

    gpu = resolve_gpu("H100")
    a = mw.analyze(
        tiny_mixtral(), input_size=(1, 64), mode="training", gpu=gpu,
        parallel={"fsdp": 16, "ep": 4},
    )  # fmt: skip
    assert a.error is None, a.error
    strides = mesh_strides(list(a.comms.itertuples()))
    assert (strides["ep"], strides["efsdp"]) == (1, 4)
    for c in a.comms.itertuples():
        seconds = collective_seconds(c, gpu, strides)
        on_nvlink = c.group_size * strides.get(c.group, 1) <= gpu.gpus_per_node
        assert on_nvlink == (c.group == "ep"), c
        assert seconds > 0
