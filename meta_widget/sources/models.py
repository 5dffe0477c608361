"""Turn what the user has into a module whose tensors all live on the ``meta`` device.

Every source leaves the user's objects as they were: an ``nn.Module`` with real tensors is analyzed
through a copy whose parameters and buffers are meta stand-ins (the real data is never copied),
so the user's module keeps its devices, storages, ``training`` flag and hooks. Sources are a
registry (``register_source``): the first whose predicate accepts the object builds it.
"""

from __future__ import annotations

import contextlib
import copy
import copyreg
import functools
import inspect
import types
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from .. import heavy
from ..data.walk import TreeFault, modules, tree_fault
from ..errors import MetaWidgetError
from ..registry import Registry
from ..undo import on_meta


class SourceError(MetaWidgetError, TypeError):
    """The object given to ``analyze`` cannot be turned into a meta model."""


@dataclass
class MetaModel:
    """A module whose parameters and buffers are all on ``meta``.

    ``owned`` says whether the module was built by meta_widget (then it may be changed freely) or
    is the user's own meta module (then the recorder restores everything it touches).
    """

    module: torch.nn.Module
    source: str
    owned: bool
    notes: list[str] = field(default_factory=list)
    #: rebuilds a fresh meta module (used by what-ifs and ``materialize``); None when not possible
    rebuild: Callable[[], torch.nn.Module] | None = None
    #: a module the user wrapped with FSDP2 / tensor parallelism: that wrapping, made again on
    #: ``module`` (a plain stand-in) when it is traced
    #: (``meta_widget.distributed.wrapping.Wrapping``)
    wrapping: Any = None


#: the sources of models by name: (accepts(obj), build(obj) -> MetaModel), tried in order
SOURCES: Registry[str, tuple[Callable[[Any], bool], Callable[[Any], MetaModel]]] = Registry(
    "source of models"
)


def register_source(
    name: str, accepts: Callable[[Any], bool], *, first: bool = False
) -> Callable[[Callable[[Any], MetaModel]], Callable[[Any], MetaModel]]:
    """Register ``build(obj) -> MetaModel`` for objects ``accepts(obj)`` is true for (tried
    after the sources registered before it, or before all of them with ``first``)."""

    def wrap(build: Callable[[Any], MetaModel]) -> Callable[[Any], MetaModel]:
        SOURCES.register(name, (accepts, build), first=first)
        return build

    return wrap


def to_meta(obj: Any) -> MetaModel:
    """Return a :class:`MetaModel` for a module, class, factory, transformers config or path."""
    given = isinstance(obj, torch.nn.Module)
    if given:
        check_tree(obj)  # before anything walks it (its copy has the same tree)
    for accepts, build in SOURCES.values():
        if accepts(obj):
            meta = build(obj)
            if not given:
                check_tree(meta.module)  # built by a factory or from a config
            return meta
    raise SourceError(
        f"meta_widget cannot analyze an object of type {type(obj).__name__!r}. Pass an "
        "nn.Module, a class or zero-argument function that builds one, a transformers config, "
        "or the path of a checkpoint (.pt, .pth, .bin, .safetensors)."
    )


def source_of(obj: Any) -> str | None:
    """The name of the source :func:`to_meta` builds ``obj`` with (None: no source takes it)."""
    return next((name for name, (accepts, _) in SOURCES.items() if accepts(obj)), None)


def check_tree(module: torch.nn.Module) -> None:
    """Refuse a module tree PyTorch's own walks cannot take (:func:`~.walk.tree_fault`): a
    submodule named ``""``, ``"a.b"`` or not by a string, an entry of ``_modules`` that is not a
    module, or a module inside itself. Raises :class:`SourceError` naming the entry's path."""
    fault = tree_fault(module)
    if fault is not None:
        raise SourceError(_fault_message(type(module).__name__, fault))


