"""The architecture as a graph: which module call's output another module call reads.

Built from tensor identity in the trace (``CallRecord.input_ids`` / ``output_ids``: equal ids, one
tensor's data): a producer call -> a consumer call. At a depth, the nodes are the modules at that
depth (and shallower leaves); the ops that the bodies of the modules above them run (a residual
``add``, a ``cat``, a ``softmax`` of router logits: ``CallRecord.flows``) lie on the edges, so a
head that reads ``left(x) + right(x)`` has the edges left -> head and right -> head, both with
``add``, and none from what fed the branches.

Nodes are module rows (``Analysis.modules``), plus :data:`INPUT` (the model's inputs) and
:data:`OUTPUT` (what it returns). :func:`row_graph` gives the graph of rows;
:func:`fold_keys` folds runs of identical numbered siblings (``layers.0`` ... ``layers.79``) as
the tree does, and :func:`folded_graph` merges each folded node's members, leaving out the edges
from one member to the next (the repeat itself: the node's ``repeats`` says it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from ..data.flatten import TensorInfo

if TYPE_CHECKING:
    from ..data.records import CallRecord
    from ..data.tree import ModuleNode

__all__ = [
    "INPUT",
    "OUTPUT",
    "FoldKeys",
    "GraphData",
    "RowEdge",
    "fold_keys",
    "folded_graph",
    "nbytes",
    "row_graph",
    "tied_edges",
]

#: the node rows of the model's inputs and of its outputs
INPUT, OUTPUT = -1, -2
#: the tensor id of data the trace does not follow (``StorageTracker.ident``): never an origin
UNKNOWN = -1
#: at most this many op names are kept on an edge (the first seen)
MAX_OPS = 6
#: the ops of a body that only move data: left off the edges' op lists
_QUIET = frozenset(
    {"clone", "contiguous", "copy", "_to_copy", "to", "expand", "_unsafe_view", "detach", "empty"}
)


@dataclass(slots=True)
class RowEdge:
    """The tensors one node hands another: the first one's summary, how many in all (calls x
    tensors), and the ops of the bodies above them they went through on the way."""

    info: TensorInfo
    count: int = 1
    ops: dict[str, None] = field(default_factory=dict)
    #: "data" (a tensor) or "tied" (a parameter shared with the source)
    kind: str = "data"


@dataclass(slots=True)
class GraphData:
    """A graph of node keys (module rows, or folded paths): nodes with their calls, and edges."""

    #: node key -> the rows it stands for (a folded node: its members' rows)
    nodes: dict[Any, list[int]]
    edges: dict[tuple[Any, Any], RowEdge]
    #: node key -> how many calls its rows had
    calls: dict[Any, int]


def _op_name(name: str) -> str:
    """``aten.add_`` -> ``add``, ``aten._softmax`` -> ``softmax``; a taped function's name as
    it is."""
    name = name.rsplit(".", 1)[-1]
    name = name[:-1] if name.endswith("_") and not name.endswith("__") else name
    return name.lstrip("_") or name


def _merge(into: dict[int, tuple[str, ...]], src: int, ops: tuple[str, ...]) -> None:
    have = into.get(src)
    if have is None:
        into[src] = ops
    elif have != ops:
        into[src] = tuple(dict.fromkeys((*have, *ops)))[:MAX_OPS]


def _schedule(
    modules: Sequence[ModuleNode], calls: Sequence[CallRecord], depth: int
) -> list[tuple[tuple[int, int, int, int], str, int, int]]:
    """The events that make the graph at ``depth``, in the order they ran: each top-level
    call's inputs ("in") and outputs ("out"), the node calls ("node"), and the flows of the
    bodies above them ("flow": call index, flow index)."""
    kids: list[list[int]] = [[] for _ in calls]
    tops: list[int] = []
    for c in calls:
        (kids[c.parent] if c.parent >= 0 else tops).append(c.index)
    events: list[tuple[tuple[int, int, int, int], str, int, int]] = []
    for k, top in enumerate(tops):
        end = tops[k + 1] if k + 1 < len(tops) else len(calls)
        events.append(((top, -1, 0, 0), "in", top, 0))
        events.append(((end, -2, 0, 0), "out", top, 0))
    todo = list(tops)
    n = len(modules)
    while todo:
        c = calls[todo.pop()]
        d = modules[c.module].depth if 0 <= c.module < n else c.depth
        if d < depth and kids[c.index]:
            for j, (seq, _, _, _) in enumerate(c.flows or ()):
                # a tie: the later-started (deeper) call's ops ran first (see graph.md)
                events.append(((seq, 0, -c.index, j), "flow", c.index, j))
            todo.extend(kids[c.index])
        else:
            events.append(((c.index, 1, 0, 0), "node", c.index, 0))
    events.sort(key=lambda e: e[0])
    return events


def row_graph(modules: Sequence[ModuleNode], calls: Sequence[CallRecord], depth: int) -> GraphData:
    """The graph of module rows at ``depth`` (root = 0): see the module docstring."""
    walk = _Walk()
    for _, kind, i, j in _schedule(modules, calls, depth):
        c = calls[i]
        if kind == "flow":
            _, name, read, made = c.flows[j]  # type: ignore[index]
            walk.flow(_op_name(name), read, made)
        elif kind == "node":
            walk.node(c)
        elif kind == "in":
            walk.out.nodes.setdefault(INPUT, [INPUT])
            for tid in c.input_ids:
                if tid != UNKNOWN:
                    walk.origin.setdefault(tid, {INPUT: ()})
        else:
            walk.out.nodes.setdefault(OUTPUT, [OUTPUT])
            for tid, (_, info) in zip(c.output_ids, c.outputs, strict=False):
                for src, ops in walk.origin.get(tid, {}).items():
                    walk.hand(src, OUTPUT, info, ops)
    return walk.out


class _Walk:
    """The state of :func:`row_graph`'s walk: where each tensor's data came from (source node
    -> the ops on the way), and the nodes upstream of each node."""

    def __init__(self) -> None:
        self.origin: dict[int, dict[int, tuple[str, ...]]] = {}
        self.upstream: dict[int, set[int]] = {}
        self.out = GraphData(nodes={}, edges={}, calls={})

    def hand(self, src: int, dst: int, info: TensorInfo, ops: tuple[str, ...]) -> None:
        """One tensor from ``src`` read by ``dst``."""
        edge = self.out.edges.get((src, dst))
        if edge is None:
            self.out.edges[(src, dst)] = RowEdge(info, 1, dict.fromkeys(ops))
        else:
            edge.count += 1
            for op in ops:
                if len(edge.ops) < MAX_OPS:
                    edge.ops[op] = None
        if dst >= 0:
            up = self.upstream.setdefault(dst, set())
            if src not in up:
                up.add(src)
                up |= self.upstream.get(src, set())

    def node(self, c: CallRecord) -> None:
        """A call of a node: it reads its inputs, and its outputs come from it."""
        row = c.module
        self.out.nodes.setdefault(row, [row])
        self.out.calls[row] = self.out.calls.get(row, 0) + c.repeats
        for tid, (_, info) in zip(c.input_ids, c.inputs, strict=False):
            for src, ops in self.origin.get(tid, {}).items():
                self.hand(src, row, info, ops)
        for tid in c.output_ids:
            if tid != UNKNOWN:
                self.origin[tid] = {row: ()}

    def flow(self, name: str, read: tuple[int, ...], made: tuple[int, ...]) -> None:
        """One op of a body above the nodes: what it made comes from where its inputs came
        from, ``name`` added on the way. Where it joins several inputs, each counts only its
        latest sources: in ``x = x + attn(x)`` then ``x + mlp(x)``, the second sum's ``x`` comes
        from ``attn`` (and the stream before it, which ``attn`` read), so the skip edge starts
        at ``attn``. An op of one input (``relu(h + x)``) keeps all of its input's sources."""
        srcs: dict[int, tuple[str, ...]] = {}
        step = () if name in _QUIET else (name,)
        found = [o for o in (self.origin.get(tid) for tid in read) if o]
        joins = len(found) > 1  # a sum of two streams; relu(x + skip) keeps both of x + skip's
        for origin in found:
            for src, ops in (self._latest(origin) if joins else origin).items():
                _merge(srcs, src, ops if not step or step[0] in ops else (*ops, *step)[:MAX_OPS])
        for tid in made:
            if tid != UNKNOWN:
                self.origin[tid] = srcs

    def _latest(self, srcs: dict[int, tuple[str, ...]] | None) -> dict[int, tuple[str, ...]]:
        """``srcs`` less those upstream of another of them."""
        if not srcs or len(srcs) == 1:
            return srcs or {}
        up = self.upstream
        covered: set[int] = set()
        for t in srcs:
            covered |= up.get(t, set())
        return {
            s: ops
            for s, ops in srcs.items()
            if s not in covered or not any(t != s and s in up.get(t, ()) for t in srcs)
        }


