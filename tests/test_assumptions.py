"""Models that branch on tensor values trace under recorded assumptions (issue: assumptions)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from models import fail_line, gpt2_config, llama_config, real
from reference import cpu_calls, recorded_calls
from torch import nn
from torch.nn.modules import module as module_globals

import meta_widget as mw


def bart_config() -> Any:
    import transformers

    return transformers.BartConfig(
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        vocab_size=100,
        max_position_embeddings=64,
        architectures=["BartForConditionalGeneration"],
    )


def mixtral_config(experts: str | None = None) -> Any:
    import transformers

    config = transformers.MixtralConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        vocab_size=100,
        max_position_embeddings=64,
        architectures=["MixtralForCausalLM"],
    )
    if experts:
        config._experts_implementation = experts
    return config


def _ids() -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randint(3, 90, (2, 10))


CASES = {
    "bart": lambda: (bart_config(), {"input_ids": _ids()}),
    "llama-no-cache": lambda: (llama_config(), {"input_ids": _ids(), "use_cache": False}),
    "gpt2-no-cache": lambda: (gpt2_config(), {"input_ids": _ids(), "use_cache": False}),
    "mixtral": lambda: (mixtral_config(), {"input_ids": _ids()}),
}


def _plain_meta_forward(config: Any, kwargs: dict[str, Any]) -> BaseException | None:
    import transformers

    with torch.device("meta"):
        model = getattr(transformers, config.architectures[0])(config).eval()
    meta_kwargs = {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    try:
        with torch.no_grad():
            model(**meta_kwargs)
    except Exception as exc:  # the failure we compare before/after
        return exc
    return None


@pytest.mark.parametrize("case", sorted(CASES))
def test_value_dependent_models_trace_with_cpu_shapes(case: str) -> None:
    config, kwargs = CASES[case]()
    a = mw.analyze(config, input_data=kwargs)
    assert a.error is None, str(a.error)
    model = real(config)
    truth = cpu_calls(model, (), kwargs)
    ours = recorded_calls(a)
    assert [p for p, _ in ours] == [p for p, _ in truth]
    for (path, mine), (_, shapes) in zip(ours, truth, strict=True):
        assert mine == shapes, path
    if case != "mixtral":  # the grouped-mm experts need no assumption, only a meta-kernel fix
        assert a.assumptions, "the masking utilities branch on a tensor value"
    else:
        assert not a.assumptions
    for site in a.assumptions:
        assert site.file is not None and site.file.endswith(".py") and site.line
        assert site.code and site.kind == "truth" and site.value == "True"
    assert a.to_dataframe()["assumed"].any() == bool(a.assumptions)


def test_strict_reproduces_the_explained_error_at_the_right_module_and_line() -> None:
    a = mw.analyze(bart_config(), input_data={"input_ids": _ids()}, strict=True)
    assert a.error is not None
    assert "cannot be called on meta tensors" in a.error.message
    assert a.error.module == "model.decoder"
    assert a.error.file is not None and a.error.file.endswith("masking_utils.py")
    assert a.error.code is not None and "fast_all(padding_mask)" in a.error.code
    assert not a.assumptions


def test_nothing_stays_patched_after_any_analysis() -> None:
    config, kwargs = CASES["bart"]()
    before = _plain_meta_forward(config, kwargs)
    assert before is not None
    for options in ({}, {"strict": True}):
        mw.analyze(config, input_data=kwargs, **options)
        from models import Failing

        mw.analyze(Failing("item"), input_size=(2, 4), **options)
    after = _plain_meta_forward(config, kwargs)
    assert type(after) is type(before) and str(after) == str(before)
    assert torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is None
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    assert _get_current_dispatch_mode_stack() == []
    assert not module_globals._global_forward_hooks
    assert not module_globals._global_forward_pre_hooks


def test_eager_mixtral_routing_gets_upper_bound_expert_shapes_marked_assumed() -> None:
    config = mixtral_config("eager")
    ids = _ids()
    # without assumptions, routing fails in nonzero, explained
    strict = mw.analyze(config, input_data={"input_ids": ids}, strict=True)
    assert strict.error is not None and "nonzero" in strict.error.fix.lower()
    assert strict.error.module == "model.layers.0.mlp.experts"
    # issue 4's switch alone: routing selects every (token, slot) for every expert
    a = mw.analyze(config, input_data={"input_ids": ids}, strict=True, assume_nonzero=True)
    assert a.error is None, str(a.error)
    assert {(x.kind, x.op) for x in a.assumptions} == {("nonzero", "nonzero")}
    experts = [c for c in a.calls if c.path.endswith("mlp.experts")]
    assert len(experts) == 2 and all(c.assumed for c in experts)
    # the loop's `if expert_idx == num_experts: continue` is decided from the known index grid
    # of the upper-bound nonzero: the 4 real experts run, each on all 2 x 10 tokens x 2 slots
    hidden, inter, rows, n_experts = 32, 64, 2 * 10 * 2, 4
    per_expert = 2 * rows * hidden * (2 * inter) + 2 * rows * inter * hidden
    assert experts[0].self_flops == n_experts * per_expert
    real_calls = cpu_calls(real(config), (), {"input_ids": ids})
    assumed = {c.path for c in a.calls if c.assumed}
    assert "model.layers.0.mlp.experts.act_fn" in assumed  # computed on upper-bound tokens
    for path, shapes in recorded_calls(a):
        seen = [s for p, s in real_calls if p == path]
        if path in assumed and path.endswith("act_fn"):  # an upper bound of every real call
            assert all(
                len(mine) == len(r) and all(m >= d for m, d in zip(mine, r, strict=True))
                for real_shapes in seen
                for mine, r in zip(shapes, real_shapes, strict=True)
            ), path
        else:
            assert shapes in seen, path
    assert "(4×)" in a.summary()


class Guarded(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.isnan(x).any():  # GUARD
            raise ValueError("NaN in the input")
        return self.proj(x)


class NeedsNumber(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = int(x.shape[0] * x.abs().max().item())  # NUMBER
        return self.proj(x).repeat(n, 1)


def _line(marker: str) -> int:
    with open(__file__, encoding="utf-8") as f:
        return next(i for i, t in enumerate(f, 1) if t.rstrip().endswith(f"# {marker}"))


def test_a_branch_that_raises_under_an_assumption_names_it_and_the_override() -> None:
    a = mw.analyze(Guarded(), input_size=(2, 4))
    assert a.error is not None and a.error.type == "ValueError"
    site = f"test_assumptions.py:{_line('GUARD')}"
    assert site in a.error.fix and "False" in a.error.fix
    assert "assumed" in a.error.explanation
    fixed = mw.analyze(Guarded(), input_size=(2, 4), assume={site: False})
    assert fixed.error is None
    assert [x.value for x in fixed.assumptions] == ["False"]


def test_numbers_come_only_from_assume_by_line_or_module() -> None:
    a = mw.analyze(NeedsNumber(), input_size=(2, 4))
    assert a.error is not None
    site = f"test_assumptions.py:{_line('NUMBER')}"
    assert site in a.error.message
    by_line = mw.analyze(NeedsNumber(), input_size=(2, 4), assume={site: 1.5})
    assert by_line.error is None
    assert by_line.calls[0].outputs[0][1].shape == (2 * 3, 4)  # int(2 * 1.5) = 3 repeats
    by_module = mw.analyze(NeedsNumber(), input_size=(2, 4), assume={"": 2.0})
    assert by_module.calls[0].outputs[0][1].shape == (2 * 4, 4)
    assert by_module.assumptions[0].kind == "value"


def test_assumptions_show_in_summary_and_payload() -> None:
    a = mw.analyze(llama_config(), input_data={"input_ids": _ids(), "use_cache": False})
    text = a.summary()
    # the mask utilities decide, but the site is the model's line that called them (the whole
    # short stack is kept for the widget)
    assert "Assumed (1 site(s)" in text and "modeling_llama.py:" in text
    payload = a.to_payload()
    assert payload["assumptions"][0]["site"].startswith("modeling_llama.py:")
    assert payload["assumptions"][0]["stack"][0].startswith("masking_utils.py:")
    assert sum(payload["calls"]["assumed"]) == sum(c.assumed for c in a.calls) > 0


def test_failing_line_markers_are_found() -> None:
    assert fail_line("item") > 0
