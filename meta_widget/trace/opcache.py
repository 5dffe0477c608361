"""The op cache: an aten op seen before on the same input metadata is not run again.

A meta kernel computes nothing but the metadata of its outputs, yet costs 0.1 to 0.6 ms of
Python (PyTorch's reference implementations) whatever the tensor sizes; an 80-layer decoder runs
the same ops on the same shapes 80 times. Like ``FakeTensorMode``'s dispatch cache
(``torch/_subclasses/fake_tensor.py``: ``_DispatchCacheKey``, ``_cached_dispatch_impl``), the
recorder keys each op by the op and its arguments' metadata (dtype, shape, strides, storage
offset, ``requires_grad`` of every tensor; type and value of every other argument) and, on a
hit, builds the outputs from the recorded metadata (``empty_strided`` on meta: fresh storage, as
the kernel would allocate), or returns the input an in-place op returns, and replays the FLOPs
and the cost (``meta_widget.trace.costs``) counted the first time. Everything after the kernel
(assumptions, FLOP and cost crediting, storage tracking) runs as on a miss, on these outputs, so
the records are the same.

Fake tensors (``FakeTensorMode``'s, which a parallel trace runs on: meta data standing for CPU
tensors) are keyed and rebuilt the same way, with their device: a hit wraps a fresh meta tensor
in a ``FakeTensor`` of the arguments' mode, where ``FakeTensorMode``'s own cache would key the
call again (its key and its output building are most of a fake op's 80 us; the rebuild is 4,
:mod:`meta_widget.trace.fake_tensors`).

An op is run, not cached (a *bypass*, counted by reason in :class:`CacheStats`), when caching it
could change what is recorded or would not pay:

- ``"view"``: its outputs alias its inputs (``view``, ``transpose``, ...): their C++ kernels are
  cheap, and a view must be a view of the actual input (a view of a fake tensor is cached: its
  outputs are rebuilt on the input's storage, where ``FakeTensorMode`` takes 55 to 100 us);
- ``"out= or metadata-changing"``: it writes an ``out=`` argument or changes its input's
  metadata (``resize_``, ``transpose_``, ...);
- ``"data-dependent"``: its output shape depends on values (``nonzero``), or the assumption
  policy answers it;
- ``"decomposed"``: the recorder runs its composite decomposition (whose ops are cached);
- ``"not meta"``: an argument or output is neither a plain strided meta tensor nor a fake
  tensor without a constant (CPU scalars, sparse, tensor subclasses such as ``DTensor``);
- ``"argument type"``: an argument cannot be part of a key (symbolic sizes, objects);
- ``"output"``: the first run returned what the cache cannot rebuild (an output aliasing an
  input or another output, storage larger than its view, a value of another type).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode

from .fake_tensors import new_fake

__all__ = [
    "CacheInfo",
    "CacheStats",
    "FakeOpCache",
    "OpCache",
    "call_key_parts",
    "key_parts",
    "static_bypass",
]

#: not ``torch.ops.aten.empty_strided``: called inside a dispatch mode, an op overload costs
#: 45 us, the torch function 9 us
_EMPTY_STRIDED = torch.empty_strided
_META = torch.device("meta")
_STRIDED = torch.strided
#: tensor types the cache keys and rebuilds (subclasses, e.g. ``DTensor``, are run)
_PLAIN = frozenset({torch.Tensor, torch.nn.Parameter})
#: argument types keyed by value (with their type: ``1``, ``1.0`` and ``True`` differ)
_ATOMS = frozenset(
    {int, float, bool, str, complex, torch.dtype, torch.device, torch.layout, torch.memory_format}
)
#: constant output types (e.g. the sizes flash attention returns beside its tensors)
_CONSTANTS = frozenset({int, float, bool, type(None)})
_NO_KEY_TAGS = frozenset({torch.Tag.dynamic_output_shape, torch.Tag.data_dependent_output})
#: ops whose output is a view of their input although their schema does not say so
_HIDDEN_VIEWS = frozenset({torch.ops.aten._unsafe_view.default})
_PRIM_DEVICE = torch.ops.prim.device.default
_FAKE = torch._C._TorchDispatchModeKey.FAKE
_get_mode = torch._C._get_dispatch_mode
#: ops with no tensor in or out (FSDP2's ``record_function`` marks): :class:`FakeOpCache` runs
#: them as they are, where ``FakeTensorMode`` keys them first (120 us)
_HOST_OPS = frozenset(
    {
        torch.ops.profiler._record_function_enter_new.default,
        torch.ops.profiler._record_function_exit._RecordFunction,
    }
)
#: the tensor types whose ops :class:`FakeOpCache` answers itself (others are subclasses')
_OWN_TYPES = _PLAIN | {FakeTensor}

VIEW = "view"
MUTATES_METADATA = "out= or metadata-changing"
DATA_DEPENDENT = "data-dependent"
DECOMPOSED = "decomposed"
NOT_META = "not meta"
ARGUMENT_TYPE = "argument type"
OUTPUT = "output"


@dataclass
class CacheStats:
    """What the fast path did in one trace: every aten op of the model is one of

    ``hits`` (outputs rebuilt from the cache, the kernel skipped), ``misses`` (run, and
    recorded for next time), ``bypassed`` (run, not cacheable; counted by reason, see
    :mod:`meta_widget.trace.opcache`) or ``replayed`` (inside an attention call replayed whole from
    the tape of an earlier call, see :mod:`meta_widget.trace.replay`: neither run nor recorded).
    """

    hits: int = 0
    misses: int = 0
    bypassed: dict[str, int] = field(default_factory=dict)
    replayed: int = 0

    @property
    def ops(self) -> int:
        """Every aten op of the trace (the replayed ones counted as they ran the first time)."""
        return self.hits + self.misses + sum(self.bypassed.values()) + self.replayed

    @property
    def hit_rate(self) -> float:
        """``(hits + replayed) / ops``: the share of ops whose kernel was skipped (0.0: none)."""
        return (self.hits + self.replayed) / self.ops if self.ops else 0.0

    def bypass(self, reason: str) -> None:
        self.bypassed[reason] = self.bypassed.get(reason, 0) + 1

    def found(self, entry: Any) -> bool:
        """Count a lookup that found ``entry`` (None: a miss; a string: why the call cannot be
        cached, a bypass); whether it is a hit."""
        if entry is None:
            self.misses += 1
            return False
        if type(entry) is str:
            self.bypass(entry)
            return False
        self.hits += 1
        return True


def static_bypass(func: Any, answered: bool) -> str | None:
    """Why ``func`` is never cached, decided once per op from its schema and tags (or None).

    ``answered``: the assumption policy runs it (a data-dependent op).
    """
    if answered or not _NO_KEY_TAGS.isdisjoint(func.tags):
        return DATA_DEPENDENT
    if func in _HIDDEN_VIEWS:
        return VIEW
    schema = func._schema
    writes = [r.alias_info for r in schema.returns if r.alias_info is not None]
    if not writes:
        return None
    if not all(a.is_write for a in writes):
        return VIEW
    first = schema.arguments[0] if schema.arguments else None
    inplace = (
        len(writes) == 1
        and torch.Tag.inplace_view not in func.tags
        and first is not None
        and not first.kwarg_only
        and first.alias_info is not None
        and first.alias_info.is_write
        and sum(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments) == 1
    )
    return None if inplace else MUTATES_METADATA


#: one output of a cached op: ("new", size, stride, dtype) | ("fake", size, stride, dtype,
#: device) | ("view", size, stride, offset, dtype, device) | ("arg", 0) | ("const", value)
_Spec = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class _Entry:
    specs: tuple[_Spec, ...]
    #: the container of several outputs (tuple or list), or None for a single one
    container: type | None
    flops: int
    #: the op's cost (``meta_widget.trace.costs``), or None: it costs nothing
    cost: Any = None

    def build(self, args: tuple[Any, ...]) -> Any:
        outs = [_make(s, args) for s in self.specs]
        return outs[0] if self.container is None else self.container(outs)


def _make(spec: _Spec, args: tuple[Any, ...]) -> Any:
    kind = spec[0]
    if kind == "new":
        return _EMPTY_STRIDED(spec[1], spec[2], dtype=spec[3], device=_META)
    if kind == "fake":
        with torch._C._DisableTorchDispatch():  # a meta tensor, past the fake mode below us
            elem = _EMPTY_STRIDED(spec[1], spec[2], dtype=spec[3], device=_META)
        return new_fake(_fake_mode(args), elem, spec[4])
    if kind == "view":
        base = args[0]
        with torch._C._DisableTorchDispatch():
            elem = _EMPTY_STRIDED((0,), (1,), dtype=spec[4], device=_META)
            elem.set_(base.untyped_storage(), spec[3], spec[1], spec[2])
        return new_fake(base.fake_mode, elem, spec[5])
    if kind == "arg":
        return args[0]
    return spec[1]


def rebuild_local(spec: _Spec, base: FakeTensor) -> Any:
    """A fake tensor as ``spec`` (``"fake"``: new storage; ``"view"``: on ``base``'s storage)
    says, in ``base``'s fake mode (a cached DTensor output's local tensor,
    ``meta_widget.distributed.dtensor_cache``)."""
    return _make(spec, (base,))


#: a dict slot and an _Entry with its tuple of specs
_ENTRY_OVERHEAD = 200


@dataclass(frozen=True)
class CacheInfo:
    """The process's op cache: ``entries`` and their ``bytes`` (an estimate: each key's tuple and
    output specs, as ``sys.getsizeof`` counts them), the bounds past which it is emptied, and
    how many times it was."""

    entries: int
    bytes: int
    max_entries: int
    max_bytes: int
    clears: int


class OpCache:
    """Cached outputs of aten ops by (op, kernel, FLOP formula, argument metadata).

    :meth:`key` gives an op call's key (None: bypassed, counted); :meth:`lookup` the cached
    outputs of a key (None: a miss, counted); :meth:`fill` records what a missed op returned.

    The entries are shared by every trace of the process, as ``FakeTensorMode``'s dispatch
    cache is (a class attribute): a key names everything its outputs follow from (the op, the
    kernel the recorder runs for it, the formula that counts its FLOPs, the metadata and values
    of its arguments), so an entry holds for any trace. A re-analysis (the widget's switches, a
    sweep, the next cell) runs no meta kernel it has run before. ``stats`` is this trace's.
    """

    #: entries of every trace, by key; emptied when it holds ``limit`` of them or ``max_bytes``
    entries: ClassVar[dict[Any, _Entry | str]] = {}
    limit: ClassVar[int] = 50_000
    max_bytes: ClassVar[int] = 256 * 1024 * 1024
    _bytes: ClassVar[int] = 0
    _clears: ClassVar[int] = 0

    def __init__(self) -> None:
        self.stats = CacheStats()
        self._entries = self.entries

    @classmethod
    def cache_info(cls) -> CacheInfo:
        """How full the process's op cache is (as ``FakeTensorMode.cache_info()`` tells)."""
        return CacheInfo(len(cls.entries), cls._bytes, cls.limit, cls.max_bytes, cls._clears)

    @classmethod
    def cache_clear(cls) -> None:
        """Empty the process's op cache (the next traces run their kernels again)."""
        cls.entries.clear()
        OpCache._bytes = 0

    def key(
        self,
        func: Any,
        kernel: Any,
        flops: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        uncached: str | None = None,
    ) -> Any:
        """The key of one call of ``func`` run by ``kernel`` and counted by ``flops`` (its
        FLOP formula, or None), or None (the bypass reason is counted). ``uncached``: why the
        op is never cached (:func:`static_bypass`), but a view of a fake tensor is (its outputs
        are rebuilt on the input's storage)."""
        if uncached is not None and not (uncached is VIEW and _fake_view(args)):
            self.stats.bypass(uncached)
            return None
        # under a fake mode a call without fake arguments makes fake tensors (a factory's):
        # keyed apart from the same call on meta, which makes meta tensors
        parts: list[Any] = [func, kernel, flops, _get_mode(_FAKE) is not None]
        reason = call_key_parts(args, kwargs, parts)
        if reason is not None:
            self.stats.bypass(reason)
            return None
        return tuple(parts)

    def lookup(self, key: Any) -> tuple[Callable[[tuple[Any, ...]], Any], int, Any] | None:
        """The output builder, FLOPs and cost of a cached ``key``; None (counted) if it must
        run."""
        entry = self._entries.get(key)
        if not self.stats.found(entry):
            return None
        assert isinstance(entry, _Entry)
        return entry.build, entry.flops, entry.cost

    def fill(
        self,
        key: Any,
        args: tuple[Any, ...],
        out: Any,
        flops: int,
        cost: Any = None,
        view: bool = False,
    ) -> None:
        """Record what the op of ``key`` returned on ``args`` (``flops`` and ``cost``: what it
        counted; ``view``: its outputs are views of ``args[0]``, a fake tensor)."""
        if isinstance(out, (tuple, list)):
            container: type | None = type(out)
            outs = list(out)
        else:
            container, outs = None, [out]
        specs = _views(outs, args[0]) if view else _specs(outs, args)
        size = _entry_bytes(key, specs)
        if len(self._entries) >= self.limit or OpCache._bytes + size > self.max_bytes:
            self.cache_clear()
            OpCache._clears += 1
        self._entries[key] = (
            OUTPUT if specs is None else _Entry(tuple(specs), container, flops, cost)
        )
        OpCache._bytes += size


