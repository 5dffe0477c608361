"""The heavy libraries the views use, imported on first use so that ``import meta_widget`` stays
fast: pandas (DataFrames), plotly (figures) and IPython (display). These are the package's only
imports made inside functions; every other import is at the top of its module.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

__all__ = ["display", "pandas", "plotly_go"]


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
