"""The widget views of ``max_fit``, ``compare`` and ``plan``: a "what fits" panel, a
comparison tree and a plan chart.

One small anywidget (``ExploreView``) with the traits ``kind`` (``"fit"``, ``"compare"`` or
``"plan"``) and ``payload`` (plain data: ``fit_payload`` of a
:class:`~meta_widget.explore.fit.Fit`, ``comparison_payload`` of a
:class:`~meta_widget.explore.comparison.Comparison`, ``plan_payload`` of a
:class:`~meta_widget.explore.plan.Plan`; saved with the notebook like the analysis widget's),
and ``detail``: what the user opened from the view (the plan view: ``{"index": i, "payload":
<the analysis payload of candidate i>}``, ``{}`` before), answered by the kernel to the view's
``{"type": "open", "index": i}`` message.
The front end is ``js/explore.ts`` (``js/fit.ts``, ``js/compare.ts``, ``js/plan.ts``), bundled
into ``static/explore.js``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anywidget
import traitlets

from ..choices import ExploreKind
from ..views.widget import NOT_BUILT, asset

__all__ = ["ExploreView", "explore_view"]


#: the message a view sends to open one of its items (the plan view: a candidate)
OPEN = "open"


class ExploreView(anywidget.AnyWidget):  # type: ignore[misc]
    """The "what fits" panel (``kind="fit"``), the comparison tree (``kind="compare"``) or the
    plan chart (``kind="plan"``)."""

    _esm = asset("explore.js", NOT_BUILT)
    _css = asset("explore.css", "")

    kind = traitlets.Unicode("").tag(sync=True)
    payload = traitlets.Dict().tag(sync=True)
    detail = traitlets.Dict().tag(sync=True)

    #: the text shown where the widget cannot be (``repr`` of the Fit, the comparison's summary)
    text: str = ""
    #: item index -> the payload ``detail`` shows for it (None: nothing to show); None: the
    #: view opens nothing
    opener: Callable[[int], dict[str, Any] | None] | None = None

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.on_msg(self._on_message)

    def _on_message(self, _widget: Any, content: Any, _buffers: Any) -> None:
        """``{"type": "open", "index": i}``: put item ``i``'s payload in ``detail``. Other
        messages, and indices the opener has nothing for, are ignored (a newer front end may
        send more)."""
        if not isinstance(content, dict) or content.get("type") != OPEN:
            return
        index = content.get("index")
        if self.opener is None or isinstance(index, bool) or not isinstance(index, int):
            return
        payload = self.opener(index)
        if payload is not None:
            self.detail = {"index": index, "payload": payload}

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        bundle = super()._repr_mimebundle_(**kwargs)
        if bundle is None or not self.text:
            return bundle
        data, meta = bundle if isinstance(bundle, tuple) else (bundle, {})
        data["text/plain"] = self.text
        return data, meta


def explore_view(kind: ExploreKind, payload: dict[str, Any], text: str) -> ExploreView:
    """The panel of ``kind`` showing ``payload`` (``fit_payload`` / ``comparison_payload`` /
    ``plan_payload``), with ``text`` where the widget cannot render."""
    view = ExploreView(kind=kind.value, payload=payload)
    view.text = text
    return view