class FakeOpCache(TorchDispatchMode):
    """A dispatch mode answering ops on fake tensors from the op cache, under a parallel
    trace's recorder (``meta_widget.distributed.parallel.trace_rank``).

    The recorder caches the ops it records, but not the ops that run below it: those DTensor
    runs on its local shards (an op on DTensors is handed to DTensor, which runs it again on
    fake tensors) and those of FSDP2's and tensor parallelism's set-up. This mode, pushed above
    ``FakeTensorMode``, answers them from the same process-wide entries (keyed apart from the
    recorder's: no kernel, no FLOP formula), and hands an op on a tensor subclass back
    (``NotImplemented``), so that the subclass's own ops come here too. It records nothing.
    """

    def __init__(self) -> None:
        super().__init__()
        self.cache = OpCache()
        self._bypass: dict[Any, str | None] = {}

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # as the recorder's mode: nothing here is compiled

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        if not _OWN_TYPES.issuperset(types):
            return NotImplemented  # DTensor: it runs the op on its fake shards, through here
        if func is _PRIM_DEVICE and type(args[0]) is FakeTensor:
            return args[0].fake_device  # as the fake mode answers outside its kernels
        if func in _HOST_OPS:
            with torch._C._DisableTorchDispatch():
                return func(*args, **kwargs)
        reason = self._bypass.get(func, "")
        if reason == "":
            reason = self._bypass[func] = static_bypass(func, False)
        cache = self.cache
        key = cache.key(func, None, None, args, kwargs, reason)
        hit = cache.lookup(key) if key is not None else None
        if hit is not None:
            return hit[0](args)
        out = func(*args, **kwargs)
        if key is not None:
            cache.fill(key, args, out, 0, None, reason is VIEW)
        return out


