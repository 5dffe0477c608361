"""Module trees as users build them by hand (issue 23.4 and 23.5): names ``add_module`` would
refuse, set straight into ``_modules``, and modules inside themselves.

Each is refused with :class:`SourceError` naming the entry and what to do, before anything is
traced, whether the module is on the CPU (analyzed through a meta copy), on meta already, or
built by a factory. The truth for what still works (a module under two parents, a deep tree) is
counted here from the module itself, with loops of the test's own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import meta_widget as mw
from meta_widget.data.tree import build_tree
from meta_widget.data.walk import tree_fault, walk
from meta_widget.sources.models import SourceError


def _net() -> torch.nn.Sequential:
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())


def _dotted() -> torch.nn.Module:
    m = _net()
    m._modules["a.b"] = torch.nn.Linear(4, 4)
    return m


def _empty() -> torch.nn.Module:
    m = _net()
    m[0]._modules[""] = torch.nn.Linear(4, 4)
    return m


def _not_a_string() -> torch.nn.Module:
    m = _net()
    m._modules[7] = torch.nn.Linear(4, 4)  # type: ignore[index]
    return m


def _not_a_module() -> torch.nn.Module:
    m = _net()
    m._modules["extra"] = "not a module"  # type: ignore[assignment]
    return m


def _own_child() -> torch.nn.Module:
    m = _net()
    m._modules["me"] = m
    return m


def _each_other() -> torch.nn.Module:
    m = _net()
    a, b = torch.nn.Sequential(), torch.nn.Sequential()
    a._modules["b"] = b
    b._modules["a"] = a
    m._modules["a"] = a
    return m


#: a hand-built tree, and words the refusal must hold: the entry's path and the remedy
TREES: dict[str, tuple[Callable[[], torch.nn.Module], list[str]]] = {
    "dotted name": (_dotted, ["Sequential._modules['a.b']", "add_module", "plain name"]),
    "empty name": (_empty, ["Sequential.0._modules['']", "add_module", "plain name"]),
    "name not a string": (_not_a_string, ["Sequential._modules[7]", "plain name"]),
    "entry not a module": (_not_a_module, ["Sequential._modules['extra']", "str, not an"]),
    "its own child": (_own_child, ["Sequential._modules['me']", "cycle", "object.__setattr__"]),
    "two holding each other": (
        _each_other,
        ["Sequential.a.b._modules['a']", "is Sequential.a itself", "cycle", "object.__setattr__"],
    ),
}


def _on_meta(build: Callable[[], torch.nn.Module]) -> torch.nn.Module:
    with torch.device("meta"):
        return build()


HOW: dict[str, Callable[[Callable[[], torch.nn.Module]], Any]] = {
    "cpu module": lambda build: build(),
    "meta module": _on_meta,
    "factory": lambda build: build,
}


@pytest.mark.parametrize("how", list(HOW))
@pytest.mark.parametrize("tree", list(TREES))
@pytest.mark.parametrize("inputs", [None, (2, 4)])
def test_odd_trees_are_refused_with_the_path(tree: str, how: str, inputs: Any) -> None:
    build, words = TREES[tree]
    model = HOW[how](build)
    with pytest.raises(SourceError) as caught:
        mw.analyze(model, input_size=inputs)
    message = str(caught.value)
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"


def test_training_and_param_dtype_are_refused_too() -> None:
    for build, _ in TREES.values():
        with pytest.raises(SourceError):
            mw.analyze(build(), input_size=(2, 4), mode="training", param_dtype="bfloat16")


def test_a_module_under_two_parents_still_works() -> None:
    """Sharing is not a cycle: the shared block is counted once, as the module's own
    ``parameters()`` (which de-duplicates) counts it."""
    shared = torch.nn.Linear(4, 4)
    model = torch.nn.Sequential(shared, torch.nn.ReLU(), torch.nn.Sequential(shared))
    a = mw.analyze(model, input_size=(2, 4))
    assert a.error is None
    assert a.total_params == sum(p.numel() for p in model.parameters())


def _chain(depth: int) -> tuple[torch.nn.Module, torch.nn.Linear]:
    """``depth`` nested containers, a Linear at the bottom and the same Linear at the top."""
    with torch.device("meta"):
        root = top = torch.nn.Module()
        for _ in range(depth):
            below = torch.nn.Module()
            top._modules["c"] = below
            top = below
        fc = torch.nn.Linear(4, 4)
    top._modules["fc"] = fc
    root._modules["fc"] = fc  # under two parents: the subtrees are gathered as sets
    return root, fc


def test_deep_trees_are_walked_without_recursion() -> None:
    """Deeper than Python's recursion limit: the checks and the tree take it (PyTorch's own
    ``named_modules`` would not)."""
    depth = 3 * 1000
    root, fc = _chain(depth)
    assert tree_fault(root) is None
    nodes = build_tree(root, walk(root))
    own = fc.weight.numel() + fc.bias.numel()  # counted by hand: one Linear(4, 4)
    assert nodes[0].params == own  # the root: the Linear once, though it has two parents
    assert nodes[1].params == own  # every container on the way down holds it too
    assert len(nodes) == depth + 2


def test_a_cycle_deep_down_is_found() -> None:
    root, _ = _chain(2000)
    bottom = root
    while "c" in bottom._modules:
        bottom = bottom._modules["c"]
    bottom._modules["up"] = root._modules["c"]
    fault = tree_fault(root)
    assert fault is not None and fault.kind == "cycle" and fault.ancestor == "c"
    assert fault.parent == ".".join(["c"] * 2000)
