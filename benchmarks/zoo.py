"""The model zoo: small configs of real architectures, each run for real on the CPU and on meta.

``make zoo`` (or ``.venv-zoo/bin/python benchmarks/zoo.py``) builds every model below from a small
config (torchvision, timm, diffusers, transformers and plain torch; no weights are downloaded),
runs it for real on the CPU and analyzes it with ``mw.analyze(model, ..., device="cpu")``, and
prints one row per model:

- **shapes**: module calls whose output shapes equal the real forward's (hooks on every module),
  of all calls;
- **params**: ``a.total_params`` against ``sum(p.numel())`` of the real model (tied once);
- **FLOPs**: ``a.total_flops`` over ``FlopCounterMode`` on the real forward (attention forced to
  the math path, which FlopCounterMode can count: the forward FLOPs of every path are equal);
- **inference / training peak**: ``a.peak_bytes`` over ``MemTracker``'s peak of a real eval
  forward under ``no_grad`` / a real train forward + ``sum()`` of the output + backward (no
  optimizer step).

It needs torchvision, which from PyPI does not import beside the test environment's CPU torch, so
it runs in its own environment (``.venv-zoo``, made by ``make zoo``). ``--only NAME`` runs the
rows whose name contains ``NAME``, ``--family torch`` one family; ``--markdown PATH`` also
writes the table there.
"""

from __future__ import annotations

import argparse
import copy
import gc
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.distributed._tools.mem_tracker import MemTracker
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

import meta_widget as mw
from meta_widget.data.flatten import named_tensors

Inputs = tuple[tuple[Any, ...], dict[str, Any]]


@dataclass
class Case:
    """One zoo row: how to build the model and its inputs, and what to compare."""

    name: str
    family: str
    build: Callable[[], nn.Module]
    inputs: Callable[[], Inputs]
    #: why the training step is not compared (None: it is)
    no_training: str | None = None
    #: values for sites the trace cannot decide (``mw.analyze(assume=...)``)
    assume: dict[str, Any] = field(default_factory=dict)
    #: the loss of a training step (default: the sum of every floating output)
    loss: Callable[[Any], torch.Tensor] | None = None


CASES: list[Case] = []


def case(
    name: str, family: str, inputs: Callable[[], Inputs], **kw: Any
) -> Callable[[Callable[[], nn.Module]], Callable[[], nn.Module]]:
    """Register ``build`` as a zoo row."""

    def wrap(build: Callable[[], nn.Module]) -> Callable[[], nn.Module]:
        CASES.append(Case(name, family, build, inputs, **kw))
        return build

    return wrap


def image(b: int = 2, size: int = 64, c: int = 3) -> Callable[[], Inputs]:
    return lambda: ((torch.randn(b, c, size, size),), {})


def ids(b: int = 2, t: int = 16, vocab: int = 100, **extra: Any) -> Callable[[], Inputs]:
    return lambda: ((), {"input_ids": torch.randint(3, vocab, (b, t)), **extra})


# ---------------------------------------------------------------------------------------------
# plain torch


@case("MLP", "torch", lambda: ((torch.randn(16, 64),), {}))
def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 256), nn.Linear(256, 10))


@case("CNN + BatchNorm", "torch", image(4, 32))
def _cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 10),
    )


def _encoder() -> nn.Module:
    layer = nn.TransformerEncoderLayer(128, 4, 256, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, 4)


def _padding() -> Inputs:
    mask = torch.zeros(4, 64, dtype=torch.bool)
    mask[1, 60:] = True  # a little padding at the end of one sequence
    return (), {"src": torch.randn(4, 64, 128), "src_key_padding_mask": mask}


case("TransformerEncoder", "torch", lambda: ((torch.randn(4, 64, 128),), {}))(_encoder)
case("TransformerEncoder + padding mask", "torch", _padding)(_encoder)


class _Recurrent(nn.Module):
    def __init__(self, kind: type[nn.Module]) -> None:
        super().__init__()
        self.rnn = kind(32, 64, num_layers=2, batch_first=True)
        self.head = nn.Linear(64, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(x)[0])


case("LSTM (2 layers)", "torch", lambda: ((torch.randn(4, 50, 32),), {}))(
    lambda: _Recurrent(nn.LSTM)
)
case("GRU (2 layers)", "torch", lambda: ((torch.randn(4, 50, 32),), {}))(lambda: _Recurrent(nn.GRU))


