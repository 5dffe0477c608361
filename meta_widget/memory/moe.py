"""Mixture-of-experts: the parameters one token uses.

A token passes through every shared parameter (embeddings, attention, norms, routers, shared
experts) and, in each layer of routed experts, through the ``k`` experts its router picks out of
``E``. With routing assumed balanced (every expert the same share of tokens), a token uses
``k / E`` of each group of routed experts: ``active = shared + k/E x expert parameters``.

The groups are found in the module tree: a module reached as ``experts`` (``shared_experts`` and
``shared_expert`` are shared, hence always active) that is either a ``ModuleList`` of ``E``
experts (transformers 4.x, most hand-written MoEs) or a module whose own parameters stack the
``E`` experts on their first dimension (transformers 5's fused ``gate_up_proj`` /
``down_proj``). ``k`` is the config's ``num_experts_per_tok`` (or ``moe_topk`` / ``top_k``),
else a ``top_k`` / ``num_experts_per_tok`` of the block holding the experts or of its router.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["BALANCED_NOTE", "ExpertGroup", "MoE", "find_moe"]

#: the config attributes naming ``k``, the experts each token is routed to
_TOP_K = ("num_experts_per_tok", "moe_topk", "top_k", "num_selected_experts")
#: the module names of routed experts (shared ones are named otherwise)
_EXPERTS = "experts"

BALANCED_NOTE = (
    "Mixture of experts: active_params (and the active_params column) count what one token "
    "uses, the shared parameters and k of each layer's E routed experts (k/E of their "
    "parameters); routing was assumed balanced, every expert getting the same share of tokens."
)


@dataclass(frozen=True)
class ExpertGroup:
    """One layer's routed experts: ``experts`` of them at ``path``, ``top_k`` used per token."""

    path: str
    experts: int
    top_k: int
    #: the parameters of all the group's experts (each tensor once)
    params: int

    @property
    def active(self) -> int:
        """The parameters one token uses: ``top_k / experts`` of :attr:`params` (exact for
        experts of one size; rounded down otherwise)."""
        return self.params * self.top_k // self.experts


@dataclass(frozen=True)
class MoE:
    """The routed expert groups of a model (plain data, kept by the analysis)."""

    groups: tuple[ExpertGroup, ...]

    def idle(self, path: str) -> int:
        """Parameters under the module at ``path`` (``""``: the root) one token does not use."""
        prefix = f"{path}." if path else ""
        return sum(
            g.params - g.active for g in self.groups if g.path == path or g.path.startswith(prefix)
        )

    def active(self, path: str, params: int) -> int:
        """The active parameters of the module at ``path``, which holds ``params``."""
        return params - self.idle(path)


def find_moe(module: torch.nn.Module) -> MoE | None:
    """The routed expert groups of ``module``, or None when it has none (a dense model)."""
    config_k = _config_top_k(module)
    groups = []
    parents: dict[str, torch.nn.Module] = {}
    for path, m in module.named_modules():
        parents[path] = m
        if path.rpartition(".")[2] != _EXPERTS:
            continue
        count = _expert_count(m)
        parent = parents.get(path.rpartition(".")[0])
        k = config_k or _block_top_k(parent)
        if count is None or k is None or not 0 < k <= count:
            continue
        params = sum(p.numel() for p in m.parameters())
        groups.append(ExpertGroup(path, count, k, params))
    return MoE(tuple(groups)) if groups else None


def _config_top_k(module: torch.nn.Module) -> int | None:
    config = getattr(module, "config", None)
    for config_part in (config, getattr(config, "text_config", None)):
        for name in _TOP_K:
            k = getattr(config_part, name, None)
            if isinstance(k, int) and not isinstance(k, bool) and k > 0:
                return k
    return None


def _block_top_k(block: torch.nn.Module | None) -> int | None:
    """``k`` as the block holding the experts (or its router) keeps it."""
    if block is None:
        return None
    routers: list[Any] = [block, getattr(block, "gate", None), getattr(block, "router", None)]
    for owner in routers:
        for name in ("top_k", "num_experts_per_tok"):
            k = getattr(owner, name, None) if owner is not None else None
            if isinstance(k, int) and not isinstance(k, bool) and k > 0:
                return k
    return None


def _expert_count(experts: torch.nn.Module) -> int | None:
    """``E``: the length of a ``ModuleList`` of experts, or the first dimension every own
    parameter of a fused experts module shares."""
    if isinstance(experts, torch.nn.ModuleList):
        return len(experts) or None
    firsts = {p.shape[0] if p.dim() else 0 for p in experts.parameters(recurse=False)}
    if len(firsts) != 1:
        return None
    (count,) = firsts
    stated = getattr(experts, "num_experts", count)
    return count if stated == count and count > 1 else None