@dataclass(slots=True)
class FoldKeys:
    """How rows fold: each row's folded path (``layers.0–79.mlp``) and the groups it sits in."""

    #: row -> its folded path ("" the root)
    path: list[str]
    #: row -> the (group id, member position) of each folded group on its path
    member: list[tuple[tuple[int, int], ...]]


def _signatures(modules: Sequence[ModuleNode]) -> list[int]:
    """A structural id per module, as ``js/tree.ts``'s ``signatures``: equal ids mean the same
    class, parameter count and subtree (children names, recursively)."""
    ids: dict[tuple[object, ...], int] = {}
    sig = [0] * len(modules)
    for m in reversed(modules):
        key = (m.type, m.params, tuple((c.name, sig[c.index]) for c in m.children))
        sig[m.index] = ids.setdefault(key, len(ids))
    return sig


def _runs(m: ModuleNode, sig: list[int]) -> list[list[ModuleNode]]:
    """Runs of at least two identical siblings with consecutive numeric names (``js/tree.ts``'s
    ``buildTree``: only ModuleList / Sequential entries fold)."""
    kids, runs, k = m.children, [], 0
    while k < len(kids):
        end = k + 1
        if kids[k].name.isdigit():
            first = int(kids[k].name)
            while (
                end < len(kids)
                and sig[kids[end].index] == sig[kids[k].index]
                and kids[end].name.isdigit()
                and int(kids[end].name) == first + end - k
            ):
                end += 1
        if end - k >= 2:
            runs.append(kids[k:end])
        k = end
    return runs


