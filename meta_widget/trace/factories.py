"""Tensors the model makes without a device, put on meta while a trace runs the user's code.

A ``forward`` may build tensors with no ``device=`` argument: ``torch.ones(t, t)``, a causal mask
from ``torch.full(...)``, positions from ``torch.arange(n)``. Outside any context they are real
CPU tensors: a trace would really allocate them (a 128k x 128k mask would take 64 GiB of RAM) and
the memory model would never see them. While the trace runs the model's forward, its loss and
its backward, :class:`DeviceLessFactories` makes meta the default device (PyTorch's own
``torch.device(...)`` context, whose ``DeviceContext`` it extends), so those tensors land on meta
and are counted like any other allocation; an explicit ``device=`` is kept as given. It also
counts them, by source line, for the analysis's notes. The optimizer step runs without it: its
device-less tensors (Adam's ``step`` counters) stay on the host, as on a real device.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils import _device

from ..undo import FunctionModes
from .kernels import AttentionKernels
from .sites import find_site, source_name

__all__ = ["DeviceLessFactories"]

#: the functions whose tensors land on the default device (PyTorch's own set)
_CONSTRUCTORS = _device._device_constructors()


class DeviceLessFactories(_device.DeviceContext):
    """Meta as the default device, counting the factory calls that relied on it.

    :meth:`enter` makes it the default device (``undo`` first gets :meth:`leave`); :meth:`leave`
    takes it off again, leaving any other mode where it is. ``made`` maps ``"torch.ones at
    file.py:LINE"`` to the number of tensors made there without a device.
    """

    def __init__(self, device: str = "meta") -> None:
        super().__init__(device)
        #: the attention (and dropout, RNN) kernels of the target device, routed in this mode
        #: while it is on (set by the trace): a second mode would cost every torch call 5 us more
        self.kernels: AttentionKernels | None = None
        self.made: dict[str, int] = {}
        self._saved_device = _device.CURRENT_DEVICE
        self._saved_modes = FunctionModes()

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if kwargs.get("device") is None and func in _CONSTRUCTORS:
            kwargs["device"] = self.device
            self._count(func)
        elif self.kernels is not None:
            return self.kernels.route(func, args, kwargs)
        return func(*args, **kwargs)

    def _count(self, func: Any) -> None:
        site, _ = find_site()
        where = f"{source_name(site.file)}:{site.line}" if site else "?"
        key = f"torch.{getattr(func, '__name__', func)} at {where}"
        self.made[key] = self.made.get(key, 0) + 1

    def enter(self, undo: Any) -> None:
        """Make meta the default device; ``undo`` first gets the step that takes it off."""
        self._saved_device = _device.CURRENT_DEVICE
        self._saved_modes = FunctionModes()
        undo.add(self.leave)
        self.__enter__()

    def leave(self) -> None:
        """Put the default device back as :meth:`enter` found it. Idempotent, and any mode
        pushed since stays (the attention kernels' mode, for one)."""
        _device.CURRENT_DEVICE = self._saved_device
        stack = [
            torch._C._get_function_stack_at(i) for i in range(torch._C._len_torch_function_stack())
        ]
        saved = self._saved_modes.modes
        # the previous default device (DeviceContext.__enter__ took it off), at the bottom
        previous = [m for m in saved if isinstance(m, _device.DeviceContext)]
        wanted = [*previous, *(m for m in stack if m is not self and m not in previous)]
        if [id(m) for m in wanted] != [id(m) for m in stack]:
            while torch._C._len_torch_function_stack():
                torch._C._pop_torch_function_stack()
            for mode in wanted:
                torch._C._push_on_torch_function_stack(mode)

    def notes(self) -> list[str]:
        """The note for the analysis, if any tensor was made without a device."""
        if not self.made:
            return []
        total = sum(self.made.values())
        sites = sorted(self.made.items(), key=lambda kv: -kv[1])
        shown = ", ".join(f"{k} ({n}×)" if n > 1 else k for k, n in sites[:5])
        more = f" and {len(sites) - 5} more site(s)" if len(sites) > 5 else ""
        return [
            f"{total} tensor(s) were made without a device ({shown}{more}): they were made on "
            "meta (the default device while the model runs) and count in memory like any other "
            "allocation, as they would with torch.set_default_device on the target device. "
            "Without it a real run makes them on the CPU."
        ]
