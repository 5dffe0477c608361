"""``max_fit``: the largest batch or sequence length whose peak fits a memory budget.

A search over traces: from size 1, sizes grow (at least doubling, guided by the line through
the last two peaks) until one does not fit; then the bracket between the last size that fits and
the first that does not closes, by guesses on the line through the last guess and its neighbour
(a peak that grows linearly near the answer is found in two more traces), with midpoints while
guesses stop closing in. Each trace is a full analysis, so the answer is what ``analyze`` says at
``size`` and at ``size + 1``. It assumes the peak grows with the size (true of batch and
sequence length in the models we know).

Per device under a parallel strategy (``devices=8, strategy="zero3"``), the bytes compared with
the budget are ``meta_widget.views.estimates.distributed``'s per-device total, the larger of its
estimates at the recorded peak and at the end of the forward pass (see :func:`_moments`; an
estimate, and the size is then the per-device batch or sequence length).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..analysis import Analysis
from ..choices import ExploreKind, Mode, Phase
from ..errors import MetaWidgetError
from ..memory.report import MemoryReport
from ..options import OptionError, OptionTypeError, check_budget
from ..units import format_bytes
from ..views.estimates import (
    STRATEGIES,
    distributed,
    largest_block_bytes,
    root_unit_bytes,
    tp_activation_fraction,
    tp_fraction,
)
from .sweeps import ProgressFn, Tracer, progress_function

__all__ = ["Fit", "FitError", "NothingFitsError", "max_fit"]


class NothingFitsError(MetaWidgetError, MemoryError):
    """Not even size 1 fits the budget (or the weights alone do not)."""


class FitError(MetaWidgetError, RuntimeError):
    """The analysis failed at a size ``max_fit`` had to try, so the search cannot go on."""


@dataclass
class Fit:
    """The answer of :func:`max_fit`."""

    #: the varied name (``"batch"`` or ``"seq"``...) and the largest size that fits
    vary: str
    size: int
    #: the bytes compared with the budget at ``size``: ``Analysis.footprint_bytes`` (with
    #: ``gpu=``, what the GPU holds; else the peak), or the per-device estimate
    peak_bytes: int
    #: the analysis at ``size``
    analysis: Analysis
    #: the bytes at ``size + 1``, over the budget; None when ``size`` is the ``limit``
    next_peak_bytes: int | None
    budget: int
    #: every size traced and its bytes, in the order traced
    history: list[tuple[int, int]] = field(default_factory=list)
    devices: int | None = None
    strategy: str | None = None

    @property
    def traces(self) -> int:
        """How many analyses the search ran."""
        return len(self.history)

    def widget(self) -> Any:
        """The "what fits" panel (``meta_widget.explore.view``)."""
        from .view import explore_view  # anywidget: ~0.5 s, loaded on first use

        return explore_view(ExploreKind.FIT, fit_payload(self), repr(self))

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget()._repr_mimebundle_(**kwargs)

    def __repr__(self) -> str:
        where = f" per device ({self.devices} x {self.strategy})" if self.devices else ""
        # the margins, which three figures of the peaks alone hide near the budget
        after = (
            f"; {self.vary}={self.size + 1} does not fit: "
            f"{format_bytes(self.next_peak_bytes)}, over by "
            f"{format_bytes(self.next_peak_bytes - self.budget)}"
            if self.next_peak_bytes is not None
            else " (the limit)"
        )
        spare = format_bytes(self.budget - self.peak_bytes)
        return (
            f"<Fit {self.vary}={self.size} fits: {format_bytes(self.peak_bytes)} of "
            f"{format_bytes(self.budget)}{where}, {spare} to spare{after}; {self.traces} traces>"
        )


def max_fit(
    model: Any,
    input_size: Any,
    *,
    budget: int | str,
    vary: str = "batch",
    dims: Mapping[str, Any] | None = None,
    devices: int | None = None,
    strategy: str | None = None,
    limit: int = 2**24,
    progress: bool | ProgressFn = False,
    **options: Any,
) -> Fit:
    """The largest ``vary`` size (batch, sequence length...) whose peak fits in ``budget``.

    Parameters
    ----------
    model, input_size
        As for ``analyze``; the ``vary`` dimensions of ``input_size`` are replaced while
        searching.
    budget
        Bytes (an int) or a size with a unit: ``"80GiB"`` (binary), ``"80GB"`` (decimal).
    vary
        ``"batch"`` (dimension 0 of every input), ``"seq"`` (dimension 1 of token-id inputs) or a
        name given in ``dims`` (see ``meta_widget.explore.vary``).
    devices, strategy
        Fit per device under a parallel strategy (``"ddp"``, ``"zero1"``, ``"zero2"``,
        ``"zero3"``/``"fsdp"``, ``"tp"``): the per-device total of
        ``meta_widget.views.estimates.distributed`` at the recorded dtype is compared with the
        budget.
    limit
        The largest size tried; when it fits, ``Fit.size`` is ``limit`` and ``next_peak_bytes``
        None.
    progress
        ``True``: a text line per trace on standard error; or a function ``(done, total, text)``.
    **options
        ``analyze``'s options (``mode``, ``device``, ``optimizer``, ``dtypes``...). With
        ``mode="generate", new_tokens=N``: the most concurrent sequences (``vary="batch"``) or
        the longest prompt (``vary="seq"``) whose whole ``generate()`` peaks within the budget.
        With ``gpu=``, the budget is held against what that GPU holds at the peak
        (``Analysis.footprint_bytes``: the caching allocator's reserve, the CUDA context),
        without it against the traced peak.

    Raises
    ------
    NothingFitsError
        When the weights alone (in training with their gradients and optimizer state) exceed the
        budget, or the peak at size 1 does.
    FitError
        When the analysis fails at a size the search needed.
    OptionError
        For a budget, vary, devices or strategy that cannot be used.
    """
    limit_bytes = check_budget(budget)
    if not isinstance(vary, str):
        raise OptionTypeError(f"vary must be one name, e.g. vary='batch' or 'seq', not {vary!r}")
    _check_limit(limit)
    measure = _measure(devices, strategy)
    report = progress_function(progress, "max_fit")
    tracer = Tracer(model, input_size, [vary], dims, options)
    history: list[tuple[int, int]] = []
    found: dict[int, tuple[int, Analysis]] = {}

    def at(size: int) -> int:
        if size not in found:
            if report is not None:
                report(len(history), 0, f"{vary}={size}")
            a = tracer.analysis_at([size])
            if a.error is not None:
                where = f" (in module {a.error.module!r})" if a.error.module else ""
                raise FitError(
                    f"max_fit: the analysis at {vary}={size} failed{where}, so the search "
                    f"cannot tell whether it fits: {a.error.type}: {a.error.message} Run "
                    "mw.analyze at that size to see the explanation, or pass limit=<a smaller "
                    "size> if larger sizes are not meant to work."
                )
            found[size] = (measure(a), a)
            history.append((size, found[size][0]))
        return found[size][0]

    first = at(1)
    _check_size_one(found[1][1], first, limit_bytes, vary, devices)
    lo, hi = _search(at, limit_bytes, limit)
    if report is not None:
        report(len(history), len(history), f"{vary}={lo} fits ({len(history)} traces)")
    peak, analysis = found[lo]
    return Fit(
        vary=vary,
        size=lo,
        peak_bytes=peak,
        analysis=analysis,
        next_peak_bytes=at(hi) if hi is not None else None,
        budget=limit_bytes,
        history=history,
        devices=devices,
        strategy=strategy,
    )


def _search(at: Callable[[int], int], budget: int, limit: int) -> tuple[int, int | None]:
    """(largest size that fits, the next size; None past ``limit``), knowing that size 1 fits.

    Bracketing: each new size is where the line through the last two traced points reaches
    the budget, a little past it, and at least twice the last size. Then, between the last size
    that fits and the first that does not: a guess and its neighbour, the first guess on the
    line through the bracket's ends, each later one on the line through the last guess and its
    neighbour (the slope where the answer is: a peak linear there is found in two more traces,
    where the line through the far ends of a convex peak creeps up on it); a round of those
    whose guess would not close in on the last ones (:func:`_guess`) gives way to midpoints, as
    does a flat line (steps), and after six of them (a bracket 64 times narrower, where a curved
    peak is nearly straight) to lines again. Every answer is checked by traces at ``size`` and
    ``size + 1``.
    """
    lo, x = 1, 2
    while True:  # bracketing
        x = min(x, limit)
        if at(x) > budget:
            hi = x
            break
        if x == limit:
            return limit, None
        guess = _where_line_meets(lo, at(lo), x, at(x), budget)
        lo, x = x, max(2 * x, int(guess * 1.05) + 1)
    line = (lo, hi)  # the bracket's ends, then the last guess and its neighbour
    guesses: list[int] = []
    bisect = 0  # the bracket's width when midpoints began; 0: guesses on lines
    while hi - lo > 1:
        if bisect and hi - lo <= bisect // 64:  # six halvings on: a line may follow it now
            bisect, line, guesses = 0, (lo, hi), []
        g = None if bisect else _guess(at, line, lo, hi, budget, guesses)
        if g is None:
            bisect, g = bisect or hi - lo, (lo + hi) // 2
        if at(g) <= budget:
            lo = g
            if not bisect and g + 1 < hi:
                lo, hi = (g + 1, hi) if at(g + 1) <= budget else (lo, g + 1)
                line = (g, g + 1)
        else:
            hi = g
            if not bisect and g - 1 > lo:
                lo, hi = (g - 1, hi) if at(g - 1) <= budget else (lo, g - 1)
                line = (g - 1, g)
    return lo, hi


def _guess(
    at: Callable[[int], int],
    line: tuple[int, int],
    lo: int,
    hi: int,
    budget: int,
    guesses: list[int],
) -> int | None:
    """Where ``line`` reaches the budget, inside the bracket; None where no line helps: a flat
    one, or guesses no longer closing in (each move at most a quarter of the one before, the
    first at most half the bracket, as a line through a guess and its neighbour moves near a
    smooth peak's answer; a steep curve makes it overshoot or crawl, and then halving is
    quicker)."""
    a, b = line
    if at(b) <= at(a):
        return None
    g = min(max(int(_where_line_meets(a, at(a), b, at(b), budget)), lo + 1), hi - 1)
    if guesses and 4 * abs(g - guesses[-1]) > (
        abs(guesses[-1] - guesses[-2]) if len(guesses) >= 2 else 2 * (hi - lo)
    ):
        return None
    guesses.append(g)
    return g


def _where_line_meets(x0: int, y0: int, x1: int, y1: int, budget: int) -> float:
    """The size where the line through ``(x0, y0)`` and ``(x1, y1)`` reaches ``budget``."""
    if y1 <= y0:
        return float(2 * x1)  # flat: no estimate, keep doubling
    return x0 + (budget - y0) * (x1 - x0) / (y1 - y0)


def _check_size_one(a: Analysis, peak: int, budget: int, vary: str, devices: int | None) -> None:
    mem = a.memory
    weights = mem.param_bytes + mem.buffer_bytes
    what = "the weights (parameters and buffers)"
    if a.mode == Mode.TRAINING:
        weights += mem.gradient_bytes + mem.optimizer_state_bytes
        what = "the weights, their gradients and the optimizer state"
    if devices is None and weights > budget:
        raise NothingFitsError(
            f"max_fit: {what} of {a.title} alone take {format_bytes(weights)}, more than the "
            f"budget of {format_bytes(budget)}: no {vary} fits on one device. Try a larger "
            "budget, devices=N with strategy='zero3' (sharded), or lower precision (dtypes of "
            "the weights, autocast)."
        )
    if peak > budget:
        where = f" per device ({devices} devices)" if devices else ""
        raise NothingFitsError(
            f"max_fit: even {vary}=1 needs {format_bytes(peak)}{where}, more than the budget of "
            f"{format_bytes(budget)} (the peak is at {mem.peak_owner}, in {mem.peak_phase}). "
            "Try a larger budget, smaller other dimensions in input_size, more devices or "
            "activation checkpointing."
        )


def _check_limit(limit: Any) -> None:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise OptionError(f"limit must be an int of 1 or more, not {limit!r}")


def _measure(devices: int | None, strategy: str | None) -> Callable[[Analysis], int]:
    """The bytes compared with the budget: ``Analysis.footprint_bytes`` (with ``gpu=``, what
    the GPU holds; else the peak), or the per-device estimate."""
    if devices is None and strategy is None:
        return lambda a: a.footprint_bytes
    if devices is None or strategy is None:
        raise OptionError(
            "devices and strategy go together: e.g. devices=8, strategy='zero3' (or neither, "
            "for one device)."
        )
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise OptionError(f"devices must be an int of 1 or more, not {devices!r}")
    if strategy not in STRATEGIES:
        raise OptionError(f"strategy must be one of {STRATEGIES}, not {strategy!r}")

    def per_device(a: Analysis) -> int:
        return max(
            distributed(
                report,
                devices,
                strategy,
                dtype=_recorded_dtype(a),
                largest_unit_bytes=largest_block_bytes(a),
                root_unit_bytes=root_unit_bytes(a),
                tp_fraction=tp_fraction(a),
                tp_activation_fraction=tp_activation_fraction(a),
            )["total"]
            for report in _moments(a.memory)
        )

    return per_device


def _moments(report: MemoryReport) -> list[MemoryReport]:
    """The report at its peak and, in training, as at the end of the forward pass.

    ``distributed`` re-scales the categories live at one moment. The single-device peak is the
    moment where the unsharded state weighs most (often the optimizer step), but sharding that
    state moves the per-device peak to where the activations weigh most: the end of the forward
    pass, when every saved activation is live and no gradient yet (bytes above parameters,
    buffers and inputs are taken as activations). The larger of the two estimates is the fit.
    """
    start = report.phases.get(Phase.BACKWARD)
    if start is None or start < 1 or not report.timeline:
        return [report]
    live = report.timeline[start - 1][0]
    categories = {c: 0 for c in report.categories}
    categories.update(
        parameters=report.param_bytes,
        buffers=report.buffer_bytes,
        inputs=report.input_bytes,
        activations=max(0, live - report.baseline_bytes),
    )
    forward_end = replace(report, categories=categories, peak_phase=str(Phase.FORWARD))
    return [report, forward_end]


def _recorded_dtype(a: Analysis) -> str:
    """The dtype the floating parameters were recorded at: estimates then only shard."""
    floats = {d: b for d, b in a.memory.params_by_dtype.items() if d in _COMPUTE}
    return max(floats, key=lambda d: floats[d]) if floats else "float32"


_COMPUTE = ("float32", "bfloat16", "float16")


def fit_payload(fit: Fit) -> dict[str, Any]:
    """What the "what fits" panel shows: the answer, the bytes at the size by category, and
    every size traced."""
    memory = fit.analysis.memory
    return {
        "title": fit.analysis.title,
        "vary": fit.vary,
        "size": fit.size,
        "peakBytes": fit.peak_bytes,
        "nextPeakBytes": fit.next_peak_bytes,
        "budget": fit.budget,
        "devices": fit.devices,
        "strategy": fit.strategy,
        "mode": fit.analysis.mode,
        "peakOwner": memory.peak_owner,
        "categories": {k: v for k, v in memory.by_category().items() if v},
        "history": [[size, peak] for size, peak in fit.history],
    }
