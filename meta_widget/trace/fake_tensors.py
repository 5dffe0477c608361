"""Fake tensors made as ``FakeTensor(mode, elem, device)`` makes them, in a quarter of the time.

The op cache rebuilds the outputs of a cached op on fake tensors (a parallel trace runs on
them): about 3,000 a trace. ``FakeTensor.__new__`` checks its arguments, normalizes the device,
and sets a dozen attributes one by one, five of them through descriptors that set three more
each (its ``*_memo`` slots): 12.8 us a tensor, a tenth of a 70B plan's time. The outputs the
cache rebuilds need none of the checks (their device was a fake tensor's, already normalized),
and every attribute but the mode and the device starts as None.

:func:`new_fake` makes the subclass as the constructor does (``Tensor._make_subclass`` with the
device for the backend keys, and the mode's data-pointer policy) and gives it, in one dict
update, the state the constructor gave a tensor it made in this process: 2.9 us. That state is
read from a tensor ``FakeTensor`` itself made, and checked once against it (every attribute and
the dispatch keys); where it differs (another PyTorch), or in ``FakeTensorConfig.debug`` (which
records a traceback per tensor), the constructor is called.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorConfig, FakeTensorMode

__all__ = ["detached", "new_fake"]

_MAKE_SUBCLASS = torch.Tensor._make_subclass
_THROW_ON_DATA_PTR = torch._C._set_throw_on_mutable_data_ptr
_WARN_ON_DATA_PTR = torch._C._set_warn_deprecated_on_mutable_data_ptr
#: the attributes set per tensor; every other one the constructor sets is None
_OWN = ("fake_mode", "_fake_device")


def new_fake(mode: FakeTensorMode, elem: torch.Tensor, device: torch.device) -> FakeTensor:
    """``FakeTensor(mode, elem, device)`` for a plain meta ``elem`` (fresh, or a view the
    caller made) and a ``device`` taken from a fake tensor's ``fake_device``."""
    state = _plain_state()
    if state is None or FakeTensorConfig.debug:
        return FakeTensor(mode, elem, device)
    return _made(mode, elem, device, state)


def detached(t: torch.Tensor) -> torch.Tensor:
    """``t.detach()`` past every mode, for a plain meta tensor and a fake tensor (that holds no
    constant; made as a fake tensor on ``t``'s storage, offset, sizes and strides, with no
    autograd history, as the op makes it). The op is a view that computes and allocates
    nothing, so a trace records nothing of it, and the trip through the trace's modes cost
    25 us; a saved-tensors pack hook calls it for what autograd saves. Any other tensor (a
    DTensor, a subclass): ``t.detach()``."""
    if type(t) is torch.Tensor and t.is_meta:
        with torch._C._DisableTorchDispatch():
            return t.detach()
    if type(t) is not FakeTensor or t.constant is not None or t.layout is not torch.strided:
        return t.detach()
    with torch._C._DisableTorchDispatch():
        elem = torch.empty_strided((0,), (1,), dtype=t.dtype, device="meta")
        elem.set_(t.untyped_storage(), t.storage_offset(), t.shape, t.stride())
    return new_fake(t.fake_mode, elem, t.fake_device)


def _made(
    mode: FakeTensorMode, elem: torch.Tensor, device: torch.device, state: dict[str, Any]
) -> FakeTensor:
    t = _MAKE_SUBCLASS(
        FakeTensor, elem, elem.requires_grad, dispatch_device=True, device_for_backend_keys=device
    )
    if mode._allow_unsafe_data_ptr_access:
        _WARN_ON_DATA_PTR(t)
    else:
        _THROW_ON_DATA_PTR(t)
    d = t.__dict__
    d.update(state)
    d["fake_mode"] = mode
    d["_fake_device"] = device
    return t  # type: ignore[no-any-return]


@functools.cache
def _plain_state() -> dict[str, Any] | None:
    """The attributes ``FakeTensor``'s constructor gives a plain tensor, other than its mode and
    device, if they are all None and :func:`_made` makes the same tensor with them; else None
    (the constructor is used)."""
    mode = FakeTensorMode()
    device = torch.device("cpu")
    with torch._C._DisableTorchDispatch():
        elems = [torch.empty_strided((2, 3), (3, 1), device="meta") for _ in range(2)]
    made = FakeTensor(mode, elems[0], device)
    state = {k: v for k, v in vars(made).items() if k not in _OWN}
    if any(v is not None for v in state.values()) or set(_OWN) - set(vars(made)):
        return None
    try:
        ours = _made(mode, elems[1], device, state)
    except (TypeError, AttributeError, RuntimeError):
        return None
    same = (
        vars(ours) == vars(made)
        and torch._C._dispatch_keys(ours) == torch._C._dispatch_keys(made)
        and ours.device == made.device
        and ours.requires_grad == made.requires_grad
    )
    return state if same else None
