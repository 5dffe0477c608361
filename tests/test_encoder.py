"""``nn.TransformerEncoder`` with a padding mask traces (its left-aligned check is a recorded
truth assumption); in training, where PyTorch takes no fused path, its peak is the real one; in
inference the fused kernels' steps give the peak the CPU allocator measures."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from truth import allocator_peak, real_peak

import meta_widget as mw


def encoder() -> nn.Module:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, 2)


def inputs() -> tuple[torch.Tensor, torch.Tensor]:
    mask = torch.zeros(4, 32, dtype=torch.bool)
    mask[1, 28:] = True  # padding at the end of one sequence: left-aligned
    return torch.randn(4, 32, 64), mask


def test_a_meta_padding_mask_traces_under_recorded_assumptions() -> None:
    """A mask given as a meta tensor has no values: its left-aligned check is a truth
    assumption, and packing keeps every token (the bound)."""
    model, (x, mask) = encoder(), inputs()
    data = {"src": x, "src_key_padding_mask": mask.to("meta")}
    a = mw.analyze(model, input_data=data, device="cpu")
    assert a.error is None, a.error
    check, kept = a.assumptions
    assert check.op == "padding mask left-aligned" and check.value == "True"
    assert check.where == "TransformerEncoder"
    assert (kept.op, kept.value) == ("masked_select", "every element selected")
    with torch.no_grad():
        real = model.eval()(x, src_key_padding_mask=mask)
    assert a.calls[0].outputs[0][1].shape == tuple(real.shape)
    off = mw.analyze(model, input_data=data, device="cpu", assume={"TransformerEncoder": False})
    assert off.error is None and off.assumptions[0].value == "False"


def test_a_real_padding_mask_is_read_not_assumed() -> None:
    """The user's own mask: its lengths and left-alignment are read from it (nothing assumed),
    and the mask itself is left as it was."""
    model, (x, mask) = encoder(), inputs()
    before = mask.clone()
    a = mw.analyze(model, input_data={"src": x, "src_key_padding_mask": mask}, device="cpu")
    assert a.error is None, a.error
    assert a.assumptions == []
    assert torch.equal(mask, before)
    with torch.no_grad():
        real = model.eval()(x, src_key_padding_mask=mask)
    assert a.calls[0].outputs[0][1].shape == tuple(real.shape)
    # padding at the start of a sequence is not left-aligned: PyTorch does not pack, nor the trace
    flipped = mask.flip(1)
    b = mw.analyze(model, input_data={"src": x, "src_key_padding_mask": flipped}, device="cpu")
    assert b.error is None, b.error
    assert b.assumptions == []
    assert "aten.masked_select" not in {op for _, _, op in b.memory.timeline}
    assert b.peak_bytes == allocator_peak(model, (x,), {"src_key_padding_mask": flipped})


def test_training_with_a_padding_mask_has_the_real_peak() -> None:
    model, (x, mask) = encoder(), inputs()
    data = {"src": x, "src_key_padding_mask": mask}
    a = mw.analyze(model, input_data=data, mode="training", optimizer=None, device="cpu")
    assert a.error is None, a.error
    assert a.peak_bytes == real_peak(model, (x,), {"src_key_padding_mask": mask}, training=True)


def test_inference_runs_the_fused_encoder_layer_kernels_steps() -> None:
    """The fast path's steps: packed projection, fused attention, ``addmm`` + activation; none of
    the unfused layer's separate projections (``tests/test_cuda_truth.py`` checks the peak
    against a real H200)."""
    model, (x, _) = encoder(), inputs()
    a = mw.analyze(model, input_data=(x,), device="cpu")
    assert a.error is None, a.error
    ops = {op for _, _, op in a.memory.timeline}
    assert "aten._addmm_activation" in ops
    assert "aten.bmm" in ops  # the CPU kernel's math branch (scores, then context)
    assert "aten._scaled_dot_product_flash_attention_for_cpu" not in ops
    with torch.no_grad():
        real = model.eval()(x)
    assert a.calls[0].outputs[0][1].shape == tuple(real.shape)
    assert a.total_flops == mw.analyze(model, input_data=(x,), device="math").total_flops
    training = mw.analyze(model, input_data=(x,), mode="training", optimizer=None, device="cpu")
    assert "aten._addmm_activation" not in {op for _, _, op in training.memory.timeline}


def test_a_users_hook_keeps_the_layer_off_the_fast_path_as_pytorch_does() -> None:
    model, (x, _) = encoder(), inputs()
    model.layers[0].linear1.register_forward_hook(lambda *a: None)
    a = mw.analyze(model, input_data=(x,), device="cpu")
    assert a.error is None, a.error
    calls = {c.path for c in a.calls}
    assert "layers.0.linear1" in calls and "layers.1.linear1" not in calls


class SelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attn(x, x, x, need_weights=False)[0]


@pytest.mark.parametrize(
    "dim, heads, ff, layers, norm_first, activation, batch, tokens",
    [
        (64, 4, 128, 2, False, "relu", 4, 32),
        (256, 8, 1024, 2, True, "gelu", 2, 128),
        (128, 2, 512, 3, False, "gelu", 3, 50),
    ],
)
def test_encoder_inference_peak_equals_the_cpu_allocators(
    dim: int,
    heads: int,
    ff: int,
    layers: int,
    norm_first: bool,
    activation: str,
    batch: int,
    tokens: int,
) -> None:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(
        dim, heads, ff, 0.0, activation, batch_first=True, norm_first=norm_first
    )
    model = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False).eval()
    x = torch.randn(batch, tokens, dim)
    a = mw.analyze(model, input_data=(x,), device="cpu")
    assert a.error is None, a.error
    truth = allocator_peak(model, (x,))
    assert a.peak_bytes == truth
    # MemTracker sees only each dispatched op's outputs, not the fused kernel's own buffers
    assert real_peak(model, (x,)) < truth


@pytest.mark.parametrize("dim, heads, batch, tokens", [(256, 8, 8, 197), (64, 4, 4, 32)])
def test_attention_inference_peak_equals_the_cpu_allocators(
    dim: int, heads: int, batch: int, tokens: int
) -> None:
    torch.manual_seed(0)
    model, x = SelfAttention(dim, heads).eval(), torch.randn(batch, tokens, dim)
    a = mw.analyze(model, input_data=(x,), device="cpu")
    assert a.error is None, a.error
    assert a.peak_bytes == allocator_peak(model, (x,))


def padded_encoder(
    dim: int, heads: int, ff: int, layers: int, batch: int, tokens: int
) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(dim, heads, ff, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, layers).eval(), torch.randn(batch, tokens, dim)


ENCODERS = [(64, 4, 128, 2, 4, 32), (256, 8, 1024, 2, 2, 128), (512, 8, 2048, 2, 4, 64)]


@pytest.mark.parametrize("dim, heads, ff, layers, batch, tokens", ENCODERS)
def test_a_padding_mask_takes_the_nested_path_and_its_peak_is_the_cpu_allocators(
    dim: int, heads: int, ff: int, layers: int, batch: int, tokens: int
) -> None:
    """With a padding mask the encoder packs the kept tokens into a nested tensor. Given the
    real mask, the trace packs as many: within 0.2 % of the allocator's peak, whatever the
    padding (a few bytes of nested-tensor metadata are not counted). Given a meta mask, every
    token is kept with one sequence a token short: never far under any mask's real peak."""
    model, x = padded_encoder(dim, heads, ff, layers, batch, tokens)
    bound = mw.analyze(
        model,
        input_data={
            "src": x,
            "src_key_padding_mask": torch.zeros(batch, tokens, dtype=torch.bool, device="meta"),
        },
        device="cpu",
    )
    assert bound.error is None, bound.error
    for padding in (0, 1, 4, tokens // 2):
        mask = torch.zeros(batch, tokens, dtype=torch.bool)
        mask[1, tokens - padding :] = True
        kwargs = {"src_key_padding_mask": mask}
        a = mw.analyze(model, input_data={"src": x, **kwargs}, device="cpu")
        assert a.error is None, a.error
        truth = allocator_peak(model, (x,), kwargs)
        assert a.peak_bytes == pytest.approx(truth, rel=0.002), padding
        assert a.peak_bytes <= truth
        assert bound.peak_bytes >= truth * 0.998, padding
    ops = {op for _, _, op in a.memory.timeline}
    assert "aten.bmm" in ops and "aten._addmm_activation" in ops


def test_layers_fused_with_a_padding_mask_when_the_encoder_does_not_pack() -> None:
    """``enable_nested_tensor=False``: each layer gets the mask and runs fused with it (the
    CPU kernel's masked softmax makes a new buffer of the scores)."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    x, mask = inputs()[0], inputs()[1]
    kwargs = {"src_key_padding_mask": mask}
    a = mw.analyze(model, input_data={"src": x, **kwargs}, device="cpu")
    assert a.error is None, a.error
    assert a.peak_bytes == allocator_peak(model, (x,), kwargs)