def _entry_bytes(key: tuple[Any, ...], specs: list[_Spec] | None) -> int:
    """What one entry holds, as ``sys.getsizeof`` counts its key's tuple and its output specs
    (their parts are shared: ops, dtypes, small ints; shapes are counted with their spec)."""
    size = sys.getsizeof(key) + _ENTRY_OVERHEAD
    for spec in specs or ():
        size += sys.getsizeof(spec) + sum(sys.getsizeof(p) for p in spec if type(p) is tuple)
    return size


def call_key_parts(
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    parts: list[Any],
    parts_of: Callable[[tuple[Any, ...], list[Any]], str | None] | None = None,
) -> str | None:
    """Append the key parts of a call's arguments to ``parts`` (the positional ones, then each
    keyword one after its name), each as ``parts_of`` keys it (default :func:`key_parts`); the
    bypass reason if one has none."""
    parts_of = parts_of or key_parts
    reason = parts_of(args, parts)
    if reason is None and kwargs:
        for name, value in kwargs.items():
            parts.append(name)
            reason = parts_of((value,), parts)
            if reason is not None:
                break
    return reason


def key_parts(values: tuple[Any, ...] | list[Any], parts: list[Any]) -> str | None:
    """Append the key parts of ``values`` to ``parts``; the bypass reason if one has none."""
    for v in values:
        if isinstance(v, torch.Tensor):
            if type(v) is FakeTensor:
                if v.constant is not None or v.layout is not _STRIDED:
                    return NOT_META
                parts.append(
                    (
                        v.dtype,
                        v.shape,
                        v.stride(),
                        v.storage_offset(),
                        v.requires_grad,
                        v.fake_device,
                    )
                )
                continue
            if type(v) not in _PLAIN or not v.is_meta or v.layout is not _STRIDED:
                return NOT_META
            parts.append((v.dtype, v.shape, v.stride(), v.storage_offset(), v.requires_grad))
        elif type(v) in _ATOMS:
            parts.append((type(v), v))
        elif v is None:
            parts.append(None)
        elif isinstance(v, (tuple, list)):
            parts.append((type(v), len(v)))
            reason = key_parts(v, parts)
            if reason is not None:
                return reason
        else:
            return ARGUMENT_TYPE
    return None


