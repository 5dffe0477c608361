"""The widget views of ``max_fit`` and ``compare``: a "what fits" panel and a comparison tree.

One small anywidget (``ExploreView``) with two traits: ``kind`` (``"fit"`` or ``"compare"``)
and ``payload`` (plain data: ``fit_payload`` of a :class:`~meta_widget.explore.fit.Fit`,
``comparison_payload`` of a :class:`~meta_widget.explore.comparison.Comparison`; saved with the
notebook like the analysis widget's).
The front end is ``js/explore.ts`` (``js/fit.ts``, ``js/compare.ts``), bundled into
``static/explore.js``.
"""

from __future__ import annotations

from typing import Any

import anywidget
import traitlets

from ..choices import ExploreKind
from ..views.widget import NOT_BUILT, asset

__all__ = ["ExploreView", "explore_view"]


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


def explore_view(kind: ExploreKind, payload: dict[str, Any], text: str) -> ExploreView:
    """The panel of ``kind`` showing ``payload`` (``fit_payload`` / ``comparison_payload``),
    with ``text`` where the widget cannot render."""
    view = ExploreView(kind=kind.value, payload=payload)
    view.text = text
    return view