def _fault_message(root: str, fault: TreeFault) -> str:
    where = f"{root}.{fault.parent}" if fault.parent else root
    entry = f"{where}._modules[{fault.name!r}]"
    if fault.kind == "name":
        return (
            f"meta_widget cannot analyze {root}: the submodule {entry} ({fault.type}) has a "
            "name PyTorch's add_module refuses (empty, holding a '.', or not a string): module "
            "paths are dotted, so its path would be read as another module's. Register it "
            "under a plain name, e.g. self.add_module('a_b', module) or setattr(self, 'a_b', "
            "module), and analyze again."
        )
    if fault.kind == "type":
        return (
            f"meta_widget cannot analyze {root}: {entry} is a {fault.type}, not an nn.Module or "
            "None; PyTorch's own walks over submodules would fail on it. Keep only modules in "
            "_modules (set other objects as plain attributes), and analyze again."
        )
    ancestor = f"{root}.{fault.ancestor}" if fault.ancestor else root
    return (
        f"meta_widget cannot analyze {root}: the submodule {entry} ({fault.type}) is "
        f"{ancestor} itself, one of its own ancestors, so the module tree is a cycle and "
        "PyTorch's own walks over it (named_modules paths, to(), train(), apply()) never end. "
        "Keep the back-reference out of the submodules: store it with object.__setattr__(self, "
        f"{fault.name!r}, module) (a plain attribute, not registered), and analyze again."
    )


def _is_module(obj: Any) -> bool:
    return isinstance(obj, torch.nn.Module)


def all_on_meta(module: torch.nn.Module) -> bool:
    """True when every parameter, buffer and direct tensor attribute of ``module`` is on meta."""
    tensor = torch.Tensor
    for m in modules(module):  # plain loops: this runs before every analysis
        for table in (m._parameters, m._buffers, vars(m)):
            for t in table.values():
                if isinstance(t, tensor) and not t.is_meta:
                    return False
    return True


#: the most objects (containers, plain objects) the search for tensors visits in a module's
#: state, and the deepest nesting it follows: past either, copying is refused (a hostile or
#: huge object graph must not hang the analysis, and a tensor left unseen would be copied)
MAX_OBJECTS = 1_000_000
MAX_DEPTH = 500


def reachable_tensors(root: Any) -> list[tuple[str, torch.Tensor]]:
    """Every tensor reachable from ``root`` the way ``copy.deepcopy`` walks it, with its path
    (see :func:`reachable`)."""
    return reachable(root).tensors


@dataclass
class Reachable:
    """What :func:`reachable` found: tensors, and other objects that hold data."""

    #: every tensor, with its path from the root
    tensors: list[tuple[str, torch.Tensor]] = field(default_factory=list)
    #: every other object holding data (see :func:`holds_data`), with its path: never entered
    data: list[tuple[str, Any]] = field(default_factory=list)


def reachable(root: Any) -> Reachable:
    """Every tensor and every other object holding data reachable from ``root`` the way
    ``copy.deepcopy`` walks it, with its path.

    Follows lists, tuples, dicts, sets, instance ``__dict__`` and ``__slots__`` (modules,
    dataclasses, plain objects), bound methods' ``self``, ``functools.partial`` arguments, and
    what a class's own ``__reduce__`` hands deepcopy (a ``deque``'s items, an exception's
    ``args``). Each object is visited once (shared references and cycles cost nothing more);
    functions, classes and scalars are not entered, as deepcopy shares them, nor are tensors and
    objects holding data (:func:`holds_data`). Raises :class:`SourceError` past
    :data:`MAX_OBJECTS` objects or :data:`MAX_DEPTH` levels.
    """
    found = Reachable()
    seen: set[int] = set()
    todo: list[tuple[Any, str, int]] = [(root, "", 0)]
    while todo:
        obj, path, depth = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            found.tensors.append((path or "module", obj))
            continue  # a tensor's own attributes are not followed (its stand-in has none)
        if holds_data(obj):
            found.data.append((path or "module", obj))
            continue
        if len(seen) > MAX_OBJECTS or depth > MAX_DEPTH:
            raise SourceError(
                f"meta_widget will not copy {type(root).__name__}: its state holds more than "
                f"{MAX_OBJECTS:,} objects or nests deeper than {MAX_DEPTH} levels (at "
                f"{path or 'the module'}), too many to search for tensors whose data must not "
                "be copied. Pass a function or class that builds the model instead, e.g. "
                "mw.analyze(lambda: MyModel(...)): it is then built directly on meta."
            )
        for key, child in _children(obj):
            if type(child) not in _ATOMIC and id(child) not in seen:
                todo.append((child, f"{path}{key}", depth + 1))
    return found


