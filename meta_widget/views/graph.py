"""The architecture as a graph: which module call's output another module call reads.

Built from tensor identity in the trace (``CallRecord.input_ids`` / ``output_ids``: equal ids, one
tensor's data): a producer call -> a consumer call. At a depth, the nodes are the modules at that
depth (and shallower leaves); the ops that the bodies of the modules above them run (a residual
``add``, a ``cat``, a ``softmax`` of router logits: ``CallRecord.flows``) lie on the edges, so a
head that reads ``left(x) + right(x)`` has the edges left -> head and right -> head, both with
``add``, and none from what fed the branches.

Nodes are module rows (``Analysis.modules``), plus :data:`INPUT` (the model's inputs),
:data:`OUTPUT` (what it returns), :data:`CACHE` (the KV cache it returns) and op nodes (an
attention, a residual add: ``views/graph_ops.py``; keyed -4, -5, ..., ``GraphData.ops``).
:func:`row_graph` gives the graph of rows; :func:`fold_keys` folds runs of identical numbered
siblings (``layers.0`` ... ``layers.79``) as the tree does, and :func:`folded_graph` merges each
folded node's members, leaving out the edges from one member to the next (the repeat itself:
the node's ``repeats`` says it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from ..data.flatten import TensorInfo
from .graph_ops import (
    ATTENTION,
    INNER,
    MATMUL,
    NO_DATA,
    RESIDUAL,
    SOFTMAX,
    OpNode,
    attention_flops,
    is_cache_output,
    is_sdpa,
    name_ops,
    residual_stream,
    scores,
)

if TYPE_CHECKING:
    from ..data.records import CallRecord
    from ..data.tree import ModuleNode

__all__ = [
    "CACHE",
    "INPUT",
    "OUTPUT",
    "FoldKeys",
    "GraphData",
    "RowEdge",
    "fold_keys",
    "folded_graph",
    "keyed",
    "nbytes",
    "op_path",
    "row_graph",
    "tied_edges",
]

#: the node rows of the model's inputs, of its outputs, and of the KV cache it returns
INPUT, OUTPUT, CACHE = -1, -2, -3
#: the key of the first op node (an attention, a residual add); the next -5, ...
FIRST_OP = -4
#: the tensor id of data the trace does not follow (``StorageTracker.ident``): never an origin
UNKNOWN = -1
#: what an edge into an op node carries when its source's tensor is not known (never, so far)
_NO_INFO = TensorInfo((), "float32", (), False)
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
    #: "data" (a tensor), "tied" (a parameter shared with the source), "residual" (the stream
    #: into a residual add: the spine) or "cache" (an entry of the KV cache the model returns)
    kind: str = "data"


@dataclass(slots=True)
class GraphData:
    """A graph of node keys (module rows, or folded paths): nodes with their calls, and edges."""

    #: node key -> the rows it stands for (a folded node: its members' rows)
    nodes: dict[Any, list[int]]
    edges: dict[tuple[Any, Any], RowEdge]
    #: node key -> how many calls its rows had
    calls: dict[Any, int]
    #: the op nodes' keys -> what they are (``views/graph_ops.py``)
    ops: dict[Any, OpNode] = field(default_factory=dict)


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
    walk = _Walk(modules)
    for _, kind, i, j in _schedule(modules, calls, depth):
        c = calls[i]
        if kind == "flow":
            _, name, read, made = c.flows[j]  # type: ignore[index]
            walk.flow(c, _op_name(name), read, made)
        elif kind == "node":
            walk.node(c)
        elif kind == "in":
            walk.out.nodes.setdefault(INPUT, [INPUT])
            for tid, (_, info) in zip(c.input_ids, c.inputs, strict=False):
                if tid != UNKNOWN and tid not in walk.origin:
                    walk.origin[tid] = {INPUT: ()}
                    walk.info.setdefault(INPUT, info)
        else:
            walk.out.nodes.setdefault(OUTPUT, [OUTPUT])
            for tid, (name, info) in zip(c.output_ids, c.outputs, strict=False):
                dst = CACHE if is_cache_output(name) else OUTPUT
                walk.out.nodes.setdefault(dst, [dst])
                srcs = walk.origin.get(tid) or (walk.maker(calls, tid) if dst == CACHE else {})
                for src, ops in srcs.items():
                    walk.hand(src, dst, info, ops, "cache" if dst == CACHE else "data")
    name_ops(walk.out.ops)
    _op_flops(walk.out.ops, calls)
    return walk.out


def _op_flops(ops: dict[Any, OpNode], calls: Sequence[CallRecord]) -> None:
    """Each attention node's FLOPs: its module's body's attention ops (shared among the body's
    attention nodes, when it has several)."""
    rows: dict[int, list[OpNode]] = {}
    for op in ops.values():
        if op.kind == ATTENTION:
            rows.setdefault(op.row, []).append(op)
    if not rows:
        return
    for c in calls:
        same = rows.get(c.module)
        if same:
            flops = attention_flops(c.ops, _op_name)
            for op in same:
                op.flops += flops // len(same)


class _Walk:
    """The state of :func:`row_graph`'s walk: where each tensor's data came from (source node
    -> the ops on the way), the nodes upstream of each node, and the op nodes found."""

    def __init__(self, modules: Sequence[ModuleNode]) -> None:
        self.modules = modules
        self.origin: dict[int, dict[int, tuple[str, ...]]] = {}
        #: node -> the nodes upstream of it, as a mask of their ``bits`` (a few machine words
        #: for a thousand nodes: the 70B's layers unfolded kept 500,000 set entries)
        self.upstream: dict[int, int] = {}
        self.bits: dict[int, int] = {}
        #: node -> the tensor it made last (what an edge from it into an op node carries)
        self.info: dict[int, TensorInfo] = {}
        #: (module row, kind, place in its body's call) -> op node key
        self.op_keys: dict[tuple[int, str, int], int] = {}
        #: (call index, kind) -> how many op nodes of that kind its body ran so far
        self.seen: dict[tuple[int, str], int] = {}
        #: tensor id -> the module whose body's op made it (built when first asked)
        self.made_by: dict[int, int] | None = None
        self.out = GraphData(nodes={}, edges={}, calls={})

    def hand(
        self, src: int, dst: int, info: TensorInfo, ops: tuple[str, ...], kind: str = "data"
    ) -> None:
        """One tensor from ``src`` read by ``dst``."""
        edge = self.out.edges.get((src, dst))
        if edge is None:
            self.out.edges[(src, dst)] = RowEdge(info, 1, dict.fromkeys(ops), kind)
        else:
            edge.count += 1
            for op in ops:
                if len(edge.ops) < MAX_OPS:
                    edge.ops[op] = None
        if dst not in (OUTPUT, CACHE):
            up = self.upstream.get(dst, 0)
            bit = self._bit(src)
            if not up & bit:
                self.upstream[dst] = up | bit | self.upstream.get(src, 0)

    def _bit(self, node: int) -> int:
        """``node``'s bit in the ``upstream`` masks."""
        bit = self.bits.get(node)
        if bit is None:
            bit = self.bits[node] = 1 << len(self.bits)
        return bit

    def above(self, src: int, dst: int) -> bool:
        """Whether ``src`` is upstream of ``dst`` (its data reached ``dst``)."""
        bit = self.bits.get(src)
        return bit is not None and bool(self.upstream.get(dst, 0) & bit)

    def node(self, c: CallRecord) -> None:
        """A call of a node: it reads its inputs, and its outputs come from it."""
        row = c.module
        self.out.nodes.setdefault(row, [row])
        self.out.calls[row] = self.out.calls.get(row, 0) + c.repeats
        for tid, (_, info) in zip(c.input_ids, c.inputs, strict=False):
            for src, ops in self.origin.get(tid, {}).items():
                self.hand(src, row, info, ops)
        for tid, (_, info) in zip(c.output_ids, c.outputs, strict=False):
            if tid != UNKNOWN:
                self.origin[tid] = {row: ()}
                self.info[row] = info

    def flow(self, c: CallRecord, name: str, read: tuple[int, ...], made: tuple[int, ...]) -> None:
        """One op of a body above the nodes: what it made comes from where its inputs came
        from, ``name`` added on the way. Where it joins several inputs, each counts only its
        latest sources: in ``x = x + attn(x)`` then ``x + mlp(x)``, the second sum's ``x`` comes
        from ``attn`` (and the stream before it, which ``attn`` read), so the skip edge starts
        at ``attn``. An op of one input (``relu(h + x)``) keeps all of its input's sources.
        An attention or a residual add is a node of its own (:meth:`op_node`)."""
        found = [o for o in (self.origin.get(tid) for tid in read) if o]
        if name in NO_DATA:
            found = []
        elif self.op_node(c, name, found, made):
            return
        srcs: dict[int, tuple[str, ...]] = {}
        step = () if name in _QUIET else (name,)
        joins = len(found) > 1  # a sum of two streams; relu(x + skip) keeps both of x + skip's
        for origin in found:
            for src, ops in (self._latest(origin) if joins else origin).items():
                _merge(srcs, src, ops if not step or step[0] in ops else (*ops, *step)[:MAX_OPS])
        for tid in made:
            if tid != UNKNOWN:
                self.origin[tid] = srcs

    def op_node(
        self,
        c: CallRecord,
        name: str,
        found: list[dict[int, tuple[str, ...]]],
        made: tuple[int, ...],
    ) -> bool:
        """Whether op ``name`` is (part of) an op node: an attention (a kernel, a softmax of
        scores, the product of its weights by the values), or a residual add. If so, its
        inputs' sources feed the node and what it made comes from the node."""
        key, stream = self._which(c, name, found)
        if key is None:
            return False
        for origin in found:
            for src, ops in self._latest(origin).items():
                if src == key:
                    continue
                kept = tuple(op for op in ops if op not in INNER)
                info = self.info.get(src, _NO_INFO)
                self.hand(src, key, info, kept, "residual" if src in stream else "data")
        # what it made, as its stream's (or first input's) source made it: this call's shapes
        first = next((s for o in (stream, *found) for s in o if s in self.info and s != key), None)
        if first is not None:
            self.info[key] = self.info[first]
        for tid in made:
            if tid != UNKNOWN:
                self.origin[tid] = {key: ()}
        return True

    def _which(
        self, c: CallRecord, name: str, found: list[dict[int, tuple[str, ...]]]
    ) -> tuple[int | None, dict[int, tuple[str, ...]]]:
        """The op node op ``name`` is part of (or None), and a residual's stream operand."""
        if is_sdpa(name) or (
            name in SOFTMAX and any(scores(ops) for o in found for ops in o.values())
        ):
            return self._op_key(c, ATTENTION, name), {}
        if name in MATMUL:
            for o in found:  # the attention's weights (a softmax's output) by the values
                if len(o) == 1:
                    ((src, ops),) = o.items()
                    op = self.out.ops.get(src)
                    if op is not None and op.kind == ATTENTION and not scores(ops):
                        return src, {}
            return None, {}
        k = residual_stream(found, self.above) if name == "add" else None
        if k is None or not self._same_shape(found):
            return None, {}
        return self._op_key(c, RESIDUAL, self._branch(c, found[1 - k])), found[k]

    def maker(self, calls: Sequence[CallRecord], tid: int) -> dict[int, tuple[str, ...]]:
        """The node whose call made tensor ``tid`` inside its body without returning it (a KV
        cache entry a layer's attention writes): ``{node: ()}``, or ``{}``."""
        if self.made_by is None:
            self.made_by = {}
            for c in calls:
                for _, _, _, made in c.flows or ():
                    for t in made:
                        self.made_by.setdefault(t, c.module)
        row, n = self.made_by.get(tid, -1), len(self.modules)
        while 0 <= row < n and row not in self.out.nodes:
            row = self.modules[row].parent
        return {row: ()} if 0 <= row < n else {}

    def _op_key(self, c: CallRecord, kind: str, detail: str) -> int:
        """The op node of the next ``kind`` op of call ``c``'s body (a new one, or the one its
        module's earlier calls ran at this place), counted as one call."""
        place = self.seen.get((c.index, kind), 0)
        self.seen[(c.index, kind)] = place + 1
        ident = (c.module, kind, place)
        key = self.op_keys.get(ident)
        if key is None:
            key = self.op_keys[ident] = FIRST_OP - len(self.op_keys)
            self.out.ops[key] = OpNode(c.module, kind, detail=detail)
            self.out.nodes[key] = [key]
        self.out.calls[key] = self.out.calls.get(key, 0) + c.repeats
        return key

    def _branch(self, c: CallRecord, branch: dict[int, tuple[str, ...]]) -> str:
        """``+ self_attn``: the child of ``c``'s module that a residual's branch comes from."""
        modules, n = self.modules, len(self.modules)
        for src in branch:
            row = self.out.ops[src].row if src in self.out.ops else src
            while 0 <= row < n and modules[row].parent != c.module and modules[row].parent >= 0:
                row = modules[row].parent
            if 0 <= row < n and modules[row].parent == c.module:
                return f"+ {modules[row].name}"
        return ""

    def _same_shape(self, found: list[dict[int, tuple[str, ...]]]) -> bool:
        """Whether the sources of an add's operands made tensors of one shape (a residual adds
        like to like; a mask or a bias broadcast onto scores is no stream)."""
        shapes = {self.info[s].shape for o in found for s in o if s in self.info}
        return len(shapes) <= 1

    def _latest(self, srcs: dict[int, tuple[str, ...]] | None) -> dict[int, tuple[str, ...]]:
        """``srcs`` less those upstream of another of them."""
        if not srcs or len(srcs) == 1:
            return srcs or {}
        up = self.upstream
        covered = 0
        for t in srcs:
            covered |= up.get(t, 0)
        return {
            s: ops
            for s, ops in srcs.items()
            if not covered & self.bits.get(s, 0)
            or not any(t != s and self.above(s, t) for t in srcs)
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
    """Whether ``src`` -> ``dst`` runs from one member of a folded group to another (rows, or
    op nodes' modules' rows)."""
    if src < 0 or dst < 0:
        return False
    theirs = dict(keys.member[dst])
    return any(theirs.get(g, pos) != pos for g, pos in keys.member[src])


def op_path(path: str, op: OpNode) -> str:
    """An op node's name: its module's path and its own (``model.layers.0–3.<residual 2>``)."""
    return f"{path}.{op.name}" if path else op.name


def keyed(
    rows: GraphData, path: Callable[[int], str], skip: Callable[[int, int], bool]
) -> GraphData:
    """``rows`` keyed by ``path(row)`` (an op node by its module's, see :func:`op_path`; the
    model's inputs, outputs and cache by :data:`INPUT`, :data:`OUTPUT`, :data:`CACHE`), nodes
    of one key merged, the edges ``skip(src row, dst row)`` says left out (an op node's row:
    its module's)."""

    def key(k: Any) -> Any:
        op = rows.ops.get(k)
        if op is not None:
            return op_path(path(op.row), op)
        return k if k < 0 else path(k)

    def row(k: Any) -> int:
        op = rows.ops.get(k)
        return op.row if op is not None else int(k)

    out = GraphData(nodes={}, edges={}, calls={})
    for k, members in rows.nodes.items():
        new = key(k)
        out.nodes.setdefault(new, []).extend(members)
        out.calls[new] = out.calls.get(new, 0) + rows.calls.get(k, 0)
        node = rows.ops.get(k)
        if node is not None:  # one per member of a folded group: their FLOPs summed
            same = out.ops.get(new)
            if same is None:
                out.ops[new] = OpNode(node.row, node.kind, node.name, node.detail, node.flops)
            else:
                same.flops += node.flops
    for (src, dst), e in rows.edges.items():
        if skip(row(src), row(dst)):
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


def folded_graph(rows: GraphData, keys: FoldKeys) -> GraphData:
    """``rows`` with each folded node's members merged (keyed by folded path; the model's
    inputs, outputs and cache by :data:`INPUT`, :data:`OUTPUT`, :data:`CACHE`), edges between
    members left out."""
    return keyed(rows, lambda r: keys.path[r], lambda s, d: _repeat_edge(keys, s, d))


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
