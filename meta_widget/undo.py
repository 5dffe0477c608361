"""Undoing what a trace changes, whatever interrupts it.

A trace changes state that is not its own: hooks and flags on the user's module, the dispatch and
function mode stacks, grad mode, saved-tensors hooks, the garbage collector, the default device.
Python's ``with`` cannot promise to undo such changes under Ctrl-C: an interrupt can land as
``__exit__`` starts, or halfway through it, and ``__exit__`` of PyTorch's modes is not safe to run
twice. So every change registers an idempotent undo step (it restores a saved state) *before* it
is made, and :class:`Undo` runs the steps from two nested ``finally`` blocks, absorbing
interrupts until every step has run (``passes.trace``; ``tests/hostile/test_interrupts.py``
injects an interrupt at every line of it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.utils._python_dispatch as _python_dispatch
from torch.utils import _device
from torch.utils._python_dispatch import TorchDispatchMode

T = TypeVar("T")

__all__ = [
    "DispatchModes",
    "FunctionModes",
    "Undo",
    "interrupt_behind",
    "on_meta",
    "set_grad_enabled",
    "undoing",
    "without_grad",
]


class Undo:
    """The undo steps of the changes a trace makes to global or user state.

    Each change registers its step *before* it is made (a step must then also be right when its
    change never happened), and every step is idempotent: it restores a saved state rather than
    reversing an action, so running it again is harmless. :meth:`run` runs the steps, the last
    added first, and removes each only once it has run: an interrupt that lands inside ``run``
    leaves the steps not yet done in place for a second ``run``. Callers therefore run it twice,
    from two nested ``finally`` blocks, each starting with the call (see ``passes.trace``)::

        undo = Undo()
        try:
            try:
                ...  # undo.add(step) before each change, then the change
            finally:
                undo.run()
        finally:
            undo.run()  # the rest, if an interrupt broke the first run off
    """

    def __init__(self) -> None:
        self.steps: list[Callable[[], object]] = []

    def add(self, step: Callable[[], object]) -> None:
        """Register ``step``; make the change it undoes after this returns."""
        self.steps.append(step)

    def run(self) -> None:
        """Run every step, the last added first. Whatever a step raises (``KeyboardInterrupt``
        included) waits until every other step has run; then the first is raised.

        A step that fails with an ``Exception`` is not tried again; one that is interrupted is
        (the interrupt may have come before it even started), up to :attr:`RETRIES` times.
        """
        steps = self.steps
        first: BaseException | None = None
        interrupts = 0
        while steps:
            try:
                steps[-1]()
            except Exception as exc:  # a failing step must not stop the others
                if first is None:
                    first = exc
            except BaseException as exc:  # an interrupt: the same step again
                if first is None:
                    first = exc
                interrupts += 1
                if interrupts <= self.RETRIES:
                    continue
            steps.pop()
        if first is not None:
            raise first

    #: how many interrupts one run of the steps absorbs (retrying the interrupted step)
    RETRIES = 10


class DispatchModes:
    """The dispatch-mode state of this thread, saved to be restored exactly (see :meth:`restore`).

    Besides its stack, ``TorchDispatchMode.__enter__`` sets three module flags of
    ``torch.utils._python_dispatch`` (and one in C): ``__exit__`` pops them back, which is not
    safe to run twice nor to break off halfway, so the saved values are written back instead.
    """

    _FLAGS = (
        "_is_in_torch_dispatch_mode",
        "_is_in_non_infra_torch_dispatch_mode",
        "_is_in_any_mode_without_ignore_compile_internals",
    )

    def __init__(self) -> None:
        self.depth = torch._C._len_torch_dispatch_stack()
        self.flags = tuple(getattr(_python_dispatch, name) for name in self._FLAGS)

    def restore(self, mode: TorchDispatchMode) -> None:
        """Pop every mode pushed since (``mode`` and any left by an interrupted body), and put
        the flags back. Idempotent."""
        while torch._C._len_torch_dispatch_stack() > self.depth:
            torch._C._pop_torch_dispatch_stack(None)
        for name, value in zip(self._FLAGS, self.flags, strict=True):
            setattr(_python_dispatch, name, value)
        _python_dispatch.set_is_in_mode_without_ignore_compile_internals(self.flags[2])
        for stack in ("old_dispatch_mode_flags", "old_non_infra_dispatch_mode_flags"):
            getattr(mode, stack, []).clear()
        getattr(mode, "old_without_ignore_compile_internals_dispatch_mode_flags", []).clear()


class FunctionModes:
    """This thread's ``TorchFunctionMode`` stack, saved to be restored exactly.

    Restoring empties the stack and pushes the saved modes back, so it is idempotent and also
    repairs a stack an interrupted ``torch.device(...)`` context left reordered.
    """

    def __init__(self) -> None:
        self.modes = _function_stack()

    def restore(self) -> None:
        """Put the saved stack back (nothing to do when it is already there). Idempotent."""
        if [id(m) for m in _function_stack()] == [id(m) for m in self.modes]:
            return
        while torch._C._len_torch_function_stack():
            torch._C._pop_torch_function_stack()
        for mode in self.modes:
            torch._C._push_on_torch_function_stack(mode)


def _function_stack() -> list[Any]:
    return [torch._C._get_function_stack_at(i) for i in range(torch._C._len_torch_function_stack())]


def set_grad_enabled(enabled: bool, undo: Undo) -> None:
    """Turn grad mode to ``enabled``, the step putting it back registered first.

    ``with torch.no_grad():`` is not enough under Ctrl-C: its ``__enter__`` is Python code, and an
    interrupt landing after it turned gradients off but before it returned leaves them off for the
    rest of the session (``__exit__`` never runs).
    """
    before = torch.is_grad_enabled()
    undo.add(lambda: torch._C._set_grad_enabled(before))
    torch._C._set_grad_enabled(enabled)


def undoing(work: Callable[[Undo], T]) -> T:
    """``work(undo)``, then ``undo``'s steps run from two nested ``finally`` blocks (the second
    for what an interrupt broke off in the first; see :class:`Undo`)."""
    undo = Undo()
    try:
        try:
            return work(undo)
        finally:
            undo.run()
    finally:
        undo.run()


def without_grad(run: Callable[[], T]) -> T:
    """``run()`` with grad mode off, put back exactly whatever interrupts it (see
    :func:`set_grad_enabled`)."""

    def work(undo: Undo) -> T:
        set_grad_enabled(False, undo)
        return run()

    return undoing(work)


def on_meta(build: Callable[[], Any]) -> Any:
    """``build()`` under ``torch.device("meta")``; the default device is put back exactly.

    Leaving ``torch.device(...)`` runs Python code that reorders the function-mode stack: an
    interrupt landing inside it would leave ``meta`` the default device of the session. So the
    state before (the module's ``CURRENT_DEVICE`` and the stack) is saved first and written back
    from two nested ``finally`` blocks, each a no-op when the context left things as they were.
    Grad mode too: the model's own initialization (``nn.init``) turns it off in a
    ``torch.no_grad()`` block, which an interrupt inside its ``__enter__`` leaves off.
    """

    saved = _DeviceState()
    try:
        try:
            return _build_under_meta(build)
        finally:
            saved.restore()
    finally:
        saved.restore()  # should an interrupt have broken off the first


def _build_under_meta(build: Callable[[], Any]) -> Any:
    try:
        with torch.device("meta"):
            return build()
    except Exception as exc:
        interrupt = interrupt_behind(exc)
        if interrupt is not None:  # torch's exit broke off halfway: the interrupt is what happened
            raise interrupt from None
        raise


def interrupt_behind(exc: BaseException) -> KeyboardInterrupt | None:
    """The ``KeyboardInterrupt`` an error was raised while handling, if any.

    Some of torch's own cleanup fails once an interrupt broke it off halfway (leaving
    ``torch.device(...)`` or ``torch.utils.checkpoint``'s recomputation: "trying to pop from
    empty mode stack"); that error is no error of the model, and the user's Ctrl-C must still
    reach them.
    """
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            return cause
        seen.add(id(cause))
        cause = cause.__context__
    return None


class _DeviceState:
    """The default device (``torch.utils._device.CURRENT_DEVICE`` and the function modes), and
    grad mode."""

    def __init__(self) -> None:
        self.device = _device.CURRENT_DEVICE
        self.modes = FunctionModes()
        self.grad = torch.is_grad_enabled()

    def restore(self) -> None:
        """Write the saved state back. Idempotent."""
        _device.CURRENT_DEVICE = self.device
        self.modes.restore()
        torch._C._set_grad_enabled(self.grad)
