"""``mw.plan(executor=...)`` on a real ``dask.distributed.LocalCluster`` (two worker processes,
started here): the plan of ``docs/explore.md``'s snippet, run against it, is the plan of the
default local pool row for row; a worker killed mid-plan and Ctrl-C mid-plan leave nothing
behind (no process once the cluster is closed, no task the scheduler still runs, no process
group)."""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from parallel_truth import no_process_group_left  # noqa: F401  (an autouse fixture)
from test_plan_workers import SIZE, SPACE, assert_same_rows, children, llama

import meta_widget as mw

distributed = pytest.importorskip("distributed")

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "explore.md"
#: the snippet of docs/explore.md this file runs (the block after this marker)
MARKER = "<!-- run by tests/test_plan_cluster.py -->"


#: the cluster, started in a process of its own session (its workers in its process group):
#: it prints its scheduler's address and runs until its standard input closes
CLUSTER = """
import sys
import distributed
with distributed.LocalCluster(
    n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None
) as cluster:
    print(cluster.scheduler_address, flush=True)
    sys.stdin.read()
"""

#: Dask's sampling profiler every millisecond, not every 10: a trace that it could disturb (a
#: frame it holds keeps a returned function's tensors alive, moving their frees) would fail the
#: per-layer rule in most runs, not in one of four (plan_trace.trace_run says why none does)
PROFILE_OFTEN = {"DASK_DISTRIBUTED__WORKER__PROFILE__INTERVAL": "1ms"}


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    """A client of a local cluster of two worker processes, one thread each, started in a
    session of its own; closed after, and then no process of it is left."""
    cluster = subprocess.Popen(
        [sys.executable, "-c", CLUSTER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, **PROFILE_OFTEN},
        text=True,
        start_new_session=True,
    )
    try:
        assert cluster.stdout is not None and cluster.stdin is not None
        address = cluster.stdout.readline().strip()  # once the cluster is up (a state)
        assert address.startswith("tcp://"), f"the cluster did not start ({cluster.poll()=})"
        with distributed.Client(address) as client:
            yield client
        cluster.stdin.close()  # the cluster closes, its workers end
        cluster.wait(timeout=300)  # bounded only so that a hung cluster cannot hang the suite
        left = group_left(cluster.pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(cluster.pid, signal.SIGKILL)  # nothing of it outlives the module
        cluster.wait()
    assert not left, f"processes left after the cluster closed: {left}"


def group_left(group: int) -> list[str]:
    """The processes of process group ``group`` once they have ended, or those still there
    after a bound (a worker's nanny ends it after the cluster closes, and a trace it was
    running when its task was cancelled runs to its end first: two minutes at most)."""
    import psutil

    for _ in range(600):
        members = [p for p in psutil.process_iter(["pid"]) if _group(p.pid) == group]
        if not members:
            return []
        psutil.wait_procs(members, 0.2)
    return describe([p.pid for p in members])


def _group(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def describe(pids: list[int]) -> list[str]:
    """Each process as ``pid state command`` (what a failure needs to say which one was left)."""
    out = []
    for pid in pids:
        try:
            state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            command = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\\0", b" ")
            out.append(f"{pid} {state} {command.decode(errors='replace')[:300]}")
        except OSError:
            out.append(f"{pid} (gone)")
    return out


@pytest.fixture(scope="module")
def local() -> mw.Plan:
    """The plan on the default executor: this process and a local pool's child."""
    return mw.plan(llama(), SIZE, workers=2, **SPACE)


def snippet() -> str:
    """The Dask snippet of docs/explore.md."""
    text = DOC.read_text(encoding="utf-8")
    assert MARKER in text, f"{DOC.name} lost its Dask snippet (the block after {MARKER})"
    block = re.search(r"```python\n(.*?)```", text.split(MARKER, 1)[1], re.S)
    assert block is not None
    return block.group(1)


def run_snippet(address: str) -> mw.Plan:
    """The snippet as written, its scheduler's address made ``address``: its own ``Client``,
    its ``client.get_executor()`` handed to the real ``mw.plan``, whose other arguments are
    this file's (``SPACE``: the documented 120 candidates of an 8-GPU 4k-token plan would take
    this machine many minutes)."""
    code = snippet()
    assert 'Client("tcp://' in code and "executor=client.get_executor()" in code
    code = re.sub(r'Client\("tcp://[^"]+"\)', f"Client({address!r})", code)
    plans: list[mw.Plan] = []

    def plan(*args: Any, executor: Any, **kwargs: Any) -> mw.Plan:
        assert isinstance(executor, distributed.cfexecutor.ClientExecutor)
        plans.append(mw.plan(llama(), SIZE, executor=executor, **SPACE))
        return plans[-1]

    code = code.replace("import meta_widget as mw\n", "")
    exec(compile(code, str(DOC), "exec"), {"config": llama(), "mw": SimpleNamespace(plan=plan)})
    assert len(plans) == 1, "the snippet makes one plan"
    return plans[0]


def test_the_docs_snippet_on_a_local_cluster_gives_the_default_plan(
    client: Any, local: mw.Plan, remote: list[tuple[Any, ...]]
) -> None:
    p = run_snippet(client.scheduler.address)
    # every candidate traced there, but the refused layout's 4, found before any trace
    assert len(remote) == len(p.candidates) - 4
    assert_same_rows(p, local)
    assert p.best.key == local.best.key and p.title == local.title
    opened = next(c for c in p.candidates if c.openable)  # traced here when asked for
    assert opened.analysis is not None and opened.analysis.peak_bytes == opened.peak_bytes


def test_a_worker_killed_mid_plan_changes_nothing(
    client: Any, local: mw.Plan, remote: list[tuple[Any, ...]]
) -> None:
    pids = sorted(client.run(os.getpid).values())
    killed: list[int] = []

    def kill_a_worker(done: int, total: int, text: str) -> None:
        if remote and not killed:  # a worker has answered: the other may be mid-run
            killed.append(pids[-1])
            os.kill(pids[-1], signal.SIGKILL)

    p = mw.plan(llama(), SIZE, executor=client.get_executor(), progress=kill_a_worker, **SPACE)
    assert killed, "no worker answered before the plan ended"
    assert_same_rows(p, local)
    assert children() == []  # the plan started no process: the cluster traced
    client.wait_for_workers(2)  # the nanny restarts it: the cluster is whole again


def test_ctrl_c_mid_plan_cancels_every_task(client: Any, remote: list[tuple[Any, ...]]) -> None:
    def interrupt(done: int, total: int, text: str) -> None:
        if remote:  # a worker has answered: others are in flight
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        mw.plan(llama(), SIZE, executor=client.get_executor(), progress=interrupt, **SPACE)
    assert remote
    # the scheduler forgets every task of the plan (a state waited for, not a time)
    client.sync(_no_task_left, client)
    assert all(f.cancelled() or f.done() for f in client.futures.values())
    assert children() == []


async def _no_task_left(client: Any) -> None:
    """Return once the scheduler runs and holds no task of this client (bounded: 120 s)."""
    import asyncio

    async def wait() -> None:
        while True:
            processing = await client.scheduler.processing()
            if not any(processing.values()):
                return
            await asyncio.sleep(0.05)

    await asyncio.wait_for(wait(), timeout=120)
