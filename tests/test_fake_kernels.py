"""FSDP2's copy-in and c10d's collectives run past the fake mode (``distributed.fake_kernels``):
no change.

Every layout must trace the same with the kernels and without them (the fake mode running each
op), event by event, cost by cost and collective by collective; each kernel must have run; and a
call the kernels are not written for (not on fake tensors, another signature) goes to the op.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch
from parallel_truth import (
    no_process_group_left,  # noqa: F401  (an autouse fixture)
    tiny_llama_config,
)
from test_fast_path import assert_same_parallel

import meta_widget as mw
from meta_widget.distributed import comms, fake_kernels


def both_ways(monkeypatch: pytest.MonkeyPatch, **kwargs: Any) -> tuple[mw.Analysis, Counter[str]]:
    ran: Counter[str] = Counter()
    made = fake_kernels.past_the_fake_mode

    def counted() -> dict[Any, Any]:
        def count(op: Any, kernel: Any) -> Any:
            def run(*args: Any, **kw: Any) -> Any:
                ran[str(op)] += 1
                return kernel(*args, **kw)

            return run

        return {op: count(op, kernel) for op, kernel in made().items()}

    with monkeypatch.context() as m:
        m.setattr(comms, "past_the_fake_mode", counted)
        fast = mw.analyze(tiny_llama_config(), mode="training", gpu="H100", **kwargs)
    with monkeypatch.context() as m:
        m.setattr(comms, "past_the_fake_mode", dict)
        slow = mw.analyze(tiny_llama_config(), mode="training", gpu="H100", **kwargs)
    assert_same_parallel(fast, slow)
    return fast, ran


LAYOUTS = [
    {"fsdp": 4},
    {"replicate": 2, "fsdp": 2},
    {"fsdp": 2, "tp": 2, "sequence_parallel": True},
    {"pp": 2, "fsdp": 2, "microbatches": 2},  # send and recv between the stages
]


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda p: "-".join(f"{k}{v}" for k, v in p.items()))
@pytest.mark.parametrize("checkpointing", [False, True])
def test_every_layout_traces_the_same_past_the_fake_mode(
    monkeypatch: pytest.MonkeyPatch, layout: dict[str, Any], checkpointing: bool
) -> None:
    _, ran = both_ways(
        monkeypatch,
        input_size=(2, 64),
        parallel=layout,
        activation_checkpointing=checkpointing,
        micro_batches=2 if checkpointing and "pp" not in layout else 1,
    )
    assert ran["fsdp.all_gather_copy_in.default"] > 0, ran
    assert ran["c10d._allgather_base_.default"] > 0, ran
    assert ran["c10d._reduce_scatter_base_.default"] > 0, ran
    assert ran["aten.lift_fresh.default"] > 0, ran  # AdamW's step counters


def test_a_call_on_real_tensors_goes_to_the_op() -> None:
    kernels = fake_kernels.past_the_fake_mode()
    copy_in = torch.ops.fsdp.all_gather_copy_in.default
    output = torch.zeros(8)
    inputs = [torch.arange(4.0)]
    mine = kernels[copy_in](inputs, output, [4], 4, 1)
    theirs = copy_in(inputs, torch.zeros(8), [4], 4, 1)
    assert torch.equal(mine[1], theirs[1]) and torch.equal(mine[1][4:], torch.arange(4.0))
    assert mine[0].data_ptr() == output[4:].data_ptr()


def test_another_signature_of_the_copy_in_is_left_to_the_fake_mode(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fake_kernels, "_COPY_IN_ARGUMENTS", ["all_gather_inputs", "dtype"])
    assert torch.ops.fsdp.all_gather_copy_in.default not in fake_kernels.past_the_fake_mode()


@pytest.mark.parametrize("rank", [0, 1, 3])
def test_the_copy_in_on_fake_tensors_is_the_fake_modes(rank: int) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    kernels = fake_kernels.past_the_fake_mode()
    copy_in = torch.ops.fsdp.all_gather_copy_in.default
    with FakeTensorMode() as mode:
        big = torch.empty(40)
        output = big[8:]  # a storage offset and a stride to keep
        inputs = [torch.empty(6), torch.empty(2)]
        theirs = copy_in(inputs, output, [6, 2], 8, rank)
        mine = kernels[copy_in](inputs, output, [6, 2], 8, rank)
    assert mine[1] is output and theirs[1] is output
    a, b = mine[0], theirs[0]
    assert type(a) is type(b) and a.fake_mode is mode
    assert (a.shape, a.stride(), a.storage_offset(), a.dtype, a.device) == (
        b.shape,
        b.stride(),
        b.storage_offset(),
        b.dtype,
        b.device,
    )
    assert a.untyped_storage()._cdata == b.untyped_storage()._cdata
    assert (a._is_view(), a.requires_grad) == (b._is_view(), b.requires_grad)


@pytest.mark.parametrize(
    "value, dtype", [(0.0, torch.float32), (7, torch.int64), (2.5, torch.float64), ([1.0], None)]
)
def test_a_small_tensor_lifted_is_the_fake_modes(value: Any, dtype: torch.dtype | None) -> None:
    """``torch.tensor`` under a fake mode (an optimizer's step counter): the same fake tensor,
    its value kept as the mode keeps it (``.item()`` reads it)."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    lift = fake_kernels.past_the_fake_mode()[torch.ops.aten.lift_fresh.default]
    with torch._C._DisableTorchDispatch():
        real = torch.tensor(value, dtype=dtype)
    with FakeTensorMode() as mode:
        theirs = torch.tensor(value, dtype=dtype)
        mine = lift(real)
    assert type(mine) is FakeTensor and mine.fake_mode is mode
    assert set(vars(mine)) == set(vars(theirs))
    for name, theirs_value in vars(theirs).items():
        if name != "constant":
            assert vars(mine)[name] == theirs_value, name
    assert torch.equal(mine.constant, theirs.constant) and mine.constant is not real
    assert mine.constant.dtype == theirs.constant.dtype
    assert torch._C._dispatch_keys(mine) == torch._C._dispatch_keys(theirs)
    assert (mine.shape, mine.stride(), mine.dtype, mine.device, mine.is_leaf) == (
        theirs.shape,
        theirs.stride(),
        theirs.dtype,
        theirs.device,
        theirs.is_leaf,
    )
    assert mine.item() == theirs.item()


def test_a_lift_the_kernel_is_not_written_for_goes_to_the_op() -> None:
    """No fake mode, more elements than the mode keeps as a constant, a gradient: the op."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    lift = fake_kernels.past_the_fake_mode()[torch.ops.aten.lift_fresh.default]
    real = torch.tensor(3.0)
    assert lift(real) is real  # no fake mode: lift_fresh is the tensor itself
    with torch._C._DisableTorchDispatch():
        big, grad = torch.arange(8.0), torch.tensor(1.0, requires_grad=True)
    with FakeTensorMode():
        lifted = lift(big)
        assert type(lifted) is FakeTensor and lifted.constant is None  # the mode's own answer
        assert type(lift(grad)) is FakeTensor


@pytest.mark.parametrize(
    "layout",
    [
        {"fsdp": 2, "tp": 2},
        {"fsdp": 2, "tp": 2, "sequence_parallel": True},
        {"pp": 2, "fsdp": 2, "tp": 2, "microbatches": 2},
    ],
    ids=["fsdp2-tp2", "fsdp2-tp2-sp", "pp2-fsdp2-tp2"],
)
def test_tensor_parallel_shards_are_cut_locally_and_trace_the_same(
    monkeypatch: pytest.MonkeyPatch, layout: dict[str, Any]
) -> None:
    """``parallelize_locally``: no parameter is scattered over the fake process group, and
    the trace is the one ``parallelize_module``'s scatter gives, every record."""
    from torch.distributed.tensor import placement_types

    from meta_widget.distributed import parallel

    if not parallel._LOCAL_SHARDS:
        pytest.skip("this PyTorch's parallelize_module has no src_data_rank")
    scattered: list[int] = []
    scatter = placement_types.mesh_scatter

    def counted(*args: Any, **kwargs: Any) -> Any:
        scattered.append(1)
        return scatter(*args, **kwargs)

    monkeypatch.setattr(placement_types, "mesh_scatter", counted)
    kwargs: dict[str, Any] = {"input_size": (2, 64), "mode": "training", "gpu": "H100"}
    local = mw.analyze(tiny_llama_config(), parallel=layout, **kwargs)
    assert not scattered
    monkeypatch.setattr(parallel, "_LOCAL_SHARDS", False)
    scattering = mw.analyze(tiny_llama_config(), parallel=layout, **kwargs)
    assert scattered  # the default scatters each sharded parameter
    assert_same_parallel(local, scattering)
