"""The module tree as plain data: one :class:`ModuleNode` per entry of ``named_modules()``, with
its subtree's parameter counts and the calls made to it. No tensors, no modules: a node pickles,
serializes and keeps no model alive.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .flatten import TensorInfo
from .walk import ModuleWalk, walk

if TYPE_CHECKING:
    import torch

    from .records import CallRecord

__all__ = ["ModuleNode", "build_tree", "held_bytes", "reached_params"]


@dataclass(slots=True)
class ModuleNode:
    """One module of the tree (an entry of ``named_modules()``), with the calls made to it.

    ``params``, ``trainable_params``, ``param_bytes``, ``float_params`` and ``buffer_bytes`` count
    the module's whole subtree, each tensor once (tied weights once).
    """

    index: int
    path: str
    name: str
    type: str
    depth: int
    parent: int
    params: int
    trainable_params: int
    param_bytes: int
    float_params: int
    buffer_bytes: int
    own_params: list[tuple[str, TensorInfo]]
    children: list[ModuleNode] = field(default_factory=list)
    calls: list[CallRecord] = field(default_factory=list)
    #: the constructor's settings as ``print(model)`` shows them (``Module.extra_repr()``)
    extra_repr: str = ""
    #: (name, owner row) of each of ``own_params`` that an earlier row holds too, the same
    #: Parameter object (tied weights: GPT-2's ``lm_head.weight`` is ``transformer.wte``'s)
    tied_params: list[tuple[str, int]] = field(default_factory=list)

    @property
    def flops(self) -> int:
        """FLOPs of all calls of this module, sub-calls included."""
        return sum(c.flops for c in self.calls)

    @property
    def backward_flops(self) -> int:
        """In a training step: FLOPs of the backward of what its calls computed."""
        return sum(c.backward_flops for c in self.calls)

    @property
    def activation_bytes(self) -> int:
        """Bytes of new storage held by the outputs of this module's calls, summed over calls."""
        return sum(c.activation_bytes for c in self.calls)

    @property
    def error(self) -> bool:
        return any(c.error for c in self.calls)

    @property
    def assumed(self) -> bool:
        """Whether a call of this module took an assumption or produced assumed shapes."""
        return any(c.assumed for c in self.calls)

    def walk(self) -> Any:
        yield self
        for child in self.children:
            yield from child.walk()


def held_bytes(t: torch.Tensor) -> int:
    """The bytes holding ``t``'s data: ``numel * element_size``; for a tensor subclass that
    packs its data into inner tensors (torchao's quantized weights: int8 or packed int4 data,
    scales, zero points), the bytes of those inner tensors. A DTensor counts its global size
    here (``meta_widget.memory.report`` counts its local shard)."""
    if not hasattr(type(t), "__tensor_flatten__") or type(t).__name__ == "DTensor":
        return t.numel() * t.element_size()
    names, _ = t.__tensor_flatten__()  # type: ignore[attr-defined]
    inner = (getattr(t, name) for name in names)
    return sum(held_bytes(v) for v in inner if hasattr(v, "element_size"))


def _extra_repr(module: torch.nn.Module) -> str:
    """``module.extra_repr()`` on one line; "" where a user's override fails on meta tensors."""
    try:
        text = module.extra_repr()
    except (RuntimeError, TypeError, ValueError, AttributeError, NotImplementedError):
        return ""  # a custom extra_repr that reads values a meta tensor does not have
    return " ".join(str(text).split())


def build_tree(module: torch.nn.Module, tree: ModuleWalk | None = None) -> list[ModuleNode]:
    """Nodes for ``module.named_modules()``, with subtree parameter counts (each tensor once).

    Subtrees are gathered bottom-up once per module object (``Module.parameters()`` per module
    would walk each subtree again: half a second on a 70B model). ``tree``: ``module``'s walk,
    if made already (the trace reuses it).
    """
    if tree is None:
        tree = walk(module)
    totals = _subtree_totals(module, tree)
    nodes: list[ModuleNode] = []
    row_by_path: dict[str, int] = {}
    owner: dict[int, int] = {}  # a Parameter's id -> the first row holding it
    for i, (path, m) in enumerate(zip(tree.names, tree.modules, strict=True)):
        row_by_path[path] = i
        n, trainable, nbytes, floats, buffer_bytes = totals[id(m)]
        parent_path, _, name = path.rpartition(".")
        parent = row_by_path[parent_path] if path else -1
        nodes.append(
            ModuleNode(
                index=i,
                path=path,
                name=name,
                type=type(m).__name__,
                depth=path.count(".") + 1 if path else 0,
                parent=parent,
                params=n,
                trainable_params=trainable,
                param_bytes=nbytes,
                float_params=floats,
                buffer_bytes=buffer_bytes,
                own_params=[
                    TensorInfo.named(n, p) for n, p in m._parameters.items() if p is not None
                ],
                extra_repr=_extra_repr(m),
                tied_params=_tied(m, i, owner),
            )
        )
        if parent >= 0:
            nodes[parent].children.append(nodes[-1])
    return nodes


def _tied(module: torch.nn.Module, row: int, owner: dict[int, int]) -> list[tuple[str, int]]:
    """``module``'s own parameters an earlier row holds (name, that row); ``owner`` (a
    Parameter's id -> its first row) learns the others."""
    out = []
    for name, p in module._parameters.items():
        if p is not None:
            first = owner.setdefault(id(p), row)
            if first != row:
                out.append((name, first))
    return out


#: a subtree's parameters, trainable parameters, parameter bytes, floating-point parameters and
#: buffer bytes
_Totals = tuple[int, int, int, int, int]


