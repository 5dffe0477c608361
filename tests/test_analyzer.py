"""The analyzer against independent truths: real CPU forwards, FlopCounterMode, numel sums."""

from __future__ import annotations

import gc
import sys
import weakref
from typing import Any

import pytest
import torch
from models import (
    DictModel,
    Failing,
    Reused,
    SmallCNN,
    SmallLSTM,
    bert_config,
    fail_line,
    gpt2_config,
    llama_config,
    real,
    t5_config,
)
from reference import cpu_calls, recorded_calls
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import meta_widget as mw


def ids(*shape: int) -> torch.Tensor:
    return torch.randint(1, 90, shape)


CASES = {
    "gpt2": lambda: (real(gpt2_config()), (ids(2, 12),), {}),
    "llama": lambda: (real(llama_config()), (ids(2, 12),), {}),
    "bert": lambda: (real(bert_config()), (ids(2, 12),), {}),
    "t5": lambda: (
        real(t5_config()),
        (),
        {"input_ids": ids(2, 12), "decoder_input_ids": ids(2, 7)},
    ),
    "cnn": lambda: (SmallCNN().eval(), (torch.randn(2, 3, 16, 16),), {}),
    "lstm": lambda: (SmallLSTM().eval(), (torch.randint(0, 50, (2, 9)),), {}),
    "reused": lambda: (Reused().eval(), (torch.randn(3, 8),), {}),
    "dict": lambda: (
        DictModel().eval(),
        ({"image": torch.randn(2, 12), "tokens": torch.randint(0, 20, (2, 5))},),
        {},
    ),
}


def _analyze(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> mw.Analysis:
    data: Any = kwargs if kwargs else args
    return mw.analyze(model, input_data=data)


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_output_shape_equals_a_real_cpu_forward(case: str) -> None:
    model, args, kwargs = CASES[case]()
    a = _analyze(model, args, kwargs)
    assert a.error is None, str(a.error)
    truth = cpu_calls(model, args, kwargs)
    ours = recorded_calls(a)
    assert [p for p, _ in ours] == [p for p, _ in truth]
    # the root's output may hold a KV cache; its other tensors are compared
    for (path, mine), (_, real_shapes) in zip(ours, truth, strict=True):
        assert mine == real_shapes, path


@pytest.mark.parametrize("case", sorted(CASES))
def test_total_flops_equal_flop_counter_mode_and_calls_add_up(case: str) -> None:
    model, args, kwargs = CASES[case]()
    a = _analyze(model, args, kwargs)
    from meta_widget.sources.inputs import to_meta_value
    from meta_widget.sources.models import meta_copy

    twin = meta_copy(model).eval()
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        twin(*to_meta_value(args), **to_meta_value(kwargs))
    assert a.total_flops == counter.get_total_flops()
    assert a.total_flops > 0 or case in ("lstm",)
    assert sum(c.self_flops for c in a.calls) + sum(a.orphan_ops.values()) == a.total_flops
    assert a.root.flops == a.total_flops
    for c in a.calls:  # a call's FLOPs = its own ops + its sub-calls
        children = [k for k in a.calls if k.parent == c.index]
        assert c.flops == c.self_flops + sum(k.flops for k in children)


def test_reused_module_flops_land_on_each_call() -> None:
    a = mw.analyze(Reused(), input_size=(3, 8))
    shared = [c for c in a.calls if c.path == "shared"]
    assert [c.inputs[0][1].shape for c in shared] == [(3, 8), (6, 8), (12, 8)]
    # Linear(8, 8) on a batch of n rows: n * 8 * 8 multiply-adds = 2 * n * 64 FLOPs
    assert [c.flops for c in shared] == [2 * n * 64 for n in (3, 6, 12)]
    assert a["shared"].flops == 2 * 64 * (3 + 6 + 12)
    assert len(a["shared"].calls) == 3


def test_parameters_are_counted_once_when_tied() -> None:
    model = real(gpt2_config())
    assert model.lm_head.weight is model.transformer.wte.weight
    a = mw.analyze(model)
    unique = sum(p.numel() for p in model.parameters())
    with_duplicates = sum(p.numel() for _, p in model.named_parameters(remove_duplicate=False))
    assert a.total_params == unique < with_duplicates
    assert a.param_bytes == unique * 4
    assert a.trainable_params == unique


def _hooks(model: nn.Module) -> int:
    return sum(
        len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._forward_hooks_with_kwargs)
        for m in model.modules()
    )


def _state(model: nn.Module) -> Any:
    return (
        [(n, p.device, p.data_ptr(), p.requires_grad) for n, p in model.named_parameters()],
        [(n, b.device, b.data_ptr()) for n, b in model.named_buffers()],
        [m.training for m in model.modules()],
        _hooks(model),
    )


