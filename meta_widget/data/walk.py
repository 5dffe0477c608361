"""One walk over a module tree: its modules, their paths, parameters and buffers.

A trace needs the module tree many times before its forward pass (hooks, the call stack's rows
and paths, training flags, parameters, the tensors that existed before it, the fused-kernel
patches, the claim against concurrent traces) and the report twice after it. Each
``Module.modules()`` / ``named_parameters()`` is a walk of nested generators: on a 5,000-module
model 12 ms and 24 ms, and a trace made 19 of them. :func:`walk` makes one, iteratively, with
the results PyTorch's own walks give (same order, same deduplication).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import cast

import torch

__all__ = ["ModuleWalk", "TreeFault", "modules", "tree_fault", "walk"]


@dataclass(frozen=True, slots=True)
class ModuleWalk:
    """What :func:`walk` found under one root module."""

    #: every module once, in ``Module.named_modules()`` order
    modules: list[torch.nn.Module]
    #: the path of each of ``modules`` (its first, as ``named_modules()`` gives it)
    names: list[str]
    #: every path of each module, by ``id``: a module shared by two parents has two
    #: (``named_modules(remove_duplicate=False)``)
    paths: dict[int, list[str]]
    #: ``named_parameters()``: each parameter once, under its first name
    parameters: list[tuple[str, torch.nn.Parameter]]
    #: ``named_buffers()``: each buffer once, under its first name
    buffers: list[tuple[str, torch.Tensor]]


def walk(root: torch.nn.Module) -> ModuleWalk:
    """Walk ``root`` once (see :class:`ModuleWalk`).

    A module shared by several parents is listed once and its paths all kept; a module inside
    itself (a cycle) is not entered again: its path there is kept, once.
    """
    modules: list[torch.nn.Module] = []
    names: list[str] = []
    paths: dict[int, list[str]] = {}
    # (path, module, ids of the modules above it) in preorder: children pushed in reverse
    todo: list[tuple[str, torch.nn.Module, frozenset[int]]] = [("", root, frozenset())]
    while todo:
        path, m, above = todo.pop()
        key = id(m)
        seen = paths.get(key)
        if seen is None:
            paths[key] = [path]
            modules.append(m)
            names.append(path)
        else:
            seen.append(path)
            if key in above:
                continue  # a cycle: its path is kept, its modules are listed already
        inside = above | {key}
        children = [
            (f"{path}.{name}" if path else name, child, inside)
            for name, child in m._modules.items()
            if child is not None
        ]
        todo.extend(reversed(children))
    return ModuleWalk(
        modules=modules,
        names=names,
        paths=paths,
        parameters=cast(
            "list[tuple[str, torch.nn.Parameter]]", _members(modules, names, "_parameters")
        ),
        buffers=_members(modules, names, "_buffers"),
    )


def _members(
    modules: list[torch.nn.Module], names: list[str], table: str
) -> list[tuple[str, torch.Tensor]]:
    found: list[tuple[str, torch.Tensor]] = []
    seen: set[int] = set()
    for prefix, m in zip(names, modules, strict=True):
        for name, t in getattr(m, table).items():
            if t is None or id(t) in seen:
                continue
            seen.add(id(t))
            found.append((f"{prefix}.{name}" if prefix else name, t))
    return found


def modules(root: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """``root.modules()``, without the paths: each module once, in the same order; cheaper for
    a loop that may stop early (``named_modules`` builds every path as it goes). A module
    inside itself is not entered again, nor an entry of ``_modules`` that is not a module
    (:func:`tree_fault` finds both)."""
    todo = [root]
    seen: set[int] = set()
    module = torch.nn.Module
    while todo:
        m = todo.pop()
        if id(m) in seen:
            continue
        seen.add(id(m))
        yield m
        todo.extend(reversed([c for c in m._modules.values() if isinstance(c, module)]))


@dataclass(frozen=True, slots=True)
class TreeFault:
    """Where a module tree breaks PyTorch's rules for one (see :func:`tree_fault`)."""

    #: ``"name"``: a submodule's name is empty, holds a ``"."`` or is not a string;
    #: ``"cycle"``: a submodule is also one of its own ancestors; ``"type"``: an entry of
    #: ``_modules`` is neither a module nor None
    kind: str
    #: the path of the module holding the entry (``""``: the root)
    parent: str
    #: the entry's key in that module's ``_modules``
    name: object
    #: the entry's type name
    type: str
    #: for a cycle, the path of the ancestor the entry is (``""``: the root)
    ancestor: str = ""


def tree_fault(root: torch.nn.Module) -> TreeFault | None:
    """The first entry of ``root``'s module tree, in ``named_modules()`` order, that breaks the
    rules ``add_module`` checks or makes the tree a cycle; None if there is none.

    Names must be non-empty strings without ``"."`` (paths are dotted: ``"a.b"`` under the root
    and ``"b"`` under ``a`` would be one path, and an empty name repeats its parent's). A module
    may appear under several parents, but not inside itself: PyTorch's own recursive walks
    (``to``, ``train``, ``apply``, ``state_dict``) never end on a cycle. Iterative, so a deep
    tree is checked as well as a wide one.
    """
    entered: dict[int, str] = {}  # the modules on the path being walked, by id: their paths
    done: set[int] = set()
    # (path, module, leaving): each module is pushed again, as leaving, below its children
    todo: list[tuple[str, torch.nn.Module, bool]] = [("", root, False)]
    while todo:
        path, m, leaving = todo.pop()
        if leaving:
            del entered[id(m)]
            done.add(id(m))
            continue
        if id(m) in done:
            continue  # a module under two parents, pushed twice: checked once
        entered[id(m)] = path
        todo.append((path, m, True))
        children = []
        for name, child in m._modules.items():
            fault = _entry_fault(path, name, child, entered)
            if fault is not None:
                return fault
            if child is not None and id(child) not in done:
                children.append((f"{path}.{name}" if path else name, child, False))
        todo.extend(reversed(children))
    return None


def _entry_fault(
    parent: str, name: object, child: object, entered: dict[int, str]
) -> TreeFault | None:
    """The fault of one ``_modules`` entry, if any (see :func:`tree_fault`)."""
    kind = type(child).__name__
    if not isinstance(name, str) or not name or "." in name:
        return TreeFault("name", parent, name, kind)
    if child is not None and not isinstance(child, torch.nn.Module):
        return TreeFault("type", parent, name, kind)
    if child is not None and id(child) in entered:
        return TreeFault("cycle", parent, name, kind, entered[id(child)])
    return None
