"""Turn what the user has into a module whose tensors all live on the ``meta`` device.

Every source leaves the user's objects as they were: an ``nn.Module`` with real tensors is analyzed
through a copy whose parameters and buffers are meta stand-ins (the real data is never copied),
so the user's module keeps its devices, storages, ``training`` flag and hooks. Sources are a
registry (``register_source``): the first whose predicate accepts the object builds it.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


class SourceError(TypeError):
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


_SOURCES: list[tuple[str, Callable[[Any], bool], Callable[[Any], MetaModel]]] = []


def register_source(
    name: str, accepts: Callable[[Any], bool]
) -> Callable[[Callable[[Any], MetaModel]], Callable[[Any], MetaModel]]:
    """Register ``build(obj) -> MetaModel`` for objects ``accepts(obj)`` is true for."""

    def wrap(build: Callable[[Any], MetaModel]) -> Callable[[Any], MetaModel]:
        _SOURCES.append((name, accepts, build))
        return build

    return wrap


def to_meta(obj: Any) -> MetaModel:
    """Return a :class:`MetaModel` for a module, class, factory, transformers config or path."""
    for _name, accepts, build in _SOURCES:
        if accepts(obj):
            return build(obj)
    raise SourceError(
        f"meta_widget cannot analyze an object of type {type(obj).__name__!r}. Pass an "
        "nn.Module, a class or zero-argument function that builds one, a transformers config, "
        "or the path of a checkpoint (.pt, .pth, .bin, .safetensors)."
    )


def _is_module(obj: Any) -> bool:
    import torch

    return isinstance(obj, torch.nn.Module)


def all_on_meta(module: torch.nn.Module) -> bool:
    """True when every parameter and buffer of ``module`` is a meta tensor."""
    return all(t.is_meta for t in _tensors(module))


def _tensors(module: torch.nn.Module) -> list[torch.Tensor]:
    import torch

    found: list[torch.Tensor] = []
    for m in module.modules():
        found.extend(p for p in m._parameters.values() if p is not None)
        found.extend(b for b in m._buffers.values() if b is not None)
        # plain tensor attributes (not registered) would otherwise be deep-copied for real
        found.extend(
            v
            for k, v in vars(m).items()
            if isinstance(v, torch.Tensor) and k not in ("_parameters", "_buffers")
        )
    return found


def meta_copy(module: torch.nn.Module) -> torch.nn.Module:
    """A structural copy of ``module`` whose tensors are meta stand-ins; no data is copied.

    Tied parameters stay tied (one stand-in per tensor object), ``requires_grad`` and strides are
    kept. The user's module is only read.
    """
    import torch

    memo: dict[int, Any] = {}
    for t in _tensors(module):
        if id(t) in memo:
            continue
        stand_in = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
        if isinstance(t, torch.nn.Parameter):
            stand_in = torch.nn.Parameter(stand_in, requires_grad=t.requires_grad)
        memo[id(t)] = stand_in
    try:
        return copy.deepcopy(module, memo)
    except Exception as exc:  # deepcopy of arbitrary user state can fail in many ways
        raise SourceError(
            f"meta_widget could not copy {type(module).__name__} to analyze it without touching "
            f"your module ({type(exc).__name__}: {exc}). Pass a function or class that builds the "
            "model instead, e.g. mw.analyze(lambda: MyModel(...)): it is then built directly on "
            "the meta device."
        ) from exc


@register_source("module", _is_module)
def _from_module(module: torch.nn.Module) -> MetaModel:
    if all_on_meta(module):
        return MetaModel(module, "module", owned=False)
    return MetaModel(meta_copy(module), "module", owned=True)


def _is_transformers_config(obj: Any) -> bool:
    # transformers 5 names the base PreTrainedConfig; 4.x PretrainedConfig
    return any(c.__name__ in ("PretrainedConfig", "PreTrainedConfig") for c in type(obj).__mro__)


@register_source("config", _is_transformers_config)
def _from_config(config: Any) -> MetaModel:
    def build() -> torch.nn.Module:
        import torch
        import transformers

        archs = getattr(config, "architectures", None) or []
        cls = getattr(transformers, archs[0], None) if archs else None
        with torch.device("meta"):
            if cls is not None:
                return cls(config)  # type: ignore[no-any-return]
            return transformers.AutoModel.from_config(config)  # type: ignore[no-any-return]

    module = build()
    return MetaModel(module, "config", owned=True, rebuild=build)


def _is_factory(obj: Any) -> bool:
    import torch

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
    import torch

    def build() -> torch.nn.Module:
        with torch.device("meta"):
            built = factory()
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
