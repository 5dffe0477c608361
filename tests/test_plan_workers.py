"""``mw.plan(workers=N)``: candidates traced in child processes beside this one give the numbers
one process gives; a child killed mid-plan hands its candidate back; Ctrl-C or a finished plan
leaves no process behind; the option is checked."""

from __future__ import annotations

import gc
import os
import signal
from typing import Any

import pytest
from torch.distributed.tensor._ops import utils as strategy_utils

import meta_widget as mw
from meta_widget.distributed import decisions
from meta_widget.explore import plan as plan_module
from meta_widget.explore import workers as workers_module
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
    # on the GPU: FSDP 4's ranks may fit (traced at full depth), FSDP 2 x TP 2's cannot (two
    # communicators' NCCL buffers: the per-layer rule's numbers stand)
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
    """This process's children that are plan workers."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{name}/cmdline", "rb") as f:
                command = f.read()
        except (OSError, ValueError, IndexError):
            continue
        if parent == os.getpid() and b"meta_widget.explore.workers" in command:
            found.append(int(name))
    return found


@pytest.fixture
def remote(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """The keys of the candidates a child traced, in the order their numbers arrived."""
    keys: list[tuple[Any, ...]] = []
    take = plan_module._take

    def watched(c: plan_module.Candidate, numbers: dict[str, Any], run: Any) -> None:
        keys.append(c.key)
        take(c, numbers, run)

    monkeypatch.setattr(plan_module, "_take", watched)
    return keys


@pytest.fixture(scope="module")
def alone() -> mw.Plan:
    """The plan in this process only: the truth the workers' plans are held to."""
    return mw.plan(llama(), SIZE, workers=1, **SPACE)


def same_plan(a: mw.Plan, b: mw.Plan) -> None:
    assert b.traces - a.traces in (0, 1)  # the child may meet the refused layout once too
    assert [c.key for c in a.candidates] == [c.key for c in b.candidates]
    for x, y in zip(a.candidates, b.candidates, strict=True):
        for name in plan_module._NUMBERS:
            assert getattr(x, name) == getattr(y, name), (x.key, name)
        assert x.openable == y.openable, x.key


def test_workers_give_the_numbers_of_one_process(
    alone: mw.Plan, remote: list[tuple[Any, ...]]
) -> None:
    assert sum(c.error is not None for c in alone.candidates) == 4  # the refused layout
    # FSDP 2 x TP 2's four, over the budget by their least bytes on the GPU, by the rule;
    # FSDP 4's, which may fit, traced at full depth (the caching allocator's reserve decides)
    assert sum(c.traced_layers == (2, 3, 4) for c in alone.candidates) == 4
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
    assert not decisions._shared and not hasattr(
        strategy_utils.expand_to_full_mesh_op_strategy, "_shared_from"
    )  # DTensor decides as before
    assert gc.get_freeze_count() == 0  # the heap the plan froze is the collector's again


def test_default_is_one_process_for_few_candidates(remote: list[tuple[Any, ...]]) -> None:
    few = dict(SPACE, layouts=[{"fsdp": 4}], precisions=["as given"])
    assert len(mw.plan(llama(), SIZE, **few).candidates) == 2
    assert remote == []


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


def test_a_child_traces_a_refused_layout_once() -> None:
    """A child refuses a layout's other candidates without tracing them, as this process does
    (a child that drew all four of the refused layout's candidates ran four traces: 28 for 25)."""
    job = dict(
        run=plan_module.trace_in_child,
        model=llama(),
        input_size=SIZE,
        input_data=None,
        mode="training",
        gpu=resolve_gpu("H100"),
        options={},
        layers=depth_of(llama()),
        budget=3 * 2**20,
    )
    first = plan_module.trace_in_child(job, (1, 1, 4, False, "as given", 1))
    again = plan_module.trace_in_child(job, (1, 1, 4, True, "param_dtype bf16", 1))
    assert first["runs"] == 1 and again["runs"] == 0
    assert first["error"] == again["error"] and "LayoutError" in str(again["error"])


def test_each_process_takes_a_run_of_consecutive_candidates() -> None:
    """A process takes the candidates of its own run in order (a layout's are consecutive: it
    warms each up once), then the last of the longest run left; every one is taken once, and
    one handed back is this process's next."""
    todo = workers_module._Todo(10, 2)
    assert [todo.take(1) for _ in range(3)] == [5, 6, 7]
    assert [todo.take(0) for _ in range(5)] == [0, 1, 2, 3, 4]
    todo.give_back(7)
    assert [todo.take(0) for _ in range(3)] == [7, 9, 8]
    assert todo.take(1) is None and todo.take(0) is None and not todo.left()
