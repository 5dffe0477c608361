"""How a checkpoint is shown: its names as a tree (repeated layers folded), a text summary, a
DataFrame, and the widget's payload. Reading lives in the other modules of this package; this one
only formats what was read.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .. import heavy
from ..data.flatten import TensorInfo
from ..data.tree import ModuleNode
from ..units import format_bytes, format_count, format_shape, is_floating
from ..views.protocol import Dictionary, encode_header

if TYPE_CHECKING:
    import pandas as pd

    from .entries import CheckpointInfo, TensorEntry

__all__ = [
    "CheckpointNode",
    "mimebundle",
    "module_nodes",
    "summary",
    "to_dataframe",
    "to_payload",
    "tree",
]


@dataclass
class CheckpointNode:
    """A dotted prefix of tensor names, with its own tensors and its sub-prefixes."""

    path: str
    name: str
    tensors: list[TensorEntry] = field(default_factory=list)
    children: list[CheckpointNode] = field(default_factory=list)

    @property
    def numel(self) -> int:
        return sum(t.numel for t in self.tensors) + sum(c.numel for c in self.children)

    @property
    def float_numel(self) -> int:
        own = sum(t.numel for t in self.tensors if is_floating(t.dtype))
        return own + sum(c.float_numel for c in self.children)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors) + sum(c.nbytes for c in self.children)

    def signature(self) -> tuple[Any, ...]:
        return (
            tuple((t.name.rpartition(".")[2], t.shape, t.dtype) for t in self.tensors),
            tuple((c.name, c.signature()) for c in self.children),
        )


def _fold(children: list[CheckpointNode]) -> list[list[CheckpointNode]]:
    """Runs of consecutive numbered siblings with the same tensors (``layers.0``–``layers.79``)."""
    groups: list[list[CheckpointNode]] = []
    for child in children:
        if (
            groups
            and child.name.isdigit()
            and groups[-1][0].name.isdigit()
            and groups[-1][0].signature() == child.signature()
        ):
            groups[-1].append(child)
        else:
            groups.append([child])
    return groups


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    stride, acc = [], 1
    for d in reversed(shape):
        stride.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(stride))


def tree(info: CheckpointInfo) -> CheckpointNode:
    """The tensors as a tree by dotted names; each node holds its own tensors."""
    root = CheckpointNode(path="", name="")
    by_path = {"": root}
    for t in info.tensors:
        node = root
        prefix = ""
        for part in t.module.split(".") if t.module else ():
            prefix = f"{prefix}.{part}" if prefix else part
            child = by_path.get(prefix)
            if child is None:
                child = by_path[prefix] = CheckpointNode(path=prefix, name=part)
                node.children.append(child)
            node = child
        node.tensors.append(t)
    return root


def to_dataframe(info: CheckpointInfo) -> pd.DataFrame:
    """One row per tensor: ``name``, ``module``, ``shape`` (tuple), ``dtype``, ``numel``,
    ``bytes``, ``file``."""
    pd = heavy.pandas()

    return pd.DataFrame(
        [
            {
                "name": t.name,
                "module": t.module,
                "shape": t.shape,
                "dtype": t.dtype,
                "numel": t.numel,
                "bytes": t.nbytes,
                "file": t.file,
            }
            for t in info.tensors
        ],
        columns=["name", "module", "shape", "dtype", "numel", "bytes", "file"],
    )


def summary(info: CheckpointInfo, depth: int | None = 2) -> str:
    """A text report: totals, bytes by dtype, memory at each dtype, the tree to ``depth``."""
    lines = [
        f"Checkpoint {info.path} ({info.format}, {len(info.files)} file"
        f"{'s' if len(info.files) != 1 else ''})",
        f"  {len(info.tensors)} tensors, {format_count(info.total_numel)} elements, "
        f"{format_bytes(info.total_bytes)}",
    ]
    for dtype, n in sorted(info.bytes_by_dtype.items(), key=lambda kv: -kv[1]):
        lines.append(
            f"    {dtype:<14} {format_count(info.numel_by_dtype[dtype]):>10} elements "
            f"{format_bytes(n):>12}"
        )
    lines.append(
        "  Memory to load at: "
        + ", ".join(f"{d} {format_bytes(b)}" for d, b in info.memory().items())
    )
    if info.others:
        lines.append("  Not tensors: " + ", ".join(f"{k} ({v})" for k, v in info.others.items()))
    lines.extend(f"  Note: {n}" for n in info.notes)
    lines.append("")

    def walk(node: CheckpointNode, level: int) -> None:
        indent = "  " * level
        for t in node.tensors:
            lines.append(
                f"{indent}{t.name.rpartition('.')[2]:<28} {format_shape(t.shape):<22} "
                f"{t.dtype:<9} {format_bytes(t.nbytes):>11}"
            )
        for group in _fold(node.children):
            first = group[0]
            label = first.name if len(group) == 1 else f"{first.name}–{group[-1].name}"
            count = f" · {len(group)} ×" if len(group) > 1 else ""
            lines.append(
                f"{indent}{label}{count}".ljust(52)
                + f"{format_count(first.numel * len(group)):>10} "
                f"{format_bytes(first.nbytes * len(group)):>11}"
            )
            if depth is None or level + 1 < depth:
                walk(first, level + 1)

    walk(tree(info), 0)
    return "\n".join(lines)


def module_nodes(info: CheckpointInfo) -> list[ModuleNode]:
    """The name tree as :class:`meta_widget.analysis.ModuleNode` rows (pre-order).

    A dotted prefix is a module row; a tensor is one of its ``own_params``. Types are
    ``Checkpoint`` (the root), ``Group`` (has sub-groups) and ``Tensors`` (tensors only).
    """
    nodes: list[ModuleNode] = []

    def add(node: CheckpointNode, parent: int, depth: int) -> None:
        row = ModuleNode(
            index=len(nodes),
            path=node.path,
            name=node.name,
            type="Checkpoint" if parent < 0 else ("Group" if node.children else "Tensors"),
            depth=depth,
            parent=parent,
            params=node.numel,
            trainable_params=0,
            param_bytes=node.nbytes,
            float_params=node.float_numel,
            buffer_bytes=0,
            own_params=[
                (
                    t.name.rpartition(".")[2],
                    TensorInfo(t.shape, t.dtype, _contiguous(t.shape), False),
                )
                for t in node.tensors
            ],
        )
        nodes.append(row)
        if parent >= 0:
            nodes[parent].children.append(row)
        for child in node.children:
            add(child, row.index, depth + 1)

    add(tree(info), -1, 0)
    return nodes


def to_payload(info: CheckpointInfo) -> dict[str, Any]:
    """The checkpoint in the widget's payload format (``meta_widget.views.protocol``, version 1).

    Modules are the name tree (see :func:`module_nodes`), ``source`` is ``"checkpoint"``,
    ``status`` ``"structural"``, there are no calls; ``totals.params`` counts every element.
    """
    title = os.path.basename(info.path.rstrip(os.sep)) or info.path
    payload = encode_header(
        module_nodes(info),
        Dictionary(),
        title=title,
        source="checkpoint",
        mode="inference",
        status="structural",
    )
    payload["totals"] = {
        "params": info.total_numel,
        "trainable_params": 0,
        "flops": 0,
        "param_bytes": info.total_bytes,
        "buffer_bytes": 0,
        "input_bytes": 0,
        "activation_bytes": 0,
        "peak_bytes": info.total_bytes,
    }
    payload["notes"] = [
        f"{info.format} checkpoint read without its tensor data: {len(info.tensors)} tensors "
        f"in {len(info.files)} file(s).",
        *info.notes,
    ]
    return payload


def mimebundle(info: CheckpointInfo, **kwargs: Any) -> Any:
    """The widget showing the checkpoint, with its text summary as ``text/plain``."""
    from ..views.widget import MetaWidget  # anywidget: ~0.5 s, loaded on first use

    bundle = MetaWidget(payload=to_payload(info))._repr_mimebundle_(**kwargs)
    data = bundle[0] if isinstance(bundle, tuple) else bundle
    if isinstance(data, dict):
        data["text/plain"] = summary(info)
    return bundle
