"""``Plan`` sorts and filters like a DataFrame, and keeps its Pareto front: held to pandas'
own sort and query of ``to_dataframe()``, and to the front by its definition (every pair
compared), on candidates whose numbers are given here (no trace: what is tested is the table)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import meta_widget as mw
from meta_widget.explore.candidates import Candidate, Layout
from meta_widget.explore.plan_front import front, speed
from meta_widget.timing.gpus import resolve_gpu

GIB = 2**30


def candidate(tp: int, micro: int, device_gib: float | None, tokens_per_s: float | None,
              fits: bool = True) -> Candidate:  # fmt: skip
    c = Candidate(Layout(fsdp=8 // tp, tp=tp), False, "as given", micro)
    c.device_bytes = None if device_gib is None else int(device_gib * GIB)
    c.peak_bytes = c.device_bytes
    c.tokens_per_s = tokens_per_s
    c.step_s = None if tokens_per_s is None else 4096 * micro * (8 // tp) / tokens_per_s
    c.fits = fits and device_gib is not None
    return c


def sample() -> mw.Plan:
    rows = [
        candidate(1, 1, 70, 9000),  # front: the fastest
        candidate(1, 2, 60, 8000),  # front
        candidate(2, 1, 60, 7000),  # beaten by the one above (as small, faster)
        candidate(2, 2, 40, 5000),  # front: the smallest
        candidate(4, 1, 90, 20000, fits=False),  # faster, but does not fit: not on the front
        candidate(4, 2, None, None),  # not traced
        candidate(8, 1, 40, 5000),  # equal to a front row: both on it
    ]
    return mw.Plan(rows, 80 * GIB, resolve_gpu("H100"), 8, "training", traces=7, title="Llama")


def brute_front(cands: list[Candidate]) -> list[bool]:
    """The definition: a fitting, timed row no fitting timed row beats on both."""
    ok = [c for c in cands if c.fits and c.device_bytes is not None and c.step_s is not None]

    def beats(b: Candidate, a: Candidate) -> bool:
        assert b.device_bytes is not None and a.device_bytes is not None
        no_worse = speed(b) >= speed(a) and b.device_bytes <= a.device_bytes
        return no_worse and (speed(b) > speed(a) or b.device_bytes < a.device_bytes)

    return [c in ok and not any(beats(b, c) for b in ok) for c in cands]


def test_the_front_flags_the_rows_no_other_beats() -> None:
    p = sample()
    table = p.to_dataframe()
    assert table["pareto"].tolist() == [True, True, False, True, False, False, True]
    assert table["pareto"].tolist() == brute_front(p.candidates)
    front_plan = p.pareto()
    assert [c.tokens_per_s for c in front_plan] == [9000, 8000, 5000, 5000]  # fastest first
    assert front_plan.to_dataframe()["pareto"].all() and front_plan.budget == p.budget


def test_gpu_hours_price_the_tokens_on_every_gpu() -> None:
    p = sample()
    assert p.to_dataframe()["gpu_hours"].isna().all()  # not priced
    priced = p.pareto(tokens=15e12)
    hours = priced.to_dataframe()["gpu_hours"].tolist()
    assert hours[0] == pytest.approx(8 * 15e12 / 9000 / 3600)  # 8 GPUs, the job's 9000 tok/s
    assert p.for_tokens(1e9).to_dataframe()["gpu_hours"].notna().sum() == 6
    for bad in (0, -1, True, "1e9", float("inf")):
        with pytest.raises(mw.OptionError, match="tokens="):
            p.for_tokens(bad)


def test_sort_query_and_masks_are_pandas_own() -> None:
    p = sample()
    table = p.to_dataframe()
    by_step = table.sort_values("step_s", na_position="last", kind="stable")
    assert (
        p.sort("step_s")
        .to_dataframe()
        .reset_index(drop=True)
        .equals(by_step.reset_index(drop=True))
    )
    fast = p.sort("tokens_per_s", descending=True)
    assert fast[0].tokens_per_s == 20000 and fast[-1].tokens_per_s is None
    kept = p.query("fits and tp <= 2")
    assert len(kept) == len(table.query("fits and tp <= 2")) == 4
    assert [c.fits for c in p[p.fits]] == [True] * 5
    assert len(p[table["fits"]]) == 5 and len(p[:2]) == 2 and p[1] is p.candidates[1]
    with pytest.raises(mw.OptionError, match="did you mean 'step_s'"):
        p.sort("step")
    with pytest.raises(mw.OptionTypeError, match="one bool per candidate"):
        p[[True]]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 6), st.integers(1, 6), st.booleans()), min_size=1, max_size=30
    )
)
def test_the_front_is_its_definition(rows: list[Any]) -> None:
    cands = [candidate(1, 1, gib * 10, rate * 1000.0, fits) for gib, rate, fits in rows]
    assert front(cands) == brute_front(cands)
