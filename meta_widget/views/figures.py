"""Plotly figures of an analysis: memory per module, and live bytes over the pass."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import heavy
from ..choices import Phase
from ..units import format_bytes
from .memory_bars import BAR_PARTS, memory_bars

if TYPE_CHECKING:
    import plotly.graph_objects as go

    from .analyzed import Analyzed

_MIB = 1024**2


def memory_figure(analysis: Analyzed, depth: int = 1) -> go.Figure:
    """Stacked horizontal bars per module at ``depth`` (``meta_widget.views.memory_bars``):
    parameters,
    in training gradients and optimizer state, and output mem; repeated layers folded into one
    bar; each part's bytes inside it where it fits and each bar's total beside it.

    Modules shallower than ``depth`` without children are shown too, so every byte appears once
    (tied weights at their first owner).
    """
    go = heavy.plotly_go()

    bars = memory_bars(analysis, depth)
    labels = [b.label for b in bars]
    fig = go.Figure()
    for name, attr in BAR_PARTS:
        values = [getattr(b, attr) for b in bars]
        if not any(values):
            continue
        fig.add_bar(
            name=name,
            y=labels,
            x=[v / _MIB for v in values],
            orientation="h",
            text=[format_bytes(v) if v else "" for v in values],
            textposition="inside",
            insidetextanchor="middle",
            hovertext=[format_bytes(v) for v in values],
            hoverinfo="y+text+name",
        )
    totals = [b.total for b in bars]
    fig.add_scatter(
        y=labels,
        x=[t / _MIB for t in totals],
        mode="text",
        text=[
            f" {format_bytes(t)}"
            + (
                f" (+{format_bytes(b.tied_bytes)} tied: counted at its first owner)"
                if b.tied_bytes
                else ""
            )
            for t, b in zip(totals, bars, strict=True)
        ],
        textposition="middle right",
        showlegend=False,
        hoverinfo="skip",
    )
    fig.update_layout(
        barmode="stack",
        uniformtext={"mode": "hide", "minsize": 9},
        title=f"{analysis.title}: memory by module (depth {depth})",
        xaxis={"title": "MiB", "range": [0, max(totals, default=0) / _MIB * 1.25 or 1]},
        yaxis={"autorange": "reversed"},
        height=max(300, 30 * len(bars) + 150),
        legend={"orientation": "h", "x": 0, "y": 1.0, "yanchor": "bottom", "traceorder": "normal"},
    )
    return fig


def timeline_figure(analysis: Analyzed) -> go.Figure:
    """Live bytes after each allocation and free of the pass, stacked by memory category
    (``MemoryReport.timeline_categories``: parameters at the bottom; they add up to the line):
    phases shaded (in training), the peak marked with its module, op and phase, and its bytes
    by category in the hover."""
    go = heavy.plotly_go()

    mem = analysis.memory
    points = mem.timeline
    ys = [b / _MIB for b, _, _ in points] or [mem.baseline_bytes / _MIB]
    modules = [analysis.calls[c].path if c >= 0 else "" for _, c, _ in points] or [""]
    ops = [op for _, _, op in points] or [""]
    fig = go.Figure()
    for name, series in mem.timeline_categories.items():  # stacked, parameters at the bottom
        if any(series):
            fig.add_scatter(
                y=[b / _MIB for b in series],
                mode="lines",
                name=name,
                stackgroup="categories",
                line={"width": 0, "shape": "hv"},
                hovertemplate=f"{name}: %{{y:.2f}} MiB<extra></extra>",
            )
    fig.add_scatter(
        y=ys,
        mode="lines",
        line={"shape": "hv"},
        name="live bytes",
        customdata=list(zip(modules, ops, strict=True)),
        hovertemplate="%{y:.2f} MiB<br>%{customdata[0]} (%{customdata[1]})<extra></extra>",
    )
    # each run of a phase (a micro-batch's forward, its backward) shaded on its own
    starts = mem.phase_runs or sorted((i, name) for name, i in mem.phases.items())
    shades: dict[str, str] = {
        Phase.FORWARD: "rgba(99,110,250,0.07)",
        Phase.BACKWARD: "rgba(239,85,59,0.07)",
        Phase.OPTIMIZER: "rgba(0,204,150,0.09)",
    }
    for k, (i, name) in enumerate(starts if len(starts) > 1 else []):
        end = starts[k + 1][0] if k + 1 < len(starts) else len(points)
        fig.add_vrect(
            x0=i,
            x1=max(end - 1, i),
            fillcolor=shades.get(name, "rgba(0,0,0,0.05)"),
            line_width=0,
            annotation_text=name,
            annotation_position="top left",
        )
    if points:
        i = max(range(len(points)), key=lambda k: points[k][0])
        where = mem.peak_owner or "?"
        phase = f", {mem.peak_phase}" if mem.peak_phase and mem.peak_phase not in where else ""
        parts = "<br>".join(f"{k}: {format_bytes(v)}" for k, v in mem.categories.items() if v)
        fig.add_scatter(
            x=[i],
            y=[ys[i]],
            mode="markers+text",
            name="peak",
            text=[f"peak {format_bytes(mem.peak_bytes)} in {where} ({mem.peak_op}{phase})"],
            textposition="top left",
            showlegend=False,
            hovertext=[parts],
            hoverinfo="text",
        )
    fig.update_layout(
        title=f"{analysis.title}: live memory over the {analysis.mode} pass",
        xaxis_title="allocation / free event",
        yaxis_title="MiB live",
        legend={"orientation": "h", "traceorder": "reversed"},
    )
    return fig


def categories_figure(analysis: Analyzed) -> go.Figure:
    """One stacked bar: the bytes live at the peak, by category (they add up to the peak)."""
    go = heavy.plotly_go()

    fig = go.Figure()
    for name, value in analysis.memory.categories.items():
        if value:
            fig.add_bar(
                name=name,
                x=[value / _MIB],
                y=["peak"],
                orientation="h",
                hovertext=[format_bytes(value)],
                hoverinfo="name+text",
            )
    fig.update_layout(
        barmode="stack",
        height=220,
        xaxis_title="MiB",
        title=f"{analysis.title}: peak {format_bytes(analysis.peak_bytes)} by category"
        + (f" ({analysis.memory.peak_phase})" if analysis.memory.peak_phase else ""),
    )
    return fig