def fold_keys(modules: Sequence[ModuleNode]) -> FoldKeys:
    """Each row's folded path and group memberships (see :class:`FoldKeys`)."""
    sig = _signatures(modules)
    label: dict[int, tuple[str, tuple[int, int]]] = {}  # row -> (group label, (group, position))
    for m in modules:
        for run in _runs(m, sig):
            text = f"{run[0].name}–{run[-1].name}"
            for pos, m_ in enumerate(run):
                label[m_.index] = (text, (run[0].index, pos))
    path = [""] * len(modules)
    member: list[tuple[tuple[int, int], ...]] = [()] * len(modules)
    for m in modules:  # parents before children
        if m.parent < 0:
            continue
        own = label.get(m.index)
        name = own[0] if own else m.name
        path[m.index] = f"{path[m.parent]}.{name}" if path[m.parent] else name
        member[m.index] = member[m.parent] + ((own[1],) if own else ())
    return FoldKeys(path, member)


def _repeat_edge(keys: FoldKeys, src: int, dst: int) -> bool:
    """Whether ``src`` -> ``dst`` runs from one member of a folded group to another."""
    if src < 0 or dst < 0:
        return False
    theirs = dict(keys.member[dst])
    return any(theirs.get(g, pos) != pos for g, pos in keys.member[src])


def folded_graph(rows: GraphData, keys: FoldKeys) -> GraphData:
    """``rows`` with each folded node's members merged (keyed by folded path; the model's
    inputs and outputs by :data:`INPUT`, :data:`OUTPUT`), edges between members left out."""

    def key(row: int) -> Any:
        return row if row < 0 else keys.path[row]

    out = GraphData(nodes={}, edges={}, calls={})
    for row, members in rows.nodes.items():
        k = key(row)
        out.nodes.setdefault(k, []).extend(members)
        out.calls[k] = out.calls.get(k, 0) + rows.calls.get(row, 0)
    for (src, dst), e in rows.edges.items():
        if _repeat_edge(keys, src, dst):
            continue
        pair = (key(src), key(dst))
        have = out.edges.get(pair)
        if have is None:
            out.edges[pair] = RowEdge(e.info, e.count, dict(e.ops), e.kind)
        else:
            have.count += e.count
            for op in e.ops:
                if len(have.ops) < MAX_OPS:
                    have.ops[op] = None
    for members in out.nodes.values():
        members.sort()
    return out


def tied_edges(modules: Sequence[ModuleNode]) -> list[tuple[int, int, TensorInfo]]:
    """Tied weights: ``(owner row, user row, the parameter)`` for each parameter a module holds
    that an earlier module (in ``named_modules()`` order) holds too, the same Parameter object
    (``ModuleNode.tied_params``; GPT-2's ``lm_head.weight`` is ``transformer.wte``'s). The owner
    is found by identity, never by shape: among several same-shape tensors, the one tied."""
    out = []
    for m in modules:
        own = dict(m.own_params)
        for name, owner in m.tied_params:
            if name in own:
                out.append((owner, m.index, own[name]))
    return out


def nbytes(info: TensorInfo) -> int:
    """The bytes of a tensor of ``info``'s shape and dtype (contiguous)."""
    n = 1
    for s in info.shape:
        n *= s
    size = _ITEMSIZE.get(info.dtype)
    if size is None:
        dtype = getattr(torch, info.dtype, None)
        size = _ITEMSIZE[info.dtype] = dtype.itemsize if isinstance(dtype, torch.dtype) else 4
    return n * size


_ITEMSIZE: dict[str, int] = {}
