"""Where ``plan``'s candidates are traced: this process, and a ``concurrent.futures.Executor``.

A trace is Python-bound and single-threaded, so a plan over many candidates spreads them over
processes through the standard interface of ``concurrent.futures``:

- by default (:func:`local_pool`) a ``ProcessPoolExecutor`` of ``workers - 1`` processes,
  started with ``spawn`` (a child never inherits torch's threads, as a fork would), while this
  process traces candidates too: the children's start-up (importing torch, ~5 s) costs no
  waiting;
- or the executor the caller gives: a ``dask.distributed`` client's
  (``client.get_executor()``), a Ray pool behind an adapter, anything with ``submit``. Every
  run of candidates is sent to it; this process gathers the numbers.

What travels is plain data: ``task``, a module-level function pickled by name and bound to
the job (the model's transformers config, the input size, the options, the GPU, the budget),
and a *run* of candidate keys (consecutive candidates of one layout: a process warms a layout
up once). What comes back is their numbers, never an analysis.

Workers change how fast, never what: a run whose future raises or is cancelled, or whose pool
breaks (a worker killed: ``BrokenProcessPool``), comes back to this process, which traces it
(and raises there what a single process would). When the plan ends, fails or is interrupted
(Ctrl-C), every future not finished is cancelled, and a pool of ours has its processes killed
and is shut down: nothing is left behind.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import warnings
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, BrokenExecutor, Executor, Future, wait
from concurrent.futures import ProcessPoolExecutor as ProcessPool
from contextlib import contextmanager
from typing import Any, TypeVar

import torch

__all__ = ["cores", "default_workers", "local_pool", "not_starting", "share"]

T = TypeVar("T")

#: below this many candidates a plan runs in this process alone (a child's start-up, ~5 s of
#: importing torch and transformers, would cost more than it saves)
MIN_CANDIDATES = 16
#: the modules a starting child runs the parent's script as (``multiprocessing.spawn``)
_MAINS = ("__mp_main__", "__main__")
#: at most this many processes by default
MAX_WORKERS = 8


def default_workers(candidates: int) -> int:
    """The processes ``plan`` uses by default (this one included): the cores this process may
    run on (at most ``MAX_WORKERS``), or 1 below ``MIN_CANDIDATES`` candidates."""
    if candidates < MIN_CANDIDATES:
        return 1
    return max(1, min(cores(), MAX_WORKERS, candidates))


def cores() -> int:
    """The cores this process may run on (its affinity; the machine's count off Linux)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def not_starting(error: type[Exception]) -> None:
    """Raise ``error`` where this process is a spawned child still importing the script that
    started its pool (Python's ``spawn`` runs that script's top level again in each child, as
    ``__mp_main__``): a plan there is the script's own call, unguarded. Left alone, each child
    traced the whole plan by itself before taking a run (2.5 times the plan's time, the
    parent's rows unchanged), as its own pool could not start (``multiprocessing`` refuses a
    process in that state, and ``share`` traces what no pool takes)."""
    if not getattr(multiprocessing.current_process(), "_inheriting", False):
        return
    script = next(
        (f for f in (getattr(sys.modules.get(m), "__file__", None) for m in _MAINS) if f),
        "the script",
    )
    raise error(
        f"plan: called while this process starts as a worker of a plan: Python's spawn start "
        f"method runs the top level of {script} again in each worker process, and with it "
        'this call. Put the script\'s work under `if __name__ == "__main__":` (as the '
        "multiprocessing docs ask of any script that starts processes), or pass workers=1. "
        "The plan in the first process goes on without this worker."
    )


@contextmanager
def local_pool(processes: int) -> Iterator[ProcessPool]:
    """A ``ProcessPoolExecutor`` of ``processes`` spawned children (each with one thread,
    warnings off and Ctrl-C left to this process), killed and shut down on exit, on any path."""
    pool = ProcessPool(
        processes, mp_context=multiprocessing.get_context("spawn"), initializer=_start_worker
    )
    try:
        yield pool
    finally:
        close_pool(pool)


def close_pool(pool: ProcessPool) -> None:
    """Kill ``pool``'s processes (a trace may run for minutes: waiting for it is no way to stop
    a plan) and shut it down: its futures cancelled, its processes and threads joined.

    ``ProcessPoolExecutor`` has no public way to kill its workers before Python 3.14
    (``kill_workers``); this reads its table of processes as that method does."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    for process in processes:
        if process.is_alive():
            process.kill()
    pool.shutdown(wait=True, cancel_futures=True)
    for process in processes:
        process.join()


def _start_worker() -> None:
    """A pool's child, before its first task: one thread for torch (the cores are the plan's
    processes'), warnings off, Ctrl-C ignored (it is the parent's to handle)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    warnings.simplefilter("ignore")
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


def share(
    runs: Sequence[Sequence[T]],
    here: Callable[[T], Any],
    task: Callable[[list[T]], list[Any]],
    executor: Executor | None,
    on_done: Callable[[T, Any, bool], None],
    *,
    helping: bool = True,
    window: int | None = None,
) -> None:
    """Run ``here(item)`` for every item of ``runs``, in this process or on ``executor``.

    A run submitted (``executor.submit(task, run)``) reaches ``on_done(item, result, True)``
    item by item, in the order runs finish; an item traced here reaches
    ``on_done(item, here(item), False)``. ``on_done`` is called in this thread only. With
    ``helping``, this process takes runs too (from the end, while the executor takes them from
    the start); ``window`` bounds the futures in flight (None: every run submitted at once).
    A run whose future raised or was cancelled, or that the executor would not take (broken,
    shut down), is traced here. On any exit (Ctrl-C included) the futures in flight are
    cancelled.
    """
    todo: deque[list[T]] = deque(list(run) for run in runs if run)
    mine: deque[T] = deque()  # the items this process traces next, in order
    pending: dict[Future[list[Any]], list[T]] = {}
    broken = executor is None
    try:
        while todo or mine or pending:
            while todo and not broken and (window is None or len(pending) < window):
                run = todo.popleft()
                try:
                    pending[executor.submit(task, run)] = run  # type: ignore[union-attr]
                except (BrokenExecutor, RuntimeError):  # broken or shut down: the rest here
                    todo.appendleft(run)
                    broken = True
            for future in [f for f in pending if f.done()]:
                _collect(future, pending.pop(future), mine, on_done)
            if not mine and todo and (helping or broken):
                mine.extend(todo.pop())
            if mine:
                item = mine.popleft()
                on_done(item, here(item), False)
            elif pending:
                wait(pending, return_when=FIRST_COMPLETED)
    finally:
        for future in pending:
            future.cancel()


def _collect(
    future: Future[list[Any]], run: list[T], mine: deque[T], on_done: Callable[[T, Any, bool], None]
) -> None:
    """Hand a finished future's results to ``on_done``; or, when it raised, was cancelled or
    answered for other items, put its run first among this process's items."""
    results: Any = None
    if not future.cancelled() and future.exception() is None:
        results = future.result()
    if not isinstance(results, list) or len(results) != len(run):
        mine.extendleft(reversed(run))  # traced here, where an error is raised as without workers
        return
    for item, result in zip(run, results, strict=True):
        on_done(item, result, True)
