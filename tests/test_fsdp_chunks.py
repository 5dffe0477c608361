"""FSDP2 cuts only the chunks of a parameter it reads (``distributed.fsdp_chunks``): no change.

The list of chunks on demand must be FSDP2's own ``_chunk_with_empty`` chunk for chunk (the same
views of the same storage, the same empty padding); every layout must trace the same with it and
without it, meshes with more ranks than rows included; and FSDP2's function is its own again
after every world, an interrupt in ``fully_shard`` included.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from parallel_truth import (
    no_process_group_left,  # noqa: F401  (an autouse fixture)
    tiny_llama_config,
)
from test_fast_path import assert_same_analysis
from torch.distributed.fsdp._fully_shard import _fsdp_common, _fsdp_param

import meta_widget as mw
from meta_widget.distributed import fsdp_chunks, parallel


def same_view(a: torch.Tensor, b: torch.Tensor) -> None:
    assert (a.shape, a.stride(), a.dtype) == (b.shape, b.stride(), b.dtype)
    if a.numel():
        assert a.storage_offset() == b.storage_offset() and a.data_ptr() == b.data_ptr()
        assert torch.equal(a, b)


@pytest.mark.parametrize("dim", [0, 1])
def test_chunks_on_demand_are_fsdps_own_chunk_for_chunk(dim: int) -> None:
    for rows in (1, 2, 5, 7, 8, 16, 17):
        t = torch.arange(rows * 6.0).reshape(rows, 6) if dim == 0 else torch.arange(6.0 * rows)
        t = t if dim == 0 else t.reshape(6, rows)
        for count in (1, 2, 3, 4, 8, 9, 32):
            own, lazy = (
                _fsdp_common._chunk_with_empty(t, count, dim),
                fsdp_chunks.Chunks(t, count, dim),
            )
            assert len(lazy) == len(own) == count
            for i in range(count):
                same_view(lazy[i], own[i])
            same_view(lazy[-1], own[-1])
            assert [c.shape for c in lazy[1:3]] == [c.shape for c in own[1:3]]
            with pytest.raises(IndexError):
                lazy[count]


def test_an_empty_dimension_is_fsdps_own_answer() -> None:
    t = torch.empty(0, 4)
    own, on_demand = _fsdp_common._chunk_with_empty(t, 4, 0), fsdp_chunks._chunk_on_demand(t, 4, 0)
    assert isinstance(on_demand, list) and len(on_demand) == len(own) == 4


def both_ways(monkeypatch: pytest.MonkeyPatch, **kwargs: Any) -> mw.Analysis:
    cut: list[int] = []
    real = fsdp_chunks.Chunks.__init__

    def counted(self: Any, *args: Any) -> None:
        cut.append(1)
        real(self, *args)

    with monkeypatch.context() as m:
        m.setattr(fsdp_chunks.Chunks, "__init__", counted)
        fast = mw.analyze(tiny_llama_config(), mode="training", gpu="H100", **kwargs)
    assert cut, "FSDP2 cut its parameters on demand"
    with monkeypatch.context() as m:
        m.setattr(parallel, "cut_on_demand", lambda: None)
        slow = mw.analyze(tiny_llama_config(), mode="training", gpu="H100", **kwargs)
    assert_same_analysis(fast, slow)
    assert _fsdp_param._chunk_with_empty is _fsdp_common._chunk_with_empty
    return fast


LAYOUTS = [
    {"fsdp": 2},
    {"fsdp": 128},  # more ranks than the 64 rows of most parameters: FSDP2's padded shards
    {"fsdp": 48},  # 48 does not divide 64 (rank 0 reads chunk 0; the others: the test above)
    {"replicate": 2, "fsdp": 4},
    {"fsdp": 2, "tp": 2, "sequence_parallel": True},  # FSDP's _StridedShard over TP's shards
    {"pp": 2, "fsdp": 2, "microbatches": 2},
]


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda p: "-".join(f"{k}{v}" for k, v in p.items()))
def test_every_layout_traces_the_same_with_chunks_on_demand(
    monkeypatch: pytest.MonkeyPatch, layout: dict[str, Any]
) -> None:
    a = both_ways(monkeypatch, input_size=(2, 64), parallel=layout)
    assert a.error is None, a.error


def test_an_interrupt_in_fully_shard_gives_fsdp_its_own_function_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = [0]
    real = fsdp_chunks.Chunks.__init__

    def interrupted(self: Any, *args: Any) -> None:
        calls[0] += 1
        if calls[0] == 3:  # the third parameter FSDP2 shards
            raise KeyboardInterrupt
        real(self, *args)

    with monkeypatch.context() as m:
        m.setattr(fsdp_chunks.Chunks, "__init__", interrupted)
        with pytest.raises(KeyboardInterrupt):
            mw.analyze(tiny_llama_config(), (2, 64), mode="training", parallel={"fsdp": 2})
    assert calls[0] == 3
    assert _fsdp_param._chunk_with_empty is _fsdp_common._chunk_with_empty
    again = mw.analyze(tiny_llama_config(), (2, 64), mode="training", parallel={"fsdp": 2})
    assert again.error is None
