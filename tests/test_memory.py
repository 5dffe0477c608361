"""Training memory: categories, gradients, optimizer state, checkpointing, attention kernels."""

from __future__ import annotations

import pytest
import torch
from models import gpt2_config, llama_config, real
from torch import nn
from torch.distributed._tools.mem_tracker import MemTracker

import meta_widget as mw
from meta_widget.memory.report import CATEGORIES


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 128), nn.Linear(128, 4))


@pytest.mark.parametrize("mode", ["inference", "training"])
def test_categories_add_up_to_the_peak(mode: str) -> None:
    for model, size in ((mlp(), (16, 32)), (gpt2_config(), (2, 16))):
        a = mw.analyze(model, input_size=size, mode=mode)
        assert a.error is None
        cats = a.memory.by_category()
        assert set(cats) == set(CATEGORIES)
        assert sum(cats.values()) == a.peak_bytes
        assert max(b for b, _, _ in a.memory.timeline) == a.peak_bytes
        if mode == "inference":
            assert cats["gradients"] == cats["optimizer state"] == 0


def test_gradients_match_trainable_parameter_bytes_and_adamw_state_is_two_fp32_copies() -> None:
    model = mlp()
    model[1].requires_grad_(False)  # no parameters: nothing changes
    model[0].bias.requires_grad_(False)  # a frozen parameter gets no gradient and no state
    trainable = [p for p in model.parameters() if p.requires_grad]
    trainable_bytes = sum(p.numel() * p.element_size() for p in trainable)
    a = mw.analyze(model, input_size=(16, 32), mode="training", optimizer="adamw")
    assert a.memory.gradient_bytes == trainable_bytes
    assert a.memory.optimizer_state_bytes == 2 * sum(p.numel() * 4 for p in trainable)
    # AdamW's step counters: one float32 scalar per trainable tensor, kept on the host
    assert a.memory.optimizer_host_bytes == 4 * len(trainable)
    sgd = mw.analyze(model, input_size=(16, 32), mode="training", optimizer="sgd-momentum")
    assert sgd.memory.optimizer_state_bytes == trainable_bytes
    plain = mw.analyze(model, input_size=(16, 32), mode="training", optimizer="sgd")
    assert plain.memory.optimizer_state_bytes == 0
    assert plain.memory.gradient_bytes == trainable_bytes
    assert plain.memory.peak_phase in ("backward", "optimizer")
    # the user's module is untouched: no gradients left behind
    assert all(p.grad is None for p in model.parameters())


def test_bf16_gradients_are_half_the_bytes() -> None:
    model = mlp().to(torch.bfloat16)
    a = mw.analyze(model, input_data=torch.randn(16, 32, dtype=torch.bfloat16), mode="training")
    assert a.memory.gradient_bytes == sum(p.numel() * 2 for p in model.parameters())


def test_activation_checkpointing_lowers_the_training_peak() -> None:
    config = llama_config()
    config.num_hidden_layers = 4
    plain = mw.analyze(config, input_size=(4, 64), mode="training", optimizer=None)
    ckpt = mw.analyze(
        config, input_size=(4, 64), mode="training", optimizer=None, activation_checkpointing=True
    )
    assert plain.error is None and ckpt.error is None
    assert ckpt.peak_bytes < plain.peak_bytes
    assert ckpt.memory.categories["activations"] < plain.memory.categories["activations"]
    # recomputation runs the blocks again in backward: more FLOPs, the same forward records
    assert ckpt.total_flops > plain.total_flops
    assert len(ckpt["model.layers.0"].calls) == 1
    # ... counted in the layers' backward (tests/test_backward.py)
    assert ckpt["model.layers.0"].backward_flops > plain["model.layers.0"].backward_flops
    with pytest.raises(ValueError, match="matches no module"):
        mw.analyze(config, input_size=(1, 8), mode="training", activation_checkpointing=["nope"])


