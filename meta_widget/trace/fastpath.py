"""PyTorch's fused inference fast paths, run on meta as the real device runs them.

In inference (``eval()``, no autograd), ``nn.MultiheadAttention`` and
``nn.TransformerEncoderLayer`` leave their Python code for one fused kernel
(``_native_multi_head_attention``, ``_transformer_encoder_layer_fwd``), which allocates
differently from the unfused layer. That path requires a real device (``cpu``/``cuda``) and no
active function mode, so a meta trace never takes it. While tracing inference for
``device="cpu"`` or ``"cuda"``, :func:`patch_fast_paths` gives each such module an instance
``forward`` that, when PyTorch's own conditions for the fast path hold, runs the kernel's steps as
ATen ops (each recorded like any other). The attention kernel has two branches, and the device
decides: CUDA takes the SDPA branch (the packed ``in_proj`` projection, kept until
``out_proj``; ``scaled_dot_product_attention`` on the heads, see :mod:`meta_widget.trace.kernels`);
the CPU always takes the math branch (PyTorch registers no CPU backend choice for it: the
projection without its bias, a ``(3, B, H, T, Dh)`` heads buffer, the scores with the softmax in
place, or into a new buffer under a padding mask, the context over the query heads, the heads
made contiguous). The encoder layer adds the residual in place, layer norms, and the feed-forward
as ``addmm`` fused with its activation (``_addmm_activation``). ``nn.TransformerEncoder`` with a
padding mask packs the kept tokens into a nested tensor first (:mod:`meta_widget.trace.nested`).
``need_weights=True`` (the default of ``MultiheadAttention.forward``) keeps the fast path, as
in PyTorch: the kernel's math branch on every device, its scores kept and returned (averaged
over the heads unless ``average_attn_weights=False``). Where the kernel would take another branch
(an attention mask), or PyTorch would not take the fast path (a user's forward hook on an encoder
layer), the module's own ``forward`` runs. The undo step puts back what was there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .callstack import CallStack
from .nested import NESTED_ATTENTION, Attention, encoder_forward

__all__ = ["patch_fast_paths"]


def _attention_ok(m: nn.MultiheadAttention, x: torch.Tensor, device: str) -> bool:
    """PyTorch's conditions for the fused attention kernel (self-attention), and on CUDA for
    its SDPA branch (a head size of a multiple of 8; the CPU takes its math branch whatever the
    head size)."""
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
        and (device == "cpu" or (m.embed_dim // m.num_heads) % 8 == 0)
        and not torch.is_autocast_enabled()
        and not (torch.is_grad_enabled() and any(p.requires_grad for p in m.parameters()))
    )


def _attention(m: nn.MultiheadAttention, x: torch.Tensor, device: str) -> torch.Tensor:
    """``_native_multi_head_attention`` as ``device`` runs it, ``need_weights=False``."""
    return _attention_math(m, x) if device == "cpu" else _attention_sdpa(m, x)


def _attention_with_weights(
    m: nn.MultiheadAttention, x: torch.Tensor, average: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """``_native_multi_head_attention`` with ``need_weights=True``: the math branch on every
    device (the SDPA branch needs ``need_weights=False``), its scores kept past the output
    projection and returned, summed over the heads and divided in place when ``average``."""
    weights: list[torch.Tensor] = []
    y = _attention_math(m, x, weights=weights, average=average)
    return y, weights[0]


def _attention_math(
    m: nn.MultiheadAttention,
    x: torch.Tensor,
    padding: torch.Tensor | None = None,
    weights: list[torch.Tensor] | None = None,
    average: bool = True,
) -> torch.Tensor:
    """The kernel's math branch, which the CPU always takes (PyTorch registers no CPU backend
    choice for it): the projection without its bias, a new ``(3, B, H, T, Dh)`` buffer for the
    biased, scaled heads, the scores (softmax in place; with a ``padding`` mask, made boolean, a
    masked softmax into a new buffer), the context written over the query heads, then the
    heads made contiguous for the output projection. With ``weights`` (``need_weights=True``)
    the scores stay alive through the projection, then are appended to it (with ``average``,
    their sum over the heads divided in place, made while the heads buffer is still alive)."""
    b, t, d = x.shape
    heads = m.num_heads
    assert m.in_proj_weight is not None
    qkv = torch.matmul(x, m.in_proj_weight.t())
    q_k_v = torch.empty((3 * b * heads, t, d // heads), dtype=qkv.dtype, device=qkv.device)
    del qkv
    q, k, v = q_k_v.split(b * heads)
    scores = torch.bmm(q, k.transpose(1, 2))
    if padding is None:
        torch._softmax(scores, -1, False, out=scores)
    else:
        keep = padding if padding.dtype == torch.bool else padding.to(torch.bool)
        scores = torch.softmax(scores, -1)  # _masked_softmax: a new buffer
        del keep
    torch.bmm(scores, v, out=q)
    if weights is None:
        del scores
    heads_last = q.view(b, heads, t, d // heads).transpose(1, 2).contiguous()
    y = F.linear(heads_last.view(b * t, d), m.out_proj.weight, m.out_proj.bias)
    del heads_last
    if weights is not None:
        per_head = scores.view(b, heads, t, scores.shape[-1])
        del scores
        if average:
            per_head = per_head.sum(1)
            per_head.div_(heads)
        weights.append(per_head)
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
        if not (
            plain
            and query is key
            and key is value
            and not kw.get("is_causal", False)
            and _attention_ok(m, query, device)
        ):
            return forward(query, key, value, *args, **kw)
        if not kw.get("need_weights", True):  # PyTorch's default, True, keeps the fast path
            return _attention(m, query, device), None
        return _attention_with_weights(m, query, bool(kw.get("average_attn_weights", True)))

    return run


def _users_hooks(m: nn.Module) -> bool:
    """Whether a forward (pre-)hook other than the trace's own is on ``m`` or a submodule: then
    PyTorch leaves the encoder layer's fast path."""
    for sub in m.modules():
        for hook in (*sub._forward_hooks.values(), *sub._forward_pre_hooks.values()):
            if not isinstance(getattr(hook, "__self__", None), CallStack):
                return True
    return False


