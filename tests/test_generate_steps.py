"""The per-step rule of decode steps (``meta_widget.trace.decode_steps``) on full traces of
``generate()``: within a stretch with no sliding-window boundary every decode step is the one
before it with its sizes one position longer, exactly (every event, call, FLOP count and cost);
across a window's boundary the rule changes, and the check says so."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import transformers
from test_generate import BATCH, HEADS, PROMPT, SMALL, gemma3, llama

import meta_widget as mw
from meta_widget.trace.decode_steps import StepRecord, decode_steps, extrapolate, follows, per_step
from meta_widget.trace.passes import Trace, trace

T = transformers
NEW = 14


@pytest.fixture(autouse=True)
def _quiet() -> Any:
    level = T.logging.get_verbosity()
    T.logging.set_verbosity_error()
    yield
    T.logging.set_verbosity(level)


def full_trace(model: torch.nn.Module, cache: str | None = None) -> Trace:
    """A trace of ``generate()`` with every decode step traced, on the analysis' meta model."""
    torch.manual_seed(0)
    ids = torch.randint(3, SMALL["vocab_size"], (BATCH, PROMPT))
    a = mw.analyze(
        model.eval(), input_data=ids, mode="generate", new_tokens=NEW,
        cache_implementation=cache, device="cpu",
    )  # fmt: skip
    assert a.source_model is not None and a.error is None
    data = a.options.input_data
    args = tuple(data) if not isinstance(data, dict) else ()
    return trace(a.source_model.module, args, {}, a.options.trace_spec(), every_step=True)


def steps_of(t: Trace) -> list[StepRecord]:
    steps = decode_steps(t.calls, t.events, t.phase_runs)
    assert [s.step for s in steps] == list(range(2, NEW))  # every decode step but the last
    return steps


@pytest.mark.parametrize("make, cache", [(llama, None), (gemma3, None), (llama, "static")])
def test_decode_steps_follow_one_rule_when_no_window_boundary_is_crossed(
    make: Any, cache: Any
) -> None:
    # the first decode step frees what the prefill left (a sliding layer's longer storage):
    # the stretch begins at the second
    steps = steps_of(full_trace(make(), cache))[1:]
    first, second = steps[0], steps[1]
    rule = per_step(first, second)
    assert rule is not None
    for later in steps[2:]:  # the rule of the first two gives every later step, exactly
        assert extrapolate(first, rule, later.step - first.step).atoms == later.atoms
        assert follows(first, second, later)
    one_position = 2 * HEADS["num_key_value_heads"] * 16 * 4 * BATCH  # keys and values, fp32
    if cache == "static":  # only generate()'s own token ids (int64) grow: not the cache
        assert 0 < max(rule) < one_position
    else:  # a dynamic cache grows: by a position per step in each layer holding it
        assert max(rule) >= one_position


def mistral_crossing_its_window() -> torch.nn.Module:
    # window 22: the cache reaches it at the 7th decode step (prompt 16 + 6)
    return T.MistralForCausalLM(T.MistralConfig(**SMALL, **HEADS, sliding_window=22))


def test_a_window_boundary_ends_a_stretch_and_the_check_sees_it() -> None:
    steps = steps_of(full_trace(mistral_crossing_its_window()))
    linear = [follows(a, b, c) for a, b, c in zip(steps, steps[1:], steps[2:], strict=False)]
    assert not all(linear)  # the rule changes at the window
    # before the boundary one rule, after it another (the window's length: no growth)
    assert follows(steps[1], steps[2], steps[4])
    assert follows(steps[-3], steps[-2], steps[-1])
    assert not follows(steps[1], steps[2], steps[-1])
    after = per_step(steps[-2], steps[-1])
    assert after is not None


def test_a_changed_number_breaks_the_rule() -> None:
    steps = steps_of(full_trace(llama()))
    a, b, c = steps[0], steps[1], steps[2]
    assert follows(a, b, c)
    i = next(i for i, x in enumerate(c.atoms) if isinstance(x, int) and x > 1000)
    bumped = StepRecord(
        c.step, c.first_call, c.first_event, (*c.atoms[:i], c.atoms[i] + 1, *c.atoms[i + 1 :])
    )
    assert not follows(a, b, bumped)
