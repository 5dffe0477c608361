"""A training step against independent truth: a real CPU step, real FLOP counts.

The analysis (meta tensors, ``device="cpu"``) is compared with the same step run for real on the
CPU: its peak as the CPU allocator sees it (``truth.loop_peaks``: kernels' own copies too, such
as the clone ``mm`` makes of a sum's expanded gradient), what it holds as
``torch.distributed._tools.mem_tracker.MemTracker`` sees it, and ``FlopCounterMode`` (or, for
kernels it has no formula for, the textbook formula) counts its FLOPs. The analysis holds two
steps; a real step is compared with the first (``tests/test_steady_state.py`` has the second).

Measured with PyTorch 2.13 (CPU), the analysis equals the real step within ``SLACK`` bytes (a
loss scalar, a reduction's scratch, BatchNorm's own buffers), with one exact, documented gap:

- Adam/AdamW keep one ``step`` counter per parameter tensor as a 4-byte float32 tensor on the
  host. On a CPU the host is the device, so the allocator counts them in its peak; the analysis
  reports them apart, as ``memory.optimizer_host_bytes``, and leaves them out of ``peak_bytes``
  (on a GPU they are not device memory). Hence ``real = peak_bytes + optimizer_host_bytes`` when
  the peak is in the optimizer step.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch.distributed._tools.mem_tracker import MemTracker
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode
from truth import loop_peaks

import meta_widget as mw

CPU = torch.device("cpu")
#: what the CPU allocator sees beyond the tensors a step makes, in bytes: the loss scalar and
#: a reduction's 8-byte scratch, BatchNorm's kernel-internal buffers (512 B here)
SLACK = 1024

#: what a user writes (PyTorch's defaults: on the CPU the single-tensor implementations)
OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "adamw": lambda ps, **kw: torch.optim.AdamW(ps, **kw),
    "adam": lambda ps, **kw: torch.optim.Adam(ps, **kw),
    "sgd": lambda ps, **kw: torch.optim.SGD(ps, lr=0.01, **kw),
    "sgd-momentum": lambda ps, **kw: torch.optim.SGD(ps, lr=0.01, momentum=0.9, **kw),
}


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 128), nn.Linear(128, 4))


class Block(nn.Module):
    """A pre-norm transformer block: fused qkv, ``scaled_dot_product_attention``, a GELU MLP."""

    def __init__(self, d: int = 64, heads: int = 4, mask: bool = False) -> None:
        super().__init__()
        self.heads, self.mask = heads, mask
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        qkv = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        if self.mask:  # a boolean mask: memory-efficient attention on a GPU
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            a = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        else:  # causal, no mask: flash attention
            a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(nn.functional.gelu(self.fc1(self.ln2(x))))


class Buffered(nn.Module):
    """BatchNorm (running stats: buffers) and a registered 1 MiB lookup table."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.bn, self.out = nn.Linear(32, 64), nn.BatchNorm1d(64), nn.Linear(64, 8)
        self.register_buffer("table", torch.zeros(512, 512))  # 1 MiB

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.bn(self.fc(x)))) + self.table[0, :8]


def model_and_input(name: str) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    if name == "mlp":
        return mlp(), torch.randn(16, 32)
    if name == "block":
        return Block(), torch.randn(2, 32, 64)
    if name == "buffered":
        return Buffered(), torch.randn(16, 32)
    raise AssertionError(name)


