"""Serving numbers pinned to a real ``generate()`` on the CPU, or to the full trace (every
decode step traced, itself held to the real run in ``test_generate.py``), on shapes the rest
of the suite does not separate (issue 36's blind spots and item 11):

- a batch of 3 with 2 key/value heads: the cache's batch is the keys' first dimension, not the
  heads' (a batch of 2 with 2 heads cannot tell them apart);
- an encoder-decoder (T5): the decoder's self-attention cache is summarized (its layers);
- decode steps given by the per-step rule on a model whose decode ops are past the kernel
  floor: their bytes grow with the step, as the full trace's do;
- a Qwen2 of 6 heads of 16 over 2 key/value heads, batch 2, prompt 40, 24 new tokens: the peak
  is the CPU allocator's.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import transformers
from test_generate import Generate, cache_storage_bytes, generate_options
from truth import allocator_peak

import meta_widget as mw
from meta_widget.trace import decode_skip

T = transformers


@pytest.fixture(autouse=True)
def _quiet() -> Any:
    level = T.logging.get_verbosity()
    T.logging.set_verbosity_error()
    yield
    T.logging.set_verbosity(level)


def test_a_batch_of_three_over_two_kv_heads_is_a_batch_of_three() -> None:
    config = T.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=256,
    )  # fmt: skip
    torch.manual_seed(0)
    model = T.LlamaForCausalLM(config).eval()
    ids = torch.randint(3, 256, (3, 10))
    with torch.no_grad():
        out = model.generate(ids, **generate_options(None, 4))
    real = out.past_key_values
    a = mw.analyze(model, input_data=ids, mode="generate", new_tokens=4, device="cpu")
    assert a.kv_cache is not None and a.kv_cache.bytes == cache_storage_bytes(real)
    for layer, mine in zip(real.layers, a.kv_cache.layers, strict=True):
        assert mine.batch == 3 and mine.tokens == layer.keys.shape[-2]
        held = layer.keys.numel() * 4 + layer.values.numel() * 4
        assert mine.token_bytes == held / (3 * layer.keys.shape[-2])
    # per position of one sequence: keys and values, 2 heads of 16, float32, 2 layers
    assert a.kv_cache.bytes_per_token == 2 * 2 * 16 * 4 * 2


def test_an_encoder_decoders_self_attention_cache_is_summarized() -> None:
    config = T.T5Config(
        vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
        decoder_start_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = T.T5ForConditionalGeneration(config).eval()
    ids = torch.randint(3, 64, (3, 10))
    with torch.no_grad():
        out = model.generate(ids, **generate_options(None, 5))
    real = out.past_key_values
    a = mw.analyze(model, input_data=ids, mode="generate", new_tokens=5, device="cpu")
    assert a.error is None and a.kv_cache is not None
    assert a.kv_cache.bytes == cache_storage_bytes(real.self_attention_cache) + (
        cache_storage_bytes(real.cross_attention_cache)
    )
    own = real.self_attention_cache.layers
    assert len(a.kv_cache.layers) == len(own) == 2
    assert [layer.tokens for layer in a.kv_cache.layers] == [x.keys.shape[-2] for x in own]
    assert [layer.bytes for layer in a.kv_cache.layers] == [
        cache_storage_bytes(type("C", (), {"layers": [x]})()) for x in own
    ]


def _generate(every_step: bool, monkeypatch: pytest.MonkeyPatch) -> mw.Analysis:
    config = T.LlamaConfig(
        hidden_size=512, intermediate_size=1024, num_hidden_layers=1, num_attention_heads=8,
        num_key_value_heads=8, vocab_size=256, architectures=["LlamaForCausalLM"],
    )  # fmt: skip
    with monkeypatch.context() as m:
        if every_step:
            m.setattr(decode_skip, "ENABLED", False)
        a = mw.analyze(config, input_size=(8, 512), mode="generate", new_tokens=24, gpu="H100")
    assert a.error is None and a.time is not None
    return a


def test_skipped_steps_time_their_growing_bytes_as_the_full_trace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the cache read by attention in a decode step: 8 x 8 heads x 512+ positions x 64 x 4 B
    # x 2 = 16.8 MB and more, past the 4 us kernel floor at 3.35 TB/s
    full = _generate(True, monkeypatch)
    fast = _generate(False, monkeypatch)
    roots = [c for c in fast.calls if c.parent < 0]
    assert len(roots) < 24 - 10  # most decode steps given by the rule
    assert fast.time is not None and full.time is not None
    assert fast.time.per_token_s == pytest.approx(full.time.per_token_s, rel=1e-12)
    assert fast.time.step_s == pytest.approx(full.time.step_s, rel=1e-12)


def test_a_qwen2_of_six_heads_has_the_peak_of_a_real_generate() -> None:
    config = T.Qwen2Config(
        hidden_size=96, intermediate_size=128, num_hidden_layers=2, num_attention_heads=6,
        num_key_value_heads=2, vocab_size=256,
    )  # fmt: skip
    torch.manual_seed(0)
    model = T.Qwen2ForCausalLM(config).eval()
    ids = torch.randint(3, 256, (2, 40))
    options = generate_options(None, 24)
    with torch.no_grad():
        out = model.generate(ids, **options)
    assert out.sequences.shape == (2, 64)
    real_peak = allocator_peak(Generate(model, options), (ids,))
    a = mw.analyze(model, input_data=ids, mode="generate", new_tokens=24, device="cpu")
    assert a.kv_cache is not None and a.kv_cache.bytes == cache_storage_bytes(out.past_key_values)
    assert abs(a.peak_bytes - real_peak) <= 0.005 * real_peak, (a.peak_bytes, real_peak)