#: the interfaces of arrays from other libraries (NumPy, CuPy, JAX, ...)
_ARRAY_PROTOCOLS = ("__array_interface__", "__cuda_array_interface__", "__dlpack__")


def holds_data(obj: Any) -> bool:
    """Whether ``obj`` (not a tensor) holds data that deepcopy would copy byte for byte: a torch
    storage, an array of another library (an array of Python objects excepted: its items are
    searched), or any object exporting a buffer (``bytearray``, ``array.array``,
    ``memoryview``, ``mmap``, ``ctypes`` arrays, ...)."""
    cls = type(obj)
    if cls in _NO_BUFFER:
        return False
    if issubclass(cls, (torch.UntypedStorage, torch.TypedStorage, memoryview)):
        return True
    if any(hasattr(cls, name) for name in _ARRAY_PROTOCOLS):
        return not _holds_objects(obj)
    try:
        memoryview(obj).release()
    except TypeError:  # the type has no buffer at all: not asked again
        _NO_BUFFER.add(cls)
        return False
    except (ValueError, BufferError):  # this object has none now
        return False
    return True


#: types whose instances export no buffer (weakly held: user classes may go)
_NO_BUFFER: weakref.WeakSet[type] = weakref.WeakSet(
    [dict, list, tuple, set, frozenset, torch.nn.Module]
)


def _holds_objects(obj: Any) -> bool:
    """Whether ``obj``, an array, is an array of Python objects (NumPy's ``dtype=object``)."""
    try:
        return bool(object.__getattribute__(obj, "dtype").hasobject)
    except AttributeError:
        return False


def _children(obj: Any) -> list[tuple[str, Any]]:
    """The objects deepcopy copies along with ``obj``, each with a path step."""
    out: list[tuple[str, Any]] = []
    if isinstance(obj, dict):
        out.extend((f"[{k!r}]", v) for k, v in obj.items())
        out.extend((f".<key {k!r}>", k) for k in obj if type(k) not in _ATOMIC)
    elif isinstance(obj, (list, tuple)):
        out.extend((f"[{i}]", v) for i, v in enumerate(obj))
    elif isinstance(obj, (set, frozenset)):
        out.extend((f".<item {i}>", v) for i, v in enumerate(obj))
    elif isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType, types.ModuleType)):
        return out  # shared by deepcopy, never copied
    elif isinstance(obj, types.MethodType):
        out.append((".__self__", obj.__self__))
    elif isinstance(obj, functools.partial):
        out.extend([(".func", obj.func), (".args", obj.args), (".keywords", obj.keywords)])
    elif any(hasattr(type(obj), name) for name in _ARRAY_PROTOCOLS) and _holds_objects(obj):
        out.extend((f"[{i}]", v) for i, v in enumerate(obj.flat))  # NumPy's dtype=object
    elif _reduced(type(obj)):
        out.extend(_reduce_children(obj))
    if type(obj) in _CONTAINERS:
        return out
    return out + _instance_state(obj)


def _instance_state(obj: Any) -> list[tuple[str, Any]]:
    """``obj``'s ``__dict__`` and ``__slots__`` values, also of container subclasses (a
    ModelOutput is a dict with fields); read without ``__getattr__``, which a hostile or lazy
    object may override."""
    out: list[tuple[str, Any]] = []
    try:
        state = object.__getattribute__(obj, "__dict__")
    except (AttributeError, TypeError):
        state = None
    if isinstance(state, dict):
        out.extend((f".{k}", v) for k, v in state.items())
    for cls in type(obj).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name in ("__dict__", "__weakref__"):
                continue
            with contextlib.suppress(AttributeError):  # an empty slot has no value
                out.append((f".{name}", object.__getattribute__(obj, name)))
    return out


