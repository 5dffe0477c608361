"""Pipelines: a tiny diffusers StableDiffusionPipeline built from small configs in code (no
download), analyzed part by part. Each part's numbers are checked against the real part (its
parameters summed here) and against ``mw.analyze`` of that part alone; the totals against sums
over the real parts; a folder written by ``save_config`` builds on meta with no weights."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import meta_widget as mw

diffusers = pytest.importorskip("diffusers")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def pipe() -> Any:
    torch.manual_seed(0)
    unet = diffusers.UNet2DConditionModel(
        block_out_channels=(8, 16), layers_per_block=1, sample_size=8, in_channels=4,
        out_channels=4, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), cross_attention_dim=16,
        attention_head_dim=2, norm_num_groups=4,
    )  # fmt: skip
    vae = diffusers.AutoencoderKL(
        block_out_channels=(8, 16), in_channels=3, out_channels=3, latent_channels=4,
        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
        norm_num_groups=4, sample_size=16,
    )  # fmt: skip
    text = transformers.CLIPTextModel(
        transformers.CLIPTextConfig(
            hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
            vocab_size=100, max_position_embeddings=20, bos_token_id=0, eos_token_id=1,
        )
    )  # fmt: skip
    return diffusers.StableDiffusionPipeline(
        vae=vae, text_encoder=text, tokenizer=None, unet=unet,
        scheduler=diffusers.DDIMScheduler(steps_offset=1, clip_sample=False),
        safety_checker=None, feature_extractor=None, requires_safety_checker=False,
    )  # fmt: skip


def weights(m: nn.Module) -> int:
    """Parameter and buffer bytes of a real module, each storage once."""
    seen = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in m.parameters()}
    seen.update({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in m.buffers()})
    return sum(seen.values())


def unet_inputs(text_tokens: int) -> dict[str, torch.Tensor]:
    """The UNet's inputs written out from its config (sample_size 8, 4 channels, 16 dims)."""
    return {
        "sample": torch.zeros(1, 4, 8, 8),
        "timestep": torch.tensor([1]),
        "encoder_hidden_states": torch.zeros(1, text_tokens, 16),
    }


def test_each_part_and_the_totals_match_the_real_parts(pipe: Any) -> None:
    p = mw.analyze_pipeline(pipe)
    assert list(p.parts) == ["vae", "text_encoder", "unet"]
    real = {"vae": pipe.vae, "text_encoder": pipe.text_encoder, "unet": pipe.unet}
    for name, module in real.items():
        assert p[name].total_params == sum(t.numel() for t in module.parameters()), name
        assert p[name].param_bytes == sum(t.nbytes for t in module.parameters()), name
        assert p[name].traced, name  # each part got default inputs from its config
    assert p.total_params == sum(t.numel() for m in real.values() for t in m.parameters())
    assert p.weight_bytes == sum(weights(m) for m in real.values())
    frame = p.to_dataframe()
    assert list(frame["part"]) == list(real)
    assert frame["params"].sum() == p.total_params
    assert "total" in p.summary() and "unet" in p.summary()


def test_each_part_peak_is_that_part_analyzed_alone_and_the_peak_adds_up(pipe: Any) -> None:
    p = mw.analyze_pipeline(pipe)
    # the defaults written out: the text encoder's 20 positions feed the UNet's 20 tokens
    alone = {
        "vae": mw.analyze(pipe.vae, input_data={"sample": torch.zeros(1, 3, 16, 16)}),
        "text_encoder": mw.analyze(
            pipe.text_encoder, input_data={"input_ids": torch.zeros(1, 20, dtype=torch.long)}
        ),
        "unet": mw.analyze(pipe.unet, input_data=unet_inputs(20)),
    }
    for name, a in alone.items():
        assert p[name].peak_bytes == a.peak_bytes, name
        assert p[name].total_flops == a.total_flops, name
    resident = sum(weights(m) for m in (pipe.vae, pipe.text_encoder, pipe.unet))
    excess = {
        "vae": alone["vae"].peak_bytes - weights(pipe.vae),
        "text_encoder": alone["text_encoder"].peak_bytes - weights(pipe.text_encoder),
        "unet": alone["unet"].peak_bytes - weights(pipe.unet),
    }
    assert p.peak_bytes == resident + max(excess.values())
    assert p.peak_part == max(excess, key=excess.__getitem__)


def test_inputs_given_per_part(pipe: Any) -> None:
    p = mw.analyze_pipeline(pipe, inputs={"text_encoder": (1, 7), "unet": unet_inputs(7)})
    te = mw.analyze(pipe.text_encoder, input_size=(1, 7))
    assert p["text_encoder"].peak_bytes == te.peak_bytes
    assert p["text_encoder"].to_dataframe()["input_shapes"][0] == [[(1, 7)]]  # one call
    assert p["unet"].peak_bytes == mw.analyze(pipe.unet, input_data=unet_inputs(7)).peak_bytes
    with pytest.raises(mw.PipelineError, match="no such part"):
        mw.analyze_pipeline(pipe, inputs={"unett": (1, 7)})


def test_a_config_folder_builds_on_meta_without_weights(pipe: Any, tmp_path: Path) -> None:
    pipe.save_config(tmp_path)  # model_index.json only
    pipe.unet.save_config(tmp_path / "unet")
    pipe.vae.save_config(tmp_path / "vae")
    os.makedirs(tmp_path / "text_encoder")
    pipe.text_encoder.config.to_json_file(tmp_path / "text_encoder" / "config.json")
    assert not list(tmp_path.rglob("*.safetensors")) and not list(tmp_path.rglob("*.bin"))
    p = mw.analyze_pipeline(tmp_path)
    assert sorted(p.parts) == ["text_encoder", "unet", "vae"]
    for name in p.parts:
        real = getattr(pipe, name)
        assert p[name].total_params == sum(t.numel() for t in real.parameters()), name
        assert p[name].source == "factory", name  # built from its config on meta
        assert p[name].traced, name
    assert p["unet"].peak_bytes == mw.analyze(pipe.unet, input_data=unet_inputs(20)).peak_bytes


def test_a_plain_object_or_dict_of_modules() -> None:
    class TwoTowers:
        def __init__(self) -> None:
            self.image = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
            self.text = nn.Embedding(50, 4)
            self.scale = 2.0

    towers = TwoTowers()
    p = mw.analyze_pipeline(towers, inputs={"image": (2, 8)})
    assert list(p.parts) == ["image", "text"]
    assert p["image"].peak_bytes == mw.analyze(towers.image, input_size=(2, 8)).peak_bytes
    assert not p["text"].traced  # no inputs and no config: parameters only
    assert p.total_params == sum(t.numel() for t in towers.image.parameters()) + 200
    d = mw.analyze_pipeline({"a": towers.image, "b": towers.image})  # one module, one part
    assert list(d.parts) == ["a"]
    with pytest.raises(mw.PipelineError, match=r"holds no nn\.Module"):
        mw.analyze_pipeline(object())


def test_analyze_points_a_pipeline_to_analyze_pipeline(pipe: Any) -> None:
    with pytest.raises(mw.SourceError, match="analyze_pipeline"):
        mw.analyze(pipe)
