"""meta_widget: see any PyTorch model on the meta device, without spending a byte on its weights.

>>> import meta_widget as mw
>>> a = mw.analyze(model, input_size=(1, 3, 224, 224))
>>> a.total_params, a.total_flops, a.peak_bytes
>>> a  # in a notebook: the widget

Heavy libraries (torch, pandas, plotly, anywidget) are imported on first use, so that
``import meta_widget`` stays fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "Analysis",
    "MetaWidget",
    "analyze",
    "checkpoint_diff",
    "explain",
    "inspect_checkpoint",
    "load_ipython_extension",
    "materialize",
    "unload_ipython_extension",
]

# explain.py imports only the standard library at the top; importing it here keeps the function
# (not the submodule of the same name) as ``meta_widget.explain``.
from .explain import explain

_WHERE = {
    "Analysis": "analysis",
    "analyze": "analysis",
    "MetaWidget": "widget",
    "inspect_checkpoint": "checkpoints",
    "checkpoint_diff": "checkpoints",
    "materialize": "materialize",
    "load_ipython_extension": "magics",
    "unload_ipython_extension": "magics",
}

if TYPE_CHECKING:
    from .analysis import Analysis, analyze
    from .checkpoints import checkpoint_diff, inspect_checkpoint
    from .magics import load_ipython_extension, unload_ipython_extension
    from .materialize import materialize
    from .widget import MetaWidget


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'meta_widget' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
