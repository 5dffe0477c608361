"""A rank's fake tensors, seen by the model's code as the real tensors they stand for.

A parallel trace runs the model on fake tensors (``meta_widget.distributed.parallel``), and some
libraries take another path when they see one: transformers' ``is_tracing(tensor)`` is true for
a ``FakeTensor`` (it takes it for ``torch.compile`` or ``torch.export`` at work), and a model
that meets it keeps the paths that work without reading values. The one that changes the price
of a step: ``masking_utils._ignore_causal_mask_sdpa`` then never drops an attention mask of ones
in favour of ``is_causal=True``, so SDPA gets an explicit mask, and a mask rules flash attention
out: the rank ran memory-efficient attention over every block, where the same model on one
device (a meta tensor is not a ``FakeTensor``) and a real rank (a real tensor) run flash
attention over the causal half. The kernel router (``meta_widget.trace.kernels``) picks the same
kernel for the same arguments on both; the arguments differed.

While :class:`SeenAsReal` is active, those checks answer for the fake tensors of its mode as they
answer for real tensors: ``transformers.utils.import_utils.is_fake_tensor`` (what its
``is_tracing`` asks) is false for them, and unchanged for every other tensor (fake tensors of
another mode, such as a ``torch.compile`` running in another thread, are still fake to it). The
library is patched only while a rank's trace runs, and only where it is already imported.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any

from torch._subclasses.fake_tensor import FakeTensorMode

__all__ = ["SeenAsReal"]

#: (module, function name): the checks that tell a library a tensor is fake
CHECKS = (("transformers.utils.import_utils", "is_fake_tensor"),)

#: the modes whose fake tensors stand for real ones (one per rank's trace running)
_modes: list[FakeTensorMode] = []
_lock = threading.Lock()
#: the library functions replaced while ``_modes`` is not empty: (module, name) -> the original
_originals: dict[tuple[str, str], Callable[[Any], bool]] = {}


def _seen_as(original: Callable[[Any], bool]) -> Callable[[Any], bool]:
    def is_fake(x: Any) -> bool:
        return original(x) and not any(getattr(x, "fake_mode", None) is m for m in _modes)

    return is_fake


class SeenAsReal:
    """``with SeenAsReal(mode):`` the fake tensors of ``mode`` look real to the checks of
    :data:`CHECKS` (see the module's docstring); on exit, on every path, they are put back
    (when no other rank's trace still needs them)."""

    def __init__(self, mode: FakeTensorMode) -> None:
        self.mode = mode

    def __enter__(self) -> SeenAsReal:
        try:
            with _lock:
                _modes.append(self.mode)
                for key in CHECKS:
                    module = sys.modules.get(key[0])
                    original = getattr(module, key[1], None)
                    if module is not None and original is not None and key not in _originals:
                        _originals[key] = original
                        setattr(module, key[1], _seen_as(original))
        except BaseException:  # an interrupt half-way: nothing stays patched
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        with _lock:
            if self.mode in _modes:
                _modes.remove(self.mode)
            if not _modes:
                for (name, attribute), original in _originals.items():
                    module = sys.modules.get(name)
                    if module is not None:
                        setattr(module, attribute, original)
                _originals.clear()
