"""``parallel=`` bounded before anything starts, and leaving nothing behind on any path.

Issue 23, items 2, 6 and 10 (tensor parallelism): a world size past any job, or one the model
cannot be split into, is the caller's mistake (``OptionError``) found before a process group is
made; whatever happens inside a parallel analysis, its fake process group is destroyed, the
exception hook ``torch.distributed`` installs (``[rank0]:`` lines) is taken down again, and
DTensor decides as it did before (``meta_widget.distributed.decisions``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from parallel_truth import DeepMLP, no_decision_kept

import meta_widget as mw

TESTS = Path(__file__).resolve().parents[1]
TP_PLAN = {"layers.*.0": "colwise", "layers.*.2": "rowwise"}


@pytest.fixture(autouse=True)
def _nothing_left() -> Iterator[None]:
    from torch.distributed.fsdp._fully_shard import _fsdp_common, _fsdp_param
    from torch.distributed.tensor._ops import utils

    hook, search = sys.excepthook, utils.expand_to_full_mesh_op_strategy
    assert not dist.is_initialized()
    yield
    assert not dist.is_initialized()
    assert sys.excepthook is hook
    # DTensor decides as it did, and no decision of a world is kept (decisions.world_ended)
    assert utils.expand_to_full_mesh_op_strategy is search and no_decision_kept()
    # FSDP2 cuts every chunk again (meta_widget.distributed.fsdp_chunks)
    assert _fsdp_param._chunk_with_empty is _fsdp_common._chunk_with_empty


def small_llama() -> Any:
    """A one-layer Llama config: 8 attention heads, 4 key/value heads."""
    import transformers

    return transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=8,
        num_key_value_heads=4,
        vocab_size=128,
    )


# -- item 2: huge world sizes ---------------------------------------------------------------

HUGE = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))  # a regression fails fast, here
import torch.distributed as dist
import meta_widget as mw
from parallel_truth import DeepMLP, no_decision_kept

hook = sys.excepthook
seen = []
for parallel in ({"fsdp": 10**9}, {"fsdp": 2**70}, {"fsdp": 2, "tp": 10**9}):
    built = []
    def make():
        built.append(1)
        return DeepMLP()
    try:
        mw.analyze(make, input_size=(8, 256), parallel=parallel)
        raised, message = None, ""
    except BaseException as exc:
        raised, message = type(exc).__name__, str(exc)
    seen.append(dict(raised=raised, message=message, built=len(built),
                     group_left=dist.is_initialized(), hook_kept=sys.excepthook is hook))
later = mw.analyze(DeepMLP, input_size=(8, 256), parallel={"fsdp": 2})
print(json.dumps(dict(seen=seen, later_error=None if later.error is None else str(later.error))))
"""


def test_a_world_of_a_billion_or_2_to_the_70_is_an_option_error_before_anything_is_built() -> None:
    run = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(HUGE)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=TESTS,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    found = json.loads(run.stdout.strip().splitlines()[-1])
    for case in found["seen"]:
        assert case["raised"] == "OptionError", case
        assert "more than 16384" in case["message"] and "\n" not in case["message"]
        assert case["built"] == 0, case  # checked before anything is built: no clock needed
        assert not case["group_left"] and case["hook_kept"], case
    assert found["later_error"] is None  # the process can still run parallel analyses


def test_degrees_are_checked_against_the_model_before_a_group_is_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[int] = []
    real_init = dist.init_process_group

    def init(*args: Any, **kwargs: Any) -> None:
        made.append(kwargs.get("world_size", -1))
        real_init(*args, **kwargs)

    monkeypatch.setattr(dist, "init_process_group", init)
    config = small_llama()
    ids = torch.randint(0, 128, (2, 16))
    # DeepMLP's largest parameter has 1024 rows: past that, FSDP2's extra ranks hold padding
    with pytest.raises(mw.OptionError, match=r"fsdp=2048 is more ranks than the 1024 rows"):
        mw.analyze(DeepMLP, input_size=(8, 256), parallel={"fsdp": 2048})
    with pytest.raises(mw.OptionError, match=r"tp=8 does not divide the 4 heads"):
        mw.analyze(config, input_data=ids, parallel={"tp": 8})
    with pytest.raises(mw.ParallelError, match="matches no module"):  # a plan path, up front
        mw.analyze(DeepMLP, input_size=(8, 256), parallel={"tp": 2, "tp_plan": {"x.*": "colwise"}})
    with pytest.raises(mw.OptionError, match="more than 16384"):
        mw.analyze(DeepMLP, input_size=(8, 256), parallel={"fsdp": 1024, "tp": 32})
    assert made == []  # every refusal came before a process group
    # what the messages allow runs
    a = mw.analyze(config, input_data=ids, parallel={"tp": 4})
    assert a.error is None, a.error
    assert made == [4]