@pytest.mark.parametrize("training", [True, False])
def test_the_users_module_is_left_as_it_was(training: bool) -> None:
    model = SmallCNN().train(training)
    before = _state(model)
    a = mw.analyze(model, input_size=(2, 3, 16, 16))
    assert a.error is None
    assert _state(model) == before
    failing = Failing("shape").train(training)
    before = _state(failing)
    b = mw.analyze(failing, input_size=(2, 4))
    assert b.error is not None
    assert _state(failing) == before


def _hook_tables(model: nn.Module) -> list[tuple[int, ...]]:
    return [
        tuple(
            sys.getsizeof(t)
            for t in (
                m._forward_pre_hooks,
                m._forward_pre_hooks_with_kwargs,
                m._forward_hooks,
                m._forward_hooks_with_kwargs,
                m._forward_hooks_always_called,
            )
        )
        for m in model.modules()
    ]


def test_the_hook_tables_give_their_memory_back() -> None:
    # CPython never shrinks a dict: emptied, a hook table kept ~1 KB per module (110 MiB on a
    # 100,000-module model) after the analysis, held by the user's modules
    with torch.device("meta"):
        model = nn.Sequential(*(nn.Sequential(nn.Linear(4, 4), nn.ReLU()) for _ in range(3)))
    mine = model[1].register_forward_hook(lambda *_: None)
    before = _hook_tables(model)
    assert mw.analyze(model, input_size=(2, 4)).error is None
    assert _hook_tables(model) == before
    assert list(model[1]._forward_hooks) == [mine.id]  # the user's own hook stays


def test_a_users_forward_hook_is_seen_before_the_call_ends() -> None:
    # the recorder's end-of-call hook runs after the module's own hooks: the recorded output is
    # what the hook returned (6 features made 9), as the model's next module receives it
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(9, 2))
    model[0].register_forward_hook(lambda m, args, out: out[:, :3].repeat(1, 3))
    a = mw.analyze(model, input_size=(5, 4))
    assert a.error is None
    (linear,) = a["0"].calls
    assert [info.shape for _, info in linear.outputs] == [(5, 9)]
    assert linear.activation_bytes == 5 * 9 * 4  # the hook's tensor
    assert [info.shape for _, info in a["1"].calls[0].outputs] == [(5, 9)]


def test_a_meta_module_of_the_user_is_restored_too() -> None:
    with torch.device("meta"):
        model = Failing("item")
    flags = [m.training for m in model.modules()]
    a = mw.analyze(model, input_size=(2, 4))
    assert a.error is not None
    assert _hooks(model) == 0
    assert [m.training for m in model.modules()] == flags


