"""The model zoo's transformers rows: small configs built in code (no hub access), registered
in ``zoo_models.CASES`` after the other families when imported (``benchmarks/zoo.py`` does).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from zoo_models import case, ids

# transformers (small configs built in code; no hub access)


def _hf(config: Callable[[], Any]) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import transformers

        c = config()
        return getattr(transformers, c.architectures[0])(c)  # type: ignore[no-any-return]

    return build


def _tf() -> Any:
    import transformers

    return transformers


_SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}
_HEADS = {"num_attention_heads": 4, "num_key_value_heads": 2}


def _text(cls: str, arch: str, **kw: Any) -> Callable[[], Any]:
    return lambda: getattr(_tf(), cls)(
        **{**_SMALL, **_HEADS, "vocab_size": 100, "max_position_embeddings": 64, **kw},
        architectures=[arch],
    )


for _cls, _arch, _kw in [
    ("LlamaConfig", "LlamaForCausalLM", {}),
    ("MistralConfig", "MistralForCausalLM", {}),
    ("Qwen2Config", "Qwen2ForCausalLM", {}),
    (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "head_dim": 16},
    ),
    (
        "MixtralConfig",
        "MixtralForCausalLM",
        {"num_local_experts": 4, "num_experts_per_tok": 2},
    ),
    (
        "DeepseekV3Config",
        "DeepseekV3ForCausalLM",
        {
            "n_routed_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "first_k_dense_replace": 1,
            "n_group": 1,
            "topk_group": 1,
            "q_lora_rank": 32,
            "kv_lora_rank": 16,
            "qk_rope_head_dim": 8,
            "qk_nope_head_dim": 8,
            "v_head_dim": 16,
            "num_key_value_heads": 4,
        },
    ),
    ("Gemma3TextConfig", "Gemma3ForCausalLM", {"head_dim": 16, "sliding_window": 8}),
    ("Phi3Config", "Phi3ForCausalLM", {"pad_token_id": 0}),
]:
    case(f"transformers {_arch}", "transformers", ids(use_cache=False))(
        _hf(_text(_cls, _arch, **_kw))
    )

case(
    "transformers GPT2LMHeadModel",
    "transformers",
    ids(use_cache=False),
)(
    _hf(
        lambda: _tf().GPT2Config(
            n_embd=64,
            n_layer=2,
            n_head=4,
            vocab_size=100,
            n_positions=64,
            architectures=["GPT2LMHeadModel"],
        )
    )
)
case("transformers BertForMaskedLM", "transformers", ids())(
    _hf(
        lambda: _tf().BertConfig(
            **_SMALL,
            num_attention_heads=4,
            vocab_size=100,
            max_position_embeddings=64,
            architectures=["BertForMaskedLM"],
        )
    )
)
case("transformers ModernBertForMaskedLM", "transformers", ids())(
    _hf(
        lambda: _tf().ModernBertConfig(
            **_SMALL,
            num_attention_heads=4,
            vocab_size=100,
            max_position_embeddings=64,
            pad_token_id=0,
            eos_token_id=1,
            bos_token_id=2,
            cls_token_id=2,
            sep_token_id=1,
            architectures=["ModernBertForMaskedLM"],
        )
    )
)
case(
    "transformers T5ForConditionalGeneration",
    "transformers",
    ids(decoder_input_ids=torch.randint(3, 100, (2, 8)), use_cache=False),
)(
    _hf(
        lambda: _tf().T5Config(
            d_model=64,
            d_ff=128,
            num_layers=2,
            num_heads=4,
            d_kv=16,
            vocab_size=100,
            architectures=["T5ForConditionalGeneration"],
        )
    )
)
case(
    "transformers BartForConditionalGeneration",
    "transformers",
    ids(use_cache=False),
)(
    _hf(
        lambda: _tf().BartConfig(
            d_model=64,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=128,
            decoder_ffn_dim=128,
            vocab_size=100,
            max_position_embeddings=64,
            architectures=["BartForConditionalGeneration"],
        )
    )
)
case("transformers MambaForCausalLM", "transformers", ids(use_cache=False))(
    _hf(
        lambda: _tf().MambaConfig(
            hidden_size=64,
            num_hidden_layers=2,
            state_size=8,
            vocab_size=100,
            architectures=["MambaForCausalLM"],
        )
    )
)
case(
    "transformers ViTForImageClassification",
    "transformers",
    lambda: ((), {"pixel_values": torch.randn(2, 3, 32, 32)}),
)(
    _hf(
        lambda: _tf().ViTConfig(
            **_SMALL,
            num_attention_heads=4,
            image_size=32,
            patch_size=8,
            architectures=["ViTForImageClassification"],
        )
    )
)
case(
    "transformers CLIPModel",
    "transformers",
    lambda: (
        (),
        {"input_ids": torch.randint(3, 90, (2, 8)), "pixel_values": torch.randn(2, 3, 32, 32)},
    ),
)(
    _hf(
        lambda: _tf().CLIPConfig(
            text_config={
                **_SMALL,
                "num_attention_heads": 4,
                "vocab_size": 100,
                "max_position_embeddings": 16,
            },
            vision_config={**_SMALL, "num_attention_heads": 4, "image_size": 32, "patch_size": 8},
            projection_dim=32,
            architectures=["CLIPModel"],
        )
    )
)
case(
    "transformers WhisperForConditionalGeneration",
    "transformers",
    lambda: (
        (),
        {
            "input_features": torch.randn(1, 16, 64),
            "decoder_input_ids": torch.randint(3, 90, (1, 8)),
            "use_cache": False,
        },
    ),
)(
    _hf(
        lambda: _tf().WhisperConfig(
            d_model=64,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=128,
            decoder_ffn_dim=128,
            vocab_size=100,
            num_mel_bins=16,
            max_source_positions=32,
            max_target_positions=32,
            pad_token_id=0,
            architectures=["WhisperForConditionalGeneration"],
        )
    )
)
case(
    "transformers Wav2Vec2ForCTC",
    "transformers",
    lambda: ((), {"input_values": torch.randn(1, 4000)}),
)(
    _hf(
        lambda: _tf().Wav2Vec2Config(
            **_SMALL,
            num_attention_heads=4,
            conv_dim=(32, 32),
            conv_stride=(5, 4),
            conv_kernel=(10, 4),
            num_conv_pos_embeddings=16,
            num_conv_pos_embedding_groups=4,
            vocab_size=32,
            layerdrop=0.0,  # no random layer skips or masks in the training step
            mask_time_prob=0.0,
            architectures=["Wav2Vec2ForCTC"],
        )
    )
)


def _llava() -> Any:
    tf = _tf()
    vision = tf.CLIPVisionConfig(**_SMALL, num_attention_heads=4, image_size=32, patch_size=8)
    text = tf.LlamaConfig(**_SMALL, **_HEADS, vocab_size=128, max_position_embeddings=64)
    return tf.LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_id=100,
        vision_feature_layer=-1,
        architectures=["LlavaForConditionalGeneration"],
    )


case(
    "transformers LlavaForConditionalGeneration",
    "transformers",
    lambda: (
        (),
        {
            "input_ids": torch.cat([torch.full((1, 16), 100), torch.randint(3, 90, (1, 8))], 1),
            "pixel_values": torch.randn(1, 3, 32, 32),
            "use_cache": False,
        },
    ),
)(_hf(_llava))
