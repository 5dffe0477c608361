"""``a.summary()`` fits 100 columns (issue 28: Llama-3-70B's training summary was 120-136 wide
and wrapped in Lab's outputs), keeping the folded layers' label whole, and writes "none" with
the widget's one symbol."""

from __future__ import annotations

import transformers

import meta_widget as mw
from meta_widget.views.summary import NONE, SUMMARY_WIDTH


def test_a_70b_training_summary_fits_100_columns() -> None:
    config = transformers.LlamaConfig(
        hidden_size=8192,
        intermediate_size=28672,
        num_hidden_layers=80,
        num_attention_heads=64,
        num_key_value_heads=8,
        vocab_size=128256,
        architectures=["LlamaForCausalLM"],
    )
    a = mw.analyze(config, input_size=(1, 16), mode="training")
    text = a.summary()
    lines = text.splitlines()
    assert SUMMARY_WIDTH == 100
    assert max(len(line) for line in lines) <= 100, max(lines, key=len)
    assert any("0–79 · 80 × LlamaDecoderLayer" in line for line in lines)
    assert any("rotary_emb · LlamaRotaryEmbedding" in line for line in lines)
    # every category of the peak is still there, wrapped, not cut
    joined = " ".join(line.strip() for line in lines)
    for category, size in a.memory.categories.items():
        if size:
            assert category in joined
    # "none" is the widget's symbol (js/rows.ts NONE), not "--"
    assert NONE == "–" and " -- " not in text and f" {NONE}" in text