def _specs(outs: list[Any], args: tuple[Any, ...]) -> list[_Spec] | None:
    """How to rebuild ``outs`` on a hit, or None if the cache cannot."""
    inputs = _storages(args)
    first = args[0] if args else None
    specs: list[_Spec] = []
    for o in outs:
        if type(o) in _CONSTANTS:
            specs.append(("const", o))
            continue
        if o is first and isinstance(first, torch.Tensor):
            specs.append(("arg", 0))  # an in-place op returns its input (its key checked it)
            continue
        if type(o) is FakeTensor:
            if o.constant is not None or o.fake_mode is not _fake_mode(args):
                return None
            spec: _Spec = ("fake", tuple(o.shape), o.stride(), o.dtype, o.fake_device)
        elif type(o) is torch.Tensor and o.is_meta:
            spec = ("new", tuple(o.shape), o.stride(), o.dtype)
        else:
            return None
        if o.layout is not _STRIDED:
            return None
        st = o.untyped_storage()
        if st._cdata in inputs or o.storage_offset() != 0:
            return None
        inputs.add(st._cdata)  # a second output on the same storage is refused too
        if _make(spec, args).untyped_storage().nbytes() != st.nbytes():
            return None  # a view of a larger storage: empty_strided would allocate less
        specs.append(spec)
    return specs


