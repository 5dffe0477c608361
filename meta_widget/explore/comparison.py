"""``compare(a, b)``: what changed between two analyses, module by module.

Modules are matched by path (``model.layers.0.self_attn.k_proj``). A row is **changed** when what
the module does *itself* differs: its class, its own parameters (not its children's), the FLOPs
and the new storage of its own body (``self_flops``, ``alloc_bytes``: outside sub-module calls),
the shapes of its outputs (KV caches left out: a cache is the layers' state handed out by
the root, and its bytes count in ``activation_bytes``), or its number of calls; or when it
exists on one side only. Totals (``params``, ``flops``, ``activation_bytes``) are those of the
module's subtree, as in ``Analysis.to_dataframe``, so a parent's totals move with a changed child
while the parent itself is not changed: the changed rows are where a difference comes from.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import heavy
from ..analysis import Analysis
from ..choices import ExploreKind
from ..data.tree import ModuleNode
from ..units import format_bytes, format_count, format_flops

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["Comparison", "ModuleDiff", "compare"]

#: the totals compared per module, and how each is formatted
NUMBERS = {"params": format_count, "flops": format_flops, "activation_bytes": format_bytes}


@dataclass(frozen=True)
class Side:
    """One module on one side: its totals and what it does itself."""

    type: str
    params: int
    flops: int
    activation_bytes: int
    output_shapes: list[list[tuple[int, ...]]]
    own: tuple[Any, ...]

    @staticmethod
    def of(node: ModuleNode) -> Side:
        own_params = tuple(sorted((n, info.shape, info.dtype) for n, info in node.own_params))
        calls = tuple((c.self_flops, c.alloc_bytes) for c in node.calls)
        shapes = [[info.shape for _, info in c.outputs] for c in node.calls]
        computed = tuple(
            tuple(info.shape for name, info in c.outputs if not _is_cache(name)) for c in node.calls
        )
        return Side(
            type=node.type,
            params=node.params,
            flops=node.flops,
            activation_bytes=node.activation_bytes,
            output_shapes=shapes,
            own=(node.type, own_params, calls, computed),
        )


@dataclass(frozen=True)
class ModuleDiff:
    """One module path in either analysis."""

    module: str
    depth: int
    a: Side | None
    b: Side | None

    @property
    def only_in(self) -> str | None:
        return "a" if self.b is None else "b" if self.a is None else None

    @property
    def changed(self) -> bool:
        return self.a is None or self.b is None or self.a.own != self.b.own

    def value(self, name: str, side: str) -> int:
        s = self.a if side == "a" else self.b
        return 0 if s is None else int(getattr(s, name))


@dataclass
class Comparison:
    """Two analyses side by side (see :func:`compare`)."""

    a: Analysis
    b: Analysis
    rows: list[ModuleDiff]

    @property
    def labels(self) -> tuple[str, str]:
        """What to call the two sides: their titles, with their sources when the titles are
        the same and the sources are not (a prediction and ``mw.measure``'s real run); the
        repr and the view add "(a)" and "(b)"."""
        a, b = self.a.title, self.b.title
        if a == b and self.a.source != self.b.source:
            return f"{a} ({self.a.source})", f"{b} ({self.b.source})"
        return a, b

    @property
    def changed(self) -> list[ModuleDiff]:
        """The rows that differ (see the module docstring)."""
        return [r for r in self.rows if r.changed]

    @property
    def totals(self) -> dict[str, tuple[int, int]]:
        """``(a, b)`` of each total: parameters, FLOPs, activation, parameter and peak bytes."""
        names = ("total_params", "total_flops", "activation_bytes", "param_bytes", "peak_bytes")
        return {n: (int(getattr(self.a, n)), int(getattr(self.b, n))) for n in names}

    def to_dataframe(self) -> pd.DataFrame:
        """One row per module path: ``module``, ``type``, then ``params_a``, ``params_b``,
        ``params_diff`` (b - a) and the same for ``flops`` and ``activation_bytes`` (a module
        missing on one side counts 0 there), ``output_shapes_a``, ``output_shapes_b`` (per call;
        None on the missing side), ``only_in`` (``"a"``, ``"b"`` or None) and ``changed``."""
        pd = heavy.pandas()

        rows = []
        for r in self.rows:
            side = r.a or r.b
            assert side is not None
            row: dict[str, Any] = {"module": r.module, "type": side.type}
            for name in NUMBERS:
                va, vb = r.value(name, "a"), r.value(name, "b")
                row.update({f"{name}_a": va, f"{name}_b": vb, f"{name}_diff": vb - va})
            row["output_shapes_a"] = r.a.output_shapes if r.a else None
            row["output_shapes_b"] = r.b.output_shapes if r.b else None
            row["only_in"] = r.only_in
            row["changed"] = r.changed
            rows.append(row)
        return pd.DataFrame(rows)

    def summary(self) -> str:
        """Totals side by side, then the changed modules (repeated layers folded: a run of
        ``layers.0`` ... ``layers.31`` that changed alike is one line ``layers.0–31 · 32 ×``)."""
        lines = [f"{'':<20}{'a':>16}{'b':>16}{'b - a':>16}"]
        formats = {
            "total_params": format_count,
            "total_flops": format_flops,
            "activation_bytes": format_bytes,
            "param_bytes": format_bytes,
            "peak_bytes": format_bytes,
        }
        for name, (va, vb) in self.totals.items():
            f = formats[name]
            diff = ("+" if vb >= va else "-") + f(abs(vb - va))
            lines.append(f"{name:<20}{f(va):>16}{f(vb):>16}{diff:>16}")
        changed = fold(self.changed)
        lines.append("")
        if not changed:
            lines.append("No module differs.")
            return "\n".join(lines)
        lines.append(f"{len(self.changed)} module(s) differ:")
        for path, r, count in changed:
            lines.append("  " + _describe(path, r, count))
        return "\n".join(lines)

    def widget(self) -> Any:
        """The comparison tree as a widget: changed modules highlighted, totals side by side,
        repeated layers folded (``meta_widget.explore.view``)."""
        from .view import explore_view  # anywidget: ~0.5 s, loaded on first use

        return explore_view(ExploreKind.COMPARE, comparison_payload(self), self.summary())

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget()._repr_mimebundle_(**kwargs)

    def __repr__(self) -> str:
        a, b = self.labels
        return f"<Comparison {a} (a) vs {b} (b): {len(self.changed)} modules differ>"


def compare(a: Analysis, b: Analysis) -> Comparison:
    """Compare two analyses (e.g. of two configs) module by module; see :class:`Comparison`.

    Rows follow ``a``'s module order, with modules only in ``b`` after the module that precedes
    them in ``b``.
    """
    for name, x in (("a", a), ("b", b)):
        if not isinstance(x, Analysis):
            raise TypeError(
                f"compare: {name} must be an Analysis (mw.analyze(...)), not {type(x).__name__}"
            )
    in_a = {n.path: n for n in a.modules}
    in_b = {n.path: n for n in b.modules}
    order = [n.path for n in a.modules]
    where = {p: i for i, p in enumerate(order)}
    previous = -1
    inserts: dict[int, list[str]] = {}
    for n in b.modules:
        if n.path in where:
            previous = where[n.path]
        else:
            inserts.setdefault(previous, []).append(n.path)
    paths = [*inserts.get(-1, [])]
    for i, p in enumerate(order):
        paths.append(p)
        paths.extend(inserts.get(i, []))
    rows = []
    for p in paths:
        na, nb = in_a.get(p), in_b.get(p)
        node = na or nb
        assert node is not None
        rows.append(
            ModuleDiff(
                module=p,
                depth=node.depth,
                a=Side.of(na) if na is not None else None,
                b=Side.of(nb) if nb is not None else None,
            )
        )
    return Comparison(a, b, rows)


def _is_cache(name: str) -> bool:
    """A KV cache entry of an output (``cache.layers[0].keys``, ``past_key_values...``)."""
    return name.startswith("cache") or "past_key_values" in name


_INDEX = re.compile(r"\.(\d+)(?=\.|$)")


def fold(rows: list[ModuleDiff]) -> list[tuple[str, ModuleDiff, int]]:
    """Rows alike but for one layer index folded: ``(path, first row, count)``, where the path
    of a fold reads ``model.layers.0–31.self_attn`` (as the tree writes a fold)."""
    out: list[tuple[str, ModuleDiff, list[str]]] = []
    groups: dict[tuple[Any, ...], int] = {}
    for r in rows:
        found = _INDEX.search(r.module)
        if found is None:
            out.append((r.module, r, []))
            continue
        pattern = r.module[: found.start()] + ".{}" + r.module[found.end() :]
        key = (pattern, _signature(r.a), _signature(r.b))
        if key in groups:
            out[groups[key]][2].append(found.group(1))
            continue
        groups[key] = len(out)
        out.append((pattern, r, [found.group(1)]))
    folded = []
    for pattern, r, indices in out:
        if len(indices) > 1:
            path = pattern.replace("{}", f"{indices[0]}–{indices[-1]}", 1)
        else:
            path = r.module
        folded.append((path, r, max(1, len(indices))))
    return folded


def _signature(side: Side | None) -> tuple[Any, ...] | None:
    if side is None:
        return None
    return (side.own, side.params, side.flops, side.activation_bytes)


def _describe(path: str, r: ModuleDiff, count: int) -> str:
    name = path or "(root)"
    times = f" · {count} ×" if count > 1 else ""
    if r.only_in is not None:
        side = r.a or r.b
        assert side is not None
        return (
            f"{name}{times}: only in {r.only_in} ({side.type}, {format_count(side.params)} params)"
        )
    parts = []
    for n, f in NUMBERS.items():
        va, vb = r.value(n, "a"), r.value(n, "b")
        if va != vb:
            parts.append(f"{n} {f(va)} -> {f(vb)}")
    assert r.a is not None and r.b is not None
    if r.a.output_shapes != r.b.output_shapes:
        parts.append(f"outputs {r.a.output_shapes} -> {r.b.output_shapes}")
    if r.a.type != r.b.type:
        parts.append(f"type {r.a.type} -> {r.b.type}")
    return f"{name}{times}: " + ("; ".join(parts) or "its own computation differs")


def comparison_payload(comparison: Comparison) -> dict[str, Any]:
    """The comparison's totals and its rows, repeated layers folded (``0–31`` and a count)."""
    rows = []
    for path, r, count in fold(comparison.rows):
        side = r.a or r.b
        assert side is not None
        row: dict[str, Any] = {
            "module": path,
            "depth": r.depth,
            "type": side.type,
            "count": count,
            "changed": r.changed,
            "onlyIn": r.only_in,
        }
        for name in NUMBERS:
            row[name] = [r.value(name, "a"), r.value(name, "b")]
        rows.append(row)
    a, b = comparison.labels
    return {
        "a": a,
        "b": b,
        "totals": {k: list(v) for k, v in comparison.totals.items()},
        "rows": rows,
    }
