"""The bars of the memory-by-module chart (``a.figure("memory")``; the widget draws the same).

One bar per module at a depth (and each shallower module without children), the same module of
repeated layers folded into one bar as the tree folds them (``model.layers.0–79.mlp`` · 80 ×
LlamaMLP, summed). Each bar stacks what the module's subtree owns (``meta_widget.memory.modules``:
tied weights at their first owner, so the bars add up to the totals) and what its calls' outputs
hold:

- **parameters**: parameter bytes the subtree owns;
- **gradients**, **optimizer state** (training): those of its parameters at the end of the step;
- **output mem**: bytes of new storage its calls' outputs hold (the tree's Output mem), summed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .summary import fold_siblings

if TYPE_CHECKING:
    from ..data.tree import ModuleNode
    from .analyzed import Analyzed

__all__ = ["BAR_PARTS", "MemoryBar", "memory_bars"]

#: the stacked parts of a bar, bottom first: (name, ``MemoryBar`` attribute)
BAR_PARTS = (
    ("parameters", "param_bytes"),
    ("gradients", "gradient_bytes"),
    ("optimizer state", "optimizer_state_bytes"),
    ("output mem", "output_bytes"),
)


@dataclass
class MemoryBar:
    """One bar: a module, or the same module of ``count`` repeated layers (summed)."""

    #: the folded path (``model.layers.0–79.mlp``); the class name for the root
    path: str
    type: str
    #: module rows it stands for (``Analysis.modules``), in order
    modules: list[int] = field(default_factory=list)
    param_bytes: int = 0
    gradient_bytes: int = 0
    optimizer_state_bytes: int = 0
    output_bytes: int = 0
    #: parameter bytes of the subtree that another module owns (counted there, not here)
    tied_bytes: int = 0

    @property
    def count(self) -> int:
        return len(self.modules)

    @property
    def label(self) -> str:
        """``path · type``, or ``path · N × type`` for a folded bar."""
        if self.count > 1:
            return f"{self.path} · {self.count} × {self.type}"
        return f"{self.path} · {self.type}"

    @property
    def total(self) -> int:
        return sum(getattr(self, attr) for _, attr in BAR_PARTS)


def folded_paths(analysis: Analyzed) -> list[str]:
    """Each module's path with the names of folded siblings replaced by their range
    (``layers.3.mlp`` -> ``layers.0–79.mlp``), as the tree and the summary fold them."""
    names = [n.name for n in analysis.modules]

    def visit(node: ModuleNode) -> None:
        for group in fold_siblings(node.children):
            if len(group) > 1:
                span = f"{group[0].name}–{group[-1].name}"
                for member in group:
                    names[member.index] = span
            for member in group:
                visit(member)

    visit(analysis.root)
    paths: list[str] = []
    for n in analysis.modules:
        paths.append(f"{paths[n.parent]}.{names[n.index]}" if n.parent > 0 else names[n.index])
    paths[0] = analysis.title
    return paths


def memory_bars(analysis: Analyzed, depth: int = 1) -> list[MemoryBar]:
    """The bars at ``depth`` (see the module docstring), in tree order."""
    nodes = [
        n for n in analysis.modules if n.depth == depth or (n.depth < depth and not n.children)
    ] or [analysis.root]
    owned = analysis.memory.by_module
    sums = owned.subtree([n.parent for n in analysis.modules]) if owned is not None else None
    tied = {row: nbytes for row, nbytes, _ in sums.tied()} if sums is not None else {}
    paths = folded_paths(analysis)
    bars: dict[str, MemoryBar] = {}
    for n in nodes:
        bar = bars.setdefault(paths[n.index], MemoryBar(paths[n.index], n.type))
        bar.modules.append(n.index)
        bar.output_bytes += n.activation_bytes
        if sums is None:
            bar.param_bytes += n.param_bytes
            continue
        bar.param_bytes += sums.param_bytes[n.index]
        bar.tied_bytes += tied.get(n.index, 0)
        bar.gradient_bytes += sums.gradient_bytes[n.index]
        bar.optimizer_state_bytes += sums.optimizer_state_bytes[n.index]
    return list(bars.values())
