"""materialize: real forwards on real data, checked against the meta analysis and real models."""

from __future__ import annotations

import pathlib

import pytest
import torch
from models import SmallCNN, gpt2_config, llama_config, real
from safetensors.torch import save_model
from torch import nn

import meta_widget as mw
from meta_widget.materialization import (
    InsufficientMemoryError,
    MaterializeError,
    available_memory,
    materialize,
)

Shapes = dict[str, list[tuple[tuple[int, ...], ...]]]


def _leaf_outputs(model: nn.Module, *args: object) -> Shapes:
    """Shapes of every output tensor of every leaf-module call of a real forward."""
    from torch.utils._pytree import tree_leaves

    seen: Shapes = {}
    handles = []
    for path, m in model.named_modules():
        if next(m.children(), None) is None:

            def hook(_m: nn.Module, _a: object, out: object, path: str = path) -> None:
                leaves = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
                seen.setdefault(path, []).append(tuple(tuple(t.shape) for t in leaves))

            handles.append(m.register_forward_hook(hook))
    try:
        with torch.no_grad():
            model(*args)
    finally:
        for h in handles:
            h.remove()
    return seen


def _analysis_leaf_outputs(a: mw.Analysis) -> Shapes:
    return {
        node.path: [tuple(info.shape for _, info in c.outputs) for c in node.calls]
        for node in a.modules
        if not node.children and node.calls
    }


@pytest.mark.parametrize("case", ["cnn", "llama"])
def test_a_materialized_models_real_forward_has_the_analysed_shapes(case: str) -> None:
    if case == "cnn":
        source, size, data = SmallCNN, (2, 3, 32, 32), (torch.randn(2, 3, 32, 32),)
    else:
        source, size, data = llama_config(), (2, 7), (torch.randint(0, 100, (2, 7)),)
    a = mw.analyze(source, input_size=size)
    assert a.error is None
    model, report = materialize(source)
    assert all(not t.is_meta for t in [*model.parameters(), *model.buffers()])
    assert report.ok and report.uninitialized == []
    real_shapes = _leaf_outputs(model.eval(), *data)
    assert real_shapes == _analysis_leaf_outputs(a)
    assert len(real_shapes) >= 5
    # initialized, not to_empty's garbage
    for p in model.parameters():
        assert torch.isfinite(p).all()
    assert report.bytes == sum(p.nbytes for p in model.parameters()) + sum(
        b.nbytes for b in model.buffers()
    )


def test_transformers_init_and_tied_weights_are_done_right() -> None:
    model, report = materialize(llama_config())
    reference = real(llama_config())  # built for real, the ordinary way
    assert torch.equal(model.model.norm.weight, torch.ones(32))
    # a non-persistent buffer that to_empty alone would leave as garbage
    assert torch.equal(model.model.rotary_emb.inv_freq, reference.model.rotary_emb.inv_freq)
    std = model.model.embed_tokens.weight.std().item()
    assert abs(std - reference.config.initializer_range) < 0.005
    assert "_init_weights" in report.method
    gpt2, _ = materialize(gpt2_config())
    assert gpt2.lm_head.weight is gpt2.transformer.wte.weight  # to_empty would untie them


def test_a_checkpoint_is_loaded_with_assign_and_gives_the_real_outputs(
    tmp_path: pathlib.Path,
) -> None:
    reference = real(gpt2_config())
    path = tmp_path / "gpt2.safetensors"
    save_model(reference, str(path))  # one of the tied names only
    model, report = materialize(gpt2_config(), checkpoint=path)
    ids = torch.randint(0, 100, (2, 9))
    with torch.no_grad():
        assert torch.allclose(model.eval()(ids).logits, reference(ids).logits, atol=1e-5)
    assert model.lm_head.weight is model.transformer.wte.weight
    assert report.missing == [] and report.unexpected == [] and report.ok
    assert len(report.loaded) == len({t.name for t in mw.inspect_checkpoint(path)})
    # a torch.save state dict, passed as a path or a dict
    torch.save(reference.state_dict(), tmp_path / "gpt2.pt")
    for ckpt in (tmp_path / "gpt2.pt", reference.state_dict()):
        again, _ = materialize(gpt2_config(), checkpoint=ckpt)
        assert torch.equal(
            again.transformer.h[1].mlp.c_fc.weight, reference.transformer.h[1].mlp.c_fc.weight
        )


def test_a_checkpoint_of_another_shape_is_refused(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "llama.safetensors"
    save_model(real(llama_config()), str(path))
    cnn = tmp_path / "cnn.pt"
    keys = len(SmallCNN().state_dict())
    torch.save(SmallCNN().state_dict(), cnn)
    with pytest.raises(MaterializeError, match=f"none of the checkpoint's {keys} keys"):
        materialize(llama_config(), checkpoint=cnn)
    other = llama_config()
    other.intermediate_size = 48
    with pytest.raises(
        MaterializeError, match=r"mlp\.\w+_proj\.weight: model \[48, 32\]|model \[32, 48\]"
    ):
        materialize(other, checkpoint=path)


def test_it_refuses_when_the_model_does_not_fit() -> None:
    reference = real(gpt2_config())
    needed = sum(p.nbytes for p in reference.parameters()) + sum(
        b.nbytes for b in reference.buffers()
    )
    with pytest.raises(InsufficientMemoryError) as info:
        materialize(gpt2_config(), available_bytes=needed)  # fits, but leaves no headroom
    err = info.value
    assert isinstance(err, MemoryError)
    assert err.needed == needed and err.available == needed
    assert "need 120 KiB" in str(err) and "only 120 KiB is available" in str(err)
    _, report = materialize(gpt2_config(), available_bytes=2 * needed)
    assert report.available_bytes == 2 * needed and report.bytes == needed


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.scale = nn.Parameter(torch.ones(4))  # no reset_parameters can restore this

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x) * self.scale


def test_modules_without_reset_parameters_are_reported_and_the_users_module_is_untouched() -> None:
    mine = Scaled()
    before = {k: v.clone() for k, v in mine.state_dict().items()}
    params = list(mine.parameters())
    model, report = materialize(mine)
    assert model is not mine
    assert report.uninitialized == [("", "Scaled", ["scale"])]
    assert report.initialized == ["proj"]
    assert not report.ok and "NOT initialized" in str(report)
    assert list(mine.parameters()) == params and all(not p.is_meta for p in params)
    assert all(torch.equal(before[k], v) for k, v in mine.state_dict().items())
    assert model.scale.device.type == "cpu" and model.scale.shape == (4,)


def test_available_memory_reads_the_machine() -> None:
    free = available_memory("cpu")
    with open("/proc/meminfo") as f:
        total = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemTotal:"))
    assert free is not None and 0 < free <= total
    assert available_memory("meta") is None
