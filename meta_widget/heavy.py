"""The heavy libraries, imported on first use: torch (~2 s; ``import meta_widget``, the command's
``--help`` and its usage errors answer without it), pandas (DataFrames), plotly (figures), IPython
(display), anywidget (the widget module, ~0.5 s) and transformers (only for its configs). These
are the package's only imports made inside functions; every other import is at the top of its
module.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

__all__ = [
    "analysis",
    "display",
    "explore_view",
    "pandas",
    "parallel",
    "plotly_go",
    "plotly_subplots",
    "torch",
    "transformers",
    "widget",
    "wrapped",
    "wrapping",
]


def torch() -> ModuleType:
    """The ``torch`` module."""
    import torch

    return torch


def analysis() -> ModuleType:
    """``meta_widget.analysis``, the analyzer (it imports torch and the tracer)."""
    from . import analysis as module

    return module


def parallel() -> ModuleType:
    """``meta_widget.parallel`` (it imports FSDP2 and tensor parallelism, ~1 s)."""
    from . import parallel as module

    return module


def wrapped() -> ModuleType:
    """``meta_widget.wrapped`` (tracing a model the user wrapped, as it stands)."""
    from . import wrapped as module

    return module


def wrapping() -> ModuleType:
    """``meta_widget.wrapping`` (reading a user's FSDP2 / tensor-parallel wrapping)."""
    from . import wrapping as module

    return module


def transformers() -> ModuleType:
    """The ``transformers`` module (a config's model class is built from it)."""
    import transformers

    return transformers


def pandas() -> ModuleType:
    """The ``pandas`` module."""
    import pandas

    return pandas


def plotly_go() -> ModuleType:
    """``plotly.graph_objects``."""
    import plotly.graph_objects

    return plotly.graph_objects


def plotly_subplots() -> ModuleType:
    """``plotly.subplots`` (figures of several panels)."""
    import plotly.subplots

    return plotly.subplots


def display(obj: Any, *, updatable: bool = False) -> Any:
    """Show ``obj`` in the running notebook (IPython's ``display``).

    With ``updatable``, returns IPython's ``DisplayHandle`` for that output (``handle.update``
    replaces it in place), or None where there is none: outside IPython, or in a front end that
    patches ``display`` with its own handle (marimo, whose update replaces the cell's whole
    output and which shows the widget anyway).
    """
    from IPython.display import DisplayHandle
    from IPython.display import display as show

    handle = show(obj, display_id=True if updatable else None)
    return handle if isinstance(handle, DisplayHandle) else None


def explore_view() -> ModuleType:
    """``meta_widget.explore_view`` (the fit and comparison widgets; anywidget)."""
    from . import explore_view as module

    return module


def widget() -> ModuleType:
    """``meta_widget.widget`` (it imports anywidget and traitlets)."""
    from . import widget as module

    return module
