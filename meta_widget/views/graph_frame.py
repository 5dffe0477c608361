""":class:`Graph`: the architecture as nodes and edges (DataFrames), from ``Analysis.graph``.

How the graph is found is :mod:`meta_widget.views.graph`'s; this module names the nodes, sums
them, and writes the graph for networkx and Graphviz.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import heavy
from ..errors import MetaWidgetError
from .graph import (
    CACHE,
    INPUT,
    OUTPUT,
    GraphData,
    RowEdge,
    fold_keys,
    folded_graph,
    keyed,
    nbytes,
    row_graph,
    tied_edges,
)

if TYPE_CHECKING:
    import pandas as pd

    from .analyzed import Analyzed

__all__ = ["Graph", "GraphDependencyError", "graph_of", "graph_rows"]

#: the names of the model's inputs, outputs and returned KV cache in ``Graph.nodes.module``
INPUT_NAME, OUTPUT_NAME, CACHE_NAME = "<input>", "<output>", "<cache>"
NODE_COLUMNS = (
    "module", "type", "calls", "flops", "activation_bytes", "params", "repeats", "row", "kind",
)  # fmt: skip
#: ``Graph.nodes.type`` of the nodes that are no module
_TYPES = {
    INPUT: "input",
    OUTPUT: "output",
    CACHE: "KV cache",
    "attention": "attention",
    "residual": "residual add",
}
_KINDS = {INPUT: "input", OUTPUT: "output", CACHE: "cache"}
EDGE_COLUMNS = ("src", "dst", "shape", "dtype", "bytes", "ops", "count", "grad_bytes", "kind")


class GraphDependencyError(MetaWidgetError, ImportError):
    """``Graph.to_networkx()`` needs networkx, which is not installed."""


@dataclass(frozen=True, eq=False)
class Graph:
    """The architecture as a graph: which module's output another module reads.

    Made by ``Analysis.graph(depth, fold)`` from tensor identity in the trace: an edge joins a
    module call that produced a tensor to a module call that read it, through the ops of the
    modules above them (a residual ``add``, a ``cat``) listed on the edge.

    Attributes
    ----------
    nodes : pandas.DataFrame
        One row per module at ``depth`` (and shallower leaves), plus ``<input>`` and ``<output>``
        (the model's inputs and what it returns), ``<cache>`` (the KV cache it returns, when it
        does) and the ops of the bodies above them drawn as nodes: each attention
        (``...self_attn.<attention>``) and each residual add (``model.layers.0–11.<residual>``,
        ``<residual 2>``: the residual stream runs through them). Columns: ``module`` (its path;
        a folded node's path names its run, ``model.layers.0–11``), ``type`` (its class;
        ``"attention"``, ``"residual add"``), ``calls`` (a module called twice is one node with
        2), ``flops`` (forward, sub-modules included, summed over calls and repeats; an
        attention's: its products and softmax), ``activation_bytes`` (new storage its outputs
        hold, summed), ``params`` (summed over repeats), ``repeats`` (how many identical
        siblings a folded node stands for; 1 otherwise), ``row`` (the row in
        ``Analysis.modules`` of its first member, an op node's module's; -1 for ``<input>``, -2
        for ``<output>``, -3 for ``<cache>``) and ``kind`` (``"module"``, ``"input"``,
        ``"output"``, ``"cache"``, ``"attention"``, ``"residual"``).
    edges : pandas.DataFrame
        One row per (``src``, ``dst``) pair of ``nodes.module``. ``shape``, ``dtype``, ``bytes``:
        of the first tensor it carries; ``count``: tensors carried in all (calls x tensors);
        ``ops``: the functional ops between the two modules (a tuple, first seen first, e.g.
        ``("add",)``); ``grad_bytes``: in a training step, the gradient the backward pass hands
        back along it (0 where the tensor needs none); ``kind``: ``"data"``, ``"tied"`` for a
        module that holds a parameter ``src`` owns (tied weights), ``"residual"`` for the stream
        into a residual add (the spine), ``"cache"`` for the KV cache entries ``src`` made. An
        edge into an op node carries the tensor its source made (the ops on the way may reshape
        it).
    depth : int
        The depth of the nodes (the root is 0).
    fold : bool
        Whether identical repeated siblings are folded into one node.
    """

    nodes: pd.DataFrame
    edges: pd.DataFrame
    depth: int
    fold: bool

    def __repr__(self) -> str:
        size = f"{len(self.nodes)} nodes, {len(self.edges)} edges"
        return f"<Graph depth={self.depth} fold={self.fold}: {size}>"

    def to_networkx(self) -> Any:
        """The graph as a ``networkx.MultiDiGraph`` (node and edge attributes: the columns).

        Raises
        ------
        GraphDependencyError
            When networkx is not installed (``pip install networkx``).
        """
        try:
            nx = heavy.networkx()
        except ImportError as e:
            raise GraphDependencyError(
                "Graph.to_networkx() needs networkx, which is not installed: "
                "`pip install networkx`, or use Graph.to_dot() / the nodes and edges DataFrames"
            ) from e
        g = nx.MultiDiGraph(depth=self.depth, fold=self.fold)
        for rec in self.nodes.to_dict("records"):
            g.add_node(rec["module"], **{str(k): v for k, v in rec.items()})
        for rec in self.edges.to_dict("records"):
            g.add_edge(rec["src"], rec["dst"], **{str(k): v for k, v in rec.items()})
        return g

    def to_dot(self) -> str:
        """The graph in Graphviz's DOT language (``dot -Tsvg``): nodes labelled with their
        module, type and repeats; edges with their shape and ops.

        Every name is written as one quoted DOT string (:func:`dot_string`): a module or class
        name holding quotes, brackets, backslashes or newlines stays text, never a node, an
        attribute (a ``URL``) or a broken file."""
        lines = ["digraph model {", "  rankdir=TB;", '  node [shape=box, fontname="Helvetica"];']
        for rec in self.nodes.to_dict("records"):
            label = _LINE.join(_label_text(str(t)) for t in (rec["module"], rec["type"]))
            if rec["repeats"] > 1:
                label += f" ×{int(rec['repeats'])}"
            shape = _DOT_SHAPES.get(str(rec["kind"]), "")
            lines.append(f'  {dot_string(str(rec["module"]))} [label="{label}"{shape}];')
        for rec in self.edges.to_dict("records"):
            label = "×".join(str(int(s)) for s in rec["shape"])
            if rec["kind"] == "cache":
                label += _LINE + "KV cache"
            if rec["ops"]:
                label += _LINE + _label_text(", ".join(str(op) for op in rec["ops"]))
            style = _DOT_STYLES.get(str(rec["kind"]), "")
            lines.append(
                f"  {dot_string(str(rec['src']))} -> {dot_string(str(rec['dst']))} "
                f'[label="{label}"{style}];'
            )
        lines.append("}")
        return "\n".join(lines) + "\n"


#: how DOT draws the nodes that are no module, and the edges that are no plain tensor: the
#: residual stream bold, the KV cache and tied weights dashed
_DOT_SHAPES = {
    "residual": ", shape=ellipse",
    "attention": ", style=rounded",
    "cache": ", style=dashed",
}
_DOT_STYLES = {"tied": ", style=dashed", "cache": ", style=dashed", "residual": ", style=bold"}
#: a line break inside a DOT label (an escString's ``\n``)
_LINE = "\\n"


def _label_text(text: str) -> str:
    """``text`` escaped for the inside of a quoted DOT label: shown as it is (escString's own
    escapes, ``\\N`` ``\\G`` ``\\l``..., and line breaks are not run)."""
    return dot_string(text)[1:-1]


def dot_string(text: str) -> str:
    r"""``text`` as one quoted DOT string: each backslash doubled (Graphviz's lexer reads
    ``\\`` as one pair, and a label shows it as one backslash, so ``\N`` or ``\l`` in a name is
    text, not an escape), each double quote written ``\"``, and each character that is not
    printable (a line break, a NUL) spelled out as ``\uNNNN``, shown as such. Nothing a user
    names can close the string, start an attribute or split the line."""
    body = text.replace("\\", "\\\\").replace('"', '\\"')
    body = "".join(c if c.isprintable() else f"\\\\u{ord(c):04x}" for c in body)
    return f'"{body}"'


def graph_of(a: Analyzed, depth: int = 1, fold: bool = True) -> Graph:
    """The architecture as a :class:`Graph`: which module's output another module reads.

    Parameters
    ----------
    depth : int
        The depth of the nodes: the modules at ``depth`` (the root is 0) and shallower leaves;
        the ops of the modules above them (a residual ``add``) lie on the edges.
    fold : bool
        Fold runs of identical numbered siblings (``layers.0`` ... ``layers.79``) into one node
        as the tree does (its ``repeats`` says how many; the edges from one repeat to the next
        are left out); ``False`` lists every one.

    Returns
    -------
    Graph
        ``nodes`` and ``edges`` DataFrames, ``to_networkx()``, ``to_dot()``.

    Raises
    ------
    ValueError
        When ``depth`` is not an int of at least 0.
    """
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
        raise ValueError(
            f"Analysis.graph(depth=...) takes an int >= 0 (the root is 0), not {depth!r}"
        )
    rows = graph_rows(a, depth)
    keys = fold_keys(a.modules)
    paths = [m.path for m in a.modules]
    data = folded_graph(rows, keys) if fold else keyed(rows, paths.__getitem__, _never)
    return _frames(a, data, depth, fold)


def _never(src: int, dst: int) -> bool:
    return False


def graph_rows(a: Analyzed, depth: int) -> GraphData:
    """The graph of module rows at ``depth``, tied weights included (the widget's payload)."""
    rows = row_graph(a.modules, a.calls, depth)
    at = _ancestor_at(a, depth)
    for owner, user, info in tied_edges(a.modules):
        src, dst = at(owner), at(user)
        if src != dst and src in rows.nodes and dst in rows.nodes:
            rows.edges.setdefault((src, dst), RowEdge(info, 1, {}, "tied"))
    return rows


def _ancestor_at(a: Analyzed, depth: int) -> Any:
    modules = a.modules

    def at(row: int) -> int:
        while modules[row].depth > depth and modules[row].parent >= 0:
            row = modules[row].parent
        return row

    return at


def _name(key: Any, a: Analyzed) -> str:
    if key == INPUT:
        return INPUT_NAME
    if key == OUTPUT:
        return OUTPUT_NAME
    if key == CACHE:
        return CACHE_NAME
    return str(key) or a.title


def _frames(a: Analyzed, data: GraphData, depth: int, fold: bool) -> Graph:
    pd = heavy.pandas()
    training = a.mode == "training"
    nodes = []
    for key, members in data.nodes.items():
        op = data.ops.get(key)
        if op is not None:  # an attention or a residual add: its module's row, its numbers
            calls = data.calls.get(key, 0)
            rec = (_name(key, a), _TYPES[op.kind], calls, op.flops, 0, 0, len(members), op.row)
            nodes.append((*rec, op.kind))
            continue
        mods = [a.modules[r] for r in members if r >= 0]
        kind = _KINDS.get(members[0], "module") if not mods else "module"
        nodes.append(
            (
                _name(key, a),
                mods[0].type if mods else _TYPES.get(members[0], "?"),
                data.calls.get(key, 0),
                sum(c.flops for m in mods for c in m.calls),
                sum(c.activation_bytes for m in mods for c in m.calls),
                sum(m.params for m in mods),
                max(len(mods), 1),
                members[0],
                kind,
            )
        )
    edges = []
    for (src, dst), e in data.edges.items():
        size = nbytes(e.info)
        grad = size if training and e.info.requires_grad and e.kind != "tied" else 0
        edges.append(
            (
                _name(src, a),
                _name(dst, a),
                e.info.shape,
                e.info.dtype,
                size,
                tuple(e.ops),
                e.count,
                grad,
                e.kind,
            )
        )
    return Graph(
        nodes=pd.DataFrame(nodes, columns=list(NODE_COLUMNS)),
        edges=pd.DataFrame(edges, columns=list(EDGE_COLUMNS)),
        depth=depth,
        fold=fold,
    )


#: the payload's graph: the levels of depth 1, 2, ... while their edges total at most this
PAYLOAD_EDGES = 2000
#: and at most this many levels
PAYLOAD_DEPTHS = 6


def encode_graph(a: Analyzed, tensor: Any, string: Any) -> dict[str, Any]:
    """``payload["graph"]``: the graph of module rows at each depth from 1 (unfolded: the
    front end folds it as its tree, and opens a folded group in place), while small
    (``PAYLOAD_EDGES``; a level with the same nodes as the one above is ``{"depth", "as"}``:
    that level's depth); ``tensor(info)`` and ``string(text)`` intern into the payload's
    dictionaries. A level's op nodes (keys -4, -5, ...) are ``ops``: ``[module row, kind,
    name, detail, FLOPs]`` each, the strings interned."""
    levels: list[dict[str, Any]] = []
    deepest = max((m.depth for m in a.modules), default=0)
    total = 0
    last: GraphData | None = None
    for depth in range(1, min(deepest, PAYLOAD_DEPTHS) + 1):
        rows = graph_rows(a, depth)
        full = [level for level in levels if "nodes" in level]
        if full and last is not None and _same(rows, last):
            levels.append({"depth": depth, "as": full[-1]["depth"]})
            continue  # the same nodes as the level above (a ModuleList is never called)
        total += len(rows.edges)
        if levels and total > PAYLOAD_EDGES:
            break
        last = rows
        edges = list(rows.edges.items())
        ops = [rows.ops[k] for k in sorted(rows.ops, reverse=True)]  # -4, -5, ...
        levels.append(
            {
                "depth": depth,
                "nodes": list(rows.nodes),
                "calls": [rows.calls.get(r, 0) for r in rows.nodes],
                "src": [s for (s, _), _ in edges],
                "dst": [d for (_, d), _ in edges],
                "tensor": [tensor(e.info) for _, e in edges],
                "ops": [[string(op) for op in e.ops] for _, e in edges],
                "count": [e.count for _, e in edges],
                "kind": [string(e.kind) for _, e in edges],
                "opnodes": [
                    [o.row, string(o.kind), string(o.name), string(o.detail), o.flops] for o in ops
                ],
            }
        )
    return {"levels": levels}


def _same(rows: GraphData, above: GraphData) -> bool:
    """Whether a level draws what the level above does (its nodes and op nodes)."""
    if rows.nodes.keys() != above.nodes.keys():
        return False
    mine = [(o.row, o.kind, o.name) for o in rows.ops.values()]
    return mine == [(o.row, o.kind, o.name) for o in above.ops.values()]