class _Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mha = nn.MultiheadAttention(64, 4, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mha(x, x, x, need_weights=False)[0]


case("MultiheadAttention", "torch", lambda: ((torch.randn(4, 64, 64),), {}))(_Attention)


class _Causal(nn.Module):
    """A block that builds its causal mask and positions without a device."""

    def __init__(self) -> None:
        super().__init__()
        self.emb, self.pos = nn.Embedding(100, 64), nn.Embedding(128, 64)
        self.qkv, self.out = nn.Linear(64, 192), nn.Linear(64, 100)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        x = self.emb(ids) + self.pos(torch.arange(t))
        q, k, v = self.qkv(x).chunk(3, -1)
        mask = torch.full((t, t), float("-inf")).triu(1)
        att = (q @ k.transpose(1, 2) / 8 + mask).softmax(-1)
        return self.out(att @ v)


case("Causal block, device-less mask", "torch", lambda: ((torch.randint(0, 100, (2, 64)),), {}))(
    _Causal
)


# ---------------------------------------------------------------------------------------------
# torchvision


def _tv() -> Any:
    import torchvision

    return torchvision


for _name, _make in {
    "resnet18": lambda: _tv().models.resnet18(num_classes=10),
    "mobilenet_v3_small": lambda: _tv().models.mobilenet_v3_small(num_classes=10),
    "efficientnet_b0": lambda: _tv().models.efficientnet_b0(num_classes=10),
    "squeezenet1_1": lambda: _tv().models.squeezenet1_1(num_classes=10),
    "shufflenet_v2_x0_5": lambda: _tv().models.shufflenet_v2_x0_5(num_classes=10),
    "regnet_y_400mf": lambda: _tv().models.regnet_y_400mf(num_classes=10),
    "densenet121": lambda: _tv().models.densenet121(num_classes=10),
    "convnext_tiny": lambda: _tv().models.convnext_tiny(num_classes=10),
}.items():
    case(f"torchvision {_name}", "torchvision", image(2, 64))(_make)


@case("torchvision ViT (MHA)", "torchvision", image(2, 32))
def _vit() -> nn.Module:
    return _tv().models.VisionTransformer(
        image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=64, mlp_dim=128
    )


@case("torchvision swin_t", "torchvision", image(1, 64))
def _swin() -> nn.Module:
    return _tv().models.swin_t(num_classes=10)


@case("torchvision deeplabv3_mobilenet_v3", "torchvision", image(2, 64))
def _deeplab() -> nn.Module:
    return _tv().models.segmentation.deeplabv3_mobilenet_v3_large(
        weights=None, weights_backbone=None, num_classes=5, aux_loss=False
    )


_EVAL_ONLY = "eval only (training needs targets)"


def _detection_input() -> Inputs:
    return ([torch.rand(3, 128, 128)],), {}


@case(
    "torchvision fasterrcnn_mobilenet_v3", "torchvision", _detection_input, no_training=_EVAL_ONLY
)
def _faster() -> nn.Module:
    return _tv().models.detection.fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None, num_classes=5
    )


@case(
    "torchvision fasterrcnn_resnet50_fpn", "torchvision", _detection_input, no_training=_EVAL_ONLY
)
def _faster50() -> nn.Module:
    return _tv().models.detection.fasterrcnn_resnet50_fpn(
        weights=None, weights_backbone=None, num_classes=5, min_size=128, max_size=128
    )


#: pasting each detection's mask reads its box as numbers (``int(box[2] - box[0] + 1)``, box
#: slices): given through ``assume=`` at the sites the analysis names (a 28 x 28 mask pasted
#: empty at the image's edge: one key answers both ends of each slice)
_PASTE = {"roi_heads.py:418": 28, "roi_heads.py:419": 28, "roi_heads.py:436": 128}


@case(
    "torchvision maskrcnn_resnet50_fpn",
    "torchvision",
    _detection_input,
    no_training=_EVAL_ONLY + "; box sizes given by assume=",
    assume=_PASTE,
)
def _mask() -> nn.Module:
    return _tv().models.detection.maskrcnn_resnet50_fpn(
        weights=None, weights_backbone=None, num_classes=5, min_size=128, max_size=128
    )


@case("torchvision ssdlite320", "torchvision", _detection_input, no_training=_EVAL_ONLY)
def _ssd() -> nn.Module:
    return _tv().models.detection.ssdlite320_mobilenet_v3_large(
        weights=None, weights_backbone=None, num_classes=5
    )


