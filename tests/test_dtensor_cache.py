"""DTensor calls rebuilt from the trace's earlier ones (``distributed.dtensor_cache``): no change.

Every tensor-parallel layout must trace the same with the cache and without it (DTensor's
dispatch on every call), every record; the cache must have answered most DTensor calls; what it
must not cache (a placement with state, an op that writes its argument) it runs; a second trace
answers from the first's entries, and no device mesh outlives its trace.
"""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest
import torch
from parallel_truth import (
    no_process_group_left,  # noqa: F401  (an autouse fixture)
    tiny_llama_config,
)
from test_fast_path import assert_same_parallel
from torch.distributed.tensor.placement_types import Replicate, Shard

import meta_widget as mw
from meta_widget.distributed import comms, dtensor_cache
from meta_widget.trace.opcache import CacheStats


def both_ways(
    monkeypatch: pytest.MonkeyPatch, **kwargs: Any
) -> tuple[mw.Analysis, list[dtensor_cache.DTensorCache]]:
    made: list[dtensor_cache.DTensorCache] = []

    def kept(stats: Any) -> dtensor_cache.DTensorCache:
        made.append(dtensor_cache.DTensorCache(stats))
        return made[-1]

    with monkeypatch.context() as m:
        m.setattr(comms, "DTensorCache", kept)
        fast = mw.analyze(tiny_llama_config(), mode="training", gpu="H100", **kwargs)
    with monkeypatch.context() as m:
        m.setattr(comms, "DTensorCache", lambda stats: None)
        slow = mw.analyze(tiny_llama_config(), mode="training", gpu="H100", **kwargs)
    assert_same_parallel(fast, slow)
    return fast, made


LAYOUTS = [  # tensor parallelism alone: sequence-parallel, so that the norms are DTensors too
    {"tp": 4, "sequence_parallel": True},
    {"fsdp": 2, "tp": 2},
    {"fsdp": 2, "tp": 2, "sequence_parallel": True},
    {"replicate": 2, "fsdp": 2, "tp": 2},
    {"pp": 2, "tp": 2, "microbatches": 2, "sequence_parallel": True},
]


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda p: "-".join(f"{k}{v}" for k, v in p.items()))
@pytest.mark.parametrize("variant", ["plain", "checkpointed bf16"])
def test_every_layout_traces_the_same_with_dtensor_calls_cached(
    monkeypatch: pytest.MonkeyPatch, layout: dict[str, Any], variant: str
) -> None:
    more: dict[str, Any] = {}
    if variant != "plain":
        more = {"activation_checkpointing": True, "param_dtype": "bfloat16"}
        if "pp" not in layout:
            more["micro_batches"] = 2
    a, made = both_ways(monkeypatch, input_size=(2, 64), parallel=layout, **more)
    assert made, "the parallel trace made a DTensor cache"
    assert a.fast_path is not None and a.fast_path.hits > a.fast_path.misses, a.fast_path


def test_a_placement_with_state_and_a_write_are_run_not_cached() -> None:
    # the embedding's masked partial sum keeps the mask it made: a subclass of Partial, and
    # only the exact placement types are cached
    from torch.distributed.tensor.placement_types import Partial, _MaskPartial

    assert issubclass(_MaskPartial, Partial)
    assert not dtensor_cache._plain((_MaskPartial(),))
    assert dtensor_cache._plain((Partial(), Replicate(), Shard(0)))
    cache = dtensor_cache.DTensorCache(CacheStats())
    for op in (torch.ops.aten.add_.Tensor, torch.ops.aten.native_dropout.default):
        assert cache.key(op, op, None, None, (), {}) is None
    assert sum(cache.stats.bypassed.values()) == 2


def test_a_second_trace_answers_from_the_first_and_no_mesh_outlives_either(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the entries are the process's: the second trace of a layout runs almost no DTensor
    # dispatch, and traces the same as without the cache; its meshes (and their process
    # groups) die with the trace all the same: no entry holds one
    made: list[dtensor_cache.DTensorCache] = []
    real = dtensor_cache.DTensorCache

    def watched(stats: Any) -> dtensor_cache.DTensorCache:
        made.append(real(stats))
        return made[-1]

    layout = {"fsdp": 2, "tp": 2, "sequence_parallel": True}
    dtensor_cache.DTensorCache.cache_clear()
    with monkeypatch.context() as m:
        m.setattr(comms, "DTensorCache", watched)
        first, second = (
            mw.analyze(tiny_llama_config(), (2, 64), mode="training", gpu="H100", parallel=layout)
            for _ in range(2)
        )
    with monkeypatch.context() as m:
        m.setattr(comms, "DTensorCache", lambda stats: None)
        slow = mw.analyze(
            tiny_llama_config(), (2, 64), mode="training", gpu="H100", parallel=layout
        )
    assert_same_parallel(second, slow)
    assert_same_parallel(first, slow)
    assert first.fast_path is not None and second.fast_path is not None
    assert second.fast_path.misses * 4 < first.fast_path.misses, (first.fast_path, second.fast_path)
    meshes = [weakref.ref(mesh) for cache in made for mesh, _ in cache._meshes.values()]
    assert len(meshes) >= 2 and dtensor_cache.DTensorCache.entries
    del made[:], first, second, slow
    gc.collect()
    assert all(ref() is None for ref in meshes), "a device mesh outlived its trace"
