"""Other processes that trace ``plan``'s candidates beside this one (``plan(workers=N)``).

A trace is Python-bound and single-threaded, so a plan over many candidates uses the other
cores through processes: this process traces candidates itself while ``N - 1`` children, each
``python -m meta_widget.explore.workers``, trace others. A child is sent the job once (the
function that traces a candidate, pickled by name, the model, which must be a transformers
config, the options, and the context its candidates all run in, ``job["session"]``) and then
one candidate at a time; it sends back the candidate's numbers, never an analysis (the
candidate's ``analysis`` is traced here when first asked for).
Children start while this process traces, so their start-up (importing torch) costs no waiting.

Nothing is left behind: the children are killed when the plan returns, fails or is interrupted
(Ctrl-C included), and a child whose parent dies reads the end of its input and exits. A child
that cannot take the job (a config class it cannot import) or that dies mid-candidate hands its
candidates back to this process, which traces them: workers change how fast, never what.
"""

from __future__ import annotations

import os
import pickle
import queue
import signal
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import IO, Any, TypeVar

__all__ = ["cores", "default_workers", "share"]

T = TypeVar("T")
R = TypeVar("R")

#: below this many candidates a plan runs in this process alone (a child's start-up, ~5 s of
#: importing torch and transformers, would cost more than it saves)
MIN_CANDIDATES = 16
#: at most this many processes by default
MAX_WORKERS = 8


def default_workers(candidates: int) -> int:
    """The processes ``plan`` uses by default: the cores this process may run on (at most
    ``MAX_WORKERS``), or 1 below ``MIN_CANDIDATES`` candidates."""
    if candidates < MIN_CANDIDATES:
        return 1
    return max(1, min(cores(), MAX_WORKERS, candidates))


