"""``nn.TransformerEncoder`` with a padding mask, as the CPU runs it: the nested-tensor path.

Given ``src_key_padding_mask`` in inference, the encoder packs each sequence's unpadded tokens
into a nested tensor (``_nested_tensor_from_mask``), runs every layer fused on it
(``_transformer_encoder_layer_fwd`` on nested input), and pads the result back to the input's
size. None of that runs on meta (no nested kernels there, and the encoder takes the path only on
a real device), so for ``device="cpu"`` :func:`encoder_forward` runs the steps of PyTorch's CPU
code as ATen ops on plain meta tensors, a packed buffer of ``(tokens, features)`` standing for
each nested tensor:

- packing (``_nested_from_padded``): a boolean mask of the kept elements, a piece per sequence
  then stacked, counted in ``int64``; ``masked_select`` (on ``_GRAIN`` elements or more, with
  more than one thread, the parallel kernel holds an ``int64`` copy of the mask and its prefix
  sum); the packed tokens;
- in each layer's attention (the kernel's math branch): the projection on the packed tokens,
  padded again to the longest sequence for the heads (a padded copy per sequence, stacked); the
  scores; the softmax a sequence at a time into a new buffer (a padded sequence's scores are a
  strided slice, which the CPU's softmax copies first); the context packed again for the output
  projection; the rest of the layer on the packed tokens;
- at the end, each sequence padded to the longest, stacked, and padded to the input's size.

How many tokens each sequence keeps is in the mask's values. When the user passed the real mask
(:mod:`meta_widget.sources.known`), the trace uses its lengths, and its left-aligned check is
answered
from them. Otherwise the trace keeps every token (``masked_select``'s recorded assumption: every
element selected) with one sequence a token short of the longest in the softmax: the most any
mask can hold.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..sources.known import value_of

__all__ = ["NESTED_ATTENTION", "Attention", "encoder_forward"]

#: an attention step of an encoder layer: the attention module, its input -> its output
Attention = Callable[[nn.MultiheadAttention, torch.Tensor], torch.Tensor]

#: while the encoder's layers run on a nested tensor: the attention they take (else None)
NESTED_ATTENTION: ContextVar[Attention | None] = ContextVar("nested_attention", default=None)

#: ATen's grain size: ``masked_select`` on fewer elements, or on one thread, runs serially
_GRAIN = 32768


def encoder_forward(
    enc: nn.TransformerEncoder,
    forward: Callable[..., Any],
    device: str,
    layer_ok: Callable[[nn.TransformerEncoderLayer, torch.Tensor], bool],
) -> Callable[..., Any]:
    """``enc``'s forward for a trace on ``device``: the nested-tensor path where PyTorch would
    take it (``layer_ok`` says whether a layer runs fused), ``forward`` elsewhere."""

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
            or not _takes_nested_path(enc, src, layer_ok)
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
        packs, lengths = _lengths(enc, src, src_key_padding_mask, padding)
        if not packs:  # a mask that is not left-aligned: each layer gets it, unfused
            output = src
            for layer in enc.layers:
                output = layer(output, src_key_padding_mask=padding)
            return output if enc.norm is None else enc.norm(output)
        return _nested(enc, src, lengths)

    return run


def _takes_nested_path(
    enc: nn.TransformerEncoder,
    src: torch.Tensor,
    layer_ok: Callable[[nn.TransformerEncoderLayer, torch.Tensor], bool],
) -> bool:
    """PyTorch's conditions for packing (the mask's own check aside), and every layer able to
    run fused on the packed tokens."""
    return (
        torch.backends.mha.get_fastpath_enabled()
        and getattr(enc, "use_nested_tensor", False)
        and src.dim() == 3
        and not torch.is_autocast_enabled()
        and all(
            type(layer) is nn.TransformerEncoderLayer and layer_ok(layer, src)
            for layer in enc.layers
        )
    )


def _lengths(
    enc: nn.TransformerEncoder,
    src: torch.Tensor,
    padding_mask: torch.Tensor,
    padding: torch.Tensor,
) -> tuple[bool, list[int] | None]:
    """Whether PyTorch packs (``padding``, the canonical mask, is left-aligned, or not checked),
    and each sequence's kept tokens: from the real mask the user passed, else None (its
    left-aligned check is then a recorded truth assumption)."""
    real = value_of(padding_mask)
    if real is None or tuple(real.shape) != tuple(padding.shape):
        check = getattr(enc, "mask_check", True)
        if check and not torch._nested_tensor_from_mask_left_aligned(src, padding.logical_not()):
            return False, None
        padding.logical_not().cumsum(1)  # the sequence lengths, counted in int64
        return True, None
    # read as Python values: no op on the real tensor reaches the trace
    rows = [[not padded for padded in row] for row in real.tolist()]
    lengths = [sum(row) for row in rows]
    left_aligned = all(
        row == [True] * n + [False] * (len(row) - n) for row, n in zip(rows, lengths, strict=True)
    )
    if getattr(enc, "mask_check", True) and not left_aligned:
        return False, None
    padding.logical_not().cumsum(1)  # the sequence lengths, counted in int64
    return True, lengths


def _nested(enc: nn.TransformerEncoder, src: torch.Tensor, lengths: list[int] | None) -> Any:
    """The encoder's nested path on ``src``, with sequences of ``lengths`` tokens (None: every
    token kept, the bound)."""
    b, t, d = src.shape
    bound = lengths is None
    kept = [t] * b if lengths is None else lengths
    select = _select_all if bound else partial(_packed_buffer, sum(kept))
    output = _pack(src, select)
    token = NESTED_ATTENTION.set(partial(_attention, lengths=kept, bound=bound))
    try:
        for layer in enc.layers:
            output = layer(output)
    finally:
        NESTED_ATTENTION.reset(token)
    longest = max(kept)
    pieces = [output.new_empty((longest, d)) for _ in kept]  # each sequence padded...
    stacked = torch.stack(pieces)
    del output
    padded = F.pad(stacked, (0, 0, 0, t - longest))  # ...then to the input's size: a copy
    del stacked, pieces
    return padded if enc.norm is None else enc.norm(padded)


def _select_all(padded: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """The tokens a meta mask keeps: all of them, as ``masked_select``'s recorded bound."""
    return torch.masked_select(padded, kept).view(-1, padded.shape[-1])


