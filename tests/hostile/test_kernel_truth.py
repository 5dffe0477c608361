"""Kernels modelled on meta against the real CPU (issue 23's blind spots).

- Autocast: each op's output dtype under ``meta_widget.trace.autocast.Autocast`` on meta equals its
  output dtype under a real ``torch.autocast("cpu")`` on real CPU tensors, op by op (losses,
  matmuls, convolutions, pooling, padding, linear algebra, FFTs, promotions), whatever group
  the table files each op under.
- ``nn.MultiheadAttention`` / ``nn.TransformerEncoderLayer`` with an odd head count: PyTorch
  leaves the fused fast path ("self.num_heads is not even"); with an even one, the CPU takes it
  whatever the head size. The trace's peak is the CPU allocator's (profiler memory events).
- ``nn.GRU`` with dropout in training: dropout between layers only, as PyTorch's CPU code; the
  trace's peak is ``MemTracker``'s on a real step.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch.distributed._tools.mem_tracker import MemTracker
from torch.nn import functional as F
from truth import allocator_peak, real_peak

import meta_widget as mw
from meta_widget.trace.autocast import Autocast

# -- autocast, op by op -------------------------------------------------------------------------

Floats = Callable[..., torch.Tensor]
Ints = Callable[..., torch.Tensor]


def _matmuls(t: Floats) -> dict[str, Callable[[], Any]]:
    return {
        "linear": lambda: F.linear(t(2, 8), t(4, 8), t(4)),
        "@": lambda: t(2, 8) @ t(8, 3),
        "mm": lambda: torch.mm(t(2, 8), t(8, 3)),
        "bmm": lambda: torch.bmm(t(2, 2, 8), t(2, 8, 3)),
        "baddbmm": lambda: torch.baddbmm(t(2, 2, 3), t(2, 2, 8), t(2, 8, 3)),
        "addmm": lambda: torch.addmm(t(2, 3), t(2, 8), t(8, 3)),
        "addbmm": lambda: torch.addbmm(t(2, 3), t(2, 2, 8), t(2, 8, 3)),
        "conv1d": lambda: F.conv1d(t(1, 3, 8), t(4, 3, 3)),
        "conv2d": lambda: F.conv2d(t(1, 3, 8, 8), t(4, 3, 3, 3), t(4)),
        "conv3d": lambda: F.conv3d(t(1, 3, 4, 4, 4), t(4, 3, 3, 3, 3)),
        "conv_transpose1d": lambda: F.conv_transpose1d(t(1, 3, 8), t(3, 4, 3)),
        "conv_transpose2d": lambda: F.conv_transpose2d(t(1, 3, 8, 8), t(3, 4, 3, 3)),
        "prelu": lambda: F.prelu(t(2, 3), t(3)),
        "sdpa": lambda: F.scaled_dot_product_attention(t(1, 2, 4, 8), t(1, 2, 4, 8), t(1, 2, 4, 8)),
        "einsum": lambda: torch.einsum("bij,bjk->bik", t(2, 2, 8), t(2, 8, 3)),
        "tensordot": lambda: torch.tensordot(t(2, 8), t(8, 3), dims=1),
        "linalg.vecdot": lambda: torch.linalg.vecdot(t(2, 8), t(2, 8)),
        "multi_head_attention_forward": lambda: _mha(t),
    }


def _mha(t: Floats) -> torch.Tensor:
    """``F.multi_head_attention_forward``: 2 heads of 4, packed projection, biases."""
    x, w, b = t(4, 1, 8), t(24, 8), t(24)
    out = F.multi_head_attention_forward(
        x, x, x, 8, 2, w, b, None, None, False, 0.0, t(8, 8), t(8), need_weights=False
    )
    return out[0]


def _losses(t: Floats, i: Ints) -> dict[str, Callable[[], Any]]:
    return {
        "cross_entropy": lambda: F.cross_entropy(t(4, 5), i(4, high=5)),
        "cross_entropy, soft targets": lambda: F.cross_entropy(t(4, 5), t(4, 5)),
        "CrossEntropyLoss": lambda: nn.CrossEntropyLoss()(t(4, 5), i(4, high=5)),
        "nll_loss": lambda: F.nll_loss(t(4, 5), i(4, high=5)),
        "nll_loss2d": lambda: F.nll_loss(t(2, 5, 3, 3), i(2, 3, 3, high=5)),
        "mse_loss": lambda: F.mse_loss(t(4), t(4)),
        "l1_loss": lambda: F.l1_loss(t(4), t(4)),
        "smooth_l1_loss": lambda: F.smooth_l1_loss(t(4), t(4)),
        "huber_loss": lambda: F.huber_loss(t(4), t(4)),
        "kl_div": lambda: F.kl_div(t(4), t(4), reduction="batchmean"),
        "binary_cross_entropy": lambda: F.binary_cross_entropy(t(4), t(4)),
        "bce_with_logits": lambda: F.binary_cross_entropy_with_logits(t(4), t(4)),
        "margin_ranking_loss": lambda: F.margin_ranking_loss(t(4), t(4), t(4)),
        "soft_margin_loss": lambda: F.soft_margin_loss(t(4), t(4)),
        "hinge_embedding_loss": lambda: F.hinge_embedding_loss(t(4), t(4)),
        "cosine_embedding_loss": lambda: F.cosine_embedding_loss(t(3, 4), t(3, 4), t(3)),
        "triplet_margin_loss": lambda: F.triplet_margin_loss(t(3, 4), t(3, 4), t(3, 4)),
        "multi_margin_loss": lambda: F.multi_margin_loss(t(4, 5), i(4, high=5)),
        "multilabel_margin_loss": lambda: F.multilabel_margin_loss(t(4, 5), i(4, 5, high=5)),
        "poisson_nll_loss": lambda: F.poisson_nll_loss(t(4), t(4)),
    }


def _pooling_and_padding(t: Floats) -> dict[str, Callable[[], Any]]:
    return {
        "avg_pool3d": lambda: F.avg_pool3d(t(1, 2, 4, 4, 4), 2),
        "max_pool3d": lambda: F.max_pool3d(t(1, 2, 4, 4, 4), 2),
        "adaptive_avg_pool3d": lambda: F.adaptive_avg_pool3d(t(1, 2, 4, 4, 4), 2),
        "adaptive_max_pool3d": lambda: F.adaptive_max_pool3d(t(1, 2, 4, 4, 4), 2),
        "fractional_max_pool2d": lambda: F.fractional_max_pool2d(t(1, 1, 8, 8), 2, output_size=4),
        "fractional_max_pool3d": lambda: F.fractional_max_pool3d(
            t(1, 1, 8, 8, 8), 2, output_size=4
        ),
        "max_unpool2d": lambda: F.max_unpool2d(
            *F.max_pool2d(t(1, 1, 4, 4), 2, return_indices=True), 2
        ),
        "max_unpool3d": lambda: F.max_unpool3d(
            *F.max_pool3d(t(1, 1, 4, 4, 4), 2, return_indices=True), 2
        ),
        "interpolate nearest": lambda: F.interpolate(t(1, 2, 4, 4), scale_factor=2),
        "interpolate bilinear": lambda: F.interpolate(
            t(1, 2, 4, 4), scale_factor=2, mode="bilinear"
        ),
        "interpolate area 2d": lambda: F.interpolate(t(1, 2, 4, 4), size=2, mode="area"),
        "interpolate area 3d": lambda: F.interpolate(t(1, 2, 4, 4, 4), size=2, mode="area"),
        "Upsample trilinear": lambda: nn.Upsample(scale_factor=2, mode="trilinear")(
            t(1, 1, 2, 2, 2)
        ),
        "pad reflect 1d": lambda: F.pad(t(1, 2, 5), (1, 1), mode="reflect"),
        "pad reflect 2d": lambda: F.pad(t(1, 2, 5, 5), (1, 1, 1, 1), mode="reflect"),
        "pad reflect 3d": lambda: F.pad(t(1, 1, 3, 3, 3), (1,) * 6, mode="reflect"),
        "pad replicate 2d": lambda: F.pad(t(1, 2, 5, 5), (1, 1, 1, 1), mode="replicate"),
        "pad replicate 3d": lambda: F.pad(t(1, 2, 3, 3, 3), (1,) * 6, mode="replicate"),
        "pad circular": lambda: F.pad(t(1, 1, 3, 3), (1,) * 4, mode="circular"),
        "pad constant": lambda: F.pad(t(1, 1, 3, 3), (1,) * 4),
        "ReflectionPad2d": lambda: nn.ReflectionPad2d(1)(t(1, 2, 5, 5)),
        "ReplicationPad1d": lambda: nn.ReplicationPad1d(1)(t(1, 2, 5)),
        "grid_sample 2d": lambda: F.grid_sample(t(1, 2, 4, 4), t(1, 3, 3, 2), align_corners=False),
        "grid_sample 3d": lambda: F.grid_sample(
            t(1, 1, 3, 3, 3), t(1, 2, 2, 2, 3), align_corners=False
        ),
    }


def _linear_algebra_and_more(t: Floats, i: Ints) -> dict[str, Callable[[], Any]]:
    return {
        "cdist": lambda: torch.cdist(t(3, 4), t(5, 4)),
        "prod": lambda: torch.prod(t(4)),
        "trace": lambda: torch.trace(t(3, 3)),
        "inverse": lambda: torch.inverse(t(3, 3)),
        "linalg.inv": lambda: torch.linalg.inv(t(3, 3)),
        "linalg.solve": lambda: torch.linalg.solve(t(3, 3), t(3)),
        "linalg.cholesky": lambda: torch.linalg.cholesky(t(3, 3)),
        "linalg.svd": lambda: torch.linalg.svd(t(3, 3)),
        "linalg.qr": lambda: torch.linalg.qr(t(3, 3)),
        "pinverse": lambda: torch.pinverse(t(3, 3)),
        "lu": lambda: torch.lu(t(3, 3))[0],
        "fft.fft": lambda: torch.fft.fft(t(8)),
        "fft.rfft": lambda: torch.fft.rfft(t(8)),
        "fft.fft2": lambda: torch.fft.fft2(t(4, 4)),
        "stft": lambda: torch.stft(t(64), 16, window=t(16), return_complex=True),
        "polar": lambda: torch.polar(t(3), t(3)),
        "quantile": lambda: torch.quantile(t(5), 0.5),
        "view_as_complex": lambda: torch.view_as_complex(t(3, 2)),
        "cat, mixed": lambda: torch.cat([t(2), t(2, dtype=torch.float32)]),
        "stack, mixed": lambda: torch.stack([t(2), t(2, dtype=torch.float32)]),
        "cat": lambda: torch.cat([t(2), t(2)]),
        "index_copy, mixed": lambda: t(4, 2).index_copy(
            0, i(2, high=4), t(2, 2, dtype=torch.float32)
        ),
        "add": lambda: t(2) + t(2),
        "softmax": lambda: t(2, 3).softmax(-1),
        "layer_norm": lambda: F.layer_norm(t(2, 4), (4,)),
        "sum": lambda: t(3).sum(),
        "exp": lambda: t(3).exp(),
    }


def _cases(t: Floats, i: Ints) -> dict[str, Callable[[], Any]]:
    return {
        **_matmuls(t),
        **_losses(t, i),
        **_pooling_and_padding(t),
        **_linear_algebra_and_more(t, i),
    }


def _dtypes(out: Any) -> list[torch.dtype]:
    if isinstance(out, torch.Tensor):
        return [out.dtype]
    if isinstance(out, (tuple, list)):
        return [d for o in out for d in _dtypes(o)]
    return []


def _output_dtypes(device: str, dtype: torch.dtype) -> dict[str, list[torch.dtype]]:
    """Every case's output dtypes, on ``device``, its floating inputs in ``dtype``: values in
    (0, 1), square matrices made diagonally dominant (invertible, positive definite)."""

    def t(*shape: int, dtype: torch.dtype = dtype) -> torch.Tensor:
        x = torch.rand(shape, generator=torch.Generator().manual_seed(0))
        if len(shape) == 2 and shape[0] == shape[1]:
            x = x + 3 * torch.eye(shape[0])
        return x.to(device=device, dtype=dtype)

    def i(*shape: int, high: int) -> torch.Tensor:
        return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(1)).to(device)

    return {name: _dtypes(case()) for name, case in _cases(t, i).items()}


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("inputs", ["float32", "low"])
@pytest.mark.parametrize("low", [torch.bfloat16, torch.float16])
def test_each_ops_output_dtype_is_real_cpu_autocasts(low: torch.dtype, inputs: str) -> None:
    """Inputs in fp32 or in autocast's own dtype (another 16-bit dtype is refused by autocast
    itself: "Unexpected floating ScalarType")."""
    dtype = low if inputs == "low" else torch.float32
    with torch.autocast("cpu", dtype=low):
        truth = _output_dtypes("cpu", dtype)
    with Autocast("cpu", low):
        traced = _output_dtypes("meta", dtype)
    wrong = {name: (traced[name], truth[name]) for name in truth if traced[name] != truth[name]}
    assert not wrong, wrong
    # the cases reach every cast: low precision, fp32, and kept as they came
    assert {low, torch.float32} <= {d for ds in truth.values() for d in ds}


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(64, 1000)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


def _cross_entropy(out: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out, torch.zeros(out.shape[0], dtype=torch.long, device=out.device))


def _autocast_step_peak(model: nn.Module, x: torch.Tensor) -> int:
    """MemTracker's peak of a real CPU step under ``torch.autocast("cpu", bfloat16)``: forward,
    the loss, backward (no optimizer), the output kept to the end (as ``analyze`` models)."""
    model = copy.deepcopy(model).train()
    tracker = MemTracker()
    tracker.track_external(model, x)
    with tracker:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x)
            loss = _cross_entropy(out)
        loss.backward()
        del loss
        peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]
    del out
    return int(peak)


def test_a_loss_kept_in_fp32_by_autocast_gives_the_real_steps_peak() -> None:
    """``cross_entropy`` runs in fp32 under CPU autocast: its log-softmax, saved for backward,
    is the step's largest buffer."""
    torch.manual_seed(0)
    model, x = Classifier(), torch.randn(512, 64)
    a = mw.analyze(
        model, input_data=(x,), mode="training", optimizer=None, device="cpu",
        autocast="bfloat16", loss=_cross_entropy,
    )  # fmt: skip
    assert a.error is None, a.error
    truth = _autocast_step_peak(model, x)
    assert a.peak_bytes == pytest.approx(truth, rel=0.05), (a.peak_bytes, truth)


