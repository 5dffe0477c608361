"""Stand-ins for the globals a ``torch.save`` pickle names: what ``torch.load(weights_only=True)``
would call is given a pure function here that builds a description instead (a tensor's shape
and dtype, never its storage); the tables of dtypes, storage types and allowed names are read
from torch once (``vars(torch)``, so no import runs).
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import heavy


@dataclass(frozen=True, slots=True)
class StoredTensor:
    """A tensor of the pickle: its shape and dtype (as torch spells it, without ``torch.``)."""

    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * _itemsizes()[self.dtype]


@dataclass(frozen=True, slots=True)
class Opaque:
    """A value ``torch.load(weights_only=True)`` would build from an allowed global that is not
    a tensor or a container (a device, a layout, a user-allowed class): named, never built."""

    kind: str


@dataclass(frozen=True, slots=True)
class Storage:
    dtype: str


@dataclass(frozen=True, slots=True)
class Global:
    """A global the machine knows: ``call(args)`` builds its stand-in (pure, never torch's)."""

    name: str
    call: Callable[[tuple[Any, ...]], Any]


_CACHE: dict[str, Any] = {}


def _dtypes() -> dict[str, Any]:
    """``"torch.float32"`` -> the torch dtype, for every dtype torch defines (no import runs)."""
    if "dtypes" not in _CACHE:
        torch = heavy.torch()
        _CACHE["dtypes"] = {
            str(d): d for d in list(vars(torch).values()) if isinstance(d, torch.dtype)
        }
    return _CACHE["dtypes"]  # type: ignore[no-any-return]


def _itemsizes() -> dict[str, int]:
    if "itemsizes" not in _CACHE:
        _CACHE["itemsizes"] = {k.removeprefix("torch."): d.itemsize for k, d in _dtypes().items()}
    return _CACHE["itemsizes"]  # type: ignore[no-any-return]


def storage_dtypes() -> dict[str, str]:
    """``"torch.FloatStorage"`` -> ``"float32"``: the storage classes torch.save names."""
    if "storages" not in _CACHE:
        torch = heavy.torch()
        table = {"torch.UntypedStorage": "uint8", "torch.storage.UntypedStorage": "uint8"}
        for dtype, name in torch.storage._dtype_to_storage_type_map().items():
            table[f"torch.{name}"] = str(dtype).removeprefix("torch.")
        _CACHE["storages"] = table
    return _CACHE["storages"]  # type: ignore[no-any-return]


def allowed_names() -> set[str]:
    """Globals ``torch.load(weights_only=True)`` would call: torch's own list and the user's."""
    if "allowed" not in _CACHE:
        torch = heavy.torch()
        names: set[str] = set()
        unpickler = getattr(torch, "_weights_only_unpickler", None)
        own = getattr(unpickler, "_get_allowed_globals", None)
        if callable(own):
            names.update(own())
        _CACHE["allowed"] = names
    user = {
        f"{g.__module__}.{g.__qualname__}" if not isinstance(g, tuple) else g[1]
        for g in heavy.torch().serialization.get_safe_globals()
    }
    return _CACHE["allowed"] | user  # type: ignore[no-any-return]


def opaque(kind: str, args: tuple[Any, ...]) -> Opaque:
    return Opaque(kind)


def _shape(size: Any, dtype: str) -> tuple[int, ...]:
    if not isinstance(size, tuple | list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in size
    ):
        raise ValueError("a shape that is not a list of integers >= 0")
    tensor = StoredTensor(tuple(size), dtype)
    if tensor.nbytes >= 2**63:
        raise ValueError(f"a shape of {tensor.nbytes} bytes, past what any tensor can hold")
    return tensor.shape


def _dtype_name(value: Any) -> str:
    if not isinstance(value, Global) or value.name not in _dtypes():
        raise TypeError("a dtype that is not a torch dtype")
    return value.name.removeprefix("torch.")


def _tensor_from_storage(args: tuple[Any, ...]) -> StoredTensor:
    # _rebuild_tensor(_v2)(storage, offset, size, stride, ...), _rebuild_qtensor(same)
    storage, size = args[0], args[2]
    if not isinstance(storage, Storage):
        raise TypeError("a tensor without a storage")
    return StoredTensor(_shape(size, storage.dtype), storage.dtype)


def _tensor_v3(args: tuple[Any, ...]) -> StoredTensor:
    # _rebuild_tensor_v3(storage, offset, size, stride, requires_grad, hooks, dtype, ...)
    if not isinstance(args[0], Storage):
        raise TypeError("a tensor without a storage")
    dtype = _dtype_name(args[6])
    return StoredTensor(_shape(args[2], dtype), dtype)


def _tensor_of(value: Any) -> Any:
    if not isinstance(value, StoredTensor | Opaque):
        raise TypeError(f"a {type(value).__name__} where a tensor belongs")
    return value


def _meta_tensor(args: tuple[Any, ...]) -> StoredTensor:
    dtype = _dtype_name(args[0])  # _rebuild_meta_tensor_no_storage(dtype, size, stride, rg)
    return StoredTensor(_shape(args[1], dtype), dtype)


def _wrapper_subclass(args: tuple[Any, ...]) -> StoredTensor:
    dtype = _dtype_name(args[1])  # (cls, dtype, size, stride, offset, layout, device, rg)
    return StoredTensor(_shape(args[2], dtype), dtype)


def _device_tensor(args: tuple[Any, ...]) -> StoredTensor:
    data, dtype = _tensor_of(args[0]), _dtype_name(args[1])  # (cpu tensor, dtype, device, rg)
    return StoredTensor(_shape(data.shape, dtype), dtype)


def _from_type(args: tuple[Any, ...]) -> Any:
    func, inner = args[0], args[2]  # _rebuild_from_type_v2(func, type, args, state)
    if not isinstance(func, Global) or not isinstance(inner, tuple):
        raise TypeError("a tensor subclass rebuilt by something that is not a function")
    return func.call(inner)


def _ordered_dict(args: tuple[Any, ...]) -> OrderedDict[Any, Any]:
    if args and not (isinstance(args[0], list | tuple) and not args[0]):
        raise TypeError("an OrderedDict built from values")
    return OrderedDict()


def _encode(args: tuple[Any, ...]) -> bytes:
    # protocol 2 writes bytes as _codecs.encode(text, "latin1")
    text, codec = args
    if not isinstance(text, str) or codec not in ("latin1", "latin-1"):
        raise TypeError("_codecs.encode of something that is not text")
    return text.encode("latin1")


def _set(args: tuple[Any, ...]) -> set[Any]:
    if not args:
        return set()
    if not isinstance(args[0], list | tuple):
        raise TypeError("a set of something that is not a list")
    if not all(isinstance(v, str | int | float | bytes) for v in args[0]):
        raise TypeError("a set of values that are not numbers or text")
    return set(args[0])


def _bytearray(args: tuple[Any, ...]) -> bytearray:
    if not args:
        return bytearray()
    if isinstance(args[0], bytes):
        return bytearray(args[0])
    if len(args) == 2 and isinstance(args[0], str) and args[1] in ("latin1", "latin-1"):
        return bytearray(args[0], "latin1")
    raise TypeError("a bytearray of something that is not bytes (a size would allocate it)")


def _complex(args: tuple[Any, ...]) -> complex:
    if not all(isinstance(a, int | float) and not isinstance(a, bool) for a in args[:2]):
        raise TypeError("a complex number of something that is not a number")
    return complex(*args[:2])


def _size(args: tuple[Any, ...]) -> tuple[int, ...]:
    return _shape(args[0] if args else (), "uint8")


def known_globals() -> dict[str, Global]:
    """Globals given their own stand-in here (others allowed by torch become :class:`Opaque`)."""
    if "known" in _CACHE:
        return _CACHE["known"]  # type: ignore[no-any-return]
    calls: dict[str, Callable[[tuple[Any, ...]], Any]] = {
        "torch._utils._rebuild_tensor": _tensor_from_storage,
        "torch._utils._rebuild_tensor_v2": _tensor_from_storage,
        "torch._utils._rebuild_qtensor": _tensor_from_storage,
        "torch._utils._rebuild_tensor_v3": _tensor_v3,
        "torch._utils._rebuild_parameter": lambda a: _tensor_of(a[0]),
        "torch._utils._rebuild_parameter_with_state": lambda a: _tensor_of(a[0]),
        "torch.nn.parameter.Parameter": lambda a: _tensor_of(a[0]),
        "torch._utils._rebuild_meta_tensor_no_storage": _meta_tensor,
        "torch._utils._rebuild_wrapper_subclass": _wrapper_subclass,
        "torch._utils._rebuild_device_tensor_from_cpu_tensor": _device_tensor,
        "torch._tensor._rebuild_from_type_v2": _from_type,
        "collections.OrderedDict": _ordered_dict,
        "torch.Size": _size,
        "torch.device": lambda a: Opaque("device"),
        "_codecs.encode": _encode,
        "builtins.set": _set,
        "builtins.bytearray": _bytearray,
        "builtins.complex": _complex,
    }
    known = {name: Global(name, call) for name, call in calls.items()}
    for name in [*_dtypes(), *storage_dtypes()]:
        known[name] = Global(name, functools.partial(opaque, name))
    _CACHE["known"] = known
    return known
