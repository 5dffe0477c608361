"""What each aten op costs: the numbers a time model needs after the trace
(``meta_widget.timing``).

For every op that runs a kernel the recorder credits one *cost* to the call (and phase) that owns
it, the way it credits FLOPs: a tuple ``(peak, flops, bytes)``, kept per call as
``{cost: count}`` (an 80-layer decoder repeats the same few dozen costs; a replayed tape and an
op cache hit credit the cost the first run recorded):

- ``peak``: which of the accelerator's peaks the op's FLOPs run at, from the dtype of its first
  tensor argument: ``"fp32"``, ``"tf32"`` (a convolution in float32: cuDNN allows TF32 by
  default, ``torch.backends.cudnn.allow_tf32``; a float32 matmul does not,
  ``torch.backends.cuda.matmul.allow_tf32`` is off by default), ``"bf16"``, ``"fp16"``,
  ``"fp8"``, ``"fp64"``, ``"int8"``; ``""`` for an op without FLOPs.
- ``flops``: the FLOPs the kernel executes: ``FlopCounterMode``'s count, except fused attention
  (flash, memory-efficient, cuDNN, the CPU flash kernel) with ``is_causal=True``, which skips the
  masked blocks: half of its count. The FLOPs the analysis reports stay ``FlopCounterMode``'s.
- ``shape``: what the time model needs of the kernel beyond FLOPs and bytes
  (``meta_widget.timing.efficiency``): ``("mm", M, N, K, batch)`` for a matrix multiply
  (``mm``, ``addmm``, ``bmm``, ``baddbmm``, ``_scaled_mm``), ``("attn", kernel, direction,
  batch x heads, query length, key length, head dim, causal)`` for a fused attention kernel
  (``kernel`` ``"flash"``, ``"efficient"``, ``"cudnn"`` or ``"cpu"``; ``direction`` ``"fwd"`` or
  ``"bwd"``; ``causal`` 0 or 1), ``()`` for any other op.
- ``bytes``: the bytes the op reads and writes: every tensor argument's and output's
  ``numel * element_size`` (a DTensor's local shard in a parallel trace). A gather
  (``embedding``, ``index_select``, ``gather``, ``index``) reads of its first argument only the
  elements it outputs: a one-token lookup in a 128k x 8k embedding reads one row (16 KB in
  bf16), not the table (2 GB).

A multi-tensor op (``_foreach_*``: the optimizer step as PyTorch runs it on CUDA) credits one
cost per tensor of its lists, each that tensor's bytes (written in place when the op returns
nothing): the kernel moves each tensor's bytes, so the step's time is their sum, and a model
with one more layer adds exactly that layer's costs (the per-layer rule of ``plan``).

Views and metadata ops cost nothing and record nothing: ops whose outputs alias their inputs
(``view``, ``transpose``, ``expand``, ``detach``, ...; the op cache's ``"view"`` bypass), ops
that only change metadata (``transpose_``, ``resize_``), allocation-only ops (``empty``,
``empty_strided``, ``new_empty``), ops that return no tensor (``sym_size``, ``item``), and
collectives (``c10d``, ``_c10d_functional``: their time comes from the trace's collectives).
"""

from __future__ import annotations

from typing import Any

import torch

from .storage import local

__all__ = [
    "PEAK_OF_DTYPE",
    "Cost",
    "OpCost",
    "Shape",
    "causal_index",
    "foreach_costs",
    "is_convolution",
    "is_foreach",
    "is_free",
    "is_gather",
    "op_cost",
    "shape_kind",
]

#: what the time model reads of a kernel's shape (see the module docstring); ``()``: nothing
Shape = tuple[Any, ...]
#: (peak class, executed FLOPs, bytes read and written, shape)
Cost = tuple[str, int, int, Shape]
#: what one op credits: a cost, or one per tensor of a multi-tensor op's lists
OpCost = Cost | tuple[Cost, ...]

aten = torch.ops.aten
_Tensor = torch.Tensor
_SEQUENCES = (list, tuple)

#: the peak class of FLOPs by the dtype of the op's first tensor argument
PEAK_OF_DTYPE: dict[torch.dtype, str] = {
    torch.float32: "fp32",
    torch.float64: "fp64",
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.int8: "int8",
    torch.uint8: "int8",
    **{
        getattr(torch, name): "fp8"
        for name in (
            "float8_e4m3fn",
            "float8_e4m3fnuz",
            "float8_e5m2",
            "float8_e5m2fnuz",
            "float8_e8m0fnu",
        )
        if hasattr(torch, name)
    },
}

