"""A Llama-3-70B-shaped model, as a transformers config built in code (nothing is downloaded).

meta-widget examples/llama_70b.py:config --input 1,4096 --html llama-70b.html
"""

import transformers

config = transformers.LlamaConfig(
    hidden_size=8192,
    intermediate_size=28672,
    num_hidden_layers=80,
    num_attention_heads=64,
    num_key_value_heads=8,
    vocab_size=128256,
    max_position_embeddings=8192,
    rope_theta=500000.0,
    architectures=["LlamaForCausalLM"],
)
