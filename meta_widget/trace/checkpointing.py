"""Activation checkpointing in a trace: the forwards of the modules picked run under
``torch.utils.checkpoint`` (non-reentrant), their recomputation in backward under the same
kernels, default device and autocast as the forward.

The trace's function modes (meta as the default device, routing attention to the target
device's kernel) are on PyTorch's mode stack when ``backward()`` starts, and the autograd
engine runs the recomputation with that stack (it is part of the thread-local state a graph
task carries): nothing is entered again for them. Only the trace's autocast is, for the
recomputation alone (``torch.utils.checkpoint`` restores autocast's state the same way), and it
goes on top of them, where it is in the forward. The order matters: autocast casts an
attention's arguments before the kernel is picked, as on a device (the dispatcher's autocast
key runs before the SDPA backend is chosen). A kernel mode entered above autocast would pick
the kernel of the float32 arguments (memory-efficient attention on CUDA, where the forward
under autocast runs flash in bf16) and run it in float32.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from ..undo import Undo
from .autocast import Autocast

__all__ = ["checkpoint_forward", "patch_forwards"]


def patch_forwards(
    modules: Sequence[torch.nn.Module],
    autocast: Callable[[], Autocast] | None,
    undo: Undo,
    recomputation: Callable[[], AbstractContextManager[Any]] = nullcontext,
) -> None:
    """Run each module's forward under activation checkpointing (an instance attribute); the
    undo step puts back exactly what was there, a ``forward`` the user set on the instance too.
    ``recomputation()`` is entered around each recomputation (the recorder's, which counts its
    FLOPs apart)."""
    for m in modules:
        state = vars(m)
        had, before = "forward" in state, state.get("forward")

        def restore(m: torch.nn.Module = m, had: bool = had, before: Any = before) -> None:
            if had:
                vars(m)["forward"] = before
            else:
                vars(m).pop("forward", None)  # back to the class's forward

        undo.add(restore)
        checkpoint_forward(m, autocast, recomputation)


def checkpoint_forward(
    m: torch.nn.Module,
    autocast: Callable[[], Autocast] | None = None,
    recomputation: Callable[[], AbstractContextManager[Any]] = nullcontext,
) -> torch.nn.Module:
    """Make ``m``'s forward run under activation checkpointing (an instance attribute).

    ``autocast`` (it makes the trace's autocast mode) is entered for the recomputation alone, on
    top of the trace's modes (see the module's docstring): the forward runs inside the trace's
    own autocast already, so both runs use the same kernels and casts and make the same tensors.
    ``recomputation()`` is entered around the recomputation too (``torch.utils.checkpoint``
    enters its recompute context around the whole of it, an early stop included).
    """
    forward = m.forward

    @contextmanager
    def recompute() -> Iterator[None]:  # entered when the recomputation starts, not before
        with recomputation(), autocast() if autocast is not None else nullcontext():
            yield

    def contexts() -> tuple[AbstractContextManager[Any], AbstractContextManager[Any]]:
        return nullcontext(), recompute()

    def checkpointed(*args: Any, **kwargs: Any) -> Any:
        return checkpoint(forward, *args, use_reentrant=False, context_fn=contexts, **kwargs)

    m.forward = checkpointed  # type: ignore[method-assign]
    return m
