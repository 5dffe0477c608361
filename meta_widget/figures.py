"""Plotly figures of an analysis: memory per module, and live bytes over the pass."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .units import format_bytes

if TYPE_CHECKING:
    import plotly.graph_objects as go

    from .analysis import Analysis

_MIB = 1024**2


def memory_figure(analysis: Analysis, depth: int = 1) -> go.Figure:
    """Stacked horizontal bars: parameter and activation bytes of each module at ``depth``.

    Modules shallower than ``depth`` without children are shown too, so every byte appears once.
    """
    import plotly.graph_objects as go

    nodes = [
        n for n in analysis.modules if n.depth == depth or (n.depth < depth and not n.children)
    ]
    if not nodes:
        nodes = [analysis.root]
    labels = [f"{n.path or analysis.title} · {n.type}" for n in nodes]
    fig = go.Figure()
    for name, values in (
        ("parameters", [n.param_bytes for n in nodes]),
        ("activations", [n.activation_bytes for n in nodes]),
    ):
        fig.add_bar(
            name=name,
            y=labels,
            x=[v / _MIB for v in values],
            orientation="h",
            hovertext=[format_bytes(v) for v in values],
            hoverinfo="y+text+name",
        )
    fig.update_layout(
        barmode="stack",
        title=f"{analysis.title}: memory by module (depth {depth})",
        xaxis_title="MiB",
        yaxis={"autorange": "reversed"},
        height=max(300, 22 * len(nodes) + 120),
        legend={"orientation": "h"},
    )
    return fig


def timeline_figure(analysis: Analysis) -> go.Figure:
    """Live bytes after each allocation and free of the pass, the peak marked with its module."""
    import plotly.graph_objects as go

    mem = analysis.memory
    points = mem.timeline
    ys = [b / _MIB for b, _, _ in points] or [mem.baseline_bytes / _MIB]
    modules = [analysis.calls[c].path if c >= 0 else "" for _, c, _ in points] or [""]
    ops = [op for _, _, op in points] or [""]
    fig = go.Figure()
    fig.add_scatter(
        y=ys,
        mode="lines",
        name="live bytes",
        customdata=list(zip(modules, ops, strict=True)),
        hovertemplate="%{y:.2f} MiB<br>%{customdata[0]} (%{customdata[1]})<extra></extra>",
    )
    if points:
        i = max(range(len(points)), key=lambda k: points[k][0])
        fig.add_scatter(
            x=[i],
            y=[ys[i]],
            mode="markers+text",
            name="peak",
            text=[f"peak {format_bytes(mem.peak_bytes)} in {mem.peak_module or '?'}"],
            textposition="top left",
        )
    fig.update_layout(
        title=f"{analysis.title}: live memory over the {analysis.mode} pass",
        xaxis_title="allocation / free event",
        yaxis_title="MiB live",
        showlegend=False,
    )
    return fig
