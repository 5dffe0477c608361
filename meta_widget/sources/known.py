"""The values of small masks the user passed in ``input_data``, kept by their meta stand-ins.

A meta trace has no values, but a few kernels allocate by them: ``nn.TransformerEncoder`` with
a padding mask keeps only each sequence's unpadded tokens. When the user hands the real mask,
its values are known: :func:`remember` keeps a reference to it (nothing is copied) under its
meta stand-in for as long as the stand-in lives, and :func:`value_of` gives it back.
"""

from __future__ import annotations

import torch
from torch.utils.weak import WeakIdKeyDictionary

__all__ = ["remember", "value_of"]

#: masks larger than this are not kept (a padding mask is batch x tokens)
MAX_ELEMENTS = 1 << 20

#: by identity: tensors compare by value
_VALUES = WeakIdKeyDictionary()


def remember(meta: torch.Tensor, real: torch.Tensor) -> None:
    """Keep ``real`` (a CPU mask: boolean, or floating of two dimensions) for ``meta``."""
    mask_like = real.dtype == torch.bool or (real.is_floating_point() and real.dim() == 2)
    if real.device.type == "cpu" and mask_like and real.numel() <= MAX_ELEMENTS:
        _VALUES[meta] = real


def value_of(meta: torch.Tensor) -> torch.Tensor | None:
    """The real tensor ``meta`` stands for, if it was a small mask the user passed."""
    value = _VALUES.get(meta)
    return value if isinstance(value, torch.Tensor) else None
