"""The optimizer's multi-tensor ops on DTensors, run on each rank's shards directly.

An optimizer step with ``foreach`` (PyTorch's default on CUDA) calls ``torch._foreach_*`` ops on
lists of every parameter, gradient and state tensor. On FSDP2's and tensor parallelism's
DTensors, DTensor finds each such op's sharding by expanding a strategy per list position and
then fixing up each expanded strategy against the whole argument list: a cost quadratic in the
number of parameters, paid again for every op of every step (Adam's scalars change each step,
and each trace has meshes of its own, so DTensor's cache never hits). For a 16-layer Llama
under FSDP 8 that was 2.5 s of a 5.6 s trace, and more the deeper the model.

The ops the optimizers call are pointwise. Where every DTensor at a list position has the same
spec (mesh, placements, shape, stride, dtype) and none is ``Partial``, DTensor's answer is to
run the op on the local shards as they are and give each output its input's placements: no
redistribution, no collective. :class:`ShardLocalForeach` does exactly that, in linear time:
the same local op, on the same local tensors, so the recorder below sees the same allocations
and kernels. Anything else (a plain tensor among DTensors, positions whose specs differ, a
``Partial`` gradient, a single tensor operand) goes DTensor's own way, its errors included.
``tests/test_shard_foreach.py`` checks that a trace is the same either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.distributed.tensor import DTensor
from torch.overrides import TorchFunctionMode

__all__ = ["POINTWISE_FOREACH", "ShardLocalForeach"]

#: the pointwise multi-tensor ops of ``torch.optim`` (in place and not): element by element,
#: so a shard's output is the op of its shards (``_foreach_norm``, a reduction, is not here)
_POINTWISE_NAMES = (
    "add", "sub", "mul", "div", "addcmul", "addcdiv", "lerp", "sqrt", "neg", "maximum",
    "reciprocal", "pow", "copy", "zero", "sign", "exp",
)  # fmt: skip
POINTWISE_FOREACH = frozenset(
    getattr(torch, f"_foreach_{name}{suffix}")
    for name in _POINTWISE_NAMES
    for suffix in ("", "_")
    if hasattr(torch, f"_foreach_{name}{suffix}")
)


class ShardLocalForeach(TorchFunctionMode):
    """While on, a pointwise ``torch._foreach_*`` op on DTensor lists whose positions agree runs
    on their local shards (module docstring); every other call is passed on unchanged."""

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func in POINTWISE_FOREACH:
            lists = _agreeing_dtensor_lists(args, kwargs)
            if lists is not None:
                return _run_on_shards(func, args, kwargs, lists[0])
        return func(*args, **kwargs)


def _agreeing_dtensor_lists(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> list[Sequence[DTensor]] | None:
    """The tensor lists among the arguments, when every tensor argument is in one, each a
    DTensor, and the specs agree position by position with no ``Partial``; else None."""
    lists: list[Sequence[DTensor]] = []
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            return None  # a single tensor operand (a scalar tensor): DTensor's own rules
        if isinstance(value, (list, tuple)) and value and isinstance(value[0], torch.Tensor):
            if not all(type(t) is DTensor for t in value):
                return None
            lists.append(value)
    if not lists or any(len(other) != len(lists[0]) for other in lists):
        return None
    for position in zip(*lists, strict=True):  # the lengths are equal (checked above)
        spec = position[0]._spec
        if spec.tensor_meta is None or any(p.is_partial() for p in spec.placements):
            return None
        if not position[0]._local_tensor.is_contiguous() or not position[0].is_contiguous():
            return None
        if any(t._spec != spec for t in position[1:]):
            return None
    return lists


def _run_on_shards(
    func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], first: Sequence[DTensor]
) -> Any:
    """``func`` on the local shards; outputs wrapped in the placements of the first list's."""
    result = func(*_locals(args), **{k: _locals((v,))[0] for k, v in kwargs.items()})
    if func.__name__.endswith("_"):
        return list(first)  # in place: the shards changed where they are; DTensor returns self
    wrapped = []
    for out, like in zip(result, first, strict=True):
        meta = like._spec.tensor_meta
        assert meta is not None  # checked by _agreeing_dtensor_lists
        spec = like._spec.shallow_copy_with_tensor_meta(
            type(meta)(meta.shape, meta.stride, out.dtype)
        )
        wrapped.append(DTensor(out, spec, requires_grad=out.requires_grad))
    return type(result)(wrapped) if isinstance(result, tuple) else wrapped


def _locals(values: tuple[Any, ...]) -> tuple[Any, ...]:
    """``values`` with each list of DTensors replaced by their local shards."""
    return tuple(
        [t._local_tensor for t in v]
        if isinstance(v, (list, tuple)) and v and type(v[0]) is DTensor
        else v
        for v in values
    )