#: convolutions: float32 runs at the TF32 peak (cuDNN's default ``allow_tf32=True``)
_CONVOLUTIONS = frozenset(
    {
        aten.convolution,
        aten._convolution,
        aten.convolution_backward,
        aten.cudnn_convolution,
        aten.cudnn_convolution_transpose,
    }
)

#: ops that read of their first argument only the elements they output (one row per index)
_GATHERS = frozenset({aten.embedding, aten.index_select, aten.gather, aten.index})

#: fused attention kernels whose ``is_causal`` skips the masked blocks
_CAUSAL_SKIPPING = frozenset(
    {
        aten._scaled_dot_product_flash_attention,
        aten._scaled_dot_product_flash_attention_backward,
        aten._scaled_dot_product_efficient_attention,
        aten._scaled_dot_product_efficient_attention_backward,
        aten._scaled_dot_product_cudnn_attention,
        aten._scaled_dot_product_cudnn_attention_backward,
        aten._scaled_dot_product_flash_attention_for_cpu,
        aten._scaled_dot_product_flash_attention_for_cpu_backward,
    }
)

#: matrix multiplies: (position of the left matrix, of the right one)
_MATMULS = {
    aten.mm: (0, 1),
    aten.bmm: (0, 1),
    aten.addmm: (1, 2),
    aten.baddbmm: (1, 2),
    aten._scaled_mm: (0, 1),
}
#: fused attention kernels: (kernel, direction, position of the query)
_ATTENTIONS = {
    aten._scaled_dot_product_flash_attention: ("flash", "fwd", 0),
    aten._scaled_dot_product_flash_attention_backward: ("flash", "bwd", 1),
    aten._scaled_dot_product_efficient_attention: ("efficient", "fwd", 0),
    aten._scaled_dot_product_efficient_attention_backward: ("efficient", "bwd", 1),
    aten._scaled_dot_product_cudnn_attention: ("cudnn", "fwd", 0),
    aten._scaled_dot_product_cudnn_attention_backward: ("cudnn", "bwd", 1),
    aten._scaled_dot_product_flash_attention_for_cpu: ("cpu", "fwd", 0),
    aten._scaled_dot_product_flash_attention_for_cpu_backward: ("cpu", "bwd", 1),
}

#: ops that allocate and write nothing a kernel computes
_ALLOCATIONS = frozenset(
    {
        aten.empty,
        aten.empty_like,
        aten.empty_strided,
        aten.new_empty,
        aten.new_empty_strided,
        aten.lift_fresh,
        aten.lift_fresh_copy,
    }
)


#: namespaces of collectives: their time is the communication model's (``a.comm_records``)
_COLLECTIVES = frozenset({"c10d", "_c10d_functional", "_c10d_functional_autograd"})


def is_free(func: Any, bypass: str | None, view: str) -> bool:
    """Whether ``func`` costs nothing here: a view (``bypass`` is the op cache's ``view``
    reason), an op changing metadata in place (``transpose_``), an allocation only, or a
    collective (timed from the trace's collectives, not as a kernel)."""
    return (
        bypass == view
        or torch.Tag.inplace_view in func.tags
        or func._overloadpacket in _ALLOCATIONS
        or func.namespace in _COLLECTIVES
    )


def causal_index(func: Any) -> int | None:
    """The position of ``is_causal`` in the schema of a fused attention kernel that skips masked
    blocks, or None (any other op)."""
    if func._overloadpacket not in _CAUSAL_SKIPPING:
        return None
    for i, argument in enumerate(func._schema.arguments):
        if argument.name == "is_causal":
            return i
    return None


def shape_kind(func: Any) -> Any:
    """What :func:`op_cost` records of ``func``'s shape: its entry of the matrix multiplies or
    of the fused attention kernels, or None (the shape ``()``)."""
    packet = func._overloadpacket
    return _MATMULS.get(packet) or _ATTENTIONS.get(packet)


def _shape(kind: Any, args: tuple[Any, ...], kwargs: dict[str, Any], causal: bool) -> Shape:
    """The shape of an op of ``kind`` (:func:`shape_kind`) called with ``args``."""
    if kind is None:
        return ()
    if len(kind) == 2:  # a matrix multiply: (..., M, K) @ (..., K, N)
        a, b = (args[i] if len(args) > i else None for i in kind)
        if not isinstance(a, _Tensor) or not isinstance(b, _Tensor) or a.dim() < 2:
            return ()
        a, b = local(a), local(b)
        batch = a.shape[0] if a.dim() == 3 else 1
        return ("mm", int(a.shape[-2]), int(b.shape[-1]), int(a.shape[-1]), int(batch))
    name, direction, at = kind
    q = args[at] if len(args) > at else None
    k = args[at + 1] if len(args) > at + 1 else None
    if not isinstance(q, _Tensor) or not isinstance(k, _Tensor) or q.dim() != 4:
        return ()
    q, k = local(q), local(k)
    heads = int(q.shape[0]) * int(q.shape[1])
    return ("attn", name, direction, heads, int(q.shape[2]), int(k.shape[2]), int(q.shape[3]),
            int(causal))  # fmt: skip


