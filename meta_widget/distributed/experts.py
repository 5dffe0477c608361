"""Expert parallelism: each rank holds ``experts / ep`` of every MoE layer's experts, and tokens
go to them and back by all-to-all, torchtitan's way, under balanced routing.

A transformers experts module (``MixtralExperts``, ``Qwen2MoeExperts``...: every expert's
weights stacked in 3-D parameters ``gate_up_proj`` and ``down_proj``, called with the tokens,
the chosen experts and their weights) is changed on meta_widget's copy of one rank: its
parameters become the rank's slice of experts (``[r * E / ep, (r + 1) * E / ep)``), and its
``forward`` becomes expert parallelism's:

1. **dispatch**: each token copied once per expert it chose (``top_k`` copies), and sent by
   ``all_to_all_single`` over the ``ep`` ranks;
2. each local expert runs on its tokens (``act(x gate^T) * (x up^T)``, then ``down``);
3. **combine**: the outputs sent back by ``all_to_all_single``, weighted by the router's weights
   and summed per token.

Routing depends on values a trace does not have; the assumption is **balanced routing**: every
expert receives the same number of token copies (``tokens * top_k / E``), every rank sends each
rank the same share (``tokens * top_k / ep``). Its all-to-all bytes are then exact: the dispatch
and the combine each move ``tokens * top_k * hidden`` elements per rank.

Where the experts' ranks come from, as torchtitan lays them out: ``ep`` borrows the innermost
``ep`` of the ``fsdp`` ranks (the ``fsdp`` dimension unflattened into ``fsdp / ep`` x ``ep``,
:func:`expert_meshes`). With ``ep == fsdp`` and no replicas every FSDP rank holds other experts:
FSDP2 leaves them alone (``ignored_params``) and shards the other parameters as usual. With
``ep < fsdp`` each experts module is ``fully_shard``-ed over the other ``fsdp / ep`` ranks (the
ranks holding the same experts), and with ``replicate`` > 1 over those and the replicas (HSDP:
sharded over the first, their gradients all-reduced over the second); the rest of the model as
without experts.

With ``Parallel.capacity_factor`` (GShard's, Megatron's padded dispatch), each expert's buffer
holds ``capacity = ceil(capacity_factor * tokens * top_k / E)`` token copies: a rank sends each
expert its balanced share padded with zeros to that capacity, so the dispatch and the combine
each move ``E * capacity * hidden`` elements per rank, and each expert's matmuls run on
``capacity`` rows. Under balanced routing no token is dropped (every expert's share is under its
capacity); the padding is what the factor costs.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._functional_collectives import all_to_all_single_autograd
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Shard

from ..options import LayoutError, Parallel

__all__ = [
    "capacity",
    "check_experts",
    "expert_meshes",
    "expert_modules",
    "shard_experts",
    "wrap_experts",
]


def expert_modules(module: nn.Module) -> list[tuple[str, Any]]:
    """The experts modules of ``module``: 3-D ``gate_up_proj`` and ``down_proj`` parameters, one
    row per expert (transformers' stacked experts)."""
    found = []
    for path, m in module.named_modules():
        up, down = getattr(m, "gate_up_proj", None), getattr(m, "down_proj", None)
        if isinstance(up, nn.Parameter) and isinstance(down, nn.Parameter) and up.ndim == 3:
            found.append((path, m))
    return found


def check_experts(plan: Parallel, module: nn.Module) -> None:
    """``ep`` against the model: a mixture of experts, whose experts ``ep`` divides, and with
    ``tp`` MoE blocks of a router and the experts (``experts_tp``); the ranks ``ep`` borrows are
    the layout's own check. With ``pp`` each pipeline rank's stages hold their layers' experts,
    sharded the same way."""
    name = type(module).__name__
    experts = expert_modules(module)
    if not experts:
        raise LayoutError(
            f"parallel ep={plan.ep}: {name} has no stacked experts (gate_up_proj, down_proj "
            "of one row per expert, as transformers' MoE layers): trace it without ep."
        )
    count = int(experts[0][1].gate_up_proj.shape[0])
    if count % plan.ep:
        raise LayoutError(
            f"parallel ep={plan.ep} does not divide the {count} experts of {name}: give an ep "
            f"that divides {count}."
        )
    if plan.tp > 1:  # each MoE block a router and its experts (experts_tp)
        from .experts_tp import moe_names

        moe_names(module, [path for path, _ in experts], plan.sequence_parallel)


def wrap_experts(
    module: nn.Module, plan: Parallel, mesh: DeviceMesh, policy: Any
) -> tuple[set[nn.Parameter], dict[str, tuple[str, int]]]:
    """Expert parallelism on this rank's copy ``module`` (the whole model, or a pipeline rank's
    stages), before FSDP2 wraps the rest: each experts module its slice of the experts and
    the all-to-all ``forward`` (:func:`shard_experts`), then ``fully_shard``-ed over the ranks
    holding the same experts where there are any (:func:`expert_meshes`).

    Returns the parameters the outer ``fully_shard`` calls must leave alone (the experts, when
    no FSDP2 of their own holds them), and the expert meshes' process groups by name, with the
    dimension's name and size, for the collectives' watcher."""
    ep_mesh, experts_mesh = expert_meshes(mesh, plan)
    split = (mesh["tp"].get_local_rank(), plan.tp) if plan.tp > 1 else None
    experts = set(shard_experts(module, plan, ep_mesh, split))
    groups = {
        str(m.get_group(i).group_name): (name, m.size(i))
        for m in (ep_mesh, experts_mesh)
        if m is not None
        for i, name in enumerate(m.mesh_dim_names or ())
        if m.size(i) > 1
    }
    if experts_mesh is None:
        return experts, groups
    for _, m in expert_modules(module):  # over the ranks holding the same experts
        fully_shard(m, mesh=experts_mesh, mp_policy=policy)
    return set(), groups  # FSDP2's now: the outer fully_shard calls skip them


def expert_meshes(mesh: DeviceMesh, plan: Parallel) -> tuple[DeviceMesh, DeviceMesh | None]:
    """The mesh of the ``ep`` ranks a rank's tokens go to, and the one FSDP2 shards its experts
    over: the ranks holding the same experts, with the replicas as HSDP's outer dimension; None
    when there is none (every FSDP rank holds other experts, no replicas).

    Without ``tp`` the ``ep`` ranks are the innermost ``ep`` of the ``fsdp`` ranks; with it,
    every tensor-parallel rank and the innermost ``ep / tp`` of the ``fsdp`` ranks (torchtitan's
    expert tensor parallelism 1), flattened into one dimension ``ep``."""
    inner = plan.ep // plan.tp  # the fsdp ranks ep borrows
    outer = plan.fsdp // inner
    if plan.tp > 1 and inner == 1:  # the tensor-parallel ranks (a group of their own, but
        ep_mesh = mesh["tp"]._flatten("ep")  # the world's where tp is all of it)
        if plan.fsdp == 1 and plan.replicate == 1:
            return ep_mesh, None
        return ep_mesh, mesh["replicate", "fsdp"] if plan.replicate > 1 else mesh["fsdp"]
    if outer == 1 and plan.replicate == 1 and plan.tp == 1:
        return mesh["fsdp"], None
    if plan.tp > 1:
        split = mesh._unflatten("fsdp", (outer, inner), ("efsdp", "ep_fsdp"))
        ep_mesh = split["ep_fsdp", "tp"]._flatten("ep")
    else:
        split = mesh._unflatten("fsdp", (outer, inner), ("efsdp", "ep"))
        ep_mesh = split["ep"]
    if outer == 1 and plan.replicate == 1:
        return ep_mesh, None
    return ep_mesh, split["replicate", "efsdp"] if plan.replicate > 1 else split["efsdp"]


def shard_experts(
    module: nn.Module, plan: Parallel, mesh: DeviceMesh, split: tuple[int, int] | None = None
) -> list[nn.Parameter]:
    """Each experts module of ``module`` (this rank's copy) made this rank's: its slice of the
    experts, and the all-to-all ``forward`` (see the module docstring); returns the new
    parameters (which FSDP2 leaves alone). Each is a DTensor of the experts sharded over the
    ``ep`` ranks (``Shard(0)`` on ``mesh``), as torchtitan's are: beside FSDP2's DTensors, one
    multi-tensor optimizer op takes them all (plain tensors it would refuse). With ``split``
    (this rank's index among the tensor-parallel ranks, and their count: ``experts_tp``), the
    forward routes this rank's share of the tokens only."""
    group = mesh.get_group()
    rank, ep = dist.get_rank(group), plan.ep
    kept: list[nn.Parameter] = []
    for _, experts in expert_modules(module):
        count = int(experts.gate_up_proj.shape[0])
        local = slice(rank * count // ep, (rank + 1) * count // ep)
        for name in ("gate_up_proj", "down_proj"):
            full = getattr(experts, name)
            mine = DTensor.from_local(
                full.detach()[local].clone(), mesh, [Shard(0)], run_check=False
            )
            part = nn.Parameter(mine, requires_grad=full.requires_grad)
            setattr(experts, name, part)
            kept.append(part)
        forward = _expert_parallel_forward(experts, count, group, plan.capacity_factor)
        if split is not None:
            forward = _share_of_tokens(forward, *split)
        experts.forward = forward  # type: ignore[method-assign]
    return kept


def capacity(tokens: int, top_k: int, experts: int, factor: float | None) -> int:
    """The token copies one expert's buffer holds from one rank: its balanced share
    ``tokens * top_k / experts``, times ``factor`` rounded up (the share itself without one)."""
    share = tokens * top_k / experts
    return math.ceil(share * factor) if factor is not None else math.ceil(share)


def _expert_parallel_forward(
    experts: Any, count: int, group: Any, factor: float | None = None
) -> Any:
    def forward(
        hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        tokens, hidden = hidden_states.shape
        top_k = top_k_index.shape[-1]
        routed = hidden_states.repeat_interleave(top_k, dim=0)  # dispatch: a copy per choice
        copies = tokens * top_k
        if factor is not None:  # the experts' shares padded to their capacity (zeros)
            padded = count * capacity(tokens, top_k, count, factor)
            routed = torch.cat([routed, routed.new_zeros(padded - copies, hidden)])
        arrived = all_to_all_single_autograd(routed, None, None, group)
        up, down = experts.gate_up_proj.to_local(), experts.down_proj.to_local()
        outs = []
        for e, chunk in enumerate(arrived.chunk(up.shape[0])):  # balanced: equal shares
            gate, lin = nn.functional.linear(chunk, up[e]).chunk(2, dim=-1)
            outs.append(nn.functional.linear(experts.act_fn(gate) * lin, down[e]))
        back = all_to_all_single_autograd(torch.cat(outs), None, None, group)  # combine
        if factor is not None:  # the padding's rows dropped
            back = back[:copies]
        weighted = back.reshape(tokens, top_k, hidden) * top_k_weights.unsqueeze(-1)
        return weighted.sum(dim=1).to(hidden_states.dtype)

    return forward


def _share_of_tokens(forward: Any, rank: int, ranks: int) -> Any:
    """``forward`` run on this tensor-parallel rank's ``1 / ranks`` of the tokens (the routed
    tokens split over the ranks, torchtitan's ``ReordererSequenceParallel``), its outputs
    written into their rows of a zero output of every token: partial sums over the ranks."""

    def share(
        hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        tokens = hidden_states.shape[0]
        if tokens % ranks:
            raise LayoutError(
                f"parallel ep with tp={ranks}: the {tokens} tokens of a micro-batch (batch x "
                f"sequence) do not split evenly over the {ranks} tensor-parallel ranks that "
                "route them (torchtitan's rule); give a batch x sequence that tp divides."
            )
        n = tokens // ranks
        rows = slice(rank * n, (rank + 1) * n)
        mine = forward(hidden_states[rows], top_k_index[rows], top_k_weights[rows])
        return nn.functional.pad(mine, (0, 0, rank * n, tokens - (rank + 1) * n))

    return share
