"""Activation checkpointing in a trace: the forwards of the modules picked run under
``torch.utils.checkpoint`` (non-reentrant), their recomputation in backward under the same
kernels, default device and autocast as the forward.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from ..undo import Undo
from .autocast import Autocast
from .kernels import AttentionKernels

__all__ = ["checkpoint_forward", "patch_forwards"]


def patch_forwards(
    modules: Sequence[torch.nn.Module],
    device: str,
    autocast: Callable[[], Autocast] | None,
    undo: Undo,
) -> None:
    """Run each module's forward under activation checkpointing (an instance attribute); the
    undo step puts back exactly what was there, a ``forward`` the user set on the instance too."""
    for m in modules:
        state = vars(m)
        had, before = "forward" in state, state.get("forward")

        def restore(m: torch.nn.Module = m, had: bool = had, before: Any = before) -> None:
            if had:
                vars(m)["forward"] = before
            else:
                vars(m).pop("forward", None)  # back to the class's forward

        undo.add(restore)
        checkpoint_forward(m, device, autocast)


def checkpoint_forward(
    m: torch.nn.Module, device: str, autocast: Callable[[], Autocast] | None = None
) -> torch.nn.Module:
    """Make ``m``'s forward run under activation checkpointing (an instance attribute).

    The recomputation runs inside the autograd engine, where the function modes of the trace are
    not active: the attention mode and meta as the default device are entered again around the
    forward, and so is the trace's autocast (``autocast``: it makes the mode) for the
    recomputation alone, as ``torch.utils.checkpoint`` restores autocast's state on a real
    device: both runs use the same kernels and casts and make the same tensors.
    """
    forward = m.forward

    def run(*args: Any, **kwargs: Any) -> Any:
        with AttentionKernels(device), torch.device("meta"):
            return forward(*args, **kwargs)

    def contexts() -> tuple[AbstractContextManager[Any], AbstractContextManager[Any]]:
        return nullcontext(), autocast() if autocast is not None else nullcontext()

    def checkpointed(*args: Any, **kwargs: Any) -> Any:
        return checkpoint(run, *args, use_reentrant=False, context_fn=contexts, **kwargs)

    m.forward = checkpointed  # type: ignore[method-assign]
    return m