def is_foreach(func: Any) -> bool:
    """Whether ``func`` is a multi-tensor op (``_foreach_add_``...): its cost is per tensor."""
    return func._overloadpacket.__name__.startswith("_foreach_")


def foreach_costs(
    args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, on_local: bool
) -> tuple[Cost, ...] | None:
    """The costs of a multi-tensor op: one per tensor of its first list, each the bytes that
    tensor's part of the op reads and writes (its element of every list argument and of the
    output list; the first list's, written in place, when the op returns nothing)."""
    first = next((a for a in args if type(a) in _SEQUENCES), None)
    if not first:
        return None
    n = len(first)

    def element(values: Any, i: int) -> Any:
        return values[i] if type(values) in _SEQUENCES and len(values) == n else values

    outs = out if type(out) in _SEQUENCES and len(out) == n else first
    costs = []
    for i in range(n):
        part = tuple(element(a, i) for a in args)
        named = {k: element(v, i) for k, v in kwargs.items()}
        cost = op_cost(part, named, outs[i], 0, None, False, on_local)
        if cost is not None:
            costs.append(cost)
    return tuple(costs) or None


def is_convolution(func: Any) -> bool:
    return func._overloadpacket in _CONVOLUTIONS


def is_gather(func: Any) -> bool:
    """Whether ``func`` reads of its first argument only the elements it outputs."""
    return func._overloadpacket in _GATHERS


def op_cost(
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    out: Any,
    flops: int,
    causal: int | None,
    convolution: bool,
    on_local: bool,
    gather: bool = False,
    shape: Any = None,
) -> Cost | None:
    """The cost of one op that ran (see the module docstring), or None: it returned no tensor.

    ``causal``: the position of ``is_causal`` (:func:`causal_index`); ``convolution``: float32
    runs at the TF32 peak; ``on_local``: count a DTensor's local shard (a parallel trace);
    ``gather``: of its first argument the op reads only as many bytes as it writes;
    ``shape``: :func:`shape_kind` of the op.
    """
    size = _local_bytes if on_local else _bytes
    written = size((out,))
    if written < 0:
        return None
    if gather and args and isinstance(args[0], _Tensor):
        read = max(size(args[1:]), 0) + written
    else:
        read = max(size(args), 0)
    if kwargs:
        read += max(size(tuple(kwargs.values())), 0)
    if not flops:
        return ("", 0, read + written, ())
    is_causal = causal is not None and _is_causal(args, kwargs, causal)
    if is_causal:
        flops //= 2
    first = _first_tensor(args)
    peak = PEAK_OF_DTYPE.get(first.dtype, "fp32") if first is not None else "fp32"
    if convolution and peak == "fp32":
        peak = "tf32"
    return (peak, flops, read + written, _shape(shape, args, kwargs, is_causal))


def _is_causal(args: tuple[Any, ...], kwargs: dict[str, Any], index: int) -> bool:
    value = args[index] if len(args) > index else kwargs.get("is_causal", False)
    return value is True


def _first_tensor(args: tuple[Any, ...]) -> torch.Tensor | None:
    for a in args:
        if isinstance(a, _Tensor):
            return a
        if type(a) in _SEQUENCES:
            for b in a:
                if isinstance(b, _Tensor):
                    return b
    return None


def _bytes(values: tuple[Any, ...]) -> int:
    """Bytes of the tensors among ``values`` (one level of lists inside); -1 if there is none."""
    n, seen = 0, False
    for v in values:
        if isinstance(v, _Tensor):
            n += v.nbytes
            seen = True
        elif type(v) in _SEQUENCES:
            for w in v:
                if isinstance(w, _Tensor):
                    n += w.nbytes
                    seen = True
    return n if seen else -1


def _local_bytes(values: tuple[Any, ...]) -> int:
    """:func:`_bytes` of the local shards of DTensors."""
    n, seen = 0, False
    for v in values:
        items = v if type(v) in _SEQUENCES else (v,)
        for w in items:
            if isinstance(w, _Tensor):
                n += local(w).nbytes
                seen = True
    return n if seen else -1