def _reduced(cls: type) -> bool:
    """Whether deepcopy copies an instance of ``cls`` through the class's own reduction (as a
    ``deque`` or an exception): no ``__deepcopy__``, and a ``__reduce_ex__`` / ``__reduce__`` of
    its own or one in ``copyreg``'s table."""
    own: dict[type, Any] = copy._deepcopy_dispatch  # type: ignore[attr-defined]
    if cls in own or getattr(cls, "__deepcopy__", None) is not None:
        return False
    return (
        cls in copyreg.dispatch_table
        or getattr(cls, "__reduce_ex__", None) is not object.__reduce_ex__
        or getattr(cls, "__reduce__", None) is not object.__reduce__
    )


def _reduce_children(obj: Any) -> list[tuple[str, Any]]:
    """What ``obj``'s reduction hands deepcopy to copy: the constructor's arguments, the state,
    the list items and the dict items."""
    reductor = copyreg.dispatch_table.get(type(obj))
    try:
        rv = reductor(obj) if reductor is not None else obj.__reduce_ex__(4)
        if not isinstance(rv, tuple):
            return []  # a global's name: shared by deepcopy
        args, state, items, pairs = (*rv[1:5], None, None, None, None)[:4]
        out: list[tuple[str, Any]] = [(f".args[{i}]", a) for i, a in enumerate(args or ())]
        if state is not None:
            out.append((".<state>", state))
        out.extend((f"[{i}]", v) for i, v in enumerate(items or ()))
        out.extend((f"[{k!r}]", v) for k, v in (pairs or ()))
    except Exception:  # user code: deepcopy calls it again, and meta_copy reports what it raises
        return []
    return out


_CONTAINERS = {dict, list, tuple, set, frozenset}
_ATOMIC = {type(None), int, float, bool, complex, str, bytes, range, type(...)}


def stand_in(t: torch.Tensor, storages: dict[int, Any]) -> torch.Tensor:
    """A meta tensor like ``t``: same shape, stride, offset and dtype, on a meta storage shared
    with every other stand-in of the same real storage (views and ties stay views and ties)."""
    plain = type(t) in (torch.Tensor, torch.nn.Parameter)  # nn.Buffer makes plain tensors
    if plain and t.layout == torch.strided and not t.is_quantized:
        st = t.untyped_storage()
        meta = storages.get(st._cdata)
        if meta is None:
            meta = storages[st._cdata] = torch.UntypedStorage(st.nbytes(), device="meta")
        out = torch.empty(0, dtype=t.dtype, device="meta").set_(
            meta, t.storage_offset(), t.shape, t.stride()
        )
    elif is_traceable_wrapper_subclass(t) and type(t).__name__ != "DTensor":
        out = _subclass_stand_in(t, storages)  # torchao's quantized weights: packed as they are
    else:  # sparse, quantized or another tensor subclass: a dense stand-in of the same shape
        out = torch.empty(t.shape, dtype=t.dtype, device="meta")
    if isinstance(t, torch.nn.Parameter):
        return torch.nn.Parameter(out, requires_grad=t.requires_grad)
    return out.requires_grad_(t.requires_grad)


def _subclass_stand_in(t: torch.Tensor, storages: dict[int, Any]) -> torch.Tensor:
    """A tensor subclass holding its data in inner tensors (torchao's ``Int8Tensor``,
    ``Int4Tensor``...), rebuilt around meta stand-ins of those: the same class, its packed
    bytes kept; a dense stand-in where the class cannot be rebuilt so."""
    names, context = t.__tensor_flatten__()  # type: ignore[attr-defined]
    try:
        inner = {n: stand_in(getattr(t, n), storages) for n in names}
        out = type(t).__tensor_unflatten__(inner, context, t.shape, t.stride())  # type: ignore[attr-defined]
    except (RuntimeError, TypeError, ValueError, AttributeError, NotImplementedError):
        return torch.empty(t.shape, dtype=t.dtype, device="meta")
    return out  # type: ignore[no-any-return]


def stand_ins(found: Reachable, storages: dict[int, Any]) -> dict[int, Any]:
    """A deepcopy memo for what :func:`reachable` found: a meta stand-in for each real tensor
    and real torch storage (:func:`stand_in`), and every other object holding data as itself,
    shared by reference and never copied. ``storages``: the meta storages by real storage, shared
    by the stand-ins of one storage."""
    memo: dict[int, Any] = {}
    for _path, t in found.tensors:
        if not t.is_meta:
            memo[id(t)] = stand_in(t, storages)
    for _path, obj in found.data:
        memo[id(obj)] = _storage_stand_in(obj, storages) if _is_storage(obj) else obj
    return memo


