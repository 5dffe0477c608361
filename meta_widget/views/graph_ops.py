"""The graph's nodes that are no module: ops of a body drawn as nodes of their own.

Most ops of a body above the nodes lie on the edges (``views/graph.py``). Three things a reader
looks for are drawn as nodes instead:

- **attention**: a ``scaled_dot_product_attention`` (any of aten's kernels), or a ``softmax`` of a
  matmul's scores with the matmul by the values that follows it (eager attention, and the
  decomposition PyTorch runs on meta). q, k and v reach it; its output goes on (``o_proj``).
- **residual add**: an ``add`` of a stream and a branch computed from it (``x + attn(norm(x))``):
  one operand's sources are all upstream of the other's, and none of them is the other's. The
  stream's edge into it is of kind ``"residual"``: the chain of them is the residual stream, the
  spine of a transformer or a ResNet. A sum of two side-by-side branches (``left(h) + right(h)``)
  stays an edge's op.
- **the KV cache** the model returns (``cache.layers[0].keys``, ``past_key_values``): not part of
  ``<output>`` but its own node, ``<cache>``, its edges of kind ``"cache"``.

An op node belongs to the module whose body runs it: its name is that module's path and
``.<attention>``, ``.<residual>`` (``.<residual 2>`` for a body's second), so a folded group's
op nodes fold with it (``model.layers.0–79.<residual 2>``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "ATTENTION",
    "NO_DATA",
    "RESIDUAL",
    "OpNode",
    "attention_flops",
    "is_cache_output",
]

ATTENTION, RESIDUAL = "attention", "residual"
#: the ops of a scaled-dot-product attention kernel (after ``_op_name``)
_SDPA = ("scaled_dot_product", "flash_attention", "efficient_attention", "flex_attention")
#: the ops that take scores to weights
SOFTMAX = frozenset({"softmax", "safe_softmax", "log_softmax"})
#: the products of an attention: q by k, weights by v
MATMUL = frozenset({"bmm", "matmul", "baddbmm", "einsum", "mm"})
#: the ops of an attention itself: left off the edges into its node
INNER = MATMUL | SOFTMAX
#: ops that read a tensor's shape, never its data: what they make comes from nowhere (a
#: ``zeros_like(h)`` that experts' outputs are summed into is no stream of ``h``)
NO_DATA = frozenset(
    {"zeros_like", "ones_like", "empty_like", "full_like", "rand_like", "randn_like",
     "randint_like", "new_zeros", "new_ones", "new_empty", "new_full", "empty_strided"}
)  # fmt: skip


@dataclass(slots=True)
class OpNode:
    """An op of module row ``row``'s body drawn as a node (see the module docstring)."""

    #: the module whose body runs it
    row: int
    #: :data:`ATTENTION` or :data:`RESIDUAL`
    kind: str
    #: its name under the module's path: ``<attention>``, ``<residual 2>``
    name: str = ""
    #: what it is: the attention's kernel; the residual's branch (``+ self_attn``)
    detail: str = ""
    #: its FLOPs (an attention's products and softmax; 0 for a residual add)
    flops: int = 0


def is_sdpa(name: str) -> bool:
    """Whether op ``name`` (``_op_name``'s) is a scaled-dot-product attention kernel."""
    return any(s in name for s in _SDPA)


def scores(ops: Sequence[str]) -> bool:
    """Whether a tensor that went through ``ops`` is attention scores (a matmul's product)."""
    return any(op in MATMUL for op in ops)


def residual_stream(
    found: Sequence[Mapping[int, tuple[str, ...]]], above: Callable[[int, int], bool]
) -> int | None:
    """Which of an ``add``'s two operands (their sources) is the stream a residual add adds a
    branch to (0 or 1), or None: not a residual (two side-by-side branches, a shared source).
    ``above(s, b)``: whether node ``s`` is upstream of node ``b``."""
    if len(found) != 2:
        return None
    for k in (0, 1):
        stream, branch = set(found[k]), set(found[1 - k])
        if not stream or not branch or stream & branch:
            continue
        if all(any(above(s, b) for b in branch) for s in stream):
            return k
    return None


def name_ops(ops: dict[int, OpNode]) -> None:
    """Name each op node by its kind and its place among its module's of that kind (op keys
    run in the order the ops ran): ``<residual>`` alone, ``<residual 1>``, ``<residual 2>``."""
    seen: dict[tuple[int, str], list[OpNode]] = {}
    for key in sorted(ops, reverse=True):  # -4, -5, ...: the order they ran
        op = ops[key]
        seen.setdefault((op.row, op.kind), []).append(op)
    for (_, kind), same in seen.items():
        for k, op in enumerate(same, 1):
            op.name = f"<{kind}>" if len(same) == 1 else f"<{kind} {k}>"


def attention_flops(op_flops: Mapping[str, int], op_name: object) -> int:
    """The FLOPs of a body's attention ops (``CallRecord.ops``: aten op -> FLOPs)."""
    total = 0
    for name, flops in op_flops.items():
        short = op_name(name)  # type: ignore[operator]
        if short in INNER or is_sdpa(short):
            total += flops
    return total


def is_cache_output(name: str) -> bool:
    """Whether an output of the model (its flattened path) is an entry of a KV cache
    (``cache.layers[0].keys``; transformers 4's ``past_key_values...``)."""
    return name.startswith("cache") or "past_key_values" in name