def cores() -> int:
    """The cores this process may run on (its affinity; the machine's count off Linux)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def share(
    items: Sequence[T],
    here: Callable[[T], R],
    job: Any,
    workers: int,
    on_done: Callable[[int, R, bool], None],
) -> None:
    """Run ``here(item)`` for every item, in this process or in ``workers - 1`` children.

    A child runs ``job["run"](job, item)`` (a function pickled by name) and its result
    reaches ``on_done(index, result, True)``; an item traced here reaches
    ``on_done(index, here(item), False)``. ``on_done`` is called in this thread only, in the
    order items finish. An item whose child raised or died is traced here (so an error is
    raised here, as without workers). ``job`` must pickle; the caller checks that.
    """
    if workers <= 1:
        for i, item in enumerate(items):
            on_done(i, here(item), False)
        return
    todo = _Todo(len(items), workers)
    finished: queue.SimpleQueue[tuple[int, Any, bool]] = queue.SimpleQueue()
    blob = pickle.dumps((list(sys.path), pickle.dumps(job)))
    children = [_Child(blob, items, todo, finished, run) for run in range(1, workers)]
    try:
        for child in children:
            child.start()
        left = len(items)
        while left:
            try:  # results of the children first, then one item here
                while True:
                    left -= _deliver(finished.get_nowait(), on_done)
            except queue.Empty:
                pass
            if not left:
                break
            mine = todo.take(0)
            if mine is None:  # the children hold the rest: wait for one to finish
                left -= _deliver(_wait(finished, children, todo), on_done)
                continue
            on_done(mine, here(items[mine]), False)
            left -= 1
    finally:
        for child in children:
            child.stop()


class _Todo:
    """The items not taken yet, cut into one run of consecutive items per process.

    A process takes the next item of its own run, then (its run done) the last item of the
    longest run left. Consecutive items share what a process has warmed up (``plan``'s: a
    layout's sharding decisions and cached ops), which a process taking every other item
    would warm up again.
    """

    def __init__(self, items: int, runs: int) -> None:
        size = max(1, -(-items // runs))
        self.runs = [deque(range(k, min(items, k + size))) for k in range(0, items, size)]
        self.runs += [deque() for _ in range(runs - len(self.runs))]
        self.lock = threading.Lock()

    def take(self, run: int) -> int | None:
        """The next item for the process of ``run``; None when none is left."""
        with self.lock:
            if self.runs[run]:
                return self.runs[run].popleft()
            longest = max(self.runs, key=len)
            return longest.pop() if longest else None

    def give_back(self, item: int) -> None:
        """An item a child took and did not finish: this process (run 0) takes it next."""
        with self.lock:
            self.runs[0].appendleft(item)

    def left(self) -> bool:
        with self.lock:
            return any(self.runs)


def _deliver(done: tuple[int, Any, bool] | None, on_done: Callable[..., None]) -> int:
    if done is None:
        return 0
    on_done(*done)
    return 1


def _wait(
    finished: queue.SimpleQueue[tuple[int, Any, bool]],
    children: list[_Child],
    todo: _Todo,
) -> tuple[int, Any, bool] | None:
    """The next child's result; None when an item came back to trace here (a child died)."""
    while True:
        try:
            return finished.get(timeout=0.2)  # a short wait keeps Ctrl-C prompt
        except queue.Empty:
            if todo.left():
                return None


class _Child:
    """One child process and the thread that feeds it items and reads its results."""

    def __init__(
        self,
        blob: bytes,
        items: Sequence[Any],
        todo: _Todo,
        finished: queue.SimpleQueue[tuple[int, Any, bool]],
        run: int,
    ) -> None:
        self.blob, self.items, self.todo, self.finished = blob, items, todo, finished
        self.run = run  # its run of ``todo``
        self.process: subprocess.Popen[bytes] | None = None
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._feed, name="meta_widget plan", daemon=True)

    def start(self) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "meta_widget.explore.workers"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        self.thread.start()

    def stop(self) -> None:
        self.stopped.set()
        p = self.process
        if p is not None and p.poll() is None:
            p.kill()
        if p is not None:
            p.wait()
            for stream in (p.stdin, p.stdout):
                if stream is not None:
                    stream.close()
        if self.thread.is_alive():
            self.thread.join()

    def _feed(self) -> None:
        p = self.process
        assert p is not None and p.stdin is not None and p.stdout is not None
        i = None
        try:
            _send(p.stdin, self.blob)
            if not pickle.loads(_receive(p.stdout)):  # the child could not take the job
                return
            while not self.stopped.is_set():
                i = self.todo.take(self.run)
                if i is None:
                    return
                _send(p.stdin, pickle.dumps(self.items[i]))
                ok, result = pickle.loads(_receive(p.stdout))
                if not ok:  # it raised: traced here, where the error is raised as without workers
                    return
                self.finished.put((i, result, True))
                i = None
        except (OSError, EOFError, pickle.UnpicklingError):
            pass  # the child died or was stopped: its item goes back to the parent
        finally:
            if i is not None:
                self.todo.give_back(i)


def _send(stream: IO[bytes], blob: bytes) -> None:
    stream.write(len(blob).to_bytes(8, "little") + blob)
    stream.flush()


def _receive(stream: IO[bytes]) -> bytes:
    head = stream.read(8)
    if len(head) < 8:
        raise EOFError("the other process closed the pipe")
    size = int.from_bytes(head, "little")
    blob = stream.read(size)
    if len(blob) < size:
        raise EOFError("the other process closed the pipe")
    return blob


def _child_main() -> None:
    """A child: read the job, answer whether it can take it, then trace item after item until
    its input ends (the parent finished, stopped it or died)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # stray prints go to stderr, not into the results
    source = sys.stdin.buffer
    try:
        path, blob = pickle.loads(_receive(source))
        sys.path[:] = path
        job = pickle.loads(blob)  # imports what it names: the function, the config's class
        run = job["run"]
    except Exception:
        _send(out, pickle.dumps(False))
        return
    _send(out, pickle.dumps(True))
    with job.get("session", nullcontext)():  # what the job's items run in, all of them
        while True:
            try:
                item = pickle.loads(_receive(source))
            except EOFError:
                return
            try:
                blob = pickle.dumps((True, run(job, item)))
            except Exception:
                blob = pickle.dumps((False, None))
            _send(out, blob)


if __name__ == "__main__":
    _child_main()
