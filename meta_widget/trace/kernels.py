"""Attention as the target device would run it, not as meta's math path.

On meta, ``F.scaled_dot_product_attention`` runs the "math" path, which materializes the whole
``T x T`` score matrix (and saves it for backward): a meta trace would overstate attention memory
many times over. While tracing, :class:`AttentionKernels` (a ``TorchFunctionMode``) sends each
call to the kernel the target ``device`` would pick, whose meta kernels allocate what the real
ones do:

- ``"cuda"`` (default): the backend PyTorch's CUDA dispatcher (``sdp_utils.cpp``) picks on an
  sm80+ GPU: flash attention for fp16/bf16 without a mask (cuDNN attention on sm90, which keeps
  the same), memory-efficient attention for fp32/fp16/bf16 with aligned head dims and equal
  query/key head counts, else the math path; the fused ones keep no score matrix. Grouped-query
  attention in fp32, or with a mask, therefore takes the math path, as measured on an H200
  (torch 2.11: Llama with SDPA in fp32 peaks at 15.7 MiB where flash would need 8.5).
  ``F.dropout`` runs as CUDA's fused ``native_dropout`` (a one-byte mask; meta and the CPU run the
  unfused path, which keeps a mask of the input's dtype).
- ``"cpu"``: ``_scaled_dot_product_flash_attention_for_cpu``, what PyTorch runs on the CPU
  (grouped-query attention natively), except with dropout, which the CPU flash kernel does not
  support: then the math path, as PyTorch does.
- ``"math"``: the math path itself (what a CPU without flash support, or a custom mask
  function, would run).

FLOPs, as ``FlopCounterMode`` counts them (causal masking never discounted):

- **forward**: the same on every path, two matmuls (``QK^T`` and ``PV``).
- **backward**: *not* the same. The fused kernels (flash, memory-efficient, CPU flash) keep no
  score matrix, so their backward recomputes ``QK^T`` before the four gradient matmuls (``dV``,
  ``dP``, ``dQ``, ``dK``): five matmuls, ``FlopCounterMode``'s scaled-dot-product backward
  formula. The math path back-propagates through the scores it saved: four matmuls. A training
  step therefore counts one more ``QK^T`` per attention call on ``"cuda"`` and ``"cpu"`` than on
  ``"math"`` (7 against 6 matmuls of that size).

PyTorch 2.13 has no formula for the CPU flash kernel (forward or backward), so both are
registered here with ``FlopCounterMode``'s formulas for the other fused kernels.
"""

from __future__ import annotations

import functools
import math
import types
from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import is_traceable_wrapper_subclass
from torch.utils.flop_counter import flop_registry, sdpa_backward_flop_count, sdpa_flop_count

from ..choices import Device
from ..options.errors import LayoutError
from .rnn import GRU, LSTM, cpu_gru, mkldnn_rnn_layer_flops, onednn_lstm
from .storage import inner_tensors, on_meta

aten = torch.ops.aten
DEVICES = tuple(d.value for d in Device)
_SDPA = torch._C._nn.scaled_dot_product_attention
_MHA = torch.nn.functional.multi_head_attention_forward
_DROPOUTS = (torch.nn.functional.dropout, torch.dropout)
_HALF = (torch.float16, torch.bfloat16)
_F = torch.nn.functional
#: what a context-parallel trace's error says of attention on the math path (``plan`` learns it)
RING_MATH_PATH = "takes PyTorch's math path on a CUDA GPU"
#: functions a trace may replay from the tape of an earlier call (``meta_widget.trace.replay``):
#: attention (the math path is ~30 aten ops), linear and matmul (up to four: a transpose, views,
#: the product), and the functions of the common layers, whose Python wrappers, dispatch and
#: several outputs (a norm's mean and inverse deviation, dropout's mask) cost more than a replay
TAPED = frozenset(
    {
        _SDPA,
        _F.linear,
        torch.matmul,
        torch.Tensor.matmul,
        torch.Tensor.__matmul__,
        _F.layer_norm,
        _F.group_norm,
        _F.rms_norm,
        _F.embedding,
        _F.relu,
        _F.gelu,
        _F.silu,
        _F.dropout,
        _F.softmax,
        _F.conv1d,
        _F.conv2d,
    }
)


def _cpu_flash_flops(q: Any, k: Any, v: Any, *args: Any, out_val: Any = None, **kw: Any) -> int:
    return int(sdpa_flop_count(_shape(q), _shape(k), _shape(v)))


