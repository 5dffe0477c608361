"""``mw.plan(workers=N)`` and ``mw.plan(executor=...)``: candidates traced in the children of a
local ``ProcessPoolExecutor`` beside this process, or on an executor given, give the numbers one
process gives; a child killed mid-plan hands its candidates back; Ctrl-C or a finished plan
leaves no process and no future behind; the options are checked."""

from __future__ import annotations

import functools
import gc
import operator
import os
import signal
import subprocess
import sys
import textwrap
import threading
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

import pandas as pd
import pytest
from parallel_truth import (
    no_decision_kept,
    no_process_group_left,  # noqa: F401  (an autouse fixture)
)

import meta_widget as mw
from meta_widget.distributed import decisions
from meta_widget.explore import plan as plan_module
from meta_widget.explore import plan_trace
from meta_widget.explore import workers as workers_module
from meta_widget.explore.candidates import Layout, Space
from meta_widget.explore.depth import depth_of
from meta_widget.timing.gpus import resolve_gpu

transformers = pytest.importorskip("transformers")

#: 2 layouts that trace and one that is refused (tp=4 past the 2 key/value heads) x
#: checkpointing x 2 precisions = 12 candidates
SPACE: dict[str, Any] = dict(
    gpu="H100",
    devices=4,
    layouts=[{"fsdp": 4}, {"fsdp": 2, "tp": 2}, {"tp": 4}],
    precisions=["as given", "param_dtype bf16"],
    micro_batches=[1],
    # on the GPU: FSDP 4's ranks fit, FSDP 2 x TP 2's do not (two communicators' NCCL
    # buffers)
    budget="700MiB",
)
SIZE = (2, 32)


def llama() -> Any:
    return transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=9,
        num_attention_heads=4,
        num_key_value_heads=2,
    )


def children() -> list[int]:
    """This process's children that a plan's pool could have started (processes spawned by
    ``multiprocessing``, and any child ended but not reaped), but for the standard library's
    resource tracker (one per Python program, started by the first spawned pool's queues; it
    ends with the program). Others are the suite's own: Playwright's driver, a cluster's
    process; they are neither counted nor killed here."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{name}/cmdline", "rb") as f:
                command = f.read()
        except (OSError, ValueError, IndexError):
            continue
        zombie = fields[0] == "Z"  # ended but not reaped: still left behind
        spawned = b"multiprocessing" in command and b"resource_tracker" not in command
        if int(fields[1]) == os.getpid() and (zombie or spawned):
            found.append(int(name))
    return found


@pytest.fixture(scope="module")
def alone() -> mw.Plan:
    """The plan in this process only: the truth the workers' plans are held to."""
    return mw.plan(llama(), SIZE, workers=1, **SPACE)


def assert_same_rows(p: mw.Plan, local: mw.Plan) -> None:
    """``p``'s table is ``local``'s, cell for cell; where not, the failure names each cell
    that differs (candidate, column, the two values: a table's repr shows neither)."""
    a, b = local.to_dataframe(), p.to_dataframe()
    assert list(a.columns) == list(b.columns) and len(a) == len(b)
    cells = []
    for i, (x, y) in enumerate(zip(a.to_dict("records"), b.to_dict("records"), strict=True)):
        cells += [
            f"{local.candidates[i].key} {column}: here {x[column]!r}, there {y[column]!r}"
            for column in a.columns
            if not a[[column]].iloc[[i]].equals(b[[column]].iloc[[i]])
        ]
    assert not cells, "the plans differ:\n" + "\n".join(cells)


def same_plan(a: mw.Plan, b: mw.Plan) -> None:
    """``b`` is ``a`` row for row (``assert_same_rows``), with the same traces and the same
    candidates openable."""
    assert b.traces == a.traces  # the refused layout is found before any trace: in no worker
    assert_same_rows(b, a)
    assert [c.openable for c in a.candidates] == [c.openable for c in b.candidates]