def _is_storage(obj: Any) -> bool:
    return isinstance(obj, (torch.UntypedStorage, torch.TypedStorage))


def _storage_stand_in(st: Any, storages: dict[int, Any]) -> Any:
    """A meta storage like ``st`` (untyped or typed), shared with the stand-ins of its tensors."""
    typed = isinstance(st, torch.TypedStorage)
    real = st._untyped_storage if typed else st
    if real.device.type == "meta":
        return st
    meta = storages.get(real._cdata)
    if meta is None:
        meta = storages[real._cdata] = torch.UntypedStorage(real.nbytes(), device="meta")
    return torch.TypedStorage(wrap_storage=meta, dtype=st.dtype, _internal=True) if typed else meta


def copied_data(copied: Any, originals: set[int]) -> str | None:
    """The path of real data in ``copied`` that is none of the user's own (``originals``, by
    ``id``): a real tensor, storage or other object holding data that deepcopy copied from
    state the search could not see (an object with its own ``__deepcopy__``); None if none."""
    found = reachable(copied)
    for path, t in found.tensors:
        if not t.is_meta and id(t) not in originals:
            return path
    for path, obj in found.data:
        if id(obj) not in originals and not (_is_storage(obj) and obj.device.type == "meta"):
            return path
    return None


def meta_copy(module: torch.nn.Module) -> torch.nn.Module:
    """A structural copy of ``module`` whose tensors are meta stand-ins; no data is copied.

    Every tensor reachable from the module's state gets a stand-in before the copy: parameters,
    buffers and tensor attributes, and tensors held in lists, tuples, dicts, sets, deques,
    exceptions, dataclasses and plain objects (see :func:`reachable`). Stand-ins keep shape,
    stride, storage offset, dtype and ``requires_grad``; tensors sharing a storage (tied
    weights, views) share one meta storage, so they stay tied. A torch storage held as it is
    gets a meta storage; any other object holding data (a NumPy array, ``array.array``,
    ``bytearray``, ``memoryview``, ...: :func:`holds_data`) is shared by reference, as it is, by
    the copy. The user's module is only read. Should the copy hold real data all the same
    (state deepcopy reaches but the search cannot see), it is dropped and :class:`SourceError`
    raised; real tensors the copy shares with the module (an object whose ``__deepcopy__``
    returns itself) are left alone.
    """
    memo = stand_ins(reachable(module), {})
    originals = set(memo)  # the user's real data: alive (the module holds it), ids stable
    try:
        copied = copy.deepcopy(module, memo)
    except Exception as exc:  # deepcopy of arbitrary user state can fail in many ways
        raise SourceError(
            f"meta_widget could not copy {type(module).__name__} to analyze it without touching "
            f"your module ({type(exc).__name__}: {exc}). Pass a function or class that builds the "
            "model instead, e.g. mw.analyze(lambda: MyModel(...)): it is then built directly on "
            "the meta device."
        ) from exc
    del memo
    # real data in the copy that is not the user's own was copied: refuse it (data the copy
    # shares, e.g. through an object whose __deepcopy__ returns itself, is no new data)
    real = copied_data(copied, originals)
    if real is not None:
        del copied
        raise SourceError(
            f"meta_widget would have copied the data of {type(module).__name__} (at {real}): it "
            "is held where the search for tensors and arrays cannot look. Pass a function or "
            "class that builds the model instead, e.g. mw.analyze(lambda: MyModel(...)): it is "
            "then built directly on meta."
        )
    return copied


@register_source("module", _is_module)
def _from_module(module: torch.nn.Module) -> MetaModel:
    if all_on_meta(module):
        return MetaModel(module, "module", owned=False)
    return MetaModel(meta_copy(module), "module", owned=True)


def _is_meta_model(obj: Any) -> bool:
    return isinstance(obj, MetaModel)