class FrozenNorm(nn.Module):
    """A block whose ``train`` keeps its dropout in eval (as models freezing batch norm do)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.drop = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.lin(x))

    def train(self, mode: bool = True) -> FrozenNorm:
        super().train(mode)
        self.drop.eval()
        return self


def test_a_modules_own_train_decides_for_its_subtree() -> None:
    """The trace sets ``training`` as ``Module.train`` would, calling a class's own ``train``:
    the dropout this block keeps in eval runs no dropout op in a training step."""
    with torch.device("meta"):
        model = nn.Sequential(FrozenNorm(), nn.Dropout(0.5), FrozenNorm())
    model.eval()
    flags = [m.training for m in model.modules()]
    a = mw.analyze(model, input_size=(2, 4), mode="training")
    assert a.error is None
    dropped = [c.path for c in a.calls if c.type == "Dropout" and c.alloc_bytes]
    assert dropped == ["1"], dropped  # the outer dropout only
    assert [m.training for m in model.modules()] == flags


@pytest.mark.parametrize(
    ("how", "kind"),
    [("item", "RuntimeError"), ("nonzero", None), ("cpu", "NotImplementedError"), ("shape", None)],
)
def test_errors_name_the_submodule_and_the_source_line(how: str, kind: str | None) -> None:
    a = mw.analyze(Failing(how), input_size=(2, 4), strict=True)
    err = a.error
    assert err is not None
    if kind:
        assert err.type == kind
    # the innermost module running: the wrong-shaped Linear itself for the shape error
    assert err.module == ("inner.block.proj" if how == "shape" else "inner.block")
    assert err.file is not None and err.file.endswith("models.py")
    assert err.line == fail_line(how)
    assert err.explanation and err.fix
    # the records made before the failure are kept: the first Linear completed
    pre = [c for c in a.calls if c.path == "pre"]
    assert len(pre) == 1 and pre[0].outputs[0][1].shape == (2, 4)
    assert not any(c.path == "post" for c in a.calls)
    frame = a.to_dataframe()
    assert frame.set_index("module").loc[err.module, "error"] == err.message


def test_explain_works_on_any_exception() -> None:
    with pytest.raises(NotImplementedError) as info:
        torch.empty(2, device="meta").tolist()
    e = mw.explain(info.value)
    assert "no data" in e.message.lower() or "meta" in e.message.lower()
    assert "to_empty" in e.fix or ".cpu()" in e.fix
    assert e.file is not None and e.file.endswith("test_analyzer.py")


def test_embedding_models_get_integer_ids_and_say_so() -> None:
    a = mw.analyze(SmallLSTM(), input_size=(2, 9))
    assert a.error is None
    assert a.calls[0].inputs[0][1].dtype == "int64"
    assert any("torch.long" in n and "dtypes=" in n for n in a.notes)


def test_float_ids_give_an_error_that_names_the_fix() -> None:
    a = mw.analyze(SmallLSTM(), input_size=(2, 9), dtypes=[torch.float32])
    assert a.error is not None
    assert "dtypes=[torch.long]" in a.error.fix
    assert a.error.module == "embed"


def test_no_inputs_gives_a_structural_analysis() -> None:
    a = mw.analyze(real(llama_config()))
    assert a.status == "structural" and a.calls == [] and a.error is None
    assert a.total_params == sum(p.numel() for p in real(llama_config()).parameters())
    assert "structure" in a.summary()


def test_configs_classes_and_factories_are_built_on_meta() -> None:
    from_config = mw.analyze(llama_config(), input_size=(1, 8))
    from_class = mw.analyze(SmallCNN, input_size=(1, 3, 8, 8))
    from_factory = mw.analyze(lambda: nn.Sequential(nn.Linear(4, 4)), input_size=(2, 4))
    assert from_config.source == "config" and from_config.title == "LlamaForCausalLM"
    assert from_class.source == "factory" and from_factory.source == "factory"
    for a in (from_config, from_class, from_factory):
        assert a.error is None and a.total_flops > 0
    with pytest.raises(TypeError, match="cannot analyze"):
        mw.analyze(42)


def test_dataframes_have_the_documented_columns() -> None:
    model = Reused()
    a = mw.analyze(model, input_size=(3, 8))
    per_module = a.to_dataframe()
    assert list(per_module["module"]) == [n for n, _ in model.named_modules()]
    for column in (
        "module",
        "type",
        "depth",
        "calls",
        "input_shapes",
        "output_shapes",
        "params",
        "param_bytes",
        "activation_bytes",
        "flops",
        "error",
    ):
        assert column in per_module.columns
    row = per_module.set_index("module").loc["shared"]
    assert row["calls"] == 3 and row["output_shapes"][2] == [(12, 8)]
    per_call = a.to_dataframe(per="call")
    assert list(per_call["call"]) == list(range(len(a.calls)))
    assert list(per_call["module"]) == ["", "shared", "shared", "shared", "head"]
    with pytest.raises(ValueError):
        a.to_dataframe(per="layer")


def test_memory_numbers_follow_their_definitions() -> None:
    a = mw.analyze(
        nn.Sequential(nn.Linear(10, 20), nn.ReLU(), nn.Linear(20, 5)), input_size=(4, 10)
    )
    mem = a.memory
    assert mem.param_bytes == (10 * 20 + 20 + 20 * 5 + 5) * 4
    assert mem.input_bytes == 4 * 10 * 4
    # outputs of each call are new storage: 4x20, 4x20 (relu is not in place), 4x5 floats
    by_path = {c.path: c.activation_bytes for c in a.calls}
    assert by_path == {"": 4 * 5 * 4, "0": 4 * 20 * 4, "1": 4 * 20 * 4, "2": 4 * 5 * 4}
    assert mem.peak_bytes == max(b for b, _, _ in mem.timeline)
    assert mem.peak_bytes >= mem.baseline_bytes + 2 * 4 * 20 * 4 - 4 * 20 * 4
    views = mw.analyze(lambda: nn.Flatten(), input_size=(2, 3, 4))
    assert views.calls[0].activation_bytes == 0  # a view allocates nothing


def test_summary_json_and_figures() -> None:
    a = mw.analyze(gpt2_config(), input_size=(1, 8))
    text = a.summary()
    assert "GPT2LMHeadModel" in text and "0–1 · 2 × GPT2Block" in text
    payload = a.to_payload()
    assert payload["version"] == 1 and payload["totals"]["flops"] == a.total_flops
    assert len(payload["modules"]["name"]) == len(a.modules)
    assert len(payload["calls"]["module"]) == len(a.calls)
    assert a.figure("memory").data and a.figure("timeline").data


def test_an_analysis_leaves_no_reference_cycle_behind() -> None:
    """Dropping the analysis and the model frees the model at once: nothing of the trace (the
    recorder holds the modules' walk) waits in a reference cycle for the collector."""
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    mw.analyze(model, input_size=(2, 4))
    gc.collect()
    gc.disable()
    try:
        a = mw.analyze(model, input_size=(2, 4))
        assert a.error is None
        ref = weakref.ref(model)
        del a, model
        assert ref() is None
        # only meta_widget's objects: a PyTorch tracker an earlier test left registered
        # (MemTracker's ModTracker hooks) makes cycles of its own on every module call
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        ours = [o for o in gc.garbage if type(o).__module__.startswith("meta_widget")]
        assert not ours, ours[:5]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