def _views(outs: list[Any], base: FakeTensor) -> list[_Spec] | None:
    """How to rebuild the outputs of a view op of the fake tensor ``base`` on a hit (each on
    ``base``'s storage), or None if the cache cannot."""
    storage = base.untyped_storage()._cdata
    specs: list[_Spec] = []
    for o in outs:
        if o is base:
            specs.append(("arg", 0))
        elif (
            type(o) is not FakeTensor
            or o.constant is not None
            or o.fake_mode is not base.fake_mode
            or o.layout is not _STRIDED
            or o.untyped_storage()._cdata != storage
        ):
            return None
        else:
            shape, stride = tuple(o.shape), o.stride()
            specs.append(("view", shape, stride, o.storage_offset(), o.dtype, o.fake_device))
    return specs


def _storages(values: Any) -> set[int]:
    """Storage keys of every meta tensor in ``values`` (nested tuples and lists)."""
    found: set[int] = set()
    todo = [values]
    while todo:
        v = todo.pop()
        if isinstance(v, torch.Tensor):
            if type(v) is FakeTensor or v.is_meta:
                found.add(v.untyped_storage()._cdata)
        elif isinstance(v, (tuple, list)):
            todo.extend(v)
    return found


def _fake_view(args: tuple[Any, ...]) -> bool:
    """Whether a view op's call ``args`` view a fake tensor (the cache rebuilds it)."""
    return bool(args) and type(args[0]) is FakeTensor


def _fake_mode(args: Any) -> Any:
    """The mode of the first fake tensor in ``args`` (nested tuples and lists), else the fake
    mode running (a factory's outputs are its), or None."""
    return _args_fake_mode(args) or _get_mode(_FAKE)


def _args_fake_mode(args: Any) -> Any:
    for v in args:
        if type(v) is FakeTensor:
            return v.fake_mode
        if isinstance(v, (tuple, list)):
            mode = _args_fake_mode(v)
            if mode is not None:
                return mode
    return None