def _cpu_flash_backward_flops(
    grad: Any, q: Any, k: Any, v: Any, *args: Any, out_val: Any = None, **kw: Any
) -> int:
    return int(sdpa_backward_flop_count(_shape(grad), _shape(q), _shape(k), _shape(v)))


def _shape(x: Any) -> Any:
    return x.shape if isinstance(x, torch.Tensor) else x


def _addmm_activation_flops(
    bias: Any, a: Any, b: Any, *args: Any, out_val: Any = None, **kw: Any
) -> int:
    """``addmm`` fused with ReLU/GELU (the encoder layer's fast path): ``addmm``'s count."""
    return 2 * int(a.shape[0]) * int(a.shape[1]) * int(b.shape[1])


def _grouped_mm_flops(a: Any, b: Any, *args: Any, out_val: Any = None, **kw: Any) -> int:
    """``torch._grouped_mm`` (mixture-of-experts layers: each group of rows of ``a`` times its
    expert's matrix in ``b``), which ``FlopCounterMode`` does not count. Every row meets one
    group's matrix, so the count does not depend on the offsets (the routing): ``2 M K N``
    for ``a`` (M, K) and ``b`` (G, K, N); per group for 3-D ``a``; and for 2-D ``a`` and ``b``
    (the weights' gradient, the groups splitting the reduced dimension) ``2 M K N`` over
    ``a`` (M, K) and ``b`` (K, N)."""
    if len(a.shape) == 2 and len(b.shape) == 2:
        return 2 * int(a.shape[0]) * int(a.shape[1]) * int(b.shape[1])
    out = _shape(out_val)
    return 2 * math.prod(int(n) for n in out) * int(a.shape[-1])


def _heads_of_query(formula: Callable[..., int], first: int) -> Callable[..., int]:
    """``formula`` given key/value shapes with the query's head count: grouped-query attention
    counts as the kernel runs it (each query head against its shared key/value head), on every
    PyTorch; before 2.12 ``sdpa_flop_count`` refused such shapes ("incompatible"), seen on 2.11."""

    def counted(*args: Any, **kwargs: Any) -> int:
        q, k, v = args[first : first + 3]
        if isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and q.dim() == k.dim() == 4:
            heads = q.shape[-3]
            if k.shape[-3] != heads:
                k_shape = torch.Size([*k.shape[:-3], heads, *k.shape[-2:]])
                v_shape = torch.Size([*v.shape[:-3], heads, *v.shape[-2:]])
                args = (*args[:first], q, k_shape, v_shape, *args[first + 3 :])
        return formula(*args, **kwargs)

    return counted


_FUSED_ATTENTION = {
    aten._scaled_dot_product_efficient_attention: 0,
    aten._scaled_dot_product_flash_attention: 0,
    aten._scaled_dot_product_cudnn_attention: 0,
    aten._scaled_dot_product_efficient_attention_backward: 1,
    aten._scaled_dot_product_flash_attention_backward: 1,
    aten._scaled_dot_product_cudnn_attention_backward: 1,
}

#: FLOP formulas for kernels FlopCounterMode's registry lacks (keyed by overload packet), and its
#: fused-attention ones made safe for grouped-query shapes
EXTRA_FLOPS = {
    aten._addmm_activation: _addmm_activation_flops,
    aten._grouped_mm: _grouped_mm_flops,
    aten.mkldnn_rnn_layer: mkldnn_rnn_layer_flops,
    aten._scaled_dot_product_flash_attention_for_cpu: _heads_of_query(_cpu_flash_flops, 0),
    aten._scaled_dot_product_flash_attention_for_cpu_backward: _heads_of_query(
        _cpu_flash_backward_flops, 1
    ),
    **{
        op: _heads_of_query(flop_registry[op], first)
        for op, first in _FUSED_ATTENTION.items()
        if op in flop_registry
    },
}