def reached_params(
    tree: ModuleWalk, size: Callable[[torch.Tensor], tuple[int, int]]
) -> tuple[list[int], list[int]]:
    """Per row of ``tree`` (``named_modules()`` order): the bytes and the floating-point
    elements of every parameter its subtree reaches, each once, as ``size(p)`` (elements,
    bytes) counts them. ``ModuleNode.param_bytes`` and ``float_params`` with another count:
    ``meta_widget.memory.modules`` counts what one rank holds of each DTensor."""
    totals = _subtree_totals(tree.modules[0], tree, size) if tree.modules else {}
    rows = [totals[id(m)] for m in tree.modules]
    return [t[2] for t in rows], [t[3] for t in rows]


def _held(t: torch.Tensor) -> tuple[int, int]:
    return t.numel(), held_bytes(t)


def _subtree_totals(
    module: torch.nn.Module,
    tree: ModuleWalk,
    size: Callable[[torch.Tensor], tuple[int, int]] = _held,
) -> dict[int, _Totals]:
    """The totals of each module's subtree, by ``id``, each tensor once; a parameter's elements
    and bytes as ``size`` counts them.

    Where no module has two parents and no tensor two owners (most models), a subtree's totals
    are its own plus its children's, summed bottom-up. Otherwise (tied weights, a shared block)
    the tensors of each subtree are gathered as sets first (:func:`_gather`).
    """
    owned = [t for m in tree.modules for t in (*m._parameters.values(), *m._buffers.values())]
    owned = [t for t in owned if t is not None]
    shared = len(owned) != len(tree.parameters) + len(tree.buffers) or any(
        len(p) > 1 for p in tree.paths.values()
    )
    if shared:
        return _totals_of_sets(module, size)
    totals: dict[int, _Totals] = {}
    for m in reversed(tree.modules):  # preorder reversed: children before their parent
        n = trainable = nbytes = floats = buffer_bytes = 0
        for p in m._parameters.values():
            if p is not None:
                k, held = size(p)
                n += k
                nbytes += held
                if p.requires_grad:
                    trainable += k
                if p.is_floating_point():
                    floats += k
        for b in m._buffers.values():
            if b is not None:
                buffer_bytes += b.numel() * b.element_size()
        for child in m._modules.values():
            if child is not None:
                t = totals[id(child)]
                n += t[0]
                trainable += t[1]
                nbytes += t[2]
                floats += t[3]
                buffer_bytes += t[4]
        totals[id(m)] = (n, trainable, nbytes, floats, buffer_bytes)
    return totals


def _totals_of_sets(
    module: torch.nn.Module, size: Callable[[torch.Tensor], tuple[int, int]]
) -> dict[int, _Totals]:
    params: dict[int, tuple[int, int, bool, bool]] = {}  # id -> numel, bytes, float, grad
    buffers: dict[int, int] = {}
    subtree: dict[int, tuple[frozenset[int], frozenset[int]]] = {}
    _gather(module, params, buffers, subtree, size)
    totals: dict[int, _Totals] = {}
    for key, (ps, bs) in subtree.items():
        info = [params[k] for k in ps]
        totals[key] = (
            sum(n for n, _, _, _ in info),
            sum(n for n, _, _, grad in info if grad),
            sum(b for _, b, _, _ in info),
            sum(n for n, _, fl, _ in info if fl),
            sum(buffers[k] for k in bs),
        )
    return totals


def _gather(
    root: torch.nn.Module,
    params: dict[int, tuple[int, int, bool, bool]],
    buffers: dict[int, int],
    subtree: dict[int, tuple[frozenset[int], frozenset[int]]],
    size: Callable[[torch.Tensor], tuple[int, int]],
) -> None:
    """The ids of the parameters and buffers in each module's subtree under ``root``, by the
    module's ``id``, into ``subtree`` (filling ``params`` and ``buffers`` on the way).

    Iterative and bottom-up (a module's sets are made once its children's are), so a deep tree
    takes no recursion; a module already on the path being walked (a cycle, which the sources
    refuse) is not entered again, its tensors counted where it is. Not a closure: a closure over
    these tables is a reference cycle, and with the collector paused for the analysis its sets
    (55 MiB on a 100,000-module model) would live as long as the analysis.
    """
    entered: set[int] = set()
    todo: list[tuple[torch.nn.Module, bool]] = [(root, False)]
    while todo:
        m, leaving = todo.pop()
        if id(m) in subtree or (id(m) in entered and not leaving):
            continue
        children = [c for c in m._modules.values() if c is not None]
        if not leaving:
            entered.add(id(m))
            todo.append((m, True))
            todo.extend((c, False) for c in reversed(children))
            continue
        ps, bs = _own_tensors(m, params, buffers, size)
        for child in children:
            below = subtree.get(id(child))  # None: an ancestor (a cycle), counted above
            if below is not None:
                ps |= below[0]
                bs |= below[1]
        subtree[id(m)] = (frozenset(ps), frozenset(bs))


def _own_tensors(
    m: torch.nn.Module,
    params: dict[int, tuple[int, int, bool, bool]],
    buffers: dict[int, int],
    size: Callable[[torch.Tensor], tuple[int, int]],
) -> tuple[set[int], set[int]]:
    """The ids of ``m``'s own parameters and buffers (recording each in ``params`` and
    ``buffers``)."""
    ps: set[int] = set()
    bs: set[int] = set()
    for p in m._parameters.values():
        if p is not None:
            params[id(p)] = (*size(p), p.is_floating_point(), p.requires_grad)
            ps.add(id(p))
    for b in m._buffers.values():
        if b is not None:
            buffers[id(b)] = b.numel() * b.element_size()
            bs.add(id(b))
    return ps, bs