# -- the fused attention fast path: odd head counts ---------------------------------------------


class SelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attn(x, x, x, need_weights=False)[0]  # type: ignore[no-any-return]


def _encoder_layer(dim: int, heads: int) -> nn.Module:
    return nn.TransformerEncoderLayer(dim, heads, 2 * dim, 0.0, batch_first=True)


def _padded_encoder(dim: int, heads: int) -> nn.Module:
    return nn.TransformerEncoder(_encoder_layer(dim, heads), 2)


@pytest.mark.parametrize(
    "build, dim, heads",
    [
        (SelfAttention, 24, 3),  # head size 8: only the head count keeps it off the fast path
        (SelfAttention, 40, 5),
        (SelfAttention, 32, 4),  # even: the fused kernel, for comparison
        (_encoder_layer, 24, 3),
        (_encoder_layer, 32, 4),
        # head sizes 10 and 12: the CPU's fused kernel takes any head size
        (SelfAttention, 20, 2),
        (SelfAttention, 24, 2),
        (_encoder_layer, 20, 2),
    ],
)
def test_attention_with_an_odd_head_count_or_any_head_size_has_the_cpu_allocators_peak(
    build: Callable[[int, int], nn.Module], dim: int, heads: int
) -> None:
    torch.manual_seed(0)
    model, x = build(dim, heads).eval(), torch.randn(4, 37, dim)
    a = mw.analyze(model, input_data=(x,), device="cpu")
    assert a.error is None, a.error
    assert a.peak_bytes == allocator_peak(model, (x,))


