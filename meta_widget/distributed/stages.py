"""A model split into pipeline stages by layer ranges, PyTorch's manual split.

``torch.distributed.pipelining`` takes one ``nn.Module`` per stage, each built by hand from the
model's own modules (torchtitan's ``pipeline_module_split``: a copy of the model with the
layers of other stages removed). A transformers decoder (``model.embed_tokens``,
``model.layers``, ``model.rotary_emb``, ``model.norm``, ``lm_head``) cannot run with parts
removed, so each stage here is a :class:`DecoderStage`: the first stage embeds the tokens, each
stage runs its layers with the rotary embedding of the positions, the last normalizes and
projects to the vocabulary, the way the model's own ``forward`` does (no padding mask: causal
attention). The stage modules hold the model's own sub-modules, not copies.

The layers are split evenly by default (the first ``layers % stages`` stages one layer more),
or where ``Parallel.stage_boundaries`` says.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard

from ..options import LayoutError, Parallel

__all__ = [
    "DecoderStage",
    "RankStages",
    "StageLayers",
    "layer_ranges",
    "rank_stages",
    "stage_indices",
]


class DecoderStage(nn.Module):
    """One pipeline stage of a transformers decoder: layers ``[lo, hi)`` (their original
    indices are the keys of ``layers``), with the embedding when first and the final norm and
    head when last."""

    embed_tokens: nn.Module
    norm: nn.Module
    lm_head: nn.Module

    def __init__(self, model: nn.Module, lo: int, hi: int, first: bool, last: bool) -> None:
        super().__init__()
        inner = _decoder(model)
        assert inner is not None
        if first:
            self.embed_tokens = inner.embed_tokens
        self.layers = StageLayers({i: inner.layers[i] for i in range(lo, hi)})
        self.rotary_emb = inner.rotary_emb
        if last:
            self.norm = inner.norm
            self.lm_head = model.get_submodule("lm_head")
        self.first, self.last = first, last
        #: the tensor-parallel mesh under sequence parallelism: the activations between stages
        #: are each rank's shard of the sequence (plain tensors, as a pipeline sends them), the
        #: residual stream inside a stage a ``DTensor`` of the whole sequence
        self.sequence_mesh: DeviceMesh | None = None

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        mesh = self.sequence_mesh
        if self.first:
            h = self.embed_tokens(h)
        elif mesh is not None:
            h = DTensor.from_local(h, mesh, [Shard(1)], run_check=False)
        positions = torch.arange(h.shape[1], device=h.device).unsqueeze(0)
        rotary = self.rotary_emb(h, positions)
        for layer in self.layers:
            out = layer(h, attention_mask=None, position_embeddings=rotary, position_ids=positions)
            h = out[0] if isinstance(out, tuple) else out
        if self.last:
            h = self.lm_head(self.norm(h))
        elif mesh is not None:
            h = h.to_local()  # type: ignore[attr-defined]
        return h


class StageLayers(nn.ModuleList):
    """A stage's decoder layers, each under its index in the model (``layers.5``): a
    ``ModuleList``, so ``activation_checkpointing=True`` picks them as it picks any
    transformer's blocks (its children run in order; indexed by name, not position)."""

    def __init__(self, layers: dict[int, nn.Module]) -> None:
        super().__init__()
        for i, layer in layers.items():
            self.add_module(str(i), layer)


class RankStages(nn.Module):
    """The stages one pipeline rank runs (``stage{i}``: stage ``i``), the root of its trace."""

    def __init__(self, stages: dict[int, nn.Module]) -> None:
        super().__init__()
        for i, stage in stages.items():
            self.add_module(f"stage{i}", stage)

    def forward(self, *args: Any) -> Any:  # pragma: no cover - a schedule runs the stages
        raise RuntimeError("a pipeline rank's stages are run by its schedule, not called")


def _decoder(model: nn.Module) -> Any:
    """The decoder inside a transformers causal LM (``model.model``), if it is one."""
    inner = getattr(model, "model", None)
    wanted = ("embed_tokens", "layers", "rotary_emb", "norm")
    if (
        isinstance(inner, nn.Module)
        and isinstance(getattr(model, "lm_head", None), nn.Module)
        and all(isinstance(getattr(inner, k, None), nn.Module) for k in wanted)
        and isinstance(inner.layers, nn.ModuleList)
    ):
        return inner
    return None


def layer_ranges(plan: Parallel, module: nn.Module) -> list[tuple[int, int]]:
    """Each stage's layers ``[lo, hi)``: ``plan.stage_boundaries``, or split evenly. Raises
    ``LayoutError`` where the model is not a transformers decoder or has too few layers."""
    inner = _decoder(module)
    name = type(module).__name__
    if inner is None:
        raise LayoutError(
            f"parallel pp={plan.pp}: meta_widget splits a transformers decoder (model.embed_tokens"
            f", model.layers, model.rotary_emb, model.norm, lm_head) into pipeline stages, and "
            f"{name} is not one; trace it without pp."
        )
    n, stages = len(inner.layers), plan.stages
    if stages > n:
        raise LayoutError(
            f"parallel pp={plan.pp} x virtual_stages={plan.virtual_stages} is {stages} stages, "
            f"more than the {n} layers of {name}: give at most {n} stages."
        )
    if plan.stage_boundaries is not None:
        bounds = [0, *plan.stage_boundaries, n]
        if bounds[-2] >= n:
            raise LayoutError(
                f"parallel stage_boundaries={plan.stage_boundaries} go past the {n} layers of "
                f"{name} (0 to {n - 1}): every stage needs one layer at least."
            )
        return list(itertools.pairwise(bounds))
    size, extra = divmod(n, stages)
    ranges, lo = [], 0
    for i in range(stages):
        hi = lo + size + (1 if i < extra else 0)
        ranges.append((lo, hi))
        lo = hi
    return ranges


def stage_indices(plan: Parallel, rank: int) -> list[int]:
    """The stages pipeline rank ``rank`` runs: stage ``rank`` (one a rank), ``rank``,
    ``rank + pp``, ... (interleaved, "loop" order), or ``rank`` and ``2 pp - 1 - rank`` (the V of
    ``ScheduleZBVZeroBubble``)."""
    if plan.schedule == "ZBV-zero-bubble":
        return [rank, 2 * plan.pp - 1 - rank]
    return [rank + k * plan.pp for k in range(plan.virtual_stages)]


def rank_stages(plan: Parallel, module: nn.Module, rank: int) -> RankStages:
    """The stages of pipeline rank ``rank`` of ``module`` (its own sub-modules, not copies)."""
    ranges = layer_ranges(plan, module)
    last = plan.stages - 1
    return RankStages(
        {i: DecoderStage(module, *ranges[i], i == 0, i == last) for i in stage_indices(plan, rank)}
    )
