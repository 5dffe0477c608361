"""``sweep``: one analysis per point of a grid of input sizes, and the :class:`Sweep` of them.

The model is built on meta once; every point re-traces it at other input sizes
(``Analysis.rerun``), which gives the numbers a separate ``analyze`` call at that size gives.
"""

from __future__ import annotations

import difflib
import inspect
import itertools
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .. import heavy
from ..analysis import Analysis, analyze
from ..memory.report import CATEGORIES
from ..options import OptionError, OptionTypeError, check_budget, input_shapes
from ..sources.inputs import make_inputs
from ..units import format_bytes
from ..warm import in_kernel
from .vary import Axis, resized, resolve_axes

if TYPE_CHECKING:
    import pandas as pd
    import plotly.graph_objects as go

__all__ = ["Progress", "Sweep", "Tracer", "sweep"]

#: ``progress(done, total, text)``: told before each trace and once when all are done
ProgressFn = Callable[[int, int, str], None]


class Progress:
    """A one-line progress bar: ``sweep [####....] 3/12 batch=8``.

    In a Jupyter kernel it is a plain-text output updated in place and left as one line that
    says what was done (standard error would draw it as a red box that stays); elsewhere, or
    with ``stream`` given, a line on that stream (standard error by default) rewritten with
    ``\\r``.
    """

    def __init__(self, what: str, stream: Any = None) -> None:
        self.what = what
        self.stream = stream if stream is not None else (None if in_kernel() else sys.stderr)
        self._handle: Any = None
        self._shown = False

    def __call__(self, done: int, total: int, text: str) -> None:
        width = 20
        if total:
            filled = width * done // total
            count = f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total}"
        else:  # a search: the number of traces is not known in advance
            count = f"trace {done + 1}"
        finished = bool(total) and done >= total
        if self.stream is None:
            line = (
                f"{self.what}: {done}/{total} {text}" if finished else f"{self.what} {count} {text}"
            )
            self._show(line)
            return
        end = "\n" if finished else ""
        self.stream.write(f"\r{self.what} {count} {text}".ljust(79) + end)
        self.stream.flush()

    def _show(self, line: str) -> None:
        """The line as the cell's plain-text output, replaced in place on each call."""
        if not self._shown:
            self._shown = True
            self._handle = heavy.display(_Line(line), updatable=True)
        elif self._handle is not None:  # None: a front end without updates shows the first only
            self._handle.update(_Line(line))