def nbytes(tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class RealStep:
    """One real step on the CPU under MemTracker: forward, ``output.sum()``, backward, step.

    It does what ``analyze(mode="training")`` models: the output is kept until the end, the loss
    freed after backward, the optimizer made after backward (making one allocates nothing).
    """

    def __init__(
        self,
        model: nn.Module,
        x: torch.Tensor,
        optimizer: str | None,
        training: bool,
        **optimizer_options: Any,
    ) -> None:
        model = copy.deepcopy(model).train(training)
        params = [p for p in model.parameters() if p.requires_grad]
        tracker = MemTracker()
        tracker.track_external(model, x)
        opt = None
        with tracker, torch.set_grad_enabled(training):
            # before anything ran: parameters, buffers and the input
            self.start = int(tracker.get_tracker_snapshot("current")[CPU]["Total"])
            out = model(x)
            if training:
                loss = out.sum()
                loss.backward()
                del loss
                if optimizer is not None:
                    opt = OPTIMIZERS[optimizer](params, **optimizer_options)
                    tracker.track_external(opt)
                    opt.step()
            peak = tracker.get_tracker_snapshot("peak")[CPU]
        self.peak = int(peak["Total"])
        if training:  # the CPU allocator's: kernels' own copies too (mm's of a sum's gradient)
            self.peak = self.allocator_peak(model, x, optimizer, **optimizer_options)
        self.buffers = int(peak[next(k for k in peak if str(k).endswith("BUFFER"))])
        self.grad_bytes = nbytes(p.grad for p in params if p.grad is not None)
        state = _items(opt)
        self.step_counter_bytes = nbytes(v for k, v in state if k == "step")
        self.state_bytes = nbytes(v for k, v in state if k != "step")
        del out

    @staticmethod
    def allocator_peak(
        model: nn.Module, x: torch.Tensor, optimizer: str | None, **optimizer_options: Any
    ) -> int:
        """The same step on a fresh copy, its peak as the CPU allocator sees it."""
        model = copy.deepcopy(model)
        params = [p for p in model.parameters() if p.requires_grad]

        def step() -> None:
            out = model(x)
            out.sum().backward()
            if optimizer is not None:
                OPTIMIZERS[optimizer](params, **optimizer_options).step()

        return loop_peaks(step, 1, [*model.parameters(), *model.buffers(), x])[0]


def first_step(a: mw.Analysis) -> tuple[int, str]:
    """The first training step's peak and its phase, from the analysis's timeline (a real
    :class:`RealStep` is one step; the analysis holds two, the second the steady state)."""
    m = a.memory
    end = m.steps[1] if len(m.steps) > 1 else len(m.timeline)
    i = max(range(end), key=lambda k: m.timeline[k][0])
    assert m.timeline[i][0] == m.first_step_peak_bytes
    return m.first_step_peak_bytes, m.timeline_phases()[i]


def _items(opt: torch.optim.Optimizer | None) -> list[tuple[str, torch.Tensor]]:
    if opt is None:
        return []
    return [(k, v) for s in opt.state.values() for k, v in s.items() if isinstance(v, torch.Tensor)]


# ---------------------------------------------------------------------------------------------
# peaks


@pytest.mark.parametrize("optimizer", ["adamw", "adam", "sgd", "sgd-momentum", None])
@pytest.mark.parametrize("name", ["mlp", "block"])
def test_training_peak_is_a_real_cpu_steps_peak(name: str, optimizer: str | None) -> None:
    model, x = model_and_input(name)
    a = mw.analyze(model, input_data=x, mode="training", optimizer=optimizer, device="cpu")
    assert a.error is None, a.error
    real = RealStep(model, x, optimizer, training=True)
    # the step counters: 4 bytes per trainable tensor, host memory in the analysis (see above)
    assert a.memory.optimizer_host_bytes == real.step_counter_bytes
    if optimizer in ("adam", "adamw"):
        assert real.step_counter_bytes == 4 * sum(1 for p in model.parameters() if p.requires_grad)
    peak, phase = first_step(a)
    host = a.memory.optimizer_host_bytes if phase == "optimizer" else 0
    assert abs(peak + host - real.peak) <= SLACK, (peak, host, real.peak)
    assert a.memory.gradient_bytes == real.grad_bytes == nbytes(model.parameters())
    assert a.memory.optimizer_state_bytes == real.state_bytes
    assert a.memory.baseline_bytes == real.start


@pytest.mark.parametrize("foreach", [True, False])
@pytest.mark.parametrize("optimizer", ["adamw", "adam", "sgd-momentum"])
def test_the_optimizers_implementation_is_the_real_steps(optimizer: str, foreach: bool) -> None:
    """``foreach=True``, PyTorch's multi-tensor step (its default on CUDA), holds a whole list
    of temporaries at once; ``False`` one parameter's: each equals the real step run so."""
    model, x = model_and_input("mlp")
    a = mw.analyze(
        model, input_data=x, mode="training", optimizer=optimizer, device="cpu", foreach=foreach
    )
    assert a.error is None, a.error
    real = RealStep(model, x, optimizer, training=True, foreach=foreach)
    peak, phase = first_step(a)
    host = a.memory.optimizer_host_bytes if phase == "optimizer" else 0
    assert abs(peak + host - real.peak) <= SLACK, (peak, host, real.peak)


def test_the_optimizer_runs_as_pytorch_runs_it_on_the_device() -> None:
    """By default the step is PyTorch's default on the device analyzed: multi-tensor on CUDA,
    one parameter at a time on the CPU; here the two peaks differ."""
    model, x = model_and_input("mlp")

    def peak(**options: Any) -> int:
        a = mw.analyze(model, input_data=x, mode="training", **options)
        assert a.error is None and a.memory.peak_phase == "optimizer", a.error
        return a.peak_bytes

    multi, loop = peak(device="cpu", foreach=True), peak(device="cpu", foreach=False)
    assert multi != loop
    assert peak(device="cuda") == multi and peak(device="cpu") == loop
    assert peak(device="cuda", foreach=False) == loop


@pytest.mark.parametrize("optimizer", ["adamw", None])
def test_buffers_count_in_the_starting_memory_and_the_training_peak(optimizer: str | None) -> None:
    model, x = model_and_input("buffered")
    buffers = nbytes(model.buffers())
    assert buffers > 2**20
    a = mw.analyze(model, input_data=x, mode="training", optimizer=optimizer, device="cpu")
    assert a.error is None, a.error
    real = RealStep(model, x, optimizer, training=True)
    assert a.param_bytes == nbytes(model.parameters())  # parameters only
    assert a.memory.buffer_bytes == buffers == real.buffers
    assert (
        a.memory.baseline_bytes == real.start == nbytes(model.state_dict().values()) + nbytes([x])
    )
    peak, phase = first_step(a)
    host = a.memory.optimizer_host_bytes if phase == "optimizer" else 0
    assert abs(peak + host - real.peak) <= SLACK, (peak, host, real.peak)
    assert a.memory.categories["buffers"] == buffers


def test_buffers_count_in_the_inference_peak() -> None:
    model, x = model_and_input("buffered")
    a = mw.analyze(model, input_data=x, device="cpu")
    assert a.error is None, a.error
    real = RealStep(model, x, None, training=False)
    assert a.memory.buffer_bytes == real.buffers == nbytes(model.buffers())
    assert a.memory.baseline_bytes == real.start
    # BatchNorm's save_mean/save_invstd: the meta kernel allocates them in eval mode, the CPU
    # kernel leaves them empty, and so does the analysis (assume.META_FIXES)
    assert a.memory.peak_module == "bn"
    assert a.peak_bytes == real.peak


# ---------------------------------------------------------------------------------------------
# FLOPs of a training step, per device


def real_flops(model: nn.Module, x: torch.Tensor, backend: SDPBackend) -> int:
    """FlopCounterMode's count of a real CPU forward + backward with ``backend`` forced."""
    model = copy.deepcopy(model).train()
    with sdpa_kernel(backend), FlopCounterMode(display=False) as counter:
        model(x).sum().backward()
    return int(counter.get_total_flops())


def attention_flops(b: int, heads: int, t: int, head_dim: int, matmuls: int) -> int:
    """``matmuls`` (b*heads) x (t x t x head_dim) matrix products, 2 FLOPs per multiply-add."""
    return matmuls * 2 * b * heads * t * t * head_dim


@pytest.mark.parametrize("mask", [False, True], ids=["causal", "bool-mask"])
def test_training_flops_per_device_against_a_real_run_and_the_flash_formula(mask: bool) -> None:
    """FLOPs of forward + backward for each ``device``, from an independent count.

    - ``"math"``: the math path is plain matmuls: FlopCounterMode on a real CPU run with
      ``SDPBackend.MATH`` forced is the whole truth (2 matmuls forward, 4 backward).
    - ``"cpu"`` / ``"cuda"``: the fused kernels (CPU flash; GPU flash, or memory-efficient with a
      mask). FlopCounterMode has no formula for the CPU flash kernel, so a real CPU run with
      ``SDPBackend.FLASH_ATTENTION`` counts the rest of the model and the attention is added by
      hand: 2 matmuls forward (QK^T, PV) and 5 backward, since the flash backward recomputes the
      scores QK^T before dV, dP, dQ and dK (Dao et al., FlashAttention, Algorithm 4).
    """
    torch.manual_seed(0)
    model, x = Block(mask=mask), torch.randn(2, 32, 64)
    b, t, _ = x.shape
    dims = (b, model.heads, t, 64 // model.heads)
    analysed = {
        device: mw.analyze(model, input_data=x, mode="training", optimizer=None, device=device)
        for device in ("math", "cpu", "cuda")
    }
    assert all(a.error is None for a in analysed.values())
    assert analysed["math"].total_flops == real_flops(model, x, SDPBackend.MATH)
    rest = real_flops(model, x, SDPBackend.FLASH_ATTENTION)  # the attention itself counts 0
    fused = rest + attention_flops(*dims, matmuls=2 + 5)
    assert analysed["cpu"].total_flops == fused
    assert analysed["cuda"].total_flops == fused
    # the math path's count is the same model with 2 + 4 attention matmuls: the runs agree
    assert analysed["math"].total_flops == rest + attention_flops(*dims, matmuls=2 + 4)
    # forward alone: every path does the same two matmuls
    inference = {mw.analyze(model, input_data=x, device=d).total_flops for d in analysed}
    assert len(inference) == 1


# ---------------------------------------------------------------------------------------------
# the user's meta module after a training step


def test_a_users_meta_module_is_left_as_it_was_after_training() -> None:
    with torch.device("meta"):
        model = mlp()
    model.eval()
    model[2].train()  # mixed flags
    model[3].requires_grad_(False)
    grad = torch.ones(128, 32, device="meta")
    model[0].weight.grad = grad
    before = [(n, p.requires_grad, p.grad) for n, p in model.named_parameters()]
    flags = [m.training for m in model.modules()]
    a = mw.analyze(model, input_size=(16, 32), mode="training")
    assert a.error is None and a.memory.gradient_bytes > 0
    after = [(n, p.requires_grad, p.grad) for n, p in model.named_parameters()]
    assert [(n, rg) for n, rg, _ in after] == [(n, rg) for n, rg, _ in before]
    assert all(g1 is g0 for (_, _, g1), (_, _, g0) in zip(after, before, strict=True))
    assert model[0].weight.grad is grad
    assert [m.training for m in model.modules()] == flags
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