class AttentionKernels(TorchFunctionMode):
    """Route ``scaled_dot_product_attention`` to ``device``'s kernel while active."""

    #: while a context-parallel trace runs (``distributed.context.sharded_sequences``), a list
    #: whose one number counts the calls its ring attention took (their query a DTensor)
    ring_calls: list[int] | None = None

    def __init__(self, device: str) -> None:
        if device not in DEVICES:
            raise ValueError(f"device must be one of {DEVICES}, not {device!r}")
        super().__init__()
        self.device = device
        #: the trace's :class:`~meta_widget.trace.replay.Tapes` (set while it runs), or None
        self.tapes: Any = None
        self._mha: Callable[..., Any] | None = None

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        return self.route(func, args, kwargs or {})

    def route(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Call ``func`` as ``device`` runs it (``DeviceLessFactories`` calls this too, to route
        a trace's calls in the same mode: one Python mode per torch call instead of two)."""
        if (
            self.tapes is not None
            and func in TAPED
            and not (func is _SDPA and AttentionKernels.ring_calls is not None)  # cp's ring
        ):  # replayed if seen on this metadata
            return self.tapes.call(func, self._route, args, kwargs)
        return self._route(func, args, kwargs)

    def _route(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if func is _SDPA:
            return self._attention(*args, **kwargs)
        if func is _MHA:
            return self._multi_head_attention(*args, **kwargs)
        if func in _DROPOUTS and self.device == "cuda":
            return _cuda_dropout(func, *args, **kwargs)
        if func is LSTM and self.device == "cpu":
            return onednn_lstm(func, *args, **kwargs)
        if func is GRU and self.device == "cpu":
            return cpu_gru(func, *args, **kwargs)
        return func(*args, **kwargs)

    def _multi_head_attention(self, *args: Any, **kwargs: Any) -> Any:
        """``F.multi_head_attention_forward``, whose SDPA and dropout calls this mode cannot see
        (a mode is not active inside the function it was called for): the same code, run with
        this mode's SDPA and dropout in its namespace."""
        if self._mha is None:
            namespace = dict(_MHA.__globals__)
            namespace["has_torch_function"] = lambda *_: False  # already handled: here
            namespace["scaled_dot_product_attention"] = lambda *a, **k: self.route(_SDPA, a, k)
            if self.device == "cuda":
                namespace["dropout"] = functools.partial(_cuda_dropout, torch.nn.functional.dropout)
            self._mha = types.FunctionType(
                _MHA.__code__, namespace, _MHA.__name__, _MHA.__defaults__, _MHA.__closure__
            )
            self._mha.__kwdefaults__ = _MHA.__kwdefaults__
        return self._mha(*args, **kwargs)

    def _attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> torch.Tensor:
        # context parallelism's ring: a DTensor (the only wrapper subclass here) to its kernel
        ring = AttentionKernels.ring_calls is not None and is_traceable_wrapper_subclass(q)
        if ring:  # its blocks on a CUDA kernel (not "math")
            AttentionKernels.ring_calls[0] += 1  # type: ignore[index]
        if not (on_meta(inner_tensors(q)[0] if ring else q) and q.dim() == 4):
            return _SDPA(
                q, k, v, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
            )
        if self.device == "cpu":
            if dropout_p > 0:  # no dropout in the CPU flash kernel: PyTorch takes the math path
                return _SDPA(
                    q, k, v, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
                )
            out, _ = aten._scaled_dot_product_flash_attention_for_cpu(
                q, k, v, dropout_p, is_causal, attn_mask=attn_mask, scale=scale
            )
            return out  # type: ignore[no-any-return]
        backend = cuda_backend(q, k, v, attn_mask, is_causal)
        if backend == "math" and ring:
            raise LayoutError(
                f"context parallelism: attention over {q.dtype} queries of shape "
                f"{list(q.shape)} (keys {list(k.shape)}, a mask given: {attn_mask is not None}) "
                f"{RING_MATH_PATH}, which context_parallel's ring "
                "attention does not run (flash: fp16/bf16 without a mask; memory-efficient: "
                "equal query and key heads). Trace it in bf16 (autocast or bf16 parameters), "
                "or without cp."
            )
        if backend == "math":
            return _SDPA(
                q, k, v, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
            )
        if backend == "flash":
            out = aten._scaled_dot_product_flash_attention(
                q, k, v, dropout_p, is_causal, False, scale=scale
            )[0]
            return out  # type: ignore[no-any-return]
        if attn_mask is not None and attn_mask.dtype == torch.bool:
            # the real dispatcher turns a bool mask into a bias
            attn_mask = torch.zeros_like(attn_mask, dtype=q.dtype).masked_fill_(
                attn_mask.logical_not(), float("-inf")
            )
        out = aten._scaled_dot_product_efficient_attention(
            q, k, v, attn_mask, q.requires_grad, dropout_p, is_causal, scale=scale
        )[0]
        return out  # type: ignore[no-any-return]


def cuda_backend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
) -> str:
    """The SDPA backend PyTorch's CUDA dispatcher picks on an sm80+ GPU: its checks, in its order.

    ``"flash"`` (fp16/bf16, no mask, equal head dims <= 256, no causal mask over unequal lengths;
    cuDNN attention, preferred on sm90, allocates the same), ``"efficient"`` (fp32/fp16/bf16,
    equal query/key head dims that are multiples of 4 (fp32) or 8 (half), equal head counts) or
    ``"math"``. Grouped-query heads in memory-efficient attention (pytorch/pytorch#191085, July
    2026) are not taken: PyTorch 2.11 on an H200 ran the math path, and this PyTorch's meta kernel
    for its backward still returns query-shaped key gradients.
    """
    dims = (q.shape[-1], k.shape[-1], v.shape[-1])
    same_heads = q.shape[-3] == k.shape[-3] == v.shape[-3]
    if (
        q.dtype in _HALF
        and attn_mask is None
        and dims[0] == dims[1] == dims[2] <= 256
        and not (is_causal and q.shape[-2] != k.shape[-2])
    ):
        return "flash"
    align = 8 if q.dtype in _HALF else 4
    if (
        q.dtype in (*_HALF, torch.float32)
        and dims[0] == dims[1]
        and dims[0] % align == 0
        and dims[2] % align == 0
        and same_heads
    ):
        return "efficient"
    return "math"


def _cuda_dropout(
    func: Any, input: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False
) -> torch.Tensor:
    """``F.dropout`` / ``torch.dropout`` as CUDA runs it: the fused ``native_dropout`` (output and
    a bool mask) wherever PyTorch's ``is_fused_kernel_acceptable`` holds; as is otherwise
    (in place, eval, ``p`` of 0 or 1, empty, not on meta)."""
    if not (input.is_meta and training and not inplace and 0 < p < 1 and input.numel() > 0):
        if func is torch.dropout:
            return func(input, p, training)  # type: ignore[no-any-return]
        return func(input, p, training, inplace)  # type: ignore[no-any-return]
    return torch.native_dropout(input, p, True)[0]


def _cublas_copy_bytes(m: torch.Tensor) -> int:
    """Bytes cuBLAS's caller copies ``m`` into when neither it nor its transpose is laid out
    with a unit stride (``prepare_matrix_for_cublas``): e.g. the expanded gradient of a sum."""
    if m.dim() < 2:
        return 0
    rows, cols = m.shape[-2], m.shape[-1]
    s_rows, s_cols = m.stride()[-2], m.stride()[-1]
    if (s_rows == 1 and s_cols >= max(1, rows)) or (s_cols == 1 and s_rows >= max(1, cols)):
        return 0
    return m.numel() * m.element_size()


def _matmul_workspace(a: torch.Tensor, b: torch.Tensor, *_: Any, **__: Any) -> int:
    return _cublas_copy_bytes(a) + _cublas_copy_bytes(b)


def _addmm_workspace(
    bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *_: Any, **__: Any
) -> int:
    return _matmul_workspace(a, b)


def _safe_softmax_workspace(x: torch.Tensor, dim: int, *_: Any, **__: Any) -> int:
    """``_safe_softmax`` (SDPA's math path) beside its output: a bool mask of ``-inf`` inputs and
    one bool per row, freed before it returns (seen on an H200)."""
    return x.numel() + x.numel() // max(1, x.shape[dim])


def _softmax_backward_workspace(grad: torch.Tensor, *_: Any, **__: Any) -> int:
    """CUDA's softmax backward allocates a second buffer of the gradient's size beside its
    output, freed before it returns (seen on an H200 in every eager-attention backward)."""
    return grad.numel() * grad.element_size()


#: scratch memory inside kernels of a target device, by overload packet: bytes from the op's args
WORKSPACES: dict[str, dict[Any, Callable[..., int]]] = {
    "cuda": {
        aten.mm: _matmul_workspace,
        aten.bmm: _matmul_workspace,
        aten.addmm: _addmm_workspace,
        aten.baddbmm: _addmm_workspace,
        aten._safe_softmax: _safe_softmax_workspace,
        aten._softmax_backward_data: _softmax_backward_workspace,
    },
    # the CPU's addmm_impl_cpu_ clones an operand BLAS cannot stride through, as cuBLAS's caller
    # does (the expanded gradient of a sum); its bmm copies one matrix at a time (not modeled)
    "cpu": {aten.mm: _matmul_workspace, aten.addmm: _addmm_workspace},
}