def _layer_ok(m: nn.TransformerEncoderLayer, x: torch.Tensor, device: str) -> bool:
    """PyTorch's conditions for the fused encoder layer kernel on ``device``."""
    return (
        m.activation_relu_or_gelu != 0
        and not _users_hooks(m)
        and m.norm1.eps == m.norm2.eps
        and m.norm1.weight is not None
        and m.linear1.bias is not None
        and _attention_ok(m.self_attn, x, device)
        and not (torch.is_grad_enabled() and any(p.requires_grad for p in m.parameters()))
    )


def _layer(
    m: nn.TransformerEncoderLayer,
    src: torch.Tensor,
    attention: Attention,
) -> torch.Tensor:
    """``_transformer_encoder_layer_fwd``: ``attention``, ``add_`` of the input, layer norms,
    and the feed-forward as two ``addmm`` (the first fused with its activation)."""
    d = src.shape[-1]
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
    x = torch.addmm(m.linear2.bias, h, m.linear2.weight.t()).view(src.shape)
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
        nested = NESTED_ATTENTION.get()
        if nested is not None:  # a nested tensor, from the encoder (which checked the layer)
            return _layer(m, src, nested)
        if src_mask is None and src_key_padding_mask is None and _layer_ok(m, src, device):
            return _layer(m, src, lambda a, x: _attention(a, x, device))
        if src_mask is None and device == "cpu" and _layer_ok(m, src, device):
            # a padding mask, fused too: the CPU kernel's math branch, masked
            padding = F._canonical_mask(
                mask=src_key_padding_mask,
                mask_name="src_key_padding_mask",
                other_type=None,
                other_name="src_mask",
                target_type=src.dtype,
            )
            return _layer(m, src, lambda a, x: _attention_math(a, x, padding))
        return forward(src, src_mask, src_key_padding_mask, is_causal=is_causal)

    return run


_PATCHES: dict[type[nn.Module], Callable[[Any, Callable[..., Any], str], Callable[..., Any]]] = {
    nn.TransformerEncoder: lambda m, forward, device: encoder_forward(
        m, forward, device, lambda layer, x: _layer_ok(layer, x, device)
    ),
    nn.TransformerEncoderLayer: _layer_forward,
    nn.MultiheadAttention: _attention_forward,
}


def patch_fast_paths(modules: Sequence[nn.Module], device: str, undo: Any) -> None:
    """Give every attention and encoder layer among ``modules`` the fast-path ``forward`` of
    ``device`` (an instance attribute); ``undo`` first gets the step putting back what each
    had."""
    for m in modules:
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
