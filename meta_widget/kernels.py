"""Attention as the target device would run it, not as meta's math path.

On meta, ``F.scaled_dot_product_attention`` runs the "math" path, which materializes the whole
``T x T`` score matrix (and saves it for backward): a meta trace would overstate attention memory
many times over. While tracing, :class:`AttentionKernels` (a ``TorchFunctionMode``) sends each
call to the kernel the target ``device`` would pick, whose meta kernels allocate what the real
ones do:

- ``"cuda"`` (default): flash attention when there is no mask, memory-efficient attention with one
  (PyTorch's priority on recent GPUs); neither keeps the score matrix.
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

from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

from .choices import Device

aten = torch.ops.aten
DEVICES = tuple(d.value for d in Device)
_SDPA = torch._C._nn.scaled_dot_product_attention


def _cpu_flash_flops(q: Any, k: Any, v: Any, *args: Any, out_val: Any = None, **kw: Any) -> int:
    return int(sdpa_flop_count(q.shape, k.shape, v.shape))


def _cpu_flash_backward_flops(
    grad: Any, q: Any, k: Any, v: Any, *args: Any, out_val: Any = None, **kw: Any
) -> int:
    return int(sdpa_backward_flop_count(grad.shape, q.shape, k.shape, v.shape))


#: FLOP formulas for kernels FlopCounterMode's registry lacks (keyed by overload packet)
EXTRA_FLOPS = {
    aten._scaled_dot_product_flash_attention_for_cpu: _cpu_flash_flops,
    aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_flash_backward_flops,
}


def _expand_heads(q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
    """Grouped-query attention: repeat key/value heads to the query's head count."""
    heads = q.shape[-3]
    if kv.shape[-3] == heads:
        return kv
    return kv.repeat_interleave(heads // kv.shape[-3], dim=-3)


class AttentionKernels(TorchFunctionMode):
    """Route ``scaled_dot_product_attention`` to ``device``'s kernel while active."""

    def __init__(self, device: str) -> None:
        if device not in DEVICES:
            raise ValueError(f"device must be one of {DEVICES}, not {device!r}")
        super().__init__()
        self.device = device

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        if func is not _SDPA:
            return func(*args, **(kwargs or {}))
        return self._attention(*args, **(kwargs or {}))

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
        if not (q.is_meta and q.dim() == 4):
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
        if enable_gqa and attn_mask is not None:  # memory-efficient attention needs equal heads
            k, v = _expand_heads(q, k), _expand_heads(q, v)
        if attn_mask is None:
            out = aten._scaled_dot_product_flash_attention(
                q, k, v, dropout_p, is_causal, False, scale=scale
            )[0]
            return out  # type: ignore[no-any-return]
        if attn_mask.dtype == torch.bool:  # the real dispatcher turns a bool mask into a bias
            attn_mask = torch.zeros_like(attn_mask, dtype=q.dtype).masked_fill_(
                attn_mask.logical_not(), float("-inf")
            )
        out = aten._scaled_dot_product_efficient_attention(
            q, k, v, attn_mask, q.requires_grad, dropout_p, is_causal, scale=scale
        )[0]
        return out  # type: ignore[no-any-return]