# ---------------------------------------------------------------------------------------------
# timm


def _timm(name: str, **kw: Any) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import timm

        return timm.create_model(name, pretrained=False, num_classes=10, **kw)  # type: ignore[no-any-return]

    return build


for _name, _kw, _size in [
    ("vit_tiny_patch16_224", {"img_size": 64}, 64),
    ("deit_tiny_patch16_224", {"img_size": 64}, 64),
    ("convnext_atto", {}, 64),
    ("resnet10t", {}, 64),
    ("efficientnet_b0", {}, 64),
    ("mobilevitv2_050", {}, 64),
    ("regnetx_002", {}, 64),
]:
    case(f"timm {_name}", "timm", image(2, _size))(_timm(_name, **_kw))


# ---------------------------------------------------------------------------------------------
# diffusers


@case(
    "diffusers UNet2DModel",
    "diffusers",
    lambda: ((torch.randn(2, 3, 32, 32), torch.tensor([10, 20])), {}),
    loss=lambda out: out.sample.sum(),
)
def _unet2d() -> nn.Module:
    import diffusers

    return diffusers.UNet2DModel(  # type: ignore[no-any-return]
        sample_size=32,
        block_out_channels=(32, 64),
        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        layers_per_block=1,
        norm_num_groups=8,
    )


@case(
    "diffusers UNet2DConditionModel",
    "diffusers",
    lambda: ((torch.randn(2, 4, 16, 16), torch.tensor([10, 20]), torch.randn(2, 8, 32)), {}),
    loss=lambda out: out.sample.sum(),
)
def _unet_cond() -> nn.Module:
    import diffusers

    return diffusers.UNet2DConditionModel(  # type: ignore[no-any-return]
        sample_size=16,
        block_out_channels=(32, 64),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        layers_per_block=1,
        cross_attention_dim=32,
        attention_head_dim=8,
        norm_num_groups=8,
    )


@case(
    "diffusers AutoencoderKL",
    "diffusers",
    image(1, 32),
    loss=lambda out: out.sample.sum(),
)
def _vae() -> nn.Module:
    import diffusers

    return diffusers.AutoencoderKL(  # type: ignore[no-any-return]
        block_out_channels=(32, 64),
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        latent_channels=4,
        norm_num_groups=8,
    )


@case(
    "diffusers DiTTransformer2DModel",
    "diffusers",
    lambda: (
        (),
        {
            "hidden_states": torch.randn(2, 4, 16, 16),
            "timestep": torch.tensor([10, 20]),
            "class_labels": torch.tensor([1, 2]),
        },
    ),
    loss=lambda out: out.sample.sum(),
)
def _dit() -> nn.Module:
    import diffusers

    return diffusers.DiTTransformer2DModel(  # type: ignore[no-any-return]
        num_attention_heads=2,
        attention_head_dim=16,
        in_channels=4,
        num_layers=2,
        sample_size=16,
        patch_size=2,
        num_embeds_ada_norm=10,
    )


# ---------------------------------------------------------------------------------------------
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


# ---------------------------------------------------------------------------------------------
# running a row


def real_forward(model: nn.Module, inputs: Inputs) -> tuple[list[Any], int, int]:
    """Output shapes of every module call, MemTracker's peak and FlopCounterMode's FLOPs of an
    eval forward under ``no_grad``."""
    args, kwargs = inputs
    model = model.eval()
    names = {id(m): n for n, m in model.named_modules()}
    shapes: list[Any] = []  # in call start order, as the analysis lists calls
    open_calls: list[int] = []

    def pre(m: nn.Module, a: Any) -> None:
        open_calls.append(len(shapes))
        shapes.append((names.get(id(m), "?"), None))

    def post(m: nn.Module, a: Any, out: Any) -> None:
        i = open_calls.pop()
        found = named_tensors(out, caches=not open_calls)
        shapes[i] = (
            shapes[i][0],
            [("nested",) if t.is_nested else tuple(t.shape) for _, t in found],
        )

    handles = [m.register_forward_pre_hook(pre) for m in model.modules()]
    handles += [m.register_forward_hook(post) for m in model.modules()]
    try:
        with torch.no_grad():
            model(*args, **kwargs)
    finally:
        for h in handles:
            h.remove()
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as fc:
        model(*args, **kwargs)
    return shapes, _peak(model, inputs, training=False), int(fc.get_total_flops())


