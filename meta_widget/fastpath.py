"""PyTorch's fused inference fast paths, run on meta as the real device runs them.

In inference (``eval()``, no autograd), ``nn.MultiheadAttention`` and
``nn.TransformerEncoderLayer`` leave their Python code for one fused kernel
(``_native_multi_head_attention``, ``_transformer_encoder_layer_fwd``), which allocates less than
the unfused layer. That path requires a real device (``cpu``/``cuda``) and no active function
mode, so a meta trace never takes it and would overstate the peak (1.26× on a 4-layer encoder,
2.7× on a bare attention layer). While tracing inference for ``device="cpu"`` or ``"cuda"``,
:func:`patch_fast_paths` gives each such module an instance ``forward`` that, when PyTorch's own
conditions for the fast path hold, runs the kernel's steps as ATen ops (each recorded like any
other): for attention, the packed ``in_proj`` projection, ``scaled_dot_product_attention`` on the
heads (the device's kernel, see :mod:`meta_widget.kernels`), the copy back to ``(B, T, D)`` and
``out_proj``; for the encoder layer, that attention, the residual added in place, layer norms, and
the feed-forward as ``addmm`` fused with its activation (``_addmm_activation``). Where the kernel
would take another branch (a mask, head sizes not a multiple of 8, ``need_weights=True``), or
PyTorch would not take the fast path (a user's forward hook on an encoder layer), the module's own
``forward`` runs, as before. The undo step puts back what was there.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .callstack import CallStack

__all__ = ["patch_fast_paths"]


def _attention_ok(m: nn.MultiheadAttention, x: torch.Tensor) -> bool:
    """PyTorch's conditions for the fused attention kernel's SDPA branch (self-attention)."""
    return (
        torch.backends.mha.get_fastpath_enabled()
        and not m.training
        and x.dim() == 3
        and m.batch_first
        and m._qkv_same_embed_dim
        and m.in_proj_bias is not None
        and m.bias_k is None
        and not m.add_zero_attn
        and m.num_heads % 2 == 0
        and (m.embed_dim // m.num_heads) % 8 == 0
        and not torch.is_autocast_enabled()
        and not (torch.is_grad_enabled() and any(p.requires_grad for p in m.parameters()))
    )


def _attention(m: nn.MultiheadAttention, x: torch.Tensor, device: str) -> torch.Tensor:
    """``_native_multi_head_attention`` as ``device`` runs it."""
    return _attention_math(m, x) if device == "cpu" else _attention_sdpa(m, x)


def _attention_math(m: nn.MultiheadAttention, x: torch.Tensor) -> torch.Tensor:
    """The kernel's math branch, which the CPU always takes (PyTorch registers no CPU backend
    choice for it): the projection without its bias, a new ``(3, B, H, T, Dh)`` buffer for the
    biased, scaled heads, the scores (softmax in place), the context written over the query
    heads, then the heads made contiguous for the output projection."""
    b, t, d = x.shape
    heads = m.num_heads
    assert m.in_proj_weight is not None
    qkv = torch.matmul(x, m.in_proj_weight.t())
    q_k_v = torch.empty((3 * b * heads, t, d // heads), dtype=qkv.dtype, device=qkv.device)
    del qkv
    q, k, v = q_k_v.split(b * heads)
    scores = torch.bmm(q, k.transpose(1, 2))
    torch._softmax(scores, -1, False, out=scores)
    torch.bmm(scores, v, out=q)
    del scores
    heads_last = q.view(b, heads, t, d // heads).transpose(1, 2).contiguous()
    y = F.linear(heads_last.view(b * t, d), m.out_proj.weight, m.out_proj.bias)
    return y.view(b, t, d)


def _attention_sdpa(m: nn.MultiheadAttention, x: torch.Tensor) -> torch.Tensor:
    """The kernel's SDPA branch (CUDA): packed projection, SDPA, projection."""
    b, _, d = x.shape
    heads = m.num_heads
    assert m.in_proj_weight is not None
    qkv = F.linear(x, m.in_proj_weight, m.in_proj_bias)
    q, k, v = (c.view(b, -1, heads, d // heads).transpose(1, 2) for c in qkv.chunk(3, -1))
    y = F.scaled_dot_product_attention(q, k, v)
    # the kernel keeps the packed projection (and y) alive until its output projection is made
    return F.linear(y.transpose(1, 2).reshape(b, -1, d), m.out_proj.weight, m.out_proj.bias)


def _attention_forward(
    m: nn.MultiheadAttention, forward: Callable[..., Any], device: str
) -> Callable[..., Any]:
    def run(
        query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args: Any, **kw: Any
    ) -> Any:
        plain = not args and not any(
            kw.get(k) is not None for k in ("key_padding_mask", "attn_mask")
        )
        if (
            plain
            and query is key
            and key is value
            and kw.get("need_weights", True) is False
            and not kw.get("is_causal", False)
            and _attention_ok(m, query)
        ):
            return _attention(m, query, device), None
        return forward(query, key, value, *args, **kw)

    return run


def _users_hooks(m: nn.Module) -> bool:
    """Whether a forward (pre-)hook other than the trace's own is on ``m`` or a submodule: then
    PyTorch leaves the encoder layer's fast path."""
    for sub in m.modules():
        for hook in (*sub._forward_hooks.values(), *sub._forward_pre_hooks.values()):
            if not isinstance(getattr(hook, "__self__", None), CallStack):
                return True
    return False


def _layer_ok(m: nn.TransformerEncoderLayer, x: torch.Tensor) -> bool:
    return (
        m.activation_relu_or_gelu != 0
        and not _users_hooks(m)
        and m.norm1.eps == m.norm2.eps
        and m.norm1.weight is not None
        and m.linear1.bias is not None
        and _attention_ok(m.self_attn, x)
        and not (torch.is_grad_enabled() and any(p.requires_grad for p in m.parameters()))
    )


def _layer(
    m: nn.TransformerEncoderLayer,
    src: torch.Tensor,
    attention: Callable[[nn.MultiheadAttention, torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """``_transformer_encoder_layer_fwd``: ``attention``, ``add_`` of the input, layer norms,
    and the feed-forward as two ``addmm`` (the first fused with its activation)."""
    b, t, d = src.shape
    eps = m.norm1.eps

    def norm(x: torch.Tensor, ln: nn.LayerNorm) -> torch.Tensor:
        return F.layer_norm(x, (d,), ln.weight, ln.bias, eps)

    x = norm(src, m.norm1) if m.norm_first else src
    x = attention(m.self_attn, x)
    x.add_(src)
    if not m.norm_first:
        x = norm(x, m.norm1)
    residual = x
    if m.norm_first:
        x = norm(x, m.norm2)
    gelu = m.activation_relu_or_gelu == 2
    h = torch._addmm_activation(
        m.linear1.bias, x.reshape(-1, d), m.linear1.weight.t(), use_gelu=gelu
    )
    del x
    x = torch.addmm(m.linear2.bias, h, m.linear2.weight.t()).view(b, t, d)
    del h
    x.add_(residual)
    del residual
    return norm(x, m.norm2) if not m.norm_first else x


def _layer_forward(
    m: nn.TransformerEncoderLayer, forward: Callable[..., Any], device: str
) -> Callable[..., Any]:
    def run(
        src: torch.Tensor,
        src_mask: Any = None,
        src_key_padding_mask: Any = None,
        is_causal: bool = False,
    ) -> Any:
        if src_mask is None and src_key_padding_mask is None and _layer_ok(m, src):
            if _NESTED.get():
                return _layer(m, src, _attention_nested)
            return _layer(m, src, lambda a, x: _attention(a, x, device))
        return forward(src, src_mask, src_key_padding_mask, is_causal=is_causal)

    return run


# -- nn.TransformerEncoder with a padding mask: the nested-tensor path (CPU) ---------------------

#: whether the encoder layers running now get a nested tensor (the encoder's padding-mask path)
_NESTED: ContextVar[bool] = ContextVar("meta_widget_nested", default=False)


def _encoder_nested_ok(enc: nn.TransformerEncoder, src: torch.Tensor) -> bool:
    """PyTorch's conditions for packing the unpadded tokens into a nested tensor (the mask's
    left-aligned check aside), and every layer able to run fused on it."""
    return (
        torch.backends.mha.get_fastpath_enabled()
        and getattr(enc, "use_nested_tensor", False)
        and src.dim() == 3
        and not torch.is_autocast_enabled()
        and all(
            type(layer) is nn.TransformerEncoderLayer and _layer_ok(layer, src)
            for layer in enc.layers
        )
    )


def _padded_copies(buffer: torch.Tensor, b: int) -> list[torch.Tensor]:
    """``to_padded_tensor``'s first step: each sequence copied, padded to the longest."""
    return [piece.clone() for piece in buffer.view(b, -1, buffer.shape[-1]).unbind()]


def _to_padded(buffer: torch.Tensor, b: int) -> torch.Tensor:
    """``NestedTensor.to_padded_tensor``: the padded copies, stacked (then let go)."""
    return torch.stack(_padded_copies(buffer, b))


#: ATen's grain size: ``masked_select`` on fewer elements, or on one thread, runs serially
_GRAIN = 32768


def _pack(
    padded: torch.Tensor, select: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
) -> torch.Tensor:
    """``_nested_from_padded``: a boolean mask of the kept elements (a piece per sequence,
    stacked), counted in ``int64``, then ``select(padded, mask)`` packs the kept tokens; the
    CPU's parallel ``masked_select`` holds an ``int64`` copy of the mask and its prefix sum."""
    b, t, d = padded.shape
    pieces = [padded.new_ones((t, d), dtype=torch.bool) for _ in range(b)]
    kept = torch.stack(pieces)
    torch.sum(kept.to(torch.int64))  # the CPU's sum of a bool mask upcasts it first
    packed = select(padded, kept)
    if kept.numel() >= _GRAIN and torch.get_num_threads() > 1:
        copies = [torch.empty_like(kept, dtype=torch.int64) for _ in range(2)]
        del copies
    del kept, pieces
    return packed


def _packed_buffer(padded: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """The packed tokens inside a layer, whose count the trace already took (every token)."""
    return torch.empty(
        (kept.shape[0] * kept.shape[1], kept.shape[2]), dtype=padded.dtype, device=padded.device
    )


def _attention_nested(m: nn.MultiheadAttention, x: torch.Tensor) -> torch.Tensor:
    """The CPU kernel's math branch on a nested input (every token kept): the projection on
    the packed tokens, padded for the heads; the softmax a sequence at a time into a new
    buffer; the context packed again for the output projection."""
    b, t, d = x.shape
    heads = m.num_heads
    assert m.in_proj_weight is not None
    qkv = torch.matmul(x, m.in_proj_weight.t())
    padded = _to_padded(qkv, b)
    q_k_v = torch.empty((3 * b * heads, t, d // heads), dtype=qkv.dtype, device=qkv.device)
    del padded, qkv
    q, k, v = q_k_v.split(b * heads)
    scores = torch.bmm(q, k.transpose(1, 2))
    probs = torch.zeros_like(scores)
    for i in range(b):
        rows = slice(i * heads, (i + 1) * heads)
        if i == 0 and t > 1:
            # a padded sequence's scores are a strided slice, which the CPU's softmax copies
            # first: the first sequence is taken one token short (the most it can hold)
            short = slice(0, t - 1)
            strided = scores[rows, short, short]
            probs[rows, short, short].copy_(torch.softmax(strided.contiguous(), -1))
            del strided
        else:
            probs[rows].copy_(torch.softmax(scores[rows], -1))
    torch.bmm(probs, v, out=q)
    del scores, probs
    heads_last = q.view(b, heads, t, d // heads).transpose(1, 2).contiguous().view(b, t, d)
    packed = _pack(heads_last, _packed_buffer)
    del heads_last
    y = F.linear(packed, m.out_proj.weight, m.out_proj.bias)
    return y.view(b, t, d)


def _encoder_forward(
    enc: nn.TransformerEncoder, forward: Callable[..., Any], device: str
) -> Callable[..., Any]:
    def run(
        src: torch.Tensor,
        mask: Any = None,
        src_key_padding_mask: Any = None,
        is_causal: Any = None,
    ) -> Any:
        if (
            device != "cpu"
            or mask is not None
            or src_key_padding_mask is None
            or not _encoder_nested_ok(enc, src)
        ):
            return forward(src, mask, src_key_padding_mask, is_causal)
        padding = F._canonical_mask(
            mask=src_key_padding_mask,
            mask_name="src_key_padding_mask",
            other_type=None,
            other_name="mask",
            target_type=src.dtype,
        )
        assert padding is not None
        if getattr(enc, "mask_check", True) and not torch._nested_tensor_from_mask_left_aligned(
            src, padding.logical_not()
        ):
            return forward(src, mask, src_key_padding_mask, is_causal)
        return _encoder_nested(enc, src, padding.logical_not())

    return run


def _encoder_nested(
    enc: nn.TransformerEncoder, src: torch.Tensor, keep: torch.Tensor
) -> torch.Tensor:
    """``nn.TransformerEncoder``'s nested-tensor path: the kept tokens packed (how many is in
    the mask's values: the trace keeps every token, recorded as an upper-bound assumption),
    each layer fused on them, then padded back to the input's size."""
    b, t, d = src.shape
    keep.cumsum(1)  # the sequence lengths, counted in int64
    output = _pack(src, torch.masked_select).view(b, t, d)
    token = _NESTED.set(True)
    try:
        for layer in enc.layers:
            output = layer(output)
    finally:
        _NESTED.reset(token)
    pieces = _padded_copies(output, b)
    stacked = torch.stack(pieces)
    del output
    padded = F.pad(stacked, (0, 0, 0, 0, 0, 0))  # padded again to the input's size: a copy
    del stacked, pieces
    return padded if enc.norm is None else enc.norm(padded)


_PATCHES: dict[type[nn.Module], Callable[[Any, Callable[..., Any], str], Callable[..., Any]]] = {
    nn.TransformerEncoder: _encoder_forward,
    nn.TransformerEncoderLayer: _layer_forward,
    nn.MultiheadAttention: _attention_forward,
}


def patch_fast_paths(module: nn.Module, device: str, undo: Any) -> None:
    """Give every attention and encoder layer of ``module`` the fast-path ``forward`` of
    ``device`` (an instance attribute); ``undo`` first gets the step putting back what each
    had."""
    for m in module.modules():
        patch = _PATCHES.get(type(m))
        if patch is None:
            continue
        state = vars(m)
        had, before = "forward" in state, state.get("forward")

        def restore(m: nn.Module = m, had: bool = had, before: Any = before) -> None:
            if had:
                vars(m)["forward"] = before
            else:
                vars(m).pop("forward", None)

        undo.add(restore)
        m.forward = patch(m, m.forward, device)  # type: ignore[method-assign]
