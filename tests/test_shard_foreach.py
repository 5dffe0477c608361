"""The optimizer's multi-tensor ops run on DTensors' shards (``trace.shard_foreach``): no change.

Each layout is traced with the mode and without it (DTensor's own sharding propagation): every
record an analysis reports must be the same, an error included, and the mode must have run.
Then the mode's ops on real CPU DTensors: the same values and the same specs as DTensor's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
from parallel_truth import (
    no_process_group_left,  # noqa: F401  (an autouse fixture)
    tiny_llama_config,
)
from test_fast_path import assert_same_analysis
from test_moe import mixtral
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.testing._internal.distributed.fake_pg import FakeStore

import meta_widget as mw
from meta_widget.trace import passes, shard_foreach


@contextlib.contextmanager
def counting(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The names of the ops the mode ran on shards, while the block runs."""
    ran: list[str] = []
    real = shard_foreach._run_on_shards

    def run(func: Any, *args: Any) -> Any:
        ran.append(func.__name__)
        return real(func, *args)

    with monkeypatch.context() as m:
        m.setattr(shard_foreach, "_run_on_shards", run)
        yield ran


def both_ways(monkeypatch: pytest.MonkeyPatch, model: Any, **kwargs: Any) -> tuple[Any, list[str]]:
    with counting(monkeypatch) as ran:
        fast = mw.analyze(model, mode="training", gpu="H100", **kwargs)
    with monkeypatch.context() as m:
        m.setattr(passes, "ShardLocalForeach", contextlib.nullcontext)
        slow = mw.analyze(model, mode="training", gpu="H100", **kwargs)
    assert_same_analysis(fast, slow)
    return fast, ran


LAYOUTS = [
    {"fsdp": 2},
    {"replicate": 2, "fsdp": 2},
    {"fsdp": 2, "tp": 2},  # FSDP's _StridedShard over TP's shards
    {"fsdp": 2, "tp": 2, "sequence_parallel": True},
    {"pp": 2, "fsdp": 2, "microbatches": 2},
]


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda p: "-".join(f"{k}{v}" for k, v in p.items()))
def test_every_layout_traces_the_same_with_and_without_the_mode(
    monkeypatch: pytest.MonkeyPatch, layout: dict[str, Any]
) -> None:
    a, ran = both_ways(monkeypatch, tiny_llama_config(), input_size=(2, 64), parallel=layout)
    assert a.error is None, a.error
    # AdamW, multi-tensor on CUDA: each of its pointwise ops ran on the shards, both steps
    assert {"_foreach_lerp_", "_foreach_sqrt", "_foreach_addcdiv_"} <= set(ran), ran


def test_tensor_parallel_alone_fails_the_same_way(monkeypatch: pytest.MonkeyPatch) -> None:
    """TP alone leaves the norms plain tensors beside DTensors: the multi-tensor step fails, as a
    real run's does; the mode passes that op to DTensor, which raises the same error."""
    a, _ = both_ways(monkeypatch, tiny_llama_config(), input_size=(2, 64), parallel={"tp": 2})
    assert a.error is not None
    assert "mixed torch.Tensor and DTensor" in str(a.error), a.error


def test_experts_and_other_optimizers_trace_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    a, ran = both_ways(monkeypatch, mixtral(), input_size=(2, 16), parallel={"fsdp": 4, "ep": 2})
    assert a.error is None and ran
    for optimizer in ("adam", "sgd-momentum"):
        a, ran = both_ways(
            monkeypatch,
            tiny_llama_config(),
            input_size=(2, 32),
            parallel={"fsdp": 2},
            optimizer=optimizer,
        )
        assert a.error is None and ran, optimizer


# -- the mode's ops on real DTensors ---------------------------------------------------------------


@pytest.fixture
def mesh() -> Iterator[Any]:
    dist.init_process_group("fake", rank=0, world_size=4, store=FakeStore())
    try:
        yield dist.device_mesh.init_device_mesh("cpu", (2, 2))
    finally:
        dist.destroy_process_group()


def _dtensors(mesh: Any, placements: Any, n: int = 3) -> list[DTensor]:
    gen = torch.Generator().manual_seed(len(placements) + n)
    return [
        DTensor.from_local(torch.rand(4 + i, 6, generator=gen) + 0.5, mesh, placements)
        for i in range(n)
    ]


def _same(a: Any, b: Any) -> None:
    assert type(a) is type(b)
    if isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    elif isinstance(a, DTensor):
        assert a._spec == b._spec and a.placements == b.placements
        assert torch.equal(a._local_tensor, b._local_tensor)


def _run(op: Any, make: Any, on: bool) -> tuple[Any, Any]:
    lists = make()
    with shard_foreach.ShardLocalForeach() if on else contextlib.nullcontext():
        out = op(*lists)
    return out, lists


OPS = {
    "sqrt": lambda a, b: torch._foreach_sqrt(a),
    "mul_": lambda a, b: torch._foreach_mul_(a, 0.9),
    "lerp_": lambda a, b: torch._foreach_lerp_(a, b, 0.1),
    "addcdiv_": lambda a, b: torch._foreach_addcdiv_(a, b, b, [0.5, 0.25, 0.125]),
    "add": lambda a, b: torch._foreach_add(a, b, alpha=2.0),
    "pow": lambda a, b: torch._foreach_pow(0.9, a),
}


@pytest.mark.parametrize("name", sorted(OPS))
@pytest.mark.parametrize(
    "placements", [(Shard(0), Replicate()), (Replicate(), Shard(1))], ids=["s0-r", "r-s1"]
)
def test_the_modes_results_are_dtensors(mesh: Any, name: str, placements: Any) -> None:
    def make() -> tuple[list[DTensor], list[DTensor]]:
        return _dtensors(mesh, placements), _dtensors(mesh, placements, 3)

    with contextlib.ExitStack():
        got, got_in = _run(OPS[name], make, True)
        want, want_in = _run(OPS[name], make, False)
    _same(got, want)
    _same(got_in, want_in)  # in place: the inputs changed the same way


def test_lists_whose_specs_differ_or_are_partial_take_dtensors_own_path(
    mesh: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    cases = {
        "placements differ": (
            lambda: (
                _dtensors(mesh, (Shard(0), Replicate())),
                _dtensors(mesh, (Replicate(), Replicate())),
            )
        ),
        "partial": lambda: (
            _dtensors(mesh, (Shard(0), Partial())),
            _dtensors(mesh, (Shard(0), Partial())),
        ),
        "a plain tensor": lambda: (
            _dtensors(mesh, (Shard(0), Replicate())),
            [torch.ones(2, 3)] * 3,
        ),
    }
    for what, make in cases.items():
        with counting(monkeypatch) as ran:
            try:
                got: Any = _run(OPS["lerp_"], make, True)
            except Exception as e:  # DTensor's own error, the same with the mode or without
                got = repr(e)
        try:
            want: Any = _run(OPS["lerp_"], make, False)
        except Exception as e:
            want = repr(e)
        assert ran == [], what
        if isinstance(want, str):
            assert got == want, what
        else:
            _same(got, want)
