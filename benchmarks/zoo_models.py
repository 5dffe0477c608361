"""The model zoo's rows: small configs of real architectures (plain torch, torchvision, timm,
diffusers, transformers; no weights downloaded), each with its inputs and what to compare.
``benchmarks/zoo.py`` runs them; see its docstring.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

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
