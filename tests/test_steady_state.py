"""The steady-state training step against real CPU training loops.

From the second step of a loop on, the optimizer state (and, with ``zero_grad(set_to_none=
False)``, the zeroed gradients) is alive through the whole forward and backward pass, so every
later step peaks higher than the first where the forward or backward pass holds the peak.
``analyze(mode="training")`` traces two steps: ``peak_bytes`` is the second's,
``memory.first_step_peak_bytes`` the first's. The truth: a real loop of five steps on the CPU,
each step's peak as the CPU allocator sees it (``tests/truth.py``'s ``loop_peaks``: every
allocation and free the profiler records, fused kernels' own buffers included).

The loop is the one the analysis models: a step function (``zero_grad``, then per micro-batch
``out = model(x)`` and ``(loss(out) / micro_batches).backward()``, then ``opt.step()``), whose
output dies when it returns. Adam's step counters are 4-byte CPU tensors, host memory in the
analysis (``optimizer_host_bytes``) and live all along from step 2 on in a CPU run: added to the
steady peak.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
from models import gpt2_config, llama_config, real
from torch import nn
from torch.utils.checkpoint import checkpoint
from truth import loop_peaks

import meta_widget as mw
from meta_widget.trace.passes import default_loss

STEPS = 5
OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "adamw": lambda ps, **kw: torch.optim.AdamW(ps, **kw),
    "sgd-momentum": lambda ps, **kw: torch.optim.SGD(ps, lr=0.01, momentum=0.9, **kw),
}


class CNN(nn.Module):
    """Convolutions, BatchNorm (buffers updated in place every step), pooling, a classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.BatchNorm2d(64),
            nn.ReLU(),
        )
        self.head = nn.Linear(64 * 16 * 16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


def case(name: str) -> tuple[nn.Module, Any]:
    """A model and its input (a tensor, or token ids)."""
    torch.manual_seed(0)
    if name == "mlp":  # activations as large as the weights: the steady step peaks in backward
        w = 256
        layers = [nn.Linear(w, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(), nn.Linear(w, w)]
        return nn.Sequential(*layers), torch.randn(1024, w)
    if name == "cnn":
        return CNN(), torch.randn(8, 3, 32, 32)
    config = llama_config() if name == "llama" else gpt2_config()
    if name == "llama":
        config.hidden_size, config.intermediate_size, config.vocab_size = 64, 128, 512
    else:
        config.n_embd, config.vocab_size = 64, 512
    return real(config), torch.randint(0, 512, (2, 64))


def real_loop(
    model: nn.Module,
    x: Any,
    optimizer: str,
    *,
    foreach: bool | None = None,
    set_to_none: bool = True,
    micro_batches: int = 1,
    autocast: torch.dtype | None = None,
    checkpointed: bool = False,
) -> list[int]:
    """Each step's peak over a real loop of :data:`STEPS` steps of a copy of ``model``."""
    model = copy.deepcopy(model).train()
    if checkpointed:  # what activation_checkpointing=True wraps: each child of a ModuleList
        for m in model.modules():
            if isinstance(m, nn.ModuleList):
                for child in m.children():
                    forward = child.forward

                    def run(*a: Any, _f: Any = forward, **k: Any) -> Any:
                        return checkpoint(_f, *a, use_reentrant=False, **k)

                    child.forward = run  # type: ignore[method-assign]
    params = [p for p in model.parameters() if p.requires_grad]
    opt = OPTIMIZERS[optimizer](params, foreach=foreach)

    def step() -> None:
        opt.zero_grad(set_to_none=set_to_none)
        for _ in range(micro_batches):
            with torch.autocast("cpu", dtype=autocast, enabled=autocast is not None):
                out = model(x)
                value = default_loss(out)
            (value / micro_batches if micro_batches > 1 else value).backward()
            del value
        opt.step()

    if autocast is None:
        return loop_peaks(step, STEPS, [*model.parameters(), *model.buffers(), x])
    # On a CPU with native bf16 (AVX512-BF16, AMX), a bf16 matmul goes to oneDNN, which packs
    # its operands into scratchpads of its own choosing (83,584 B, 100,096 B... for these
    # shapes: 5 % of this step's peak); a device="cpu" trace predicts PyTorch's own kernels, the
    # ones every CPU runs with oneDNN off (docs/numbers.md). Where a CPU lacks bf16, both agree.
    with torch.backends.mkldnn.flags(enabled=False):
        return loop_peaks(step, STEPS, [*model.parameters(), *model.buffers(), x])


CASES = [
    ("mlp", "adamw", {"foreach": False}),
    ("mlp", "adamw", {"foreach": True}),
    ("mlp", "sgd-momentum", {}),
    ("mlp", "adamw", {"set_to_none": False}),
    ("mlp", "adamw", {"micro_batches": 2}),
    ("cnn", "adamw", {}),
    ("cnn", "sgd-momentum", {"foreach": True}),
    ("llama", "adamw", {}),
    ("llama", "adamw", {"checkpointed": True}),
    ("llama", "adamw", {"autocast": torch.bfloat16}),
    ("llama", "adamw", {"micro_batches": 2, "checkpointed": True}),
    ("gpt2", "adamw", {"foreach": True}),
    ("gpt2", "sgd-momentum", {"checkpointed": True, "autocast": torch.bfloat16}),
]


@pytest.mark.parametrize(("name", "optimizer", "options"), CASES, ids=lambda v: str(v))
def test_the_steady_peak_is_a_real_loops_peak_from_its_second_step(
    name: str, optimizer: str, options: dict[str, Any]
) -> None:
    model, x = case(name)
    analysis_options = {k: v for k, v in options.items() if k != "checkpointed"}
    a = mw.analyze(
        model,
        input_data=x,
        mode="training",
        optimizer=optimizer,
        device="cpu",
        activation_checkpointing=options.get("checkpointed", False),
        **analysis_options,
    )
    assert a.error is None, a.error
    peaks = real_loop(model, x, optimizer, **options)
    steady = max(peaks[1:])
    assert max(peaks[1:]) - min(peaks[1:]) <= 0.001 * steady, peaks  # steps 2-5 are alike
    predicted = a.peak_bytes + a.memory.optimizer_host_bytes
    assert predicted == pytest.approx(steady, rel=0.02), (predicted, peaks)
    first = a.memory.first_step_peak_bytes
    assert first == pytest.approx(peaks[0], rel=0.02), (first, peaks)
    assert a.memory.peak_step == 2 and a.memory.steps[0] == 0 and len(a.memory.steps) == 2


def test_the_state_a_loop_keeps_raises_the_peak_of_every_later_step() -> None:
    """The MLP whose activations are as large as its weights: step 1 peaks in the optimizer
    step, when AdamW's moments appear; from step 2 on they are there through backward too."""
    model, x = case("mlp")
    a = mw.analyze(model, input_data=x, mode="training", device="cpu")
    state = a.memory.optimizer_state_bytes
    assert state == 2 * sum(p.numel() * 4 for p in model.parameters())
    assert a.peak_bytes > a.memory.first_step_peak_bytes
    assert a.memory.peak_phase == "backward"
    # the state is live from the steady step's first event
    start = a.memory.steps[1]
    assert a.memory.timeline_categories["optimizer state"][start] == state
    # the records are one step's: FLOPs and calls are not counted twice
    assert a.total_flops == mw.analyze(model, input_data=x, mode="training").total_flops
    assert len(a.calls) == 6


def test_zero_grad_keeping_the_gradients_holds_them_through_the_forward_pass() -> None:
    model, x = case("mlp")
    freed = mw.analyze(model, input_data=x, mode="training", device="cpu")
    kept = mw.analyze(model, input_data=x, mode="training", device="cpu", set_to_none=False)
    grads = sum(p.numel() * 4 for p in model.parameters())
    start = kept.memory.steps[1]
    assert kept.memory.timeline_categories["gradients"][start] == grads
    assert freed.memory.timeline_categories["gradients"][freed.memory.steps[1]] < grads
    assert kept.peak_bytes >= freed.peak_bytes
    assert kept.memory.first_step_peak_bytes == freed.memory.first_step_peak_bytes
    with pytest.raises(mw.OptionError, match="set_to_none"):
        mw.analyze(model, input_data=x, mode="training", set_to_none="yes")  # type: ignore[arg-type]


def test_inference_is_one_pass() -> None:
    model, x = case("mlp")
    a = mw.analyze(model, input_data=x, device="cpu")
    assert a.memory.steps == [0] and a.memory.peak_step is None
    assert a.memory.first_step_peak_bytes == a.peak_bytes
