"""Training as people run it: autocast, pure bf16 parameters, gradient accumulation.

Truth: the same step run for real on the CPU under ``torch.autocast("cpu", ...)`` and measured by
``MemTracker``; the op lists against the autocast kernels registered in the running PyTorch.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
from models import SmallCNN, llama_config, real
from torch import nn
from torch.distributed._tools.mem_tracker import MemTracker
from torch.utils.flop_counter import FlopCounterMode

import meta_widget as mw
from meta_widget.trace.autocast import COMPOSITES, CPU_POLICY, CUDA_POLICY, Autocast, policy_for

CPU = torch.device("cpu")


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 128), nn.Linear(128, 4))


def tiny_llama() -> nn.Module:
    config = llama_config()
    config._attn_implementation = "sdpa"
    return real(config)


def logits_sum(out: Any) -> torch.Tensor:
    return (out.logits if hasattr(out, "logits") else out).sum()


def real_peak(
    model: nn.Module,
    x: torch.Tensor,
    training: bool,
    autocast: torch.dtype | None = None,
    micro_batches: int = 1,
) -> int:
    """The MemTracker peak of a real CPU step (AdamW step counters, host memory on a GPU, out)."""
    model = copy.deepcopy(model).train(training)
    params = [p for p in model.parameters() if p.requires_grad]
    tracker = MemTracker()
    tracker.track_external(model, x)
    host = 0
    with tracker, torch.set_grad_enabled(training):
        for i in range(micro_batches):
            if i:
                tracker.reset_mod_stats()  # per-module stats only; the peak is kept
            with torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=bool(autocast)):
                out = model(x)
                loss = logits_sum(out)
            if training:
                (loss / micro_batches if micro_batches > 1 else loss).backward()
                del loss
        if training:
            opt = torch.optim.AdamW(params)
            tracker.track_external(opt)
            opt.step()
            host = sum(
                v.numel() * v.element_size()
                for s in opt.state.values()
                for k, v in s.items()
                if k == "step"
            )
        peak = int(tracker.get_tracker_snapshot("peak")[CPU]["Total"])
    return peak - host


CASES: dict[str, Callable[[], tuple[nn.Module, torch.Tensor]]] = {
    "mlp": lambda: (mlp(), torch.randn(16, 32)),
    "cnn": lambda: (SmallCNN(), torch.randn(4, 3, 32, 32)),
    "llama": lambda: (tiny_llama(), torch.randint(0, 100, (2, 16))),
}


def test_meta_tensors_do_not_take_the_autocast_path_by_themselves() -> None:
    layer = nn.Linear(4, 4, device="meta")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert layer(torch.empty(2, 4, device="meta")).dtype == torch.float32
    with Autocast("cpu", torch.bfloat16):
        assert layer(torch.empty(2, 4, device="meta")).dtype == torch.bfloat16


@pytest.mark.parametrize(
    ("name", "training", "dtype"),
    [(n, t, torch.bfloat16) for n in CASES for t in (False, True)]
    + [("mlp", t, torch.float16) for t in (False, True)],  # float16: the same op lists
)
def test_autocast_peak_is_within_5_percent_of_a_real_cpu_autocast_run(
    name: str, training: bool, dtype: torch.dtype
) -> None:
    model, x = CASES[name]()
    a = mw.analyze(
        model, input_data=x, mode="training" if training else "inference", device="cpu",
        autocast=dtype, loss=logits_sum,
    )  # fmt: skip
    truth = real_peak(model, x, training, dtype)
    assert a.error is None
    first = a.memory.first_step_peak_bytes  # a real step is one: the first
    assert first == pytest.approx(truth, rel=0.05), (first, truth)
    plain = mw.analyze(
        model, input_data=x, mode="training" if training else "inference", device="cpu",
        loss=logits_sum,
    )  # fmt: skip
    assert plain.peak_bytes != a.peak_bytes  # autocast changed what the trace holds


def test_casts_match_real_cpu_autocast_op_by_op() -> None:
    def ops(device: str) -> dict[str, torch.dtype]:
        def t(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
            return torch.zeros(shape, device=device, dtype=dtype)

        w = nn.Parameter(t(8, 8))
        q = t(1, 2, 4, 8)
        return {
            "linear": nn.functional.linear(t(2, 8), w).dtype,
            "matmul": (t(2, 8) @ w).dtype,
            "conv2d": nn.functional.conv2d(t(1, 3, 8, 8), t(4, 3, 3, 3)).dtype,
            "sdpa": nn.functional.scaled_dot_product_attention(q, q, q).dtype,
            "softmax of bf16": t(2, 8, dtype=torch.bfloat16).softmax(-1).dtype,
            "cat promotes": torch.cat([t(2, dtype=torch.bfloat16), t(2)]).dtype,
            "mse_loss in fp32": nn.functional.mse_loss(
                t(2, dtype=torch.bfloat16), t(2, dtype=torch.bfloat16)
            ).dtype,
            "add keeps types": (t(2, dtype=torch.bfloat16) + t(2)).dtype,
        }

    with torch.autocast("cpu", dtype=torch.bfloat16):
        truth = ops("cpu")
    with Autocast("cpu", torch.bfloat16):
        emulated = ops("meta")
    assert emulated == truth


@pytest.mark.parametrize(
    ("key", "table", "device"),
    [("AutocastCPU", CPU_POLICY, "cpu"), ("AutocastCUDA", CUDA_POLICY, "cuda")],
)
def test_op_lists_are_pytorchs(key: str, table: dict[str, Any], device: str) -> None:
    """Every op autocast registers for the device is in the table, and nothing else but the
    documented composites (the dispatcher's own registrations, read from the running PyTorch)."""
    names = torch._C._dispatch_get_registrations_for_dispatch_key(key)
    assert set(table) - COMPOSITES[device] == {n[6:].split(".")[0] for n in names}
    assert set(policy_for(device)) == set(table)  # this PyTorch has every op of the tables


def test_pure_bf16_parameters_gradients_and_state() -> None:
    model, x = mlp(), torch.randn(16, 32)
    a = mw.analyze(model, input_data=x, mode="training", device="cpu", param_dtype="bfloat16")
    truth = real_peak(model.to(torch.bfloat16), x.to(torch.bfloat16), True)
    first = a.memory.first_step_peak_bytes  # a real step is one: the first
    assert first == pytest.approx(truth, rel=0.05), (first, truth)
    n = sum(p.numel() for p in model.parameters())
    assert a.param_bytes == 2 * n and a.memory.gradient_bytes == 2 * n
    assert a.memory.optimizer_state_bytes == 2 * 2 * n  # AdamW's moments, bf16 like the weights
    fresh = mlp()
    mw.analyze(fresh, input_size=(2, 32), mode="training", param_dtype=torch.bfloat16)
    assert next(fresh.parameters()).dtype == torch.float32  # the user's module is left as it was


def test_gradient_accumulation_over_micro_batches() -> None:
    model, x = mlp(), torch.randn(16, 32)
    a = mw.analyze(model, input_data=x, mode="training", device="cpu", micro_batches=3)
    one = mw.analyze(model, input_data=x, mode="training", device="cpu")
    truth = real_peak(model, x, True, micro_batches=3)
    assert a.memory.first_step_peak_bytes == pytest.approx(truth, rel=0.05)
    assert a.total_flops == 3 * one.total_flops  # three passes; AdamW's step counts 0 FLOPs
    assert a["0"].calls and len(a["0"].calls) == 3


def test_precision_options_are_checked() -> None:
    with pytest.raises(mw.OptionError, match=r"bfloat16 or torch\.float16"):
        mw.analyze(mlp(), input_size=(2, 32), autocast=torch.float32)
    with pytest.raises(mw.OptionError, match="only a training step"):
        mw.analyze(mlp(), input_size=(2, 32), micro_batches=2)
    with pytest.raises(mw.OptionError, match="1 or more"):
        mw.analyze(mlp(), input_size=(2, 32), mode="training", micro_batches=0)
    with pytest.raises(mw.OptionError, match="not a floating dtype"):
        mw.analyze(mlp(), input_size=(2, 32), param_dtype="long")


def test_a_rerun_in_inference_leaves_micro_batches_behind() -> None:
    a = mw.analyze(mlp(), input_size=(4, 32), mode="training", micro_batches=2, autocast="bfloat16")
    b = a.rerun(mode="inference")  # what the widget's mode switch does
    assert b.options.micro_batches == 1 and b.options.autocast == torch.bfloat16
    assert b.mode == "inference" and len(b["0"].calls) == 1
    assert a.total_flops == 2 * a.rerun(micro_batches=1).total_flops


def _checkpoint_blocks(model: nn.Module) -> nn.Module:
    """``model`` with each child of its ModuleLists run under torch.utils.checkpoint, as
    ``activation_checkpointing=True`` picks them (non-reentrant)."""
    from torch.utils.checkpoint import checkpoint

    for m in list(model.modules()):
        if isinstance(m, nn.ModuleList):
            for block in m:
                forward = block.forward

                def checkpointed(*args: Any, forward: Any = forward, **kwargs: Any) -> Any:
                    return checkpoint(forward, *args, use_reentrant=False, **kwargs)

                block.forward = checkpointed  # type: ignore[method-assign]
    return model


class Blocks(nn.Module):
    """Residual MLP blocks in a ModuleList (what ``activation_checkpointing=True`` picks)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList(
            nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)) for _ in range(3)
        )
        self.head = nn.Linear(64, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = x + layer(x)
        return self.head(x)


def test_autocast_with_activation_checkpointing_runs_as_pytorch_runs_it() -> None:
    """The recomputation in backward runs under the same autocast as the forward (as
    torch.utils.checkpoint restores autocast's state): before, it ran without it and the
    checkpoint refused "a different number of tensors was saved".

    Truths: FlopCounterMode on the real autocast step with the same blocks checkpointed (the
    recomputed forward included), and the peak of a real AdamW step (MemTracker), which is in
    the optimizer step, where checkpointing changes nothing (MemTracker itself misses tensors
    when forwards are wrapped by torch.utils.checkpoint, so it measures the plain model)."""
    model, x = Blocks(), torch.randn(32, 64)
    a = mw.analyze(
        model, input_data=x, mode="training", device="cpu", autocast=torch.bfloat16,
        activation_checkpointing=True, loss=logits_sum,
    )  # fmt: skip
    assert a.error is None, a.error
    real = _checkpoint_blocks(copy.deepcopy(model))
    with FlopCounterMode(display=False) as counter, torch.autocast("cpu", dtype=torch.bfloat16):
        logits_sum(real(x)).backward()
    assert a.total_flops == counter.get_total_flops()
    assert a.memory.peak_phase == "optimizer"
    assert a.memory.first_step_peak_bytes == real_peak(model, x, True, torch.bfloat16)
