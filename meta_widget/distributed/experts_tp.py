"""Expert parallelism beside tensor parallelism, torchtitan's way with expert tensor parallelism
1 (``ep`` borrowing every tensor-parallel rank: ``Parallel._check_expert_ranks``).

Each MoE block of a decoder layer (the module holding a router and the stacked experts,
``MixtralSparseMoeBlock``...) gets, in the tensor-parallel plan:

- **the block** (:data:`MOE_STYLES`): its input taken as the tokens replicated over the
  tensor-parallel ranks (with sequence parallelism, the block's norm has all-gathered them, as
  before every tensor-parallel block; torchtitan gathers at the block's input instead, the
  same bytes), handed in as a local tensor; its output the partial sums of each rank's share of
  the tokens, reduce-scattered along the sequence (sequence parallelism: ``PrepareModuleInput
  Output(output_layouts=Partial(), desired_output_layouts=Shard(1))``, as torchtitan's
  ``apply_moe_ep_tp``) or all-reduced (plain tensor parallelism);
- **the router**: computed whole on every rank (:class:`ReplicatedCompute`, torchtitan's
  ``NoParallel``): its weight a replicated ``DTensor``;
- **the experts** (``experts.shard_experts`` with ``split``): each tensor-parallel rank takes
  ``1 / tp`` of the routed tokens (torchtitan's ``ReordererSequenceParallel``), sends their
  copies over the ``ep`` ranks and writes its outputs into the rows of its share of a zero
  output of every token: the partial sums the block reduces.

A block with other parameters than its router's and its experts' (a shared expert, as Qwen-MoE's
and DeepSeek-V3's) is refused: torchtitan shards those by tensor parallelism of their own, which
is not built here.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_module
from torch.distributed.tensor.parallel import ParallelStyle, PrepareModuleInputOutput
from torch.utils._pytree import tree_map_only

from ..options import LayoutError

__all__ = ["MOE_STYLES", "ReplicatedCompute", "moe_names"]


class ReplicatedCompute(ParallelStyle):
    """A module computed whole on every tensor-parallel rank (torchtitan's ``NoParallel``): its
    parameters replicated ``DTensor``s, its tensor inputs taken as replicated, its outputs
    handed on as local tensors."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        return distribute_module(module, device_mesh, None, _as_replicated, _as_local)


def _as_replicated(module: nn.Module, inputs: Any, mesh: DeviceMesh) -> Any:
    return tuple(
        DTensor.from_local(x, mesh, [Replicate()], run_check=False)
        if isinstance(x, torch.Tensor) and not isinstance(x, DTensor)
        else x
        for x in inputs
    )


def _as_local(module: nn.Module, outputs: Any, mesh: DeviceMesh) -> Any:
    return tree_map_only(DTensor, lambda t: t.to_local(), outputs)


#: the styles of an MoE block and its router under ``ep`` x ``tp`` (see the module docstring)
MOE_STYLES: dict[str, Callable[[], ParallelStyle]] = {
    "moe_block": lambda: PrepareModuleInputOutput(
        input_layouts=(Replicate(),),
        desired_input_layouts=(Replicate(),),
        use_local_input=True,
        output_layouts=(Partial(),),
        desired_output_layouts=(Replicate(),),
    ),
    "moe_block_sequence": lambda: PrepareModuleInputOutput(
        input_layouts=(Replicate(),),
        desired_input_layouts=(Replicate(),),
        use_local_input=True,
        output_layouts=(Partial(),),
        desired_output_layouts=(Shard(1),),
        use_local_output=False,
    ),
    "replicated": ReplicatedCompute,
}


def moe_names(module: nn.Module, experts: list[str], sequence_parallel: bool) -> dict[str, str]:
    """The tensor-parallel plan's entries (module path pattern -> style name) for the MoE
    blocks holding the ``experts`` (their paths), each block one entry and its router one:
    ``model.layers.*.mlp`` where that names the blocks and no other module, else each path.

    Raises ``LayoutError`` for a block holding more than a router beside its experts."""
    paths = dict(module.named_modules())
    blocks: list[str] = []
    routers: list[str] = []
    for path in experts:
        block = path.rsplit(".", 1)[0] if "." in path else ""
        others = [
            f"{block}.{name}" if block else name
            for name, child in paths[block].named_children()
            if f"{block}.{name}" != path and any(True for _ in child.parameters())
        ]
        own = [n for n, _ in paths[block].named_parameters(recurse=False)]
        if len(others) != 1 or own:
            raise LayoutError(
                f"parallel ep with tp: the MoE block {block!r} of {type(module).__name__} holds "
                f"{', '.join(others + own) or 'nothing'} beside its experts, where meta_widget "
                "shards a block of one router and its experts (Mixtral's): a shared expert "
                "would need its own tensor parallelism. Give ep without tp (e.g. {'fsdp': 4, "
                "'ep': 4}), or tp without ep."
            )
        blocks.append(block)
        routers.append(others[0])
    style = "moe_block_sequence" if sequence_parallel else "moe_block"
    return {
        **{p: style for p in _patterns(blocks, paths)},
        **{p: "replicated" for p in _patterns(routers, paths)},
    }


def _patterns(chosen: list[str], paths: dict[str, nn.Module]) -> list[str]:
    """``chosen`` as one pattern with ``*`` for the layer index where it names them and no
    other module, else the paths themselves."""
    patterns = {re.sub(r"\.\d+\.", ".*.", p) for p in chosen}
    if len(patterns) == 1:
        pattern = patterns.pop()
        regex = re.compile(re.escape(pattern).replace(r"\*", r"[^.]+") + r"\Z")
        if {p for p in paths if regex.match(p)} == set(chosen):
            return [pattern]
    return list(chosen)