# -- item 10: tensor parallelism that does not divide the heads ---------------------------------


def test_tp_that_does_not_divide_the_heads_says_so_not_fix_input_size() -> None:
    config = small_llama()
    with pytest.raises(mw.OptionError) as info:
        mw.analyze(config, input_data=torch.randint(0, 128, (2, 16)), parallel={"tp": 3})
    message = str(info.value)
    assert "tp=3 does not divide the 8 heads of LlamaModel" in message
    assert "num_attention_heads" in message and "tp=2" in message
    assert "input_size" not in message
    a = mw.analyze(config, input_data=torch.randint(0, 128, (2, 16)), parallel={"tp": 2})
    assert a.error is None, a.error


# -- items 2 and 6: nothing left behind, on every path ------------------------------------------


def test_excepthook_is_the_users_after_a_parallel_analysis() -> None:
    def mine(*args: Any) -> None:
        sys.__excepthook__(*args)

    before = sys.excepthook
    sys.excepthook = mine
    try:
        a = mw.analyze(DeepMLP, input_size=(8, 256), mode="training", parallel={"fsdp": 2})
        assert a.error is None
        assert sys.excepthook is mine
        a = mw.analyze(DeepMLP, input_size=(8, 256), parallel={"tp": 2, "tp_plan": TP_PLAN})
        assert a.error is None
        assert sys.excepthook is mine
    finally:
        sys.excepthook = before


class Fails(DeepMLP):
    """Fails in its forward pass, on one rank's shards."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("the model's own error")


@pytest.mark.parametrize("where", ["after init_process_group", "in init_device_mesh", "in wrap"])
def test_a_failure_inside_a_parallel_analysis_destroys_its_group(
    monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    import meta_widget.distributed.parallel as parallel

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise MemoryError(f"injected {where}")

    if where == "after init_process_group":  # how world size 10**9 failed: the group was kept
        real_init = dist.init_process_group

        def init(*args: Any, **kwargs: Any) -> None:
            real_init(*args, **kwargs)
            raise MemoryError(f"injected {where}")

        monkeypatch.setattr(dist, "init_process_group", init)
    elif where == "in init_device_mesh":  # the layout builds the mesh (mw.Parallel.mesh)
        monkeypatch.setattr(mw.Parallel, "mesh", broken)
    else:
        monkeypatch.setattr(parallel, "fully_shard", broken)
    with pytest.raises(MemoryError, match="injected"):
        mw.analyze(DeepMLP, input_size=(8, 256), parallel={"fsdp": 2})
    # (the fixture checks: no process group, the exception hook as it was)


def test_a_model_error_and_an_interrupt_inside_a_parallel_trace_leave_nothing() -> None:
    a = mw.analyze(Fails(), input_size=(8, 256), mode="training", parallel={"fsdp": 2})
    assert a.error is not None and "the model's own error" in a.error.message

    class Interrupted(DeepMLP):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        mw.analyze(Interrupted(), input_size=(8, 256), parallel={"fsdp": 2})


def test_an_interrupt_in_the_optimizers_step_on_the_shards_leaves_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ctrl-C inside a multi-tensor op run on the shards (``trace.shard_foreach``, a function
    mode pushed for the optimizer step): the mode is off again, grad mode and the device as
    they were, no process group (the fixture), and the next analysis is as one made before."""
    from meta_widget.trace import shard_foreach

    options: dict[str, Any] = {
        "input_size": (8, 256),
        "mode": "training",
        "gpu": "H100",  # CUDA's multi-tensor AdamW
        "parallel": {"fsdp": 2},
    }
    before = mw.analyze(DeepMLP(), **options)
    modes, grad = torch._C._len_torch_function_stack(), torch.is_grad_enabled()

    def interrupted(*args: Any) -> Any:
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(shard_foreach, "_run_on_shards", interrupted)
        with pytest.raises(KeyboardInterrupt):
            mw.analyze(DeepMLP(), **options)
    assert torch._C._len_torch_function_stack() == modes
    assert torch.is_grad_enabled() == grad
    assert torch.empty(1).device.type == "cpu"
    after = mw.analyze(DeepMLP(), **options)
    assert after.error is None and after.peak_bytes == before.peak_bytes
