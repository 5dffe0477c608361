"""The heavy third-party libraries, imported on first use: torch (~2 s; ``import meta_widget``, the
command's ``--help`` and its usage errors answer without it), pandas (DataFrames), plotly
(figures), IPython (display) and transformers (its configs; its model base, quietly:
:func:`transformers_models`). These are the package's
only imports of other libraries made inside functions. The package's own modules are never
loaded here: a module that loads one of them on first use (the widget, whose anywidget costs
~0.5 s; FSDP2 for ``parallel=``) imports it inside the function that needs it, down the layers,
where the architecture test sees it (``tests/test_architecture.py``).
"""

from __future__ import annotations

import importlib
import logging
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

__all__ = [
    "diffusers",
    "display",
    "networkx",
    "pandas",
    "plotly_go",
    "plotly_subplots",
    "quiet_logs",
    "torch",
    "transformers",
    "transformers_models",
]


def torch() -> ModuleType:
    """The ``torch`` module."""
    import torch

    return torch


def transformers() -> ModuleType:
    """The ``transformers`` module (a config's model class is built from it)."""
    import transformers

    return transformers


def transformers_models() -> ModuleType:
    """The ``transformers`` module with its model base (``transformers.modeling_utils``)
    imported, the first time with the log records of this thread dropped (:func:`quiet_logs`):
    importing it imports what it integrates (torchao, when installed), which logs that it
    cannot load its GPU kernels on this machine ("Failed to load ..._C_mxfp8...so") and makes
    torch's ``_pytree`` log deprecations; a meta trace runs none of those kernels, and in a
    notebook the lines would land as an error box under the cell that built a model from a
    config (the warm-up imports it the same way, ``meta_widget.warmstart``)."""
    import transformers

    if "transformers.modeling_utils" not in sys.modules:
        with quiet_logs() as cover:
            importlib.import_module("transformers.utils.logging")  # its handler, made at import
            cover()
            importlib.import_module("transformers.modeling_utils")
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


class _OtherThreads(logging.Filter):
    """Passes the log records of every thread but the one that made it."""

    def __init__(self) -> None:
        super().__init__()
        self.thread = threading.get_ident()

    def filter(self, record: logging.LogRecord) -> bool:
        return record.thread != self.thread


@contextmanager
def quiet_logs() -> Iterator[Callable[[], None]]:
    """The log records of this thread dropped by every handler (``logging.lastResort``, the
    one that prints a library's warnings when nothing is configured, included); each handler
    as it was after. The block gets a function that covers the handlers made since."""
    quiet = _OtherThreads()
    held: list[logging.Handler] = []

    def cover() -> None:
        loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
        handlers = {h for lg in loggers if isinstance(lg, logging.Logger) for h in lg.handlers}
        if logging.lastResort is not None:
            handlers.add(logging.lastResort)
        for handler in handlers - set(held):
            handler.addFilter(quiet)
            held.append(handler)

    try:
        cover()
        yield cover
    finally:
        for handler in held:
            handler.removeFilter(quiet)
