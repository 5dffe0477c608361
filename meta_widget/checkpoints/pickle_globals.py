"""Stand-ins for the globals a ``torch.save`` pickle names: what ``torch.load(weights_only=True)``
would call is given a pure function here that builds a description instead (a tensor's shape
and dtype, never its storage); the tables of dtypes, storage types and allowed names are read
from torch once (``vars(torch)``, so no import runs).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import heavy


@dataclass(frozen=True, slots=True, eq=False)
class StoredTensor:
    """A tensor of the pickle: its shape and dtype (as torch spells it, without ``torch.``).

    Compared and hashed by identity, as torch compares tensors: two tensors of one shape are
    two keys of a dict, two members of a set. ``stored`` is the bytes a sparse tensor holds
    (its indices and values); ``None`` for a dense one, which holds ``numel * itemsize``.
    """

    shape: tuple[int, ...]
    dtype: str
    stored: int | None = None

    @property
    def nbytes(self) -> int:
        if self.stored is not None:
            return self.stored
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


#: dimensions of a tensor read here: torch builds tensors of any rank, but no model's tensor has
#: more than a handful, and a shape of a million copies of one memoized number is a file of a
#: few MB that takes minutes to multiply out
MAX_RANK = 64
_MAX_DIM = 2**63  # torch's sizes are int64


def _shape(size: Any, dtype: str) -> tuple[int, ...]:
    """``size`` as a shape, checked before it is multiplied out: at most :data:`MAX_RANK`
    dimensions, each an int64 >= 0, and under 2**63 bytes in all."""
    if not isinstance(size, tuple | list):
        raise ValueError("a shape that is not a list of integers >= 0")
    if len(size) > MAX_RANK:
        raise ValueError(
            f"a shape of {len(size):,} dimensions, past the {MAX_RANK} meta_widget reads "
            "(no model's tensor has more than a few)"
        )
    if not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < _MAX_DIM for d in size):
        raise ValueError("a shape that is not a list of integers >= 0 and < 2**63")
    tensor = StoredTensor(tuple(size), dtype)
    if tensor.nbytes >= _MAX_DIM:  # at most 64 numbers of 63 bits: cheap to multiply
        raise ValueError("a shape of 2**63 bytes or more, past what any tensor can hold")
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


#: what ``_rebuild_from_type_v2`` may call: the functions that rebuild a tensor
_REBUILDS = (
    "torch._utils._rebuild_tensor",
    "torch._utils._rebuild_tensor_v2",
    "torch._utils._rebuild_tensor_v3",
    "torch._utils._rebuild_qtensor",
    "torch._utils._rebuild_parameter",
    "torch._utils._rebuild_parameter_with_state",
    "torch._utils._rebuild_meta_tensor_no_storage",
    "torch._utils._rebuild_wrapper_subclass",
    "torch._utils._rebuild_device_tensor_from_cpu_tensor",
    "torch._utils._rebuild_sparse_tensor",
    "torch.nn.parameter.Parameter",
)


def _from_type(args: tuple[Any, ...]) -> Any:
    func, inner = args[0], args[2]  # _rebuild_from_type_v2(func, type, args, state)
    if not isinstance(func, Global) or not isinstance(inner, tuple):
        raise TypeError("a tensor subclass rebuilt by something that is not a function")
    if func.name not in _REBUILDS:  # torch.save writes the tensor's own rebuild function there
        raise TypeError(f"a tensor subclass rebuilt by {func.name}, which rebuilds no tensor")
    return func.call(inner)


#: the sparse layouts ``torch.serialization._get_layout`` names, and how many tensors each
#: one's data holds before its size: COO (indices, values, size[, coalesced]); the compressed
#: ones (compressed indices, plain indices, values, size)
_SPARSE = {
    "torch.sparse_coo": 2,
    "torch.sparse_csr": 3,
    "torch.sparse_csc": 3,
    "torch.sparse_bsr": 3,
    "torch.sparse_bsc": 3,
}


def _layout(args: tuple[Any, ...]) -> Opaque:
    if len(args) != 1 or not isinstance(args[0], str):
        raise TypeError("a layout that is not named")
    return Opaque(args[0])


def _sparse_tensor(args: tuple[Any, ...]) -> StoredTensor:
    """``_rebuild_sparse_tensor(layout, data)``: the shape and dtype
    ``torch.sparse_coo_tensor`` (or ``sparse_compressed_tensor``) builds, checked as they
    check them; its bytes are those of its indices and values."""
    layout, data = args
    held = _SPARSE.get(layout.kind) if isinstance(layout, Opaque) else None
    if held is None or not isinstance(data, tuple) or len(data) < held + 1:
        raise TypeError("a sparse tensor of a layout torch does not rebuild")
    tensors, size = data[:held], data[held]
    if not all(isinstance(t, StoredTensor) for t in tensors):
        raise TypeError("a sparse tensor whose indices or values are not tensors")
    values = tensors[-1]
    shape = _shape(size, values.dtype)
    if held == 2:  # COO: indices (sparse dims, nnz), values (nnz, *dense dims)
        indices = tensors[0]
        sparse = indices.shape[0] if len(indices.shape) == 2 else -1
        if (
            sparse < 0
            or values.shape[:1] != indices.shape[1:]
            or len(shape) != sparse + len(values.shape) - 1
            or shape[sparse:] != values.shape[1:]
        ):
            raise ValueError("a sparse COO tensor whose indices, values and size disagree")
    return StoredTensor(shape, values.dtype, stored=sum(t.nbytes for t in tensors))


def _encode(args: tuple[Any, ...]) -> bytes:
    # protocol 2 writes bytes as _codecs.encode(text, "latin1")
    text, codec = args
    if not isinstance(text, str) or codec not in ("latin1", "latin-1"):
        raise TypeError("_codecs.encode of something that is not text")
    return text.encode("latin1")


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
        "torch._utils._rebuild_sparse_tensor": _sparse_tensor,
        "torch.serialization._get_layout": _layout,
        "torch.Size": _size,
        "torch.device": lambda a: Opaque("device"),
        "_codecs.encode": _encode,
        "builtins.bytearray": _bytearray,
        "builtins.complex": _complex,
    }
    known = {name: Global(name, call) for name, call in calls.items()}
    for name in [*_dtypes(), *storage_dtypes()]:
        known[name] = Global(name, functools.partial(opaque, name))
    _CACHE["known"] = known
    return known
