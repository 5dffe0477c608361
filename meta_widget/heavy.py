"""The heavy third-party libraries, imported on first use: torch (~2 s; ``import meta_widget``, the
command's ``--help`` and its usage errors answer without it), pandas (DataFrames), plotly
(figures), IPython (display) and transformers (only for its configs). These are the package's
only imports of other libraries made inside functions. The package's own modules are never
loaded here: a module that loads one of them on first use (the widget, whose anywidget costs
~0.5 s; FSDP2 for ``parallel=``) imports it inside the function that needs it, down the layers,
where the architecture test sees it (``tests/test_architecture.py``).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

__all__ = [
    "diffusers",
    "display",
    "networkx",
    "pandas",
    "plotly_go",
    "plotly_subplots",
    "torch",
    "transformers",
]


def torch() -> ModuleType:
    """The ``torch`` module."""
    import torch

    return torch


def transformers() -> ModuleType:
    """The ``transformers`` module (a config's model class is built from it)."""
    import transformers

    return transformers


def diffusers() -> ModuleType:
    """The ``diffusers`` module (optional: a pipeline's parts built from its config folder);
    ImportError without it."""
    import diffusers

    return diffusers


def pandas() -> ModuleType:
    """The ``pandas`` module."""
    import pandas

    return pandas


def networkx() -> ModuleType:
    """The ``networkx`` module (optional: ``Graph.to_networkx``); ImportError without it."""
    import networkx

    return networkx


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