def _real_peak(model: nn.Module, ids: torch.Tensor) -> int:
    tracker = MemTracker()
    tracker.track_external(model, ids)
    with torch.no_grad(), tracker:
        out = model(input_ids=ids)
    del out
    return int(tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"])


def test_attention_is_accounted_as_the_target_kernel() -> None:
    config = gpt2_config()
    config.n_positions = 512
    model = real(config)
    ids = torch.randint(0, 90, (2, 512))
    math = mw.analyze(model, input_data=ids, device="math")
    cpu = mw.analyze(model, input_data=ids, device="cpu")
    cuda = mw.analyze(model, input_data=ids, device="cuda")
    # the math path materializes the (2, 2, 512, 512) float32 score matrix; the kernels do not
    scores = 2 * 2 * 512 * 512 * 4
    assert math.peak_bytes - cpu.peak_bytes >= scores
    assert cuda.peak_bytes < math.peak_bytes
    assert math.total_flops == cpu.total_flops == cuda.total_flops
    # device="cpu" is what a real CPU run allocates
    assert cpu.peak_bytes == _real_peak(model.eval(), ids)
    with pytest.raises(ValueError, match="device must be one of"):
        mw.analyze(model, input_data=ids, device="tpu")


def test_training_summary_and_payload_show_phases_and_categories() -> None:
    a = mw.analyze(mlp(), input_size=(16, 32), mode="training")
    text = a.summary()
    assert "training" in text and "gradients" in text and "optimizer state" in text
    payload = a.to_payload()
    assert payload["mode"] == "training"
    assert payload["memory"]["categories"]["gradients"] == a.memory.categories["gradients"]
    assert set(payload["memory"]["phases"]) == {"forward", "backward", "optimizer"}
    assert len(payload["timeline"]["phase"]) == len(payload["timeline"]["bytes"])


def test_checkpoint_diff_and_materialize_from_an_analysis(tmp_path: object) -> None:
    import os

    model = real(gpt2_config())
    path = os.path.join(str(tmp_path), "gpt2.pt")
    state = model.state_dict()
    state.pop("transformer.ln_f.bias")
    state["extra.weight"] = torch.zeros(3)
    torch.save(state, path)
    a = mw.analyze(model, input_size=(1, 8), checkpoint=path)
    assert a.checkpoint_diff is not None
    assert a.checkpoint_diff.missing == ["transformer.ln_f.bias"]
    assert a.checkpoint_diff.unexpected == ["extra.weight"]
    assert "Checkpoint:" in a.summary() and a.to_payload()["checkpoint"]["ok"] is False
    info = mw.analyze(path)  # a path is inspected, not loaded
    assert isinstance(info, mw.inspect_checkpoint(path).__class__)
    real_copy, report = a.materialize(checkpoint=model.state_dict())
    assert report.method.startswith("load_state_dict")
    ids = torch.randint(0, 90, (1, 8))
    with torch.no_grad():
        logits = real_copy.eval()(ids).logits
    assert tuple(logits.shape) == a.calls[0].outputs[0][1].shape
    assert torch.allclose(logits, model.eval()(ids).logits)


def test_the_widget_reruns_in_training_mode_on_request() -> None:
    from meta_widget.views.widget import MetaWidget

    sent: list[dict[str, object]] = []

    class Recording(MetaWidget):  # type: ignore[misc]
        def send(self, content: dict[str, object], buffers: object = None) -> None:
            sent.append(content)

    view = Recording()
    a = mw.analyze(mlp(), input_size=(16, 32), widget=view)
    assert view.payload["mode"] == "inference" and [m["type"] for m in sent][-1] == "done"
    sent.clear()
    view._on_message(view, {"type": "rerun", "mode": "training", "optimizer": "sgd"}, [])
    assert view.payload["mode"] == "training"
    # every forward call is sent before the front end hears that backward runs, then the step
    types = [m["type"] for m in sent]
    assert [m["phase"] for m in sent if m["type"] == "phase"] == ["backward", "optimizer"]
    assert types.index("phase") > max(i for i, t in enumerate(types) if t == "calls")
    assert types[-1] == "done"
    assert view.payload["memory"]["gradient_bytes"] == a.param_bytes
    assert view.analysis is not None and view.analysis.memory.optimizer_state_bytes == 0
    with pytest.raises(ValueError, match="mode must be one of"):
        view.rerun(mode="fast")


def test_figures_show_phases_and_categories_and_rerun_changes_inputs() -> None:
    a = mw.analyze(mlp(), input_size=(16, 32), mode="training")
    timeline = a.figure("timeline")
    labels = {s.label.text for s in timeline.layout.shapes if s.label is not None} | {
        x.text for x in timeline.layout.annotations
    }
    assert {"forward", "backward", "optimizer"} <= labels
    bars = a.figure("categories")
    assert sum(b.x[0] for b in bars.data) * 2**20 == pytest.approx(a.peak_bytes)
    bigger = a.rerun(input_size=(64, 32))
    assert bigger.calls[0].inputs[0][1].shape == (64, 32) and bigger.mode == "training"
    assert bigger.memory.categories["activations"] > a.memory.categories["activations"]


def test_the_first_analysis_of_a_process_frees_what_the_model_frees() -> None:
    """A lazy import inside PyTorch on the first trace of a process once kept frames, and with
    them an activation, alive: the first analysis showed a higher peak than the next ones."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = (
        "import torch, meta_widget as mw\n"
        "peaks = []\n"
        "for mode in ('inference', 'training', 'inference', 'training'):\n"
        "    m = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),"
        " torch.nn.Linear(64, 8))\n"
        "    peaks.append(mw.analyze(m, input_size=(16, 32), mode=mode).peak_bytes)\n"
        "print(peaks)\n"
    )
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
    ).stdout
    first_inference, first_training, inference, training = eval(out.strip())
    assert (first_inference, first_training) == (inference, training)
    # inference: input + weights + at the ReLU its input and output (the first Linear's output
    # is freed before the last Linear allocates its 512 B)
    assert inference == 2048 + 10528 + 2 * 4096