@register_source("meta model", _is_meta_model)
def _from_meta_model(meta: MetaModel) -> MetaModel:
    """An analysis's own meta model, traced again by ``Analysis.rerun``: its source and notes
    are kept; not owned, so the trace restores every change it makes to the module."""
    return MetaModel(
        meta.module,
        meta.source,
        owned=False,
        notes=list(meta.notes),
        rebuild=meta.rebuild,
        wrapping=meta.wrapping,
    )


def is_transformers_config(obj: Any) -> bool:
    """Whether ``obj`` is a transformers config (without importing transformers)."""
    # transformers 5 names the base PreTrainedConfig; 4.x PretrainedConfig
    return any(c.__name__ in ("PretrainedConfig", "PreTrainedConfig") for c in type(obj).__mro__)


@register_source("config", is_transformers_config)
def _from_config(config: Any) -> MetaModel:
    def build() -> torch.nn.Module:
        transformers = heavy.transformers_models()
        cls = model_class(config)
        make = cls if cls is not None else transformers.AutoModel.from_config
        return on_meta(lambda: make(config))  # type: ignore[no-any-return]

    module = build()
    return MetaModel(
        module, "config", owned=True, notes=[built_note(config, module)], rebuild=build
    )


def model_class(config: Any) -> type | None:
    """The class the first of ``config.architectures`` names, when it is a transformers model
    class (a subclass of ``PreTrainedModel``), else None. Nothing else a config names is ever
    called: ``["Trainer"]``, ``["pipeline"]`` or ``["__class__"]`` in a ``config.json`` would
    otherwise run ``transformers.Trainer(config)`` (which reseeds every global RNG)."""
    archs = getattr(config, "architectures", None)
    name = archs[0] if isinstance(archs, (list, tuple)) and archs else None
    if not isinstance(name, str) or not name.isidentifier() or name.startswith("_"):
        return None
    transformers = heavy.transformers_models()
    try:
        cls = getattr(transformers, name, None)
    except Exception:  # a lazy import of a model whose optional library is missing
        return None
    model = transformers.PreTrainedModel
    return cls if isinstance(cls, type) and issubclass(cls, model) else None


def built_note(config: Any, module: torch.nn.Module) -> str:
    """Which class a config built, why, and how to pick another (``config.architectures``)."""
    built = type(module).__name__
    archs = getattr(config, "architectures", None) or []
    if archs and archs[0] == built:
        why = "the first of its architectures"
    elif archs:
        why = (
            f"its architectures names {str(archs[0])[:80]!r}, which is no model class of "
            "transformers: AutoModel's choice"
        )
    else:
        why = "it names no architectures: AutoModel's base model, without a task head"
    auto = getattr(heavy.transformers().models.auto, "modeling_auto", None)
    kind = getattr(config, "model_type", "")
    # another class for the same config: the causal-LM head, or else the base model
    others = [
        getattr(auto, table, {}).get(kind)
        for table in ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "MODEL_MAPPING_NAMES")
    ]
    other = next((o for o in others if isinstance(o, str) and o != built), "OtherClass")
    return (
        f"Built {built} from the {type(config).__name__} ({why}). For another class, set "
        f"config.architectures = ['{other}'] or pass mw.analyze(lambda: "
        f"transformers.{other}(config))."
    )


def _is_factory(obj: Any) -> bool:
    if isinstance(obj, type):
        return issubclass(obj, torch.nn.Module)
    if not callable(obj) or isinstance(obj, (str, bytes)):
        return False
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return False
    return all(
        p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        for p in sig.parameters.values()
    )


@register_source("factory", _is_factory)
def _from_factory(factory: Callable[[], Any]) -> MetaModel:
    def build() -> torch.nn.Module:
        built = on_meta(factory)
        if not isinstance(built, torch.nn.Module):
            raise SourceError(
                f"{getattr(factory, '__name__', factory)!r} returned a "
                f"{type(built).__name__}, not an nn.Module. Pass a function or class that "
                "builds the model."
            )
        if not all_on_meta(built):
            # tensors created with an explicit device=...; we own the module, so move it
            built = meta_copy(built)
        return built

    return MetaModel(build(), "factory", owned=True, rebuild=build)