def _packed_buffer(tokens: int, padded: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """``masked_select``'s output for ``tokens`` known tokens."""
    return padded.new_empty((tokens, padded.shape[-1]))


def _pack(
    padded: torch.Tensor, select: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
) -> torch.Tensor:
    """``_nested_from_padded``: the mask of kept elements (a boolean piece per sequence,
    stacked), counted in ``int64``, then ``select`` packs the kept tokens; the CPU's parallel
    ``masked_select`` holds an ``int64`` copy of the mask and its prefix sum meanwhile."""
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


def _to_padded(packed: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """``NestedTensor.to_padded_tensor``: each sequence copied, padded to the longest, then
    stacked (the copies let go after)."""
    longest, features = max(lengths), packed.shape[-1]
    pieces = [packed.new_empty((longest, features)) for _ in lengths]
    return torch.stack(pieces)


def _attention(
    m: nn.MultiheadAttention, x: torch.Tensor, lengths: list[int], bound: bool
) -> torch.Tensor:
    """The CPU kernel's math branch on packed tokens ``x`` (``(tokens, features)``)."""
    b, d, heads = len(lengths), x.shape[-1], m.num_heads
    assert m.in_proj_weight is not None
    qkv = torch.matmul(x, m.in_proj_weight.t())
    padded = _to_padded(qkv, lengths)
    longest = padded.shape[1]
    q_k_v = padded.new_empty((3 * b * heads, longest, d // heads))
    del padded, qkv
    q, k, v = q_k_v.split(b * heads)
    scores = torch.bmm(q, k.transpose(1, 2))
    probs = torch.zeros_like(scores)
    for i, n in enumerate(lengths):
        rows = slice(i * heads, (i + 1) * heads)
        if bound and i == 0 and n > 1:
            n -= 1  # the bound: one sequence a token short, whose softmax copies its slice
        if n < longest:
            strided = scores[rows, :n, :n]
            probs[rows, :n, :n].copy_(torch.softmax(strided.contiguous(), -1))
            del strided
        else:
            probs[rows].copy_(torch.softmax(scores[rows], -1))
    torch.bmm(probs, v, out=q)
    del scores, probs
    heads_last = q.view(b, heads, longest, d // heads).transpose(1, 2).contiguous()
    packed = _pack(heads_last.view(b, longest, d), partial(_packed_buffer, x.shape[0]))
    del heads_last
    return F.linear(packed, m.out_proj.weight, m.out_proj.bias)
