"""Decode steps given by the per-step rule, not traced one by one (``trace.decode_skip``):
every number of the analysis equals that of the full trace (every decode step traced, itself
checked against transformers' real ``generate()`` in ``test_generate.py``), and against the
real run on the CPU too; where the rule does not hold, the whole trace is made again."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import transformers
from test_generate import (
    BATCH,
    HEADS,
    PROMPT,
    SMALL,
    Generate,
    cache_storage_bytes,
    gemma3,
    generate_options,
    llama,
)
from truth import allocator_peak

import meta_widget as mw
from meta_widget.trace import decode_skip
from meta_widget.trace.passes import trace

T = transformers
NEW = 40
WINDOW = 30  # prompt 16: the cache reaches it at the 16th decode step, mid-generation


def mistral_crossing() -> torch.nn.Module:
    return T.MistralForCausalLM(T.MistralConfig(**SMALL, **HEADS, sliding_window=WINDOW))


def gemma3_crossing() -> torch.nn.Module:  # sliding and full layers, the window reached
    config = T.Gemma3TextConfig(
        **{**SMALL, "num_hidden_layers": 3},
        **HEADS,
        head_dim=16,
        sliding_window=WINDOW,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
    )
    return T.Gemma3ForCausalLM(config)


CASES: dict[str, tuple[Callable[[], torch.nn.Module], str | None]] = {
    "llama": (llama, None),
    "mistral-window-crossed": (mistral_crossing, None),
    "gemma3": (gemma3, None),
    "gemma3-window-crossed": (gemma3_crossing, None),
    "llama-static": (llama, "static"),
    "gemma3-static-window-crossed": (gemma3_crossing, "static"),
}


@pytest.fixture(autouse=True)
def _quiet() -> Any:
    level = T.logging.get_verbosity()
    T.logging.set_verbosity_error()
    yield
    T.logging.set_verbosity(level)


def analyze(
    name: str, every_step: bool, monkeypatch: pytest.MonkeyPatch, prompt: int = PROMPT
) -> mw.Analysis:
    make, cache = CASES[name]
    torch.manual_seed(0)
    ids = torch.randint(3, SMALL["vocab_size"], (BATCH, prompt))
    with monkeypatch.context() as m:
        if every_step:
            m.setattr(decode_skip, "ENABLED", False)
        a = mw.analyze(
            make().eval(), input_data=ids, mode="generate", new_tokens=NEW,
            cache_implementation=cache, device="cpu", gpu="H100",
        )  # fmt: skip
    assert a.error is None
    return a


def passes(a: mw.Analysis) -> int:
    """The root calls: a forward pass each, or a stretch of decode steps summed."""
    return len([c for c in a.calls if c.parent < 0])


def assert_same_numbers(fast: mw.Analysis, full: mw.Analysis) -> None:
    """Every number the skipping must keep: the peak and where it is, FLOPs, the cache, the
    assumptions, the time, and what is live at the peak."""
    assert fast.peak_bytes == full.peak_bytes
    m, n = fast.memory, full.memory
    assert (m.peak_module, m.peak_op, m.peak_phase) == (n.peak_module, n.peak_op, n.peak_phase)
    assert m.categories == n.categories
    assert fast.total_flops == full.total_flops
    assert fast.kv_cache is not None and full.kv_cache is not None
    assert fast.kv_cache.bytes == full.kv_cache.bytes
    assert fast.kv_cache.by_layer.equals(full.kv_cache.by_layer)
    assert fast.kv_cache.layers == full.kv_cache.layers
    assert len(fast.assumptions) == len(full.assumptions)
    assert [(s.kind, s.site, s.value, s.count) for s in fast.assumptions] == [
        (s.kind, s.site, s.value, s.count) for s in full.assumptions
    ]
    assert fast.time is not None and full.time is not None
    for field in ("step_s", "prefill_s", "per_token_s", "tokens_per_s"):
        assert getattr(fast.time, field) == pytest.approx(getattr(full.time, field), rel=1e-12)


@pytest.mark.parametrize("name", list(CASES))
def test_skipped_decode_steps_give_the_numbers_of_the_full_trace(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    full = analyze(name, True, monkeypatch)
    fast = analyze(name, False, monkeypatch)
    assert passes(full) == NEW  # every forward pass traced
    assert passes(fast) <= NEW - 15  # most decode steps given by the rule
    assert not [n for n in fast.notes if "every step was traced again" in n]
    assert_same_numbers(fast, full)


def test_the_peak_in_a_decode_step_is_found_as_in_the_full_trace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a short prompt: the cache at the end outweighs the prefill's activations
    full = analyze("llama", True, monkeypatch, prompt=4)
    fast = analyze("llama", False, monkeypatch, prompt=4)
    assert full.memory.peak_phase == "decode" and passes(fast) <= NEW - 15
    assert_same_numbers(fast, full)


def test_no_stretch_crosses_a_window_boundary() -> None:
    make, _ = CASES["mistral-window-crossed"]
    torch.manual_seed(0)
    ids = torch.randint(3, SMALL["vocab_size"], (BATCH, PROMPT))
    a = mw.analyze(make().eval(), input_data=ids, mode="generate", new_tokens=NEW, device="cpu")
    assert a.source_model is not None
    data = a.options.input_data
    t = trace(a.source_model.module, tuple(data), {}, a.options.trace_spec())
    assert len(t.stretches) == 2  # one before the window is reached, one after
    for s in t.stretches:
        # the cache's length at the start of each skipped step (the prompt at step 2)
        lengths = [PROMPT + step - 2 for step in range(s.first, s.last + 1)]
        assert all(n < WINDOW - 3 for n in lengths) or all(n > WINDOW + 3 for n in lengths)
        assert s.last <= NEW - 3  # the last two complete steps and the last step: traced
        assert t.events[s.event].op == decode_skip.SKIPPED
        # a step's calls, summed: the stretch's root, and the next traced step's right after
        assert t.calls[s.call].parent < 0 and t.calls[s.call + s.count].parent < 0
        assert all(c.parent >= 0 for c in t.calls[s.call + 1 : s.call + s.count])


@pytest.mark.parametrize("name", ["llama", "mistral-window-crossed"])
def test_with_steps_skipped_the_cache_and_peak_are_those_of_a_real_generate(name: str) -> None:
    make, cache = CASES[name]
    torch.manual_seed(0)
    model = make().eval()
    ids = torch.randint(3, SMALL["vocab_size"], (BATCH, PROMPT))
    options = generate_options(cache, NEW)
    with torch.no_grad():
        out = model.generate(ids, **options)
    real_peak = allocator_peak(Generate(model, options), (ids,))
    a = mw.analyze(model, input_data=ids, mode="generate", new_tokens=NEW, device="cpu")
    assert a.kv_cache is not None and passes(a) <= NEW - 15
    assert a.kv_cache.bytes == cache_storage_bytes(out.past_key_values)
    assert abs(a.peak_bytes - real_peak) <= 0.02 * real_peak, (a.peak_bytes, real_peak)


def test_a_rule_that_does_not_hold_traces_every_step_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a stub that leaves the cache where the skipped steps began: the live bytes differ from
    # the rule's when tracing resumes
    full = analyze("llama", True, monkeypatch)
    monkeypatch.setattr(decode_skip.Skipper, "_catch_up", lambda self, n, last: None)
    redone = analyze("llama", False, monkeypatch)
    assert passes(redone) == NEW
    assert [n for n in redone.notes if "every step was traced again" in n and "live bytes" in n]
    assert_same_numbers(redone, full)


def test_an_error_in_a_skipped_step_traces_every_step_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    full = analyze("gemma3", True, monkeypatch)

    def broken(self: decode_skip.Skipper) -> Any:
        raise RuntimeError("a stub that fails")

    monkeypatch.setattr(decode_skip.Skipper, "_stub", broken)
    redone = analyze("gemma3", False, monkeypatch)
    assert passes(redone) == NEW
    assert [n for n in redone.notes if "RuntimeError" in n]
    assert_same_numbers(redone, full)


def test_fast_false_traces_every_decode_step() -> None:
    a = mw.analyze(llama().eval(), (1, 8), mode="generate", new_tokens=20, fast=False)
    assert passes(a) == 20
    assert [name for _, name in a.memory.phase_runs] == ["prefill"] + ["decode"] * 19
