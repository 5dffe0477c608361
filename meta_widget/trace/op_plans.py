"""How the recorder handles each aten op (:class:`OpPlan`), decided the first time the op runs
(:func:`plan_op`): the kernel that runs it (the op itself, the assumption policy's answer, a fixed
meta kernel, the target device's), its FLOP formula (``FlopCounterMode``'s registry plus the
kernels it lacks; on a DTensor op's local tensors), whether its composite decomposition runs
instead (as ``FlopCounterMode`` decomposes), and what its cost records (``trace.costs``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

from .assume import META_FIXES, data_dependent
from .costs import causal_index, is_convolution, is_foreach, is_free, is_gather, shape_kind
from .kernels import EXTRA_FLOPS
from .opcache import VIEW, static_bypass
from .storage import local

__all__ = ["PRIM_DEVICE", "OpPlan", "plan_op"]

_COMPOSITE = torch._C.DispatchKey.CompositeImplicitAutograd
#: FLOP formulas by overload packet: FlopCounterMode's registry, plus kernels it lacks
_FLOPS = {**flop_registry, **EXTRA_FLOPS}
#: ``prim.device``: a tensor's ``.device``, asked of every gradient by autograd
PRIM_DEVICE = torch.ops.prim.device.default


@dataclass(frozen=True, slots=True)
class OpPlan:
    """How the recorder handles one aten op, decided the first time it runs."""

    #: the op's name in FLOP tables and the timeline (``aten.mm``)
    name: str
    #: run its composite decomposition instead: it holds ops that count FLOPs (as
    #: ``FlopCounterMode`` decomposes); elsewhere the fused kernel runs, as on a real device
    decompose: bool
    #: the kernel: the op itself, the assumption policy's answer, or a fixed meta kernel
    run: Callable[..., Any]
    #: ``FlopCounterMode``'s formula (called with ``out_val=`` the output), or None: counts 0
    flops: Callable[..., int] | None
    #: why the op cache never holds this op (``meta_widget.trace.opcache``), or None
    uncached: str | None = None
    #: bytes the target device's kernel allocates and frees inside the op (``kernels.py``), or
    #: None: none
    workspace: Callable[..., int] | None = None
    #: a view or metadata op: it costs nothing (``meta_widget.trace.costs``)
    free: bool = False
    #: the position of ``is_causal`` in a fused attention kernel that skips masked blocks
    causal: int | None = None
    #: a convolution: float32 runs at the TF32 peak
    convolution: bool = False
    #: a multi-tensor op (``_foreach_*``): a cost per tensor of its lists
    foreach: bool = False
    #: a gather (``embedding``...): it reads from its first argument only what it outputs
    gather: bool = False
    #: a matrix multiply or fused attention: what its cost records of its shape
    shape: Any = None


def plan_op(
    func: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    answer: Callable[[Any, tuple[Any, ...], dict[str, Any]], Any] | None,
    kernels: Mapping[Any, Callable[..., Any]],
    workspaces: Mapping[Any, Callable[..., int]],
    local_flops: bool,
) -> OpPlan:
    """How to handle ``func`` (called with ``args`` and ``kwargs`` the first time): ``answer``
    the assumption policy's (None: no policy), ``kernels`` the target device's by op,
    ``workspaces`` the scratch bytes of its kernels by overload packet, ``local_flops`` a
    DTensor trace's (FLOPs and workspaces counted on each argument's local tensor)."""
    run: Callable[..., Any] = func
    answered = data_dependent(func) and answer is not None
    if answered:
        assert answer is not None

        def run(*a: Any, **k: Any) -> Any:
            return answer(func, a, k)

    elif func in META_FIXES:
        run = META_FIXES[func]
    elif func in kernels:
        run = kernels[func]
    flops = _FLOPS.get(func._overloadpacket)
    workspace = workspaces.get(func._overloadpacket)
    uncached = static_bypass(func, answered)
    return OpPlan(
        name=str(func._overloadpacket),
        decompose=_decomposition_counts(func, args, kwargs),
        run=run,
        flops=_on_local(flops) if flops is not None and local_flops else flops,
        uncached=uncached,
        workspace=_on_local(workspace)
        if workspace is not None and local_flops
        else workspace,  # a DTensor op's kernel runs on its local tensors
        free=is_free(func, uncached, VIEW),
        causal=causal_index(func),
        convolution=is_convolution(func),
        foreach=is_foreach(func),
        gather=is_gather(func),
        shape=shape_kind(func),
    )


def _on_local(formula: Callable[..., int]) -> Callable[..., int]:
    """``formula`` applied to the local tensors of DTensor arguments: one device's FLOPs."""

    def count(*args: Any, **kwargs: Any) -> int:
        return formula(*_locals(args), **{k: _locals(v) for k, v in kwargs.items()})

    return count


def _locals(value: Any) -> Any:
    """``value`` with each tensor in it, nested in tuples, lists and dicts, its local one:
    ``tree_map_only(torch.Tensor, local, value)`` for an op's arguments, at a tenth of the cost
    (a DTensor op's FLOPs are counted on every call: the op cache keys no DTensor)."""
    if isinstance(value, torch.Tensor):
        return local(value)
    kind = type(value)
    if kind is tuple or kind is list:
        return kind(_locals(v) for v in value)
    if kind is dict:
        return {k: _locals(v) for k, v in value.items()}
    return value


class _FlopProbe(TorchDispatchMode):
    """Sees whether any op with a FLOP formula runs (used once per composite op)."""

    found = False

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        if func._overloadpacket in _FLOPS:
            self.found = True
        return func(*args, **(kwargs or {}))


def _decomposition_counts(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether ``func`` has a composite decomposition holding ops that count FLOPs."""
    if func is PRIM_DEVICE or not (
        _COMPOSITE in func.py_kernels
        or torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), _COMPOSITE)
    ):
        return False
    if func._schema.is_mutable:
        return True  # never run twice; decompose as FlopCounterMode does
    probe = _FlopProbe()
    try:
        with probe:
            func.decompose(*args, **kwargs)
    except Exception:
        return True
    return probe.found
