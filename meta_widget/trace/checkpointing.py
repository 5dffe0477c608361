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

Selective (op-level) checkpointing runs them under PyTorch's own
``create_selective_checkpoint_contexts`` with the policy of ``checkpoint_policy=``
(``meta_widget.options.selective``): its dispatch modes keep the outputs of the ops the policy
saves from the forward, alive until backward uses them, and hand them back instead of running
those ops again in the recomputation. Both modes sit above the recorder's, so the recorder
sees every op the forward runs and only the ops the recomputation runs again: the memory and
the recompute FLOPs are those of PyTorch's own code path. :class:`SavedOps` counts what the
policy decided.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from typing import Any

import torch
from torch.utils._pytree import tree_leaves
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from ..options import OptionTypeError
from ..options.selective import SavePolicy, op_name
from ..undo import Undo
from .autocast import Autocast
from .storage import local

__all__ = [
    "KV_CACHE_NOTE",
    "SavedOps",
    "checkpoint_forward",
    "kv_cache_note",
    "patch_forwards",
    "region_policy",
    "writes_cache",
]

_MM = torch.ops.aten.mm.default
_SAVE = (CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_SAVE)


class SavedOps:
    """What a selective policy decided in the checkpointed forwards of a trace: by op name,
    the outputs saved (count and bytes) and the ops left to be recomputed (count)."""

    def __init__(self) -> None:
        self.saved: Counter[str] = Counter()
        self.saved_bytes: Counter[str] = Counter()
        self.recomputed: Counter[str] = Counter()
        #: the classes of the checkpointed modules that were handed a KV cache to write
        self.with_cache: set[str] = set()

    def add(self, op: Any, output: Any, saved: bool) -> None:
        name = op_name(op)
        if saved:
            self.saved[name] += 1
            self.saved_bytes[name] += sum(
                local(t).numel() * local(t).element_size()
                for t in tree_leaves(output)
                if isinstance(t, torch.Tensor)
            )
        else:
            self.recomputed[name] += 1

    def notes(self, policy: SavePolicy | None, steps: int = 1) -> list[str]:
        """The notes for the analysis: what each of the ``steps`` traced steps saved (they are
        alike) and how much it left to recompute; and the checkpointed modules that wrote a KV
        cache."""
        cache = [kv_cache_note(self.with_cache)] if self.with_cache else []
        if policy is None or (not self.saved and not self.recomputed):
            return cache
        shown = ", ".join(
            f"{name} {n // steps}× ({self.saved_bytes[name] // steps:,} B)"
            for name, n in self.saved.most_common()
        )
        return [
            f"Selective activation checkpointing ({policy.label}): each step's checkpointed "
            f"forwards saved {sum(self.saved.values()) // steps} op output(s) "
            f"({shown or 'none'}) and left {sum(self.recomputed.values()) // steps} op(s) to "
            "recompute in backward.",
            *cache,
        ]


#: the words that start :func:`kv_cache_note` (``plan`` finds the note in its traces by them)
KV_CACHE_NOTE = "ran checkpointed with a KV cache to write"


def kv_cache_note(classes: set[str]) -> str:
    """The note of a trace whose checkpointed modules (of ``classes``) wrote a KV cache."""
    return (
        f"{', '.join(sorted(classes))} {KV_CACHE_NOTE} (transformers' use_cache=True): each "
        "writes its keys and values into the cache in the forward and again when backward "
        "recomputes it, and the cache keeps them to the end of the step, as a real run does "
        "(traced so). Training stacks run without it (transformers' own gradient checkpointing "
        "turns it off; torchtitan's models have none): set config.use_cache = False, or pass "
        "use_cache=False, to trace the step as they run it."
    )


#: the keywords transformers hands a layer its KV cache by (``modeling_layers.py``'s
#: ``GradientCheckpointingLayer`` clears the same ones under its own checkpointing)
_CACHE_KWARGS = ("cache", "past_key_values", "past_key_value", "layer_past")


def writes_cache(kwargs: dict[str, Any]) -> bool:
    """Whether a layer called with ``kwargs`` is handed a KV cache to write
    (``use_cache=True``, or a cache object)."""
    return kwargs.get("use_cache") is True or any(kwargs.get(k) is not None for k in _CACHE_KWARGS)