class _Line:
    """A line of text shown as itself (its ``repr``) in a notebook's output."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def byte_ticks(top: float, count: int = 5) -> tuple[list[int], list[str]]:
    """Axis ticks for bytes from 0 to ``top``: binary multiples written as ``format_bytes``
    writes them ("80.0 GiB", as the budget's label; plotly's own would say "80B")."""
    if not top > 0:
        return [0], [format_bytes(0)]
    unit = 1024 ** max(0, min(5, int(math.log(top, 1024))))
    raw = top / count / unit
    step = next(m for m in (0.25, 0.5, 1, 2, 4, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1024)
                if m >= raw) * unit  # fmt: skip
    values = [round(k * step) for k in range(int(top / step) + 2)]
    return values, [format_bytes(v) for v in values]


def progress_function(progress: bool | ProgressFn, what: str) -> ProgressFn | None:
    """``progress`` as a function: ``True`` a text bar, ``False`` none, a function itself."""
    if progress is True:
        return Progress(what)
    if progress is False or progress is None:
        return None
    if callable(progress):
        return progress
    raise OptionTypeError(
        f"progress must be True, False or a function (done, total, text), not {progress!r}"
    )


def check_analyze_options(options: Mapping[str, Any], who: str) -> None:
    """Every name of ``options`` is an option of ``analyze`` (said before anything is traced,
    where ``analyze`` itself would raise Python's ``TypeError`` at the first trace)."""
    known = inspect.signature(analyze).parameters
    unknown = sorted(name for name in options if name not in known)
    if unknown:
        names = [n for n in known if n not in ("model", "input_size")]
        close = [m for u in unknown for m in difflib.get_close_matches(u, names, n=1)]
        hint = f"did you mean {', '.join(map(repr, close))}? " if close else ""
        raise OptionTypeError(
            f"{who}: {', '.join(map(repr, unknown))} is an option of neither {who} nor analyze; "
            f"{hint}analyze's options: {', '.join(names)}."
        )


class Tracer:
    """The analyses of one model at several sizes: built on meta once, traced per size.

    ``analysis_at([v1, v2])`` is the analysis with each axis set to its value, the same numbers
    as ``analyze(model, input_size=<those shapes>, **options)``; ``traces`` counts the traces.
    """

    def __init__(
        self,
        model: Any,
        input_size: Any,
        names: Sequence[str],
        dims: Mapping[str, Any] | None,
        options: dict[str, Any],
    ) -> None:
        for bad in ("widget", "input_data"):
            if bad in options:
                raise OptionError(
                    f"{bad}= cannot be used here: the inputs are made from input_size, varied "
                    "per point (give input_size, and dtypes for their dtypes)."
                )
        if input_size is None:
            raise OptionError(
                "input_size is needed: the shapes whose dimensions are varied, e.g. "
                "input_size=(1, 512) for token ids of (batch, seq)."
            )
        input_shapes(input_size)  # checked before anything is built
        self.input_size = input_size
        self.options = options
        # the meta model, structure only (no trace); dtypes go with the sizes of each point
        self.base = analyze(model, **{k: v for k, v in options.items() if k != "dtypes"})
        assert self.base.source_model is not None
        module = self.base.source_model.module
        dtypes = [
            t.dtype for t in make_inputs(module, input_size, None, options.get("dtypes")).args
        ]
        self.axes: list[Axis] = resolve_axes(names, input_size, dtypes, dims)
        self.traces = 0

    @property
    def notes(self) -> list[str]:
        return [a.note for a in self.axes if a.note]

    def analysis_at(self, values: Sequence[int]) -> Analysis:
        self.traces += 1
        shapes = resized(self.input_size, self.axes, values)
        return self.base.rerun(input_size=shapes, dtypes=self.options.get("dtypes"))


@dataclass
class Sweep:
    """Analyses over a grid of input sizes (see :func:`sweep`)."""

    #: the varied names (``"batch"``, ``"seq"``...), in the order given
    names: list[str]
    #: one tuple of values per point (itertools.product order), and its analysis
    points: list[tuple[int, ...]]
    analyses: list[Analysis]
    budget: int | None = None
    notes: list[str] = field(default_factory=list)

    def to_dataframe(self) -> pd.DataFrame:
        """One row per point: a column per varied name, then ``peak_bytes``, ``total_flops``,
        ``param_bytes``, ``activation_bytes``, the bytes live at the peak by category (a column
        per category of ``Analysis.memory.by_category()``) and ``error`` (None, or the message
        of a point whose trace failed)."""
        pd = heavy.pandas()

        rows = []
        for values, a in zip(self.points, self.analyses, strict=True):
            row: dict[str, Any] = dict(zip(self.names, values, strict=True))
            row.update(
                peak_bytes=a.peak_bytes,
                total_flops=a.total_flops,
                param_bytes=a.param_bytes,
                activation_bytes=a.activation_bytes,
            )
            cats = a.memory.by_category()
            row.update({c: cats.get(c, 0) for c in CATEGORIES})
            row["error"] = a.error.message if a.error is not None else None
            rows.append(row)
        return pd.DataFrame(rows)

    def figure(self, budget: int | str | None = None) -> go.Figure:
        """Peak bytes (left) and FLOPs (right) against the first varied size, one line per value
        of the others; the budget (given here or to ``sweep``) as a dashed line."""
        go = heavy.plotly_go()
        subplots = _make_subplots()
        frame = self.to_dataframe()
        limit = check_budget(budget) if budget is not None else self.budget
        x, others = self.names[0], self.names[1:]
        fig = subplots(rows=1, cols=2, subplot_titles=("peak memory", "FLOPs"))
        groups = frame.groupby(others, sort=False) if others else [((), frame)]
        for key, rows in groups:
            keys = key if isinstance(key, tuple) else (key,)
            label = ", ".join(f"{n}={v}" for n, v in zip(others, keys, strict=True)) or "model"
            hover = [format_bytes(b) for b in rows["peak_bytes"]]
            fig.add_trace(
                go.Scatter(
                    x=rows[x], y=rows["peak_bytes"], name=label, legendgroup=label,
                    text=hover, hovertemplate=f"{x}=%{{x}}<br>peak %{{text}}<extra>{label}</extra>",
                ),
                row=1, col=1,
            )  # fmt: skip
            fig.add_trace(
                go.Scatter(
                    x=rows[x], y=rows["total_flops"], name=label, legendgroup=label,
                    showlegend=False,
                ),
                row=1, col=2,
            )  # fmt: skip
        if limit is not None:
            fig.add_hline(
                y=limit, line_dash="dash", row=1, col=1,
                annotation_text=f"budget {format_bytes(limit)}",
            )  # fmt: skip
        fig.update_xaxes(title_text=x)
        peaks = [float(b) for b in frame["peak_bytes"] if b == b]  # NaN: a trace that failed
        values, labels = byte_ticks(max([*peaks, float(limit or 0)], default=0.0))
        fig.update_yaxes(title_text="peak memory", tickvals=values, ticktext=labels, row=1, col=1)
        fig.update_yaxes(title_text="FLOPs", row=1, col=2)
        return fig

    def __repr__(self) -> str:
        return f"<Sweep of {', '.join(self.names)}: {len(self.points)} points>"


def _make_subplots() -> Any:
    return heavy.plotly_subplots().make_subplots


def sweep(
    model: Any,
    input_size: Any,
    vary: Mapping[str, Sequence[int]],
    *,
    dims: Mapping[str, Any] | None = None,
    budget: int | str | None = None,
    progress: bool | ProgressFn = True,
    **options: Any,
) -> Sweep:
    """Analyze ``model`` at every combination of the sizes in ``vary``.

    Parameters
    ----------
    model
        Anything ``analyze`` takes (built on meta once, re-traced per point).
    input_size
        The input shapes (torchinfo's convention); the varied dimensions are replaced per point.
    vary
        ``{"batch": [1, 8, 32], "seq": [512, 2048]}``: every combination is analyzed
        (``itertools.product`` order). ``"batch"`` is dimension 0 of every input, ``"seq"``
        dimension 1 of the token-id (integer) inputs; other names need ``dims``.
    dims
        Which dimensions a name sets: ``{name: d}`` (dimension ``d`` of every input) or
        ``{name: [(input, d), ...]}``; see ``meta_widget.explore.vary``.
    budget
        A memory budget (``"80GiB"``, or bytes) drawn on ``figure()``.
    progress
        ``True``: a one-line text progress bar on standard error; ``False``: none; or a
        function ``progress(done, total, text)``.
    **options
        ``analyze``'s options (``mode``, ``dtypes``, ``device``, ``optimizer``...).

    Returns
    -------
    Sweep
        Each point's analysis, equal to ``analyze(model, input_size=<its shapes>, **options)``;
        a point whose trace fails keeps its analysis with ``error`` set.
    """
    if not isinstance(vary, Mapping) or not vary:
        raise OptionTypeError(
            f"vary must be a dict of name -> sizes, e.g. vary={{'batch': [1, 8, 32]}}, not {vary!r}"
        )
    grids = {name: _sizes(name, values) for name, values in vary.items()}
    limit = check_budget(budget) if budget is not None else None
    report = progress_function(progress, "sweep")
    tracer = Tracer(model, input_size, list(grids), dims, options)
    points = list(itertools.product(*grids.values()))
    analyses = []
    for k, values in enumerate(points):
        if report is not None:
            report(k, len(points), " ".join(f"{n}={v}" for n, v in zip(grids, values, strict=True)))
        analyses.append(tracer.analysis_at(values))
    if report is not None:
        report(len(points), len(points), "done")
    return Sweep(list(grids), points, analyses, limit, tracer.notes)


def _sizes(name: str, values: Any) -> list[int]:
    if isinstance(values, int) and not isinstance(values, bool):
        values = [values]
    if (
        not isinstance(values, Sequence)
        or isinstance(values, str)
        or not values
        or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in values)
    ):
        raise OptionError(
            f"vary[{name!r}]={values!r} must be a list of sizes (ints of 1 or more), e.g. "
            "[1, 8, 32]."
        )
    return [int(v) for v in values]
