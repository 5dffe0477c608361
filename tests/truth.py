"""The peak of a real CPU run, as ``torch.distributed._tools.mem_tracker.MemTracker`` measures it.

What ``mw.analyze(..., device="cpu")`` models: inference is ``eval()`` under ``no_grad``, one
forward; training is ``train()``, forward, the sum of the output, backward (no optimizer step),
the output kept to the end.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn
from torch.distributed._tools.mem_tracker import MemTracker


def real_peak(
    model: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any] | None = None,
    *,
    training: bool = False,
) -> int:
    """MemTracker's peak (bytes) of one real CPU pass of a copy of ``model``."""
    model = copy.deepcopy(model).train(training)
    kwargs = kwargs or {}
    tracker = MemTracker()
    tracker.track_external(
        model, *[a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
    )
    with tracker, torch.set_grad_enabled(training):
        out = model(*args, **kwargs)
        if training:
            loss = out.sum()
            loss.backward()
            del loss
        peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]
    del out
    return int(peak["Total"])
