"""The changes a trace makes to global and user state, each with its undo step registered
first (see ``meta_widget.undo.Undo``): who is traced (one thread a module), ``training`` flags,
gradients, grad mode, saved-tensors hooks and the cyclic garbage collector."""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

import torch

from ..data.walk import ModuleWalk
from ..errors import MetaWidgetError
from ..undo import Undo

__all__ = ["ConcurrentTraceError", "pause_gc", "set_training"]


class ConcurrentTraceError(MetaWidgetError, RuntimeError):
    """A module is already being traced by another thread."""


#: id of each module being traced -> the token of the trace (its Undo); set and cleared with
#: single dict operations, atomic under the GIL, so no lock an interrupt could leave held
_claims: dict[int, int] = {}


def _claim(tree: ModuleWalk, undo: Undo) -> None:
    """Mark every module of ``tree`` as being traced, or raise if a running trace has one."""
    token = id(undo)
    ids = [id(m) for m in tree.modules]

    def release() -> None:
        for i in ids:
            if _claims.get(i) == token:
                _claims.pop(i, None)

    undo.add(release)
    for i in ids:
        if _claims.setdefault(i, token) != token:
            name = tree.paths[i][0]
            where = f" (its module {name!r})" if name else ""
            root = type(tree.modules[0]).__name__
            raise ConcurrentTraceError(
                f"{root}{where} is being analyzed already, by another thread "
                "(or by a listener of the same analysis). One module cannot be traced twice at "
                "once: its training flags and gradients would be shared. Analyze it again once "
                "the other analysis returns, or give each thread its own model."
            )


_MODULE_TRAIN = torch.nn.Module.train
_MODULE_SETATTR = torch.nn.Module.__setattr__


def set_training(root: torch.nn.Module, mode: bool) -> None:
    """``root.train(mode)``, as fast as a flag per module can be set: ``Module.__setattr__``
    (Python, looking for parameters and buffers of the name first) is skipped where the class
    keeps PyTorch's own, and a module whose class overrides ``train`` is asked to do its
    subtree itself. A module inside itself is set once (``train`` would recurse without end)."""
    todo, seen = [root], set()
    while todo:
        m = todo.pop()
        if id(m) in seen:
            continue
        seen.add(id(m))
        if type(m).train is not _MODULE_TRAIN:
            m.train(mode)
            continue
        _set_flag(m, mode)
        todo.extend(c for c in m._modules.values() if c is not None)


def _set_flag(m: torch.nn.Module, mode: bool) -> None:
    if type(m).__setattr__ is _MODULE_SETATTR:  # what it would end in, for a plain attribute
        object.__setattr__(m, "training", mode)
    else:
        m.training = mode


def remove_module_hooks(modules: Iterable[torch.nn.Module], owns: Callable[[Any], bool]) -> None:
    """Remove the forward hooks ``owns`` picks from each of ``modules``: found by owner, not by
    handle, so a hook whose handle was never kept (an interrupt inside ``register_*``, after it
    stored the hook) goes too. Idempotent."""
    for m in modules:
        for hooks, extras in (
            (m._forward_pre_hooks, (m._forward_pre_hooks_with_kwargs,)),
            (m._forward_hooks, (m._forward_hooks_with_kwargs, m._forward_hooks_always_called)),
        ):
            mine = [k for k, h in hooks.items() if owns(h)]
            for k in mine:
                for extra in extras:
                    extra.pop(k, None)
                hooks.pop(k, None)
            for table in (hooks, *extras):
                if not table:
                    # an emptied dict keeps its grown table (CPython never shrinks one):
                    # ~1 KB per module, 110 MiB on a 100,000-module model, until cleared
                    table.clear()


def _keep_state(
    modules: list[torch.nn.Module], params: list[torch.nn.Parameter], undo: Undo
) -> None:
    """Register restoring ``training`` flags and gradients: a user's meta module is left as it
    was (the forward, backward and optimizer step change both)."""
    flags = [(m, m.training) for m in modules]
    grads = [(p, p.grad) for p in params]

    def restore() -> None:
        for m, flag in flags:
            if m.training is not flag:
                _set_flag(m, flag)
        for p, g in grads:
            if p.grad is not g:
                p.grad = g

    undo.add(restore)


class _SavedTensorsHooks:
    """The saved-tensors hooks of this thread: saved when made, with the undo step popping back
    down to the hooks then on top (also any an interrupted checkpoint left). Idempotent."""

    def __init__(self, undo: Undo) -> None:
        self.top = _top_saved_hooks()
        undo.add(self.restore)

    def push(self, pack: Callable[[torch.Tensor], Any], unpack: Callable[[Any], Any]) -> None:
        torch._C._autograd._push_saved_tensors_default_hooks(pack, unpack)

    def restore(self) -> None:
        while (top := _top_saved_hooks()) is not None and not _same_hooks(top, self.top):
            torch._C._autograd._pop_saved_tensors_default_hooks()


def _top_saved_hooks() -> tuple[Any, Any] | None:
    return torch._C._autograd._top_saved_tensors_default_hooks(True)  # type: ignore[no-any-return]


def _same_hooks(a: tuple[Any, Any] | None, b: tuple[Any, Any] | None) -> bool:
    return a is b or (a is not None and b is not None and a[0] is b[0] and a[1] is b[1])


class _GcPause:
    """The cyclic garbage collector paused while any trace runs, in any thread.

    It would scan the growing records again and again (a third of the time on a 20,000-module
    model); reference counting still frees storages the moment they die, so the memory timeline
    is unchanged. It is switched back on when the last trace ends, if it was on before the first.
    Each step is ordered so that an interrupt between two lines leaves it right after ``resume``;
    the lock is reentrant and let go of in full at the end of each, so that an interrupt landing
    just before a ``with`` releases it cannot leave it held.
    """

    lock: ClassVar[threading.RLock] = threading.RLock()
    holders: ClassVar[set[int]] = set()  # one token per trace running
    enable_after: ClassVar[bool] = False

    @classmethod
    def pause(cls, token: int) -> None:
        try:
            with cls.lock:
                if not cls.holders:
                    cls.enable_after = gc.isenabled()
                cls.holders.add(token)
                gc.disable()
        finally:
            cls.let_go()

    @classmethod
    def resume(cls, token: int) -> None:
        try:
            with cls.lock:
                if token in cls.holders:
                    if cls.holders == {token} and cls.enable_after:
                        gc.enable()  # before the token goes: an interrupt here is harmless
                    cls.holders.discard(token)
        finally:
            cls.let_go()

    @classmethod
    def let_go(cls) -> None:
        """Release the lock as often as this thread holds it."""
        while cls.lock._is_owned():  # type: ignore[attr-defined]
            cls.lock.release()


def pause_gc(undo: Undo) -> None:
    """Pause the cyclic garbage collector (see :class:`_GcPause`); ``undo`` resumes it."""
    token = id(undo)
    undo.add(lambda: _GcPause.resume(token))
    _GcPause.pause(token)
