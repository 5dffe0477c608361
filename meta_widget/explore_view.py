"""The widget views of ``max_fit`` and ``compare``: a "what fits" panel and a comparison tree.

One small anywidget (``ExploreView``) with two traits: ``kind`` (``"fit"`` or ``"compare"``)
and ``payload`` (plain data, made here from a :class:`~meta_widget.fit.Fit` or a
:class:`~meta_widget.comparison.Comparison`; saved with the notebook like the analysis widget's).
The front end is ``js/explore.ts`` (``js/fit.ts``, ``js/compare.ts``), bundled into
``static/explore.js``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anywidget
import traitlets

from .choices import ExploreKind
from .comparison import NUMBERS, Comparison, fold
from .widget import NOT_BUILT, asset

if TYPE_CHECKING:
    from .fit import Fit

__all__ = ["ExploreView", "comparison_payload", "fit_payload"]


class ExploreView(anywidget.AnyWidget):  # type: ignore[misc]
    """The "what fits" panel (``kind="fit"``) or the comparison tree (``kind="compare"``)."""

    _esm = asset("explore.js", NOT_BUILT)
    _css = asset("explore.css", "")

    kind = traitlets.Unicode("").tag(sync=True)
    payload = traitlets.Dict().tag(sync=True)

    #: the text shown where the widget cannot be (``repr`` of the Fit, the comparison's summary)
    text: str = ""

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        bundle = super()._repr_mimebundle_(**kwargs)
        if bundle is None or not self.text:
            return bundle
        data, meta = bundle if isinstance(bundle, tuple) else (bundle, {})
        data["text/plain"] = self.text
        return data, meta


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


def comparison_payload(comparison: Comparison) -> dict[str, Any]:
    """The comparison's totals and its rows, repeated layers folded (``{0..31}`` and a count)."""
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
    return {
        "a": comparison.a.title,
        "b": comparison.b.title,
        "totals": {k: list(v) for k, v in comparison.totals.items()},
        "rows": rows,
    }


def fit_view(fit: Fit) -> ExploreView:
    view = ExploreView(kind=ExploreKind.FIT.value, payload=fit_payload(fit))
    view.text = repr(fit)
    return view


def comparison_view(comparison: Comparison) -> ExploreView:
    view = ExploreView(kind=ExploreKind.COMPARE.value, payload=comparison_payload(comparison))
    view.text = comparison.summary()
    return view