@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")
@pytest.mark.parametrize("dim, heads", [(20, 2), (24, 3)])
def test_a_padded_encoder_packs_as_pytorch_does_whatever_the_heads(dim: int, heads: int) -> None:
    """An encoder given a padding mask packs the kept tokens (nested tensors) only when its
    layers can run fused: an even head count, any head size (within 0.2 %: a few bytes of
    nested-tensor metadata are not counted)."""
    torch.manual_seed(0)
    model, x = _padded_encoder(dim, heads).eval(), torch.randn(4, 37, dim)
    mask = torch.zeros(4, 37, dtype=torch.bool)
    mask[1, 20:] = True
    kwargs = {"src_key_padding_mask": mask}
    a = mw.analyze(model, input_data={"src": x, **kwargs}, device="cpu")
    assert a.error is None, a.error
    truth = allocator_peak(model, (x,), kwargs)
    assert a.peak_bytes == pytest.approx(truth, rel=0.002), (a.peak_bytes, truth)


# -- GRU dropout, between layers only -----------------------------------------------------------


class LastGRU(nn.Module):
    def __init__(self, **options: Any) -> None:
        super().__init__()
        self.rnn = nn.GRU(**options)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.rnn(x)[0]  # type: ignore[no-any-return]


@pytest.mark.filterwarnings("ignore:dropout option adds dropout")
@pytest.mark.parametrize("layers", [1, 2, 3])
def test_gru_dropout_in_training_has_a_real_steps_peak(layers: int) -> None:
    """PyTorch applies a GRU's dropout after every layer but the last (one layer: none)."""
    torch.manual_seed(0)
    model = LastGRU(input_size=32, hidden_size=64, num_layers=layers, dropout=0.3)
    x = torch.randn(20, 8, 32)
    a = mw.analyze(model, input_data=(x,), mode="training", optimizer=None, device="cpu")
    assert a.error is None, a.error
    assert a.peak_bytes == real_peak(model, (x,), training=True)
