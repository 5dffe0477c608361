"""Sequence parallelism: a tensor-parallel plan whose norms and residual stream hold
``sequence / tp`` tokens a rank (Megatron-LM's sequence parallelism; PyTorch's
``SequenceParallel`` as torchtitan's Llama plan uses it).

Plain tensor parallelism leaves every rank holding the whole sequence between its blocks: the
norms' inputs and outputs, the residual additions and the row-wise projections' all-reduced
outputs. With sequence parallelism those are sharded along the sequence (``Shard(1)``): each
row-wise projection reduce-scatters its partial sums instead of all-reducing them, and each
block's norm all-gathers its (normalized) output for the column-wise projections that follow.
The bytes on the wire are the same (an all-reduce is a reduce-scatter then an all-gather); the
activations between blocks, and those the norms save for backward, shrink ``tp`` times.

:func:`sequence_parallel_names` turns a tensor-parallel plan of style names (transformers'
``base_model_tp_plan``, or the caller's) into its sequence-parallel form; the residual stream
stays a ``DTensor`` from the embedding to the final norm, so the model's own code sees the
global sequence length (positions, the causal mask).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from typing import Any

from torch import nn
from torch.distributed.tensor import DeviceMesh, DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
)

from ..options import LayoutError

__all__ = ["SEQUENCE_STYLES", "sequence_parallel_names"]


class _GatheredSequenceParallel(SequenceParallel):
    """A norm run on each rank's sequence shard, its output all-gathered (a ``DTensor``
    replicated over the tensor-parallel ranks, or its local tensor when ``use_local_output``)
    for the column-wise projections after it."""

    @staticmethod
    def _prepare_output_fn(  # type: ignore[override]
        use_local_output: bool, mod: nn.Module, outputs: Any, device_mesh: DeviceMesh
    ) -> Any:
        if not isinstance(outputs, DTensor):
            return outputs
        gathered = outputs.redistribute(placements=[Replicate()])
        return gathered.to_local() if use_local_output else gathered


#: the style names of a sequence-parallel plan -> the ``torch.distributed`` style each stands for
SEQUENCE_STYLES: dict[str, Callable[[], ParallelStyle]] = {
    # the residual stream leaves the embedding sharded along the sequence
    "embedding_sequence": lambda: PrepareModuleOutput(
        output_layouts=Replicate(), desired_output_layouts=Shard(1), use_local_output=False
    ),
    "embedding_rowwise_sequence": lambda: RowwiseParallel(
        input_layouts=Replicate(), output_layouts=Shard(1), use_local_output=False
    ),
    # a block's norm: on the shard, then all-gathered for the block's column-wise projections
    "sequence_parallel_gather": _GatheredSequenceParallel,
    # the same, handed on as a plain tensor (to an output head that is not tensor-parallel)
    "sequence_parallel_gather_local": lambda: _GatheredSequenceParallel(use_local_output=True),
    # the final norm, its output still sharded for the head that gathers it
    "sequence_parallel": SequenceParallel,
    # a block's output projection: partial sums reduce-scattered along the sequence
    "rowwise_sequence": lambda: RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
    # the output head: gathers the sequence, its vocabulary columns gathered too
    "colwise_sequence_gather_output": lambda: ColwiseParallel(
        input_layouts=Shard(1), output_layouts=Replicate()
    ),
}

#: a tensor-parallel style -> its sequence-parallel form
_AS_SEQUENCE = {
    "colwise": "colwise",
    "rowwise": "rowwise_sequence",
    "embedding_rowwise": "embedding_rowwise_sequence",
    "colwise_gather_output": "colwise_sequence_gather_output",
}


def sequence_parallel_names(module: nn.Module, names: dict[str, str]) -> dict[str, str]:
    """``names`` (a tensor-parallel plan: module path pattern -> style name) in its
    sequence-parallel form: row-wise projections reduce-scatter along the sequence, the input
    embedding's output is sharded along it, every norm of a block runs on the shard and
    all-gathers its output, the final norm runs on the shard and the output head gathers it.

    Raises ``LayoutError`` where the plan or the model has a part this cannot place (a style
    with no sequence-parallel form, no input embedding, no norm)."""
    name = type(module).__name__
    out: dict[str, str] = {}
    for pattern, style in names.items():
        if style in SEQUENCE_STYLES:  # already written for sequence parallelism
            out[pattern] = style
            continue
        if style not in _AS_SEQUENCE:
            raise LayoutError(
                f"parallel sequence_parallel=True: the tensor-parallel style {style!r} (for "
                f"{pattern!r}) has no sequence-parallel form meta_widget knows (it knows "
                f"{', '.join(sorted(_AS_SEQUENCE))}). Give a tp_plan in sequence-parallel "
                f"styles ({', '.join(sorted(SEQUENCE_STYLES))}), or leave sequence_parallel out."
            )
        out[pattern] = _AS_SEQUENCE[style]
    paths = dict(module.named_modules())
    planned = [p for p in paths if _pattern_of(p, out)]
    # the blocks' own projections (not the embedding or the head)
    blocks = [p for p in planned if out[_pattern_of(p, out)] in ("colwise", "rowwise_sequence")]
    embedding = _input_embedding_path(module, paths)
    if embedding is None:
        raise LayoutError(
            f"parallel sequence_parallel=True shards the sequence from the input embedding on, "
            f"and {name} has none meta_widget can find (get_input_embeddings() or one "
            "nn.Embedding). Leave sequence_parallel out."
        )
    if embedding not in planned:
        out[embedding] = "embedding_sequence"
    head = _output_head_path(module, paths)
    gathered_head = head is not None and out.get(_pattern_of(head, out), "") == (
        "colwise_sequence_gather_output"
    )
    # a norm beside a projection (a query norm inside the attention, which runs on heads
    # already split) is left as it is
    beside = {_parent(p) for p in blocks}
    holders = _ancestors(blocks)
    norms = [p for p, m in paths.items() if _is_norm(m) and _parent(p) not in beside]
    in_blocks = [p for p in norms if _in_block(p, paths) and _parent(p) in holders]
    finals = [p for p in norms if not _in_block(p, paths) and _parent(p) in holders]
    if not in_blocks:
        raise LayoutError(
            f"parallel sequence_parallel=True runs each block's norm on the sequence shard, and "
            f"no norm of {name} sits beside its tensor-parallel blocks (a class named *Norm). "
            "Leave sequence_parallel out."
        )
    for p in _as_patterns(in_blocks, paths):
        out[p] = "sequence_parallel_gather"
    for p in finals:
        out[p] = "sequence_parallel" if gathered_head else "sequence_parallel_gather_local"
    return out


def _is_norm(m: nn.Module) -> bool:
    return type(m).__name__.endswith("Norm") and not any(True for _ in m.children())


def _parent(path: str) -> str:
    return path.rsplit(".", 1)[0] if "." in path else ""


def _ancestors(planned: list[str]) -> set[str]:
    """The paths of the modules that hold a planned projection, at any depth ("": the whole
    model), each found once: linear in the paths (a 126-layer model has 882 projections)."""
    found: set[str] = set()
    for path in planned:
        while path:
            path = _parent(path)
            if path in found:
                break
            found.add(path)
    return found


def _in_block(path: str, paths: dict[str, nn.Module]) -> bool:
    """A norm of one of the repeated blocks (``layers.3.input_layernorm``: its module an item
    of a ``ModuleList``), not the final one (``model.norm``)."""
    block = _parent(path)
    return bool(block) and isinstance(paths.get(_parent(block)), nn.ModuleList)


def _as_patterns(norms: list[str], paths: dict[str, nn.Module]) -> list[str]:
    """The blocks' norms as one pattern per name where it names these norms and no others
    (``model.layers.*.input_layernorm`` for its 126 paths), else their paths."""
    chosen = set(norms)
    out: list[str] = []
    names_only: dict[str, bool] = {}  # pattern -> it matches the chosen norms only
    for path in norms:
        block = _parent(path)
        pattern = f"{_parent(block)}.*.{path.rsplit('.', 1)[1]}"
        if pattern not in names_only:
            names_only[pattern] = all(p in chosen for p in paths if fnmatch.fnmatchcase(p, pattern))
        entry = pattern if names_only[pattern] else path
        if entry not in out:
            out.append(entry)
    return out


def _input_embedding_path(module: nn.Module, paths: dict[str, nn.Module]) -> str | None:
    found = _asked(module, "get_input_embeddings")
    if found is None:
        embeddings = [m for m in paths.values() if isinstance(m, nn.Embedding)]
        found = embeddings[0] if len(embeddings) == 1 else None
    return next((p for p, m in paths.items() if m is found), None)


def _output_head_path(module: nn.Module, paths: dict[str, nn.Module]) -> str | None:
    found = _asked(module, "get_output_embeddings")
    return next((p for p, m in paths.items() if m is found), None)


def _asked(module: nn.Module, getter: str) -> nn.Module | None:
    """``module.<getter>()`` (transformers' ``get_input_embeddings`` and the like), or None
    where the model has none or its getter raises that it has none."""
    get = getattr(module, getter, None)
    try:
        found = get() if callable(get) else None
    except (AttributeError, NotImplementedError):
        return None
    return found if isinstance(found, nn.Module) else None


def _pattern_of(path: str, plan: dict[str, str]) -> str:
    return next((pat for pat in plan if fnmatch.fnmatchcase(path, pat)), "")