def test_workers_give_the_numbers_of_one_process(
    alone: mw.Plan, remote: list[tuple[Any, ...]]
) -> None:
    assert sum(c.error is not None for c in alone.candidates) == 4  # the refused layout
    # all eight by the rule, the caching allocator's reserve replayed over the steps it builds
    # (FSDP 4 with checkpointing, as given, too: its steps follow the rule since the traces are
    # diffed a phase run at a time, ``depth._chunks``); six with the 2-layer trace too, for a
    # free outside the layers' runs
    assert sum(c.traced_layers in ((3, 4), (2, 3, 4)) for c in alone.candidates) == 8
    assert sum(c.traced_layers == (2, 3, 4) for c in alone.candidates) == 6
    assert [c.fits for c in alone.candidates if c.error is None] == [True] * 4 + [False] * 4
    p = mw.plan(llama(), SIZE, workers=2, **SPACE)
    assert remote, "no candidate was traced by the child"
    same_plan(alone, p)
    assert p.best.key == alone.best.key
    opened = next(c for c in p.candidates if c.key in remote and c.error is None)
    assert opened.analysis is not None  # traced here at full depth when asked for
    truth = next(c for c in alone.candidates if c.key == opened.key)
    assert truth.analysis is not None and opened.analysis.peak_bytes == truth.peak_bytes
    assert children() == []


def test_a_child_killed_mid_plan_hands_its_candidates_back(
    alone: mw.Plan, remote: list[tuple[Any, ...]]
) -> None:
    killed: list[int] = []

    def kill_after_first_result(done: int, total: int, text: str) -> None:
        if remote and not killed:
            killed.extend(children())
            for pid in killed:
                os.kill(pid, signal.SIGKILL)

    p = mw.plan(llama(), SIZE, workers=2, progress=kill_after_first_result, **SPACE)
    assert killed, "the child sent no result before the plan ended"
    same_plan(alone, p)
    assert children() == []


def test_ctrl_c_leaves_no_process_behind(remote: list[tuple[Any, ...]]) -> None:
    def interrupt(done: int, total: int, text: str) -> None:
        if remote:  # the child is running: it has sent a result
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        mw.plan(llama(), SIZE, workers=2, progress=interrupt, **SPACE)
    assert remote and children() == []
    assert decisions._kept.blocks == []  # no sharding decision is kept past the plan
    assert no_decision_kept()
    assert gc.get_freeze_count() == 0  # the heap the plan froze is the collector's again


def test_default_is_one_process_for_few_candidates(remote: list[tuple[Any, ...]]) -> None:
    few = dict(SPACE, layouts=[{"fsdp": 4}], precisions=["as given"])
    assert len(mw.plan(llama(), SIZE, **few).candidates) == 2
    assert remote == []


