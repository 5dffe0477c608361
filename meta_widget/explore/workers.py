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
and a *run* of candidate keys (consecutive candidates of one layout, which a process warms up
once: with a local pool, one group of them, those that hold the same state). A child is sent
its next run the moment its last one ends. What comes back is their numbers, never an
analysis.

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
import threading
import warnings
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, BrokenExecutor, Executor, Future, wait
from concurrent.futures import ProcessPoolExecutor as ProcessPool
from contextlib import contextmanager
from typing import Any, Generic, TypeVar

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
    ``helping``, this process takes runs too, in the same order as the executor: the first one
    left (so with the dearest runs first, the last to end anywhere are the cheapest: the wait
    at the end is short); ``window`` bounds the runs in flight (None: every run submitted at
    once), and the next run is submitted the moment one finishes (:class:`_Feed`), not when
    this thread is next free. A run whose future raised or was cancelled, or that the
    executor would not take (broken, shut down), is traced here. On any exit (Ctrl-C
    included) nothing more is submitted and the futures in flight are cancelled.
    """
    feed = _Feed([list(run) for run in runs if run], task, executor, window)
    mine: deque[T] = deque()  # the items this process traces next, in order
    try:
        feed()
        while True:
            for future, run in feed.finished():
                _collect(future, run, mine, on_done)
            if not mine and (helping or feed.broken):
                mine.extend(feed.first())
            if mine:
                item = mine.popleft()
                on_done(item, here(item), False)
            elif not feed.wait():
                break
    finally:
        feed.close()


class _Feed(Generic[T]):
    """The runs not yet taken and the futures of those submitted, shared by the thread of
    :func:`share` and the futures' done-callbacks (both take the first run left; a callback
    submits it as soon as a run ends: a worker never waits for a trace of
    this process to end first, nor holds a run queued behind its own that this process,
    once idle, could have taken: up to two runs' wait at a plan's end)."""

    def __init__(
        self,
        runs: list[list[T]],
        task: Callable[[list[T]], list[Any]],
        executor: Executor | None,
        window: int | None,
    ) -> None:
        self.todo: deque[list[T]] = deque(runs)
        self.pending: dict[Future[list[Any]], list[T]] = {}
        self.task, self.executor, self.window = task, executor, window
        self.broken = executor is None
        self.closed = False
        self.running = 0
        self.lock = threading.RLock()  # a future done already calls back in this thread

    def __call__(self, ended: Future[list[Any]] | None = None) -> None:
        """Submit runs from the start while fewer than ``window`` run (``ended``: a future
        that finished, when called back)."""
        with self.lock:
            if ended is not None:
                self.running -= 1
            while self.todo and not (self.broken or self.closed):
                if self.window is not None and self.running >= self.window:
                    return
                run = self.todo[0]  # taken once submitted: any error leaves it to be traced
                try:
                    future = self.executor.submit(self.task, run)  # type: ignore[union-attr]
                except (BrokenExecutor, RuntimeError):  # broken or shut down: the rest here
                    self.broken = True
                    return
                self.todo.popleft()
                self.pending[future] = run
                self.running += 1
                if self.window is not None:
                    future.add_done_callback(self)

    def finished(self) -> list[tuple[Future[list[Any]], list[T]]]:
        """The futures done, with their runs, taken out of ``pending``."""
        with self.lock:
            done = [f for f in self.pending if f.done()]
            return [(f, self.pending.pop(f)) for f in done]

    def first(self) -> list[T]:
        """The first run not yet taken, for this process (none left: empty)."""
        with self.lock:
            return self.todo.popleft() if self.todo else []

    def wait(self) -> bool:
        """Wait for a future to finish; False when nothing is left anywhere."""
        with self.lock:
            if not (self.pending or self.todo):
                return False
            pending = list(self.pending)
        if pending:
            wait(pending, return_when=FIRST_COMPLETED)
        return True

    def close(self) -> None:
        """Submit nothing more; cancel the futures in flight."""
        with self.lock:
            self.closed = True
            pending = list(self.pending)
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
