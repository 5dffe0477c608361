"""Kernels a parallel trace's recorder runs for FSDP2's and c10d's ops on fake tensors, in
place of the trip through the fake mode below it.

The fake mode takes 0.5 to 1 ms an op for ops it cannot cache (they mutate or alias their
arguments): an FSDP2 all-gather is ``fsdp.all_gather_copy_in`` and ``c10d._allgather_base_``, a
reduce-scatter ``c10d._reduce_scatter_base_``; together 13 % of a 4-layer FSDP 8 trace of a
2048-wide Llama. What the fake mode gives back for each is known and small, so each kernel here
makes it straight:

- a c10d collective: PyTorch's own meta function of the op (``torch.distributed.
  _meta_registrations``: its output argument and a ``FakeWork``), which is what the fake mode
  runs for it;
- FSDP2's copy-in (``all_gather_copy_in(inputs, output, split_sizes, numel, rank)``, torch
  2.13's signature): this rank's slice of ``output`` as a fake tensor on its storage, not an
  autograd view (as the fake mode returns it), and ``output`` itself. Its meta kernel copies
  nothing, so neither does this.

A call on anything but fake tensors (for ``lift_fresh``: a plain real tensor of at most the
fake mode's ``CONSTANT_NUMEL_LIMIT`` elements, no gradient, under a fake mode), or of another
signature, goes to the op as before. The test (``tests/test_fake_kernels.py``) traces FSDP2 and
tensor-parallel layouts with and without these kernels and compares every number: the timeline
event by event, each call's costs and FLOPs, the collectives.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._subclasses.fake_tensor import CONSTANT_NUMEL_LIMIT, FakeTensor
from torch.utils._mode_utils import no_dispatch

from ..trace.fake_tensors import new_fake
from ..trace.storage import on_meta

try:  # the meta function of each c10d collective: what the fake mode runs for it
    from torch.distributed._meta_registrations import _META_FUNCTIONS
except ImportError:  # pragma: no cover - a PyTorch without the table: the fake mode runs them
    _META_FUNCTIONS = {}

__all__ = ["past_the_fake_mode"]

#: FSDP2's copy-in arguments, in the signature the kernel below is written for
_COPY_IN_ARGUMENTS = [
    "all_gather_inputs",
    "all_gather_output",
    "inp_split_sizes",
    "all_gather_input_numel",
    "rank",
]


def past_the_fake_mode() -> dict[Any, Callable[..., Any]]:
    """The kernels of this module by op (``Recorder.kernels``); an op PyTorch does not have,
    or has in another signature, is left out (the fake mode runs it)."""
    kernels = _collectives()
    kernels[_LIFT_FRESH] = _lift_fresh
    copy_in = _copy_in_op()
    if copy_in is not None:
        kernels[copy_in] = _all_gather_copy_in(copy_in)
    return kernels


_LIFT_FRESH = torch.ops.aten.lift_fresh.default
_FAKE_KEY = torch._C._TorchDispatchModeKey.FAKE


def _lift_fresh(*args: Any, **kwargs: Any) -> Any:
    """``torch.tensor``'s lift of a small real tensor into the fake mode below: as the fake
    mode makes it (a fake tensor on the real one's device, its value a copy kept as its
    ``constant``, which ``.item()`` reads), past the mode's converter."""
    t = args[0] if len(args) == 1 and not kwargs else None
    mode = torch._C._get_dispatch_mode(_FAKE_KEY)
    if (
        type(t) is not torch.Tensor
        or mode is None
        or t.layout is not torch.strided
        or t.requires_grad
        or t.numel() > CONSTANT_NUMEL_LIMIT
        or t.device.type == "meta"
    ):
        return _LIFT_FRESH(*args, **kwargs)
    with no_dispatch():
        constant = t.clone()
        elem = torch.empty_strided(
            constant.shape, constant.stride(), dtype=constant.dtype, device="meta"
        )
    return FakeTensor(mode, elem, constant.device, constant=constant)


def _collectives() -> dict[Any, Callable[..., Any]]:
    kernels: dict[Any, Callable[..., Any]] = {}
    for name, meta in _META_FUNCTIONS.items():
        packet = getattr(torch.ops.c10d, name, None)
        if packet is not None:
            kernels[packet.default] = _collective(packet.default, meta)
    return kernels


def _collective(op: Any, meta: Callable[..., Any]) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        if kwargs or not _fake(args[0] if args else None):  # as the dispatcher passes it
            return op(*args, **kwargs)
        return meta(*args)

    return run


def _fake(x: Any) -> bool:
    """Whether ``x`` (a tensor, or a list of them, or of lists) holds meta or fake tensors."""
    if isinstance(x, torch.Tensor):
        return on_meta(x)
    return isinstance(x, (list, tuple)) and bool(x) and all(_fake(y) for y in x)


def _copy_in_op() -> Any:
    packet = getattr(getattr(torch.ops, "fsdp", None), "all_gather_copy_in", None)
    if packet is None:
        return None
    try:
        op = packet.default
    except AttributeError:  # pragma: no cover - FSDP2 not imported: nothing calls it
        return None
    names = [a.name for a in op._schema.arguments]
    return op if names == _COPY_IN_ARGUMENTS else None


def _all_gather_copy_in(op: Any) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        output = args[1] if len(args) == 5 else None
        if kwargs or type(output) is not FakeTensor or output.dim() != 1:
            return op(*args, **kwargs)
        numel, rank = args[3], args[4]
        if not (type(numel) is int and type(rank) is int):
            return op(*args, **kwargs)
        with torch._C._DisableTorchDispatch():
            elem = torch.empty_strided((0,), (1,), dtype=output.dtype, device="meta")
            step = output.stride(0)
            offset = output.storage_offset() + numel * rank * step
            elem.set_(output.untyped_storage(), offset, (numel,), (step,))
        return new_fake(output.fake_mode, elem, output.fake_device), output

    return run
