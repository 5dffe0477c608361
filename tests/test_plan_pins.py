"""Plans pinned to analyses traced here and to the workers' own contract (issue 36's blind
spots): a candidate whose bytes on the GPU equal the budget fits (by the per-layer rule and at full
depth); a candidate a child traced comes back with its peak, the peak ``analyze`` traces (a run
whose child raised is traced here: ``tests/test_plan_workers.py``); ``plan_checkpointing`` tells
``blocks.1`` from ``blocks.10``."""

from __future__ import annotations

from typing import Any

import pytest
import transformers
from test_checkpoint_plan import Net

import meta_widget as mw
from meta_widget.explore import depth
from meta_widget.explore import plan as plan_module

SIZE = (2, 32)
ONE = dict(
    gpu="H100", devices=2, layouts=[{"fsdp": 2}], activation_checkpointing=[False],
    precisions=["as given"], micro_batches=[1],
)  # fmt: skip


def llama() -> Any:
    return transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=2,
    )  # fmt: skip


@pytest.fixture(scope="module")
def traced() -> mw.Analysis:
    """The one candidate, as ``analyze`` traces it at full depth."""
    a = mw.analyze(llama(), SIZE, mode="training", gpu="H100", parallel={"fsdp": 2})
    assert a.error is None
    return a


@pytest.mark.parametrize("full_depth", [False, True], ids=["rule", "full-depth"])
def test_bytes_on_the_gpu_equal_to_the_budget_fit(traced: mw.Analysis, full_depth: bool) -> None:
    """What the GPU holds is the caching allocator's reserve replayed at full depth, by the
    rule too (over the steps it builds, ``depth_reserve``): equal to the budget, it fits."""
    assert traced.footprint_bytes == traced.memory.device_bytes > traced.peak_bytes
    held = traced.footprint_bytes
    for budget, fits in ((held, True), (held - 1, False)):
        p = mw.plan(llama(), SIZE, budget=budget, full_depth=full_depth, workers=1, **ONE)
        (c,) = p.candidates
        assert (c.peak_bytes, c.device_bytes, c.fits) == (traced.peak_bytes, held, fits)
        assert c.traced_layers == (() if full_depth else (2, 3, 4))
        assert (p.best is c) if fits else not p.to_dataframe()["fits"].any()


def test_without_the_reserve_the_rule_rejects_what_cannot_fit_by_its_least_bytes(
    traced: mw.Analysis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the allocator's steps do not follow the rule (no reserve by it), under the least
    the GPU can hold (the peak, cuBLAS's workspaces, the CUDA context, NCCL's buffers) the
    rule's numbers stand (after the 2-layer trace, tried for the reserve): not traced at full
    depth; at that least, the full-depth trace's reserve decides."""
    monkeypatch.setattr(depth, "reserved_peak", lambda *args: None)
    m = traced.memory
    least = m.peak_bytes + m.workspace_bytes + m.device_bytes - m.reserved_bytes
    assert m.peak_bytes < least < m.device_bytes
    (c,) = mw.plan(llama(), SIZE, budget=least - 1, workers=1, **ONE).candidates
    assert c.traced_layers == (2, 3, 4) and c._analysis is None
    assert (c.peak_bytes, c.device_bytes, c.fits) == (m.peak_bytes, least, False)
    (c,) = mw.plan(llama(), SIZE, budget=least, workers=1, **ONE).candidates
    assert c.traced_layers == () and c.device_bytes == m.device_bytes and not c.fits


def test_a_childs_candidates_come_back_with_their_peaks(monkeypatch: pytest.MonkeyPatch) -> None:
    remote: list[tuple[Any, ...]] = []
    take = plan_module.take

    def watched(c: plan_module.Candidate, numbers: dict[str, Any], *rest: Any) -> None:
        remote.append(c.key)
        take(c, numbers, *rest)

    monkeypatch.setattr(plan_module, "take", watched)
    monkeypatch.setattr(plan_module, "cores", lambda: 2)  # a child even on one core
    # the children take runs from the first candidates: FSDP 2's, which trace (TP 2's stop at an
    # error, as a real run does)
    space = dict(ONE, layouts=[{"fsdp": 2}, {"tp": 2}], activation_checkpointing=[False, True])
    space.pop("precisions")  # all three: 12 candidates, time for the child to start
    p = mw.plan(llama(), SIZE, budget="1GiB", workers=2, **space)
    traced = [c for c in p.candidates if c.key in remote and c.error is None]
    assert traced, "no candidate was traced by the child"
    for c in traced:
        if c.key in remote:
            assert c.analysis is not None  # traced here, at full depth, when asked for
            assert c.peak_bytes == c.analysis.peak_bytes and c.fits


def test_checkpointing_tells_blocks_1_from_blocks_10() -> None:
    model = Net((64,) * 12)  # blocks.0 ... blocks.11
    every = [f"blocks.{i}" for i in range(12)]
    shape = (16, 64, 64)
    traced = mw.analyze(model, shape, mode="training", activation_checkpointing=every)
    budget = int(traced.peak_bytes)  # only checkpointing every block fits
    p = mw.plan_checkpointing(model, shape, budget=budget)
    assert p.peak_bytes <= budget
    assert set(p.modules) == set(every), p.modules