def _peak(model: nn.Module, inputs: Inputs, training: bool, loss: Any = None) -> int:
    args, kwargs = inputs
    model = copy.deepcopy(model).train(training)
    tracker = MemTracker()
    tensors = [t for _, t in named_tensors((args, kwargs))]
    frozen = [p for p in model.parameters() if not p.requires_grad]
    if frozen and training:
        raise RuntimeError("MemTracker cannot track a training step with frozen parameters")
    for p in frozen:  # MemTracker hooks every parameter's grad (no effect under no_grad)
        p.requires_grad_(True)
    tracker.track_external(model, *tensors)
    with tracker, torch.set_grad_enabled(training):
        out = model(*args, **kwargs)
        if training:
            value = (loss or mw_loss)(out)
            value.backward()
            del value
        peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]
    del out
    return int(peak["Total"])


def mw_loss(out: Any) -> torch.Tensor:
    from meta_widget.trace.passes import default_loss

    return default_loss(out)


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.3f}" if b else ("1.000" if not a else "—")


def run_case(c: Case) -> dict[str, str]:
    torch.manual_seed(0)
    model = c.build()
    inputs = c.inputs()
    params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    shapes, infer_peak, flops = real_forward(model, inputs)
    a = mw.analyze(model, input_data=_as_data(inputs), device="cpu", assume=c.assume or None)
    row = {"model": c.name, "family": c.family}
    if a.error is not None:
        row["note"] = f"inference: {a.error.title}: {str(a.error.message).splitlines()[0][:120]}"
        return row
    mine = [
        (x.path, [info.shape for _, info in x.outputs]) for x in a.calls if x.phase == "forward"
    ]
    same = sum(1 for m, r in zip(mine, shapes, strict=False) if m == r)
    row["calls"] = f"{same}/{len(shapes)}" + (
        "" if len(mine) == len(shapes) else f" (ours {len(mine)})"
    )
    row["params"] = "=" if a.total_params == params else f"{a.total_params}≠{params}"
    row["flops"] = _ratio(a.total_flops, flops)
    row["inference"] = _ratio(a.peak_bytes, infer_peak)
    row["assumed"] = str(len(a.assumptions)) if a.assumptions else ""
    if c.no_training is not None:
        row["training"] = "—"
        row["note"] = c.no_training
        return row
    b = mw.analyze(
        model,
        input_data=_as_data(inputs),
        mode="training",
        optimizer=None,
        device="cpu",
        loss=c.loss,
        assume=c.assume or None,
    )
    if b.error is not None:
        row["training"] = "error"
        row["note"] = f"training: {b.error.title}"
        return row
    try:
        real = _peak(model, inputs, training=True, loss=c.loss)
    except RuntimeError as exc:  # the truth cannot be measured: say why
        row["training"], row["note"] = "—", str(exc)
        return row
    row["training"] = _ratio(b.peak_bytes, real)
    return row


def _as_data(inputs: Inputs) -> Any:
    args, kwargs = inputs
    if kwargs and not args:
        return kwargs
    if kwargs:
        raise ValueError("a zoo row passes positional or keyword inputs, not both")
    return args


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="run the rows whose name contains this")
    parser.add_argument("--family", default="", help="run one family (torch, timm, ...)")
    parser.add_argument("--markdown", default="", help="also write the table to this file")
    opts = parser.parse_args(argv)
    cols = ["model", "calls", "params", "flops", "inference", "training", "assumed", "note"]
    head = [
        "model",
        "shapes (calls equal)",
        "params",
        "FLOPs ratio",
        "inference peak ratio",
        "training peak ratio",
        "assumptions",
        "note",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    print(f"torch {torch.__version__}", file=sys.stderr)
    for c in CASES:
        if (opts.only and opts.only not in c.name) or (opts.family and opts.family != c.family):
            continue
        start = time.perf_counter()
        try:
            row = run_case(c)
        except Exception as exc:  # a row that cannot run says why, and the zoo goes on
            traceback.print_exc()
            row = {
                "model": c.name,
                "note": f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}",
            }
        gc.collect()
        line = "| " + " | ".join(row.get(k, "") for k in cols) + " |"
        lines.append(line)
        print(line, f"({time.perf_counter() - start:.1f} s)", file=sys.stderr, flush=True)
    table = "\n".join(lines)
    print(table)
    if opts.markdown:
        with open(opts.markdown, "w") as f:
            f.write(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