def test_a_script_without_a_main_guard_is_planned_once(tmp_path: Any) -> None:
    """Spawn runs the script that started a pool again in each child as it starts (its top
    level, as ``__mp_main__``): there the script's own ``plan`` is refused, saying what to do,
    where the child traced the whole plan by itself before taking a run; the script's plan
    goes on in its own process, with the rows of one process."""
    few = dict(SPACE, layouts=[{"fsdp": 4}], precisions=["as given"])
    script = tmp_path / "unguarded.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import transformers
            import meta_widget as mw

            config = transformers.LlamaConfig(**{llama().to_diff_dict()!r})
            p = mw.plan(config, {SIZE!r}, workers=2, **{few!r})
            print(p.traces, [c.peak_bytes for c in p.candidates])
            """
        )
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, check=True
    )
    alone = mw.plan(llama(), SIZE, workers=1, **few)
    assert (
        done.stdout.split("\n")[-2] == f"{alone.traces} {[c.peak_bytes for c in alone.candidates]}"
    )
    refused = "PlanError: plan: called while this process starts as a worker of a plan"
    assert done.stderr.count(refused) == 1, done.stderr
    assert f"top level of {script} again" in done.stderr
    assert 'under `if __name__ == "__main__":`' in done.stderr


@pytest.mark.parametrize("workers", [0, -1, True, "2", 1.5])
def test_workers_must_be_a_whole_number(workers: Any) -> None:
    with pytest.raises(mw.OptionError, match="workers must be a whole number"):
        mw.plan(llama(), SIZE, workers=workers, **SPACE)


def test_workers_need_a_config_and_no_input_data() -> None:
    import torch

    with pytest.raises(mw.OptionError, match="not a transformers config"):
        mw.plan(torch.nn.Linear(4, 4), (2, 4), workers=2, gpu="H100", devices=2)
    with pytest.raises(mw.OptionError, match="input_data is given"):
        mw.plan(
            llama(),
            input_data=torch.zeros(2, 32, dtype=torch.long, device="meta"),
            workers=2,
            **SPACE,
        )


def test_a_worker_traces_a_refused_layout_once_a_run() -> None:
    """A worker refuses the rest of a layout's run without tracing it, as this process does
    (a worker that traced each of the refused layout's candidates ran four traces for one)."""
    job = plan_trace.Job(
        llama(), SIZE, None, "training", resolve_gpu("H100"), {}, depth_of(llama()), 3 * 2**20
    )
    tp4 = Layout(tp=4)
    keys = [(tp4, False, "as given", 1, None), (tp4, True, "param_dtype bf16", 1, None)]
    first, again = plan_trace.trace_run(job, keys)
    assert first["runs"] == 1 and again["runs"] == 0
    assert first["error"] == again["error"] and "LayoutError" in str(again["error"])


def test_a_thread_holding_every_frame_moves_no_free() -> None:
    """A Dask worker's profile holds every thread's frames for a moment
    (``sys._current_frames``): a function of a trace that returned meanwhile kept its tensors
    alive, moving their frees, and the rule failed or a number moved at random. A worker's run
    gives the same numbers beside a thread that holds them for 10 ms at a time (without
    ``plan_trace.unpreempted``, each of these traces differed), and the switch interval is
    the program's again after."""
    job = plan_trace.Job(
        llama(), SIZE, None, "training", resolve_gpu("H100"), {}, depth_of(llama()), 2**40
    )
    keys = [(Layout(fsdp=4), c, "param_dtype bf16", 1, None) for c in (False, True)]
    alone = plan_trace.trace_run(job, keys)
    interval = sys.getswitchinterval()
    done, held = threading.Event(), []

    def hold_every_frame() -> None:
        while not done.is_set():
            frames = sys._current_frames()
            held.append(len(frames))
            sum(range(300_000))  # ~10 ms holding them, as a profile's walk of a deep stack
            del frames
            # then lets go for 20 ms: with the trace unpreempted it runs only while the holder
            # waits, and at 0.2 ms it got about one op a hold (a test of ten minutes)
            done.wait(0.02)

    holder = threading.Thread(target=hold_every_frame)
    holder.start()
    try:
        beside = plan_trace.trace_run(job, keys)
    finally:
        done.set()
        holder.join()
    assert held, "the other thread never ran"
    assert [a["traced_layers"] for a in alone] == [(2, 3, 4), (3, 4)]
    assert beside == alone
    assert sys.getswitchinterval() == interval


def test_runs_are_consecutive_candidates_of_one_layout() -> None:
    """A worker takes a run whole: candidates of one layout (it warms the layout up once), at
    most the size asked where that splits no group of candidates that hold the same state
    (``HELD_AS``: one of them over the budget prunes the rest); every candidate in one run."""
    todo = Space.checked(
        4, "training", resolve_gpu("H100"), SPACE["layouts"], None, SPACE["precisions"], [1]
    ).candidates()
    for size, lengths in ((3, [2] * 6), (1, [2] * 6), (4, [4] * 3)):
        runs = plan_module._runs(todo, size)
        assert [len(r) for r in runs] == lengths
        assert sorted(map(repr, (k for r in runs for k in r))) == sorted(repr(c.key) for c in todo)
        assert all(len({k[0] for k in r}) == 1 for r in runs)
    (as_given, bf16, *_) = plan_module._runs(todo, 3)
    assert {k[2] for k in as_given} == {"as given"} and {k[2] for k in bf16} == {"param_dtype bf16"}
    # the longest runs first, the plan's order among runs as long: with autocast, which holds
    # what the precision as given holds, each layout's first group is twice its second
    todo = Space.checked(
        4, "training", resolve_gpu("H100"), SPACE["layouts"], None, None, [1]
    ).candidates()
    runs = plan_module._runs(todo, 1)
    assert [len(r) for r in runs] == [4] * 3 + [2] * 3
    assert [r[0][0] for r in runs] == [todo[0].layout, todo[6].layout, todo[12].layout] * 2


def test_pruned_rows_are_the_same_whatever_the_executors_width() -> None:
    """The candidates pruned by what one of their group holds (``plan_trace.Learned``) give the
    same rows in one process and on an executor that takes runs of one candidate each (8
    threads): a group is never split, so its first candidate is the one traced either way."""
    # between what FSDP 4 holds in state and CUDA context in bf16 (581.6 MB) and in fp32 (582.3)
    budget = 582 * 10**6
    space = {**SPACE, "layouts": [{"fsdp": 4}], "precisions": None, "budget": budget}
    alone = mw.plan(llama(), SIZE, workers=1, **space)
    with ThreadPoolExecutor(8) as wide:
        spread = mw.plan(llama(), SIZE, executor=wide, **space)
    rows = alone.to_dataframe()
    assert list(rows["traced_layers"]) == ["3", "none", "2, 3, 4", "none", "none", "3, 4"]
    pd.testing.assert_frame_equal(rows, spread.to_dataframe())
    assert alone.traces == spread.traces == 1 + 3 + 2


def test_a_run_whose_future_raised_is_traced_here() -> None:
    """A run the pool's child raised on (here a TypeError: truediv of a string) comes back and
    is traced here, item by item; nothing is dropped (a dropped item waits forever: the wait
    is bounded, and a hang fails the test instead)."""
    done: dict[int, Any] = {}

    def on_done(item: int, result: Any, remote: bool) -> None:
        assert not remote  # nothing a child raised on comes back as its result
        done[item] = result

    def work() -> None:
        with workers_module.local_pool(1) as pool:
            task = functools.partial(operator.truediv, "not a number")
            runs = [list(range(k, k + 5)) for k in range(0, 60, 5)]
            workers_module.share(runs, lambda i: i * 10, task, pool, on_done, helping=False)

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    thread.join(timeout=300)
    assert not thread.is_alive(), f"share never returned; items done: {sorted(done)}"
    assert done == {i: i * 10 for i in range(60)}
    assert children() == []


def test_a_worker_gets_its_next_run_while_this_process_traces() -> None:
    """With a window of one run, a worker is sent its next run the moment its last one ends
    (a done-callback), not when this thread is next free: here this thread's one item waits
    until the worker has finished the three other runs, which it could not do if the next
    run waited for this thread (the wait is bounded: a hang fails the test instead). Before,
    this thread submitted between its own traces, so a worker waited up to a trace for its
    next run, or held a second run queued behind its own that this process, idle at the end
    of a plan, could not take. Both take the first run left: the worker the first, this thread
    the second or the third (the worker's callback may take the second first)."""
    there: list[int] = []
    three = threading.Event()
    done: dict[int, bool] = {}

    def task(run: list[int]) -> list[int]:
        there.extend(run)
        if len(there) == 3:
            three.set()
        return run

    def here(item: int) -> int:
        assert three.wait(timeout=60), f"the worker ran {there} while this thread waited"
        return item

    def on_done(item: int, result: int, remote: bool) -> None:
        assert result == item
        done[item] = remote

    with ThreadPoolExecutor(1) as pool:
        workers_module.share([[1], [2], [3], [4]], here, task, pool, on_done, window=1)
    (mine,) = [item for item, remote in done.items() if not remote]
    assert there[0] == 1 and there == sorted(there)  # each the first run left when taken
    assert sorted([*there, mine]) == [1, 2, 3, 4] and mine in (2, 3)


def test_an_executor_given_gives_the_same_plan_and_stays_open(
    alone: mw.Plan, remote: list[tuple[Any, ...]]
) -> None:
    """A ``ProcessPoolExecutor`` of the caller's: every candidate traced there, the plan of one
    process, and the executor still the caller's to use (plan does not shut it down)."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(2, mp_context=context) as executor:
        p = mw.plan(llama(), SIZE, executor=executor, **SPACE)
        assert executor.submit(operator.add, 1, 2).result() == 3
    # every candidate traced there, but the refused layout's 4, found before any trace
    assert len(remote) == len(p.candidates) - 4
    same_plan(alone, p)
    assert children() == []


def test_executor_is_checked() -> None:
    with pytest.raises(mw.OptionError, match="not both"):
        mw.plan(llama(), SIZE, workers=2, executor=ThreadPoolExecutor(1), **SPACE)
    with pytest.raises(mw.OptionTypeError, match=r"concurrent\.futures\.Executor"):
        mw.plan(llama(), SIZE, executor=object(), **SPACE)
    import torch

    with pytest.raises(mw.OptionError, match="executor= cannot be used: model is not"):
        mw.plan(torch.nn.Linear(4, 4), (2, 4), executor=ThreadPoolExecutor(1), gpu="H100")