def region_policy(policy: SavePolicy, log: SavedOps | None = None) -> Callable[..., Any]:
    """The policy function of one checkpointed forward (a region), as
    ``create_selective_checkpoint_contexts`` calls it: the user's function (its answer
    checked), or ``policy``'s ops, with torchtitan's rule (every second ``aten.mm`` of the
    region recomputed) where it applies. Made again for every region: the count of ``mm`` is
    the region's."""
    user = policy.function
    mm = 0

    def decide(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        nonlocal mm
        if user is not None:
            choice = user(ctx, op, *args, **kwargs)
            if isinstance(choice, bool):
                choice = CheckpointPolicy.MUST_SAVE if choice else CheckpointPolicy.PREFER_RECOMPUTE
            if not isinstance(choice, CheckpointPolicy):
                raise OptionTypeError(
                    f"checkpoint_policy returned {choice!r} for {op_name(op)}: a policy "
                    "returns a torch.utils.checkpoint.CheckpointPolicy (or a bool: save)."
                )
        else:
            save = policy.saves(op)
            if op is _MM and policy.every_other_mm:
                mm += 1
                save = save and mm % 2 == 1
            choice = CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE
        if log is not None:
            log.add(op, getattr(ctx, "op_output", None), choice in _SAVE)
        return choice

    return decide


class _Together:
    """Context managers entered as one, in order (the recomputation's autocast and the
    selective policy's mode)."""

    def __init__(self, *managers: AbstractContextManager[Any]) -> None:
        self.managers = managers
        self.stack = ExitStack()

    def __enter__(self) -> _Together:
        for m in self.managers:
            self.stack.enter_context(m)
        return self

    def __exit__(self, *exc: Any) -> bool | None:
        return self.stack.__exit__(*exc)


def patch_forwards(
    modules: Sequence[torch.nn.Module],
    autocast: Callable[[], Autocast] | None,
    undo: Undo,
    recomputation: Callable[[], AbstractContextManager[Any]] = nullcontext,
    policy: SavePolicy | None = None,
    log: SavedOps | None = None,
) -> None:
    """Run each module's forward under activation checkpointing (an instance attribute),
    selective under ``policy`` if given (``log`` counts its decisions); the undo step puts back
    exactly what was there, a ``forward`` the user set on the instance too.
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
        checkpoint_forward(m, autocast, recomputation, policy, log)


def checkpoint_forward(
    m: torch.nn.Module,
    autocast: Callable[[], Autocast] | None = None,
    recomputation: Callable[[], AbstractContextManager[Any]] = nullcontext,
    policy: SavePolicy | None = None,
    log: SavedOps | None = None,
) -> torch.nn.Module:
    """Make ``m``'s forward run under activation checkpointing (an instance attribute).

    ``autocast`` (it makes the trace's autocast mode) is entered for the recomputation alone, on
    top of the trace's modes (see the module's docstring): the forward runs inside the trace's
    own autocast already, so both runs use the same kernels and casts and make the same tensors.
    ``recomputation()`` is entered around the recomputation too (``torch.utils.checkpoint``
    enters its recompute context around the whole of it, an early stop included). With a
    ``policy``, PyTorch's selective checkpointing: its caching mode runs in the forward, its
    cached mode (inside the autocast) in the recomputation.
    """
    forward = m.forward

    @contextmanager
    def recompute() -> Iterator[None]:  # entered when the recomputation starts, not before
        with recomputation(), autocast() if autocast is not None else nullcontext():
            yield

    def contexts() -> tuple[AbstractContextManager[Any], AbstractContextManager[Any]]:
        if policy is None:
            return nullcontext(), recompute()
        caching, cached = create_selective_checkpoint_contexts(region_policy(policy, log))
        return caching, _Together(recompute(), cached)

    def checkpointed(*args: Any, **kwargs: Any) -> Any:
        if log is not None and writes_cache(kwargs):  # the class FSDP2's wrapping derives from
            mro = type(m).__mro__
            log.with_cache.add(next(c for c in mro if not c.__name__.startswith("FSDP")).__name__)
        return checkpoint(forward, *args, use_reentrant=False, context_fn=contexts, **kwargs)

    m.forward = checkpointed  # type: ignore[method-assign]
    return m
