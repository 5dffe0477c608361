"""Upper bounds for ops whose output size depends on values: ``unique``, ``nms``, your own ops.

Some ops return as many elements as their values decide: ``torch.unique`` (as many as there are
distinct values), torchvision's ``nms`` (the boxes that survive), a custom op that filters. On
meta there are no values, and their meta or fake kernels ask for a size nobody can give (a fake
kernel calls ``torch.library.get_ctx().new_dynamic_size()``, which meta tensors refuse). Where
the size has a known upper bound, the trace takes it, as ``nonzero`` takes "every element
selected": the outputs get upper-bound shapes, are marked as assumed, and the site is listed in
``Analysis.assumptions`` (kind ``"bound"``).

A registry, :func:`register_bound`, holds one :class:`Bound` per op (``"namespace::name"``):

- ``size(*args, **kwargs) -> int``: the upper bound, given the op's (meta) arguments; the op's
  own fake kernel then runs with a context whose ``new_dynamic_size()`` returns it, so the
  output shapes are the op author's. This is how users register their own ops::

      mw.register_bound("mylib::keep_positive", lambda x: x.numel())

- or ``run(*args, **kwargs)``: a whole meta implementation, for the ATen ops that have no fake
  kernel at all (the ``unique`` family, below).

Built in: ``aten::_unique2``, ``aten::unique_dim``, ``aten::unique_consecutive``,
``aten::unique_dim_consecutive`` (every value distinct) and ``torchvision::nms`` (every box kept;
``batched_nms`` is made of ``nms`` and ``unique``). Bounds apply while the assumption policy
answers data-dependent shapes (``assume_nonzero``, on unless ``strict=True``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, overload

import torch
from torch._library import fake_impl, simple_registry

from ..errors import MetaWidgetError
from ..registry import Registry

__all__ = ["BOUNDS", "Bound", "BoundError", "bound_for", "register_bound", "run_bound"]


class BoundError(MetaWidgetError, ValueError):
    """A bound cannot be registered or used (no such op, no fake kernel, a bad size)."""


SizeFn = Callable[..., int]


@dataclass(frozen=True)
class Bound:
    """The upper bound of one op's data-dependent size: ``size`` or a whole ``run``."""

    op: str
    size: SizeFn | None = None
    run: Callable[..., Any] | None = None
    #: what is assumed, in words (shown in ``Analysis.assumptions``)
    what: str = "the largest possible size"


#: op name (``"namespace::name"``) -> its bound
BOUNDS: Registry[str, Bound] = Registry("bound")


@overload
def register_bound(op: Any, size: SizeFn) -> SizeFn: ...
@overload
def register_bound(op: Any, size: None = None) -> Callable[[SizeFn], SizeFn]: ...


def register_bound(op: Any, size: SizeFn | None = None) -> Any:
    """Give the trace an upper bound for ``op``'s data-dependent output size.

    Parameters
    ----------
    op
        The op: its name ``"namespace::name"``, or the op itself (``torch.ops.mylib.myop``, an
        overload of it, or what ``torch.library.custom_op`` returned).
    size
        ``size(*args, **kwargs) -> int``, called with the op's meta arguments: the largest size
        the op can return (e.g. ``lambda boxes, scores, iou: boxes.shape[0]``). Every
        ``get_ctx().new_dynamic_size()`` of the op's fake kernel gets it (within the ``min``
        and ``max`` the kernel gives). Without it, a decorator.

    The op must have a fake kernel (``torch.library.register_fake``): it makes the outputs.
    A second registration for the same op replaces the first.
    """
    if size is None:
        return lambda fn: register_bound(op, fn)
    if not callable(size):
        raise BoundError(
            f"register_bound({op!r}, ...) needs a function of the op's arguments returning an "
            f"int, not a {type(size).__name__}."
        )
    name = op_name(op)
    BOUNDS.register(name, Bound(name, size=size))
    return size


