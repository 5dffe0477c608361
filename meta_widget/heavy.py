"""The heavy libraries the views use, imported on first use so that ``import meta_widget`` and an
analysis in a script stay fast: pandas (DataFrames), plotly (figures), IPython (display) and
anywidget (the widget module, ~0.5 s to import). These are the package's only imports made inside
functions; every other import is at the top of its module.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

__all__ = ["display", "pandas", "plotly_go", "widget"]


def pandas() -> ModuleType:
    """The ``pandas`` module."""
    import pandas

    return pandas


def plotly_go() -> ModuleType:
    """``plotly.graph_objects``."""
    import plotly.graph_objects

    return plotly.graph_objects


def display(obj: Any) -> None:
    """Show ``obj`` in the running notebook (IPython's ``display``)."""
    from IPython.display import display as show

    show(obj)


def widget() -> ModuleType:
    """``meta_widget.widget`` (it imports anywidget and traitlets)."""
    from . import widget as module

    return module
