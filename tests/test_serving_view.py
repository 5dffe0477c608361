"""The serving view of ``mode="generate"`` (issue 40): the widget's numbers are the analysis'
own, the KV cache is its own memory category, calls are counted as the model ran them, and
``paged()`` says why nothing fits.

Truths: a real ``generate()`` on the CPU (the same tiny models as ``test_generate.py``) counts
the forward calls of each module and holds the cache; the weights are summed from the model.
"""

from __future__ import annotations

import pickle
from typing import Any

import pytest
import torch
from test_generate import NEW, _case, cache_storage_bytes, generate_options

import meta_widget as mw
from meta_widget.views.protocol import encode_analysis


def real_calls(
    model: torch.nn.Module, ids: torch.Tensor, cache: str | None
) -> tuple[dict[str, int], Any]:
    """How many times a real ``generate()`` called each module, and the output."""
    counts: dict[str, int] = {}
    handles = [
        m.register_forward_hook(
            lambda *_, name=name: counts.__setitem__(name, counts.get(name, 0) + 1)
        )
        for name, m in model.named_modules()
    ]
    try:
        with torch.no_grad():
            out = model.generate(ids, **generate_options(cache))
    finally:
        for h in handles:
            h.remove()
    return counts, out


@pytest.mark.parametrize("name", ["llama", "mistral-window"])
def test_the_serving_payload_holds_the_analysis_numbers_and_real_call_counts(name: str) -> None:
    model, ids, cache = _case(name)
    counts, out = real_calls(model, ids, cache)
    a = mw.analyze(model, input_data=ids, mode="generate", new_tokens=NEW, device="cpu", gpu="H100")
    assert a.kv_cache is not None and a.time is not None
    # calls as the model ran them: a real generate() calls the model once per token
    frame = a.to_dataframe()
    ran = dict(zip(frame.module, frame.calls, strict=True))
    assert counts[""] == NEW
    assert {k: v for k, v in ran.items() if v} == counts
    payload = encode_analysis(a)
    per_row = [0] * len(a.modules)
    more = payload["calls"].get("more_calls", [0] * len(payload["calls"]["module"]))
    for module, extra in zip(payload["calls"]["module"], more, strict=True):
        per_row[module] += 1 + extra
    assert per_row == [ran[n.path] for n in a.modules]
    # the serving view's numbers are a.kv_cache's and a.time's
    s = payload["serving"]
    assert s["kv_bytes"] == a.kv_cache.bytes == cache_storage_bytes(out.past_key_values)
    assert s["kv_bytes_per_token"] == a.kv_cache.bytes_per_token
    assert (s["prefill_s"], s["per_token_s"], s["tokens_per_s"]) == (
        a.time.prefill_s,
        a.time.per_token_s,
        a.time.tokens_per_s,
    )
    fit = a.kv_cache.paged(a.time.gpu.memory_bytes)
    assert s["paged"]["sequences"] == int(fit) and s["paged"]["reason"] == fit.reason
    assert sum(n for n, _ in s["layers"].values()) == len(a.kv_cache.layers)
    # the KV cache is a memory category of its own: at the end, the cache returned is live
    kinds = {layer.kind for layer in a.kv_cache.layers}
    series = a.memory.timeline_categories
    cache_names = [c for c in series if c.startswith("KV cache")]
    assert ("KV cache (sliding window)" in cache_names) == ("sliding" in kinds)
    # (a sliding layer's window is also a 0-dim int64 tensor that transformers makes on the
    # CPU, off the meta timeline: 8 bytes a layer)
    off_meta = 8 * sum(layer.kind == "sliding" for layer in a.kv_cache.layers)
    assert sum(series[c][-1] for c in cache_names) == a.kv_cache.bytes - off_meta
    assert set(cache_names) <= set(payload["timeline"]["categories"])
    # and no category is lost: they add up to the live bytes at every event, the peak included
    assert sum(a.memory.categories.values()) == a.peak_bytes


def test_paged_says_why_nothing_fits_and_stays_a_number() -> None:
    model, ids, _ = _case("llama")
    a = mw.analyze(model, input_data=ids, mode="generate", new_tokens=NEW, device="cpu")
    assert a.kv_cache is not None
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    weights += sum(b.numel() * b.element_size() for b in model.buffers())
    under = a.kv_cache.paged(weights - 1)
    assert under == 0 and isinstance(under, int)
    assert "weights alone" in under.reason and "exceed" in under.reason
    assert repr(under).startswith("0 (the weights alone") and str(under) == "0"
    one = a.kv_cache.sequence_bytes(ids.shape[1] + NEW)
    short = a.kv_cache.paged(weights + one - 1)
    assert short == 0 and "more than" in short.reason
    fits = a.kv_cache.paged(weights + 3 * one)
    assert fits == 3 and fits + 1 == 4 and repr(fits) == "3" and f"{fits:,}" == "3"
    back = pickle.loads(pickle.dumps(under))
    assert back == 0 and back.reason == under.reason


def test_a_long_generate_time_reads_in_seconds() -> None:
    model, ids, _ = _case("llama")
    a = mw.analyze(model, input_data=ids, mode="generate", new_tokens=NEW, device="cpu", gpu="H100")
    assert a.time is not None
    slow = a.time.__class__(**{**a.time.__dict__, "step_s": 16.25, "prefill_s": 0.922})
    text = repr(slow)
    assert "e+" not in text and "16.3 s" in text and "922 ms" in text, text
    assert mw.units.format_seconds(16250.0 / 1e3) == "16.3 s"