def op_name(op: Any) -> str:
    """``"namespace::name"`` of an op given by name, packet, overload or custom-op object."""
    if isinstance(op, str):
        if "::" not in op:
            raise BoundError(
                f"register_bound needs the op's qualified name, 'namespace::name', not {op!r} "
                "(e.g. 'mylib::keep_positive' for torch.ops.mylib.keep_positive)."
            )
        return op.split(".", 1)[0]
    for attr in ("_qualified_op_name", "_qualname"):  # a packet; torch.library.custom_op's
        name = getattr(op, attr, None)
        if isinstance(name, str) and "::" in name:
            return name
    name = getattr(getattr(op, "_schema", None), "name", None)
    if isinstance(name, str):  # an overload
        return name
    raise BoundError(
        f"register_bound cannot tell which op {op!r} is: pass its name, 'namespace::name'."
    )


def bound_for(func: Any) -> Bound | None:
    """The bound registered for an op overload, if any."""
    if not BOUNDS:
        return None
    return BOUNDS.get(func._schema.name)


class _BoundContext:
    """What ``torch.library.get_ctx()`` returns to a fake kernel while the bound applies."""

    def __init__(self, op: str, bound: int) -> None:
        self.op, self.bound = op, bound

    def new_dynamic_size(self, *, min: int = 0, max: int | None = None) -> int:
        n = self.bound if max is None or self.bound <= max else max
        return n if n >= min else min

    create_unbacked_symint = new_dynamic_size  # the older name


def run_bound(bound: Bound, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run ``func`` with its data-dependent size at ``bound``; returns its outputs and the size."""
    if bound.run is not None:
        return bound.run(*args, **kwargs), None
    assert bound.size is not None
    n = bound.size(*args, **kwargs)
    if isinstance(n, torch.Tensor) or not isinstance(n, int) or n < 0:
        raise BoundError(
            f"the bound registered for {bound.op} returned {n!r}, not a non-negative int "
            "computed from the arguments' shapes (a meta tensor has no values)."
        )
    kernel = simple_registry.singleton.find(bound.op).fake_impl.kernel
    if kernel is None:
        raise BoundError(
            f"{bound.op} has a bound but no fake kernel to make its outputs: register one "
            f"with @torch.library.register_fake({bound.op!r}) (its output sizes from "
            "torch.library.get_ctx().new_dynamic_size()), as torch.compile needs too."
        )
    with fake_impl.set_ctx_getter(lambda: _BoundContext(bound.op, n)):
        return kernel(*args, **kwargs), n


# ---------------------------------------------------------------------------------------------
# built in: the unique family (no meta kernel at all) and torchvision's nms (a fake kernel)


def _empty(x: torch.Tensor, shape: tuple[int, ...] | torch.Size, dtype: Any = None) -> Any:
    return torch.empty(tuple(shape), dtype=dtype or x.dtype, device=x.device)


def _unique2(
    x: torch.Tensor,
    sorted: bool = True,
    return_inverse: bool = False,
    return_counts: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n = x.numel()
    inverse = _empty(x, x.shape if return_inverse else (0,), torch.long)
    return _empty(x, (n,)), inverse, _empty(x, (n,) if return_counts else (0,), torch.long)


def _unique_consecutive(
    x: torch.Tensor,
    return_inverse: bool = False,
    return_counts: bool = False,
    dim: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if dim is not None:
        return _unique_dim(x, dim, True, return_inverse, return_counts)
    return _unique2(x, True, return_inverse, return_counts)


def _unique_dim(
    x: torch.Tensor,
    dim: int,
    sorted: bool = True,
    return_inverse: bool = False,
    return_counts: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n = x.shape[dim]  # the kernel returns the inverse and the counts whatever the flags
    return _empty(x, x.shape), _empty(x, (n,), torch.long), _empty(x, (n,), torch.long)


def _unique_dim_consecutive(
    x: torch.Tensor, dim: int, return_inverse: bool = False, return_counts: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _unique_dim(x, dim, True, return_inverse, return_counts)


_DISTINCT = "every value distinct"
for _name, _run in (
    ("aten::_unique2", _unique2),
    ("aten::unique_consecutive", _unique_consecutive),
    ("aten::unique_dim", _unique_dim),
    ("aten::unique_dim_consecutive", _unique_dim_consecutive),
):
    BOUNDS.register(_name, Bound(_name, run=_run, what=_DISTINCT))
for _name in ("torchvision::nms", "torchvision::qnms"):
    BOUNDS.register(
        _name,
        Bound(_name, size=lambda boxes, *_a, **_k: int(boxes.shape[0]), what="every box kept"),
    )
