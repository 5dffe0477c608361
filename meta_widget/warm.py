"""The warm-up of PyTorch's meta path, run once in a background thread (``warmstart``).

PyTorch's first operation on meta tensors imports its meta kernels, decompositions, dynamo and
sympy: ~900 modules, seconds, paid by whatever runs first. ``%load_ext meta_widget`` (and
``import meta_widget`` in a Jupyter kernel) pays it in a background thread while the user types;
the first analysis waits for it (:func:`wait`) instead of importing the same modules at the
same time (two threads importing modules that import each other can deadlock). The warm-up
prints nothing; a failure is logged on the ``meta_widget.warm`` logger and ignored.

The package's own modules import each other in circles (``analysis`` -> ``materialization``
-> ``sources``, while ``sources`` is reached from ``pipeline`` too), and two threads importing
them in opposite orders stop one with Python's ``_DeadlockError``: a kernel whose first cell
named ``mw.Analysis`` while the warm-up imported ``pipeline`` failed so (CI, notebook 06). So
the warm-up imports them holding :data:`imports`, and so does ``meta_widget.<name>`` (the
package's lazy names): one of the two waits for the other.

What it cannot order: the user's own cells may import other modules while it runs (``import
transformers`` right after ``%load_ext``), or the package's submodules by their full names.
Python's per-module import locks make one thread wait for the other; only a circular import
between two modules taken in opposite orders by the two threads would stop one with
``_DeadlockError``. Nor a fork while it runs (multiprocessing's default start method on
Linux): the child has no warm-up thread, so it waits for none and gets an import lock of its
own, but a module the parent's warm-up was importing at that instant stays half imported there
(Python resets no module's import lock at a fork: what Python 3.12 warns of for any fork of a
threaded process); the ``spawn`` start method has no such state. ``META_WIDGET_WARMUP=0`` turns
the warm-up off.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable

__all__ = ["imports", "in_kernel", "running", "so_far", "start", "wait"]

LOG = logging.getLogger("meta_widget.warm")

_lock = threading.Lock()
#: held while the package's own modules are imported: by the warm-up, and by ``meta_widget``'s
#: lazy names (``mw.Analysis``), so that two threads never import them in opposite orders
imports = threading.RLock()
_thread: threading.Thread | None = None
_done = threading.Event()
#: how long the warm-up took, once done (seconds); None before
seconds: float | None = None
#: when the warm-up started (``time.perf_counter()``); None before
started: float | None = None


def _forked() -> None:
    """In a child forked while a warm-up ran (multiprocessing's default start method on Linux):
    no warm-up thread runs there, so nothing to wait for, and a lock no thread holds. (The
    parent's may have held both at the fork: the child waited forever.)"""
    global imports, _done
    imports = threading.RLock()
    if _thread is not None and not _done.is_set():
        _done = threading.Event()
        _done.set()


os.register_at_fork(after_in_child=_forked)


def start(job: Callable[[], object]) -> bool:
    """Run ``job`` once per process in a daemon thread; False when one already started."""
    global _thread, started
    with _lock:
        if _thread is not None:
            return False
        started = time.perf_counter()
        _thread = threading.Thread(
            target=_run, args=(job,), name="meta_widget-warm-up", daemon=True
        )
        _thread.start()
    return True


def _run(job: Callable[[], object]) -> None:
    global seconds
    try:
        job()
    except Exception:  # the warm-up is an optimization: the first analysis pays it instead
        LOG.warning(
            "meta_widget's warm-up failed; the first analysis loads PyTorch instead", exc_info=True
        )
    finally:
        seconds = so_far()  # from ``started``: the clock the widget counts from
        _done.set()


def running() -> bool:
    """A warm-up started and has not finished (False inside the warm-up itself)."""
    thread = _thread
    return thread is not None and not _done.is_set() and thread is not threading.current_thread()


def so_far() -> float:
    """Seconds since the warm-up started (0.0 when none did)."""
    return 0.0 if started is None else time.perf_counter() - started


def wait(on_wait: Callable[[], None] | None = None) -> float:
    """Wait for a running warm-up to finish (``on_wait`` is called first, only if it runs);
    the seconds waited."""
    if not running():
        return 0.0
    if on_wait is not None:
        on_wait()
    begun = time.perf_counter()
    _done.wait()
    return time.perf_counter() - begun


def in_kernel() -> bool:
    """Running in a Jupyter kernel (IPython with a kernel), without importing IPython."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return shell is not None and getattr(shell, "kernel", None) is not None
