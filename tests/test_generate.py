"""``analyze(..., mode="generate")`` against transformers' own ``generate()`` run for real on
the CPU (random weights, greedy, ``min_new_tokens = max_new_tokens``): the cache it returns
(each storage once) and the CPU allocator's peak of the whole call (``truth.allocator_peak``);
``max_fit`` checked by ``analyze`` itself; the paged view against a formula from the config."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
import transformers
from truth import allocator_peak

import meta_widget as mw
from meta_widget.options import OptionError

T = transformers
BATCH, PROMPT, NEW = 2, 16, 6
SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, vocab_size=256)
HEADS = dict(num_attention_heads=4, num_key_value_heads=2)  # grouped-query: 2 heads per kv head


def llama() -> torch.nn.Module:
    return T.LlamaForCausalLM(T.LlamaConfig(**SMALL, **HEADS))


def qwen2() -> torch.nn.Module:
    return T.Qwen2ForCausalLM(T.Qwen2Config(**SMALL, **HEADS))


def mistral() -> torch.nn.Module:  # a window (6) shorter than prompt + new tokens (22)
    return T.MistralForCausalLM(T.MistralConfig(**SMALL, **HEADS, sliding_window=6))


def gemma3() -> torch.nn.Module:  # sliding and full layers
    config = T.Gemma3TextConfig(
        **{**SMALL, "num_hidden_layers": 3},
        **HEADS,
        head_dim=16,
        sliding_window=6,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
    )
    return T.Gemma3ForCausalLM(config)


CASES: dict[str, tuple[Callable[[], torch.nn.Module], str | None]] = {
    "llama": (llama, None),
    "qwen2": (qwen2, None),
    "mistral-window": (mistral, None),
    "gemma3": (gemma3, None),
    "llama-static": (llama, "static"),
}


class Generate(torch.nn.Module):
    """``model.generate(ids, **options)`` as a module's forward, for ``allocator_peak``."""

    def __init__(self, model: torch.nn.Module, options: dict[str, Any]) -> None:
        super().__init__()
        self.model, self.options = model, options

    def forward(self, ids: torch.Tensor) -> Any:
        return self.model.generate(ids, **self.options)  # type: ignore[operator]


def generate_options(cache: str | None, new: int = NEW) -> dict[str, Any]:
    return dict(
        max_new_tokens=new,
        min_new_tokens=new,
        do_sample=False,
        return_dict_in_generate=True,
        cache_implementation=cache,
    )


def cache_storage_bytes(cache: Any) -> int:
    """Bytes of the distinct storages of every tensor the real cache's layers hold."""
    storages: dict[int, int] = {}
    for layer in cache.layers:
        for value in vars(layer).values():
            if isinstance(value, torch.Tensor):
                st = value.untyped_storage()
                storages[st._cdata] = st.nbytes()
    return sum(storages.values())


@pytest.fixture(autouse=True)
def _quiet() -> Any:
    level = T.logging.get_verbosity()
    T.logging.set_verbosity_error()  # generate()'s warnings about pad tokens, on both sides
    yield
    T.logging.set_verbosity(level)


def _case(name: str) -> tuple[torch.nn.Module, torch.Tensor, str | None]:
    make, cache = CASES[name]
    torch.manual_seed(0)
    model = make().eval()
    ids = torch.randint(3, SMALL["vocab_size"], (BATCH, PROMPT))
    return model, ids, cache


@pytest.mark.parametrize("name", list(CASES))
def test_the_cache_and_the_peak_are_those_of_a_real_generate(name: str) -> None:
    model, ids, cache = _case(name)
    with torch.no_grad():
        out = model.generate(ids, **generate_options(cache))
    assert out.sequences.shape == (BATCH, PROMPT + NEW)  # exactly NEW tokens, for real
    real_cache = cache_storage_bytes(out.past_key_values)
    real_peak = allocator_peak(Generate(model, generate_options(cache)), (ids,))

    a = mw.analyze(
        model,
        input_data=ids,
        mode="generate",
        new_tokens=NEW,
        cache_implementation=cache,
        device="cpu",
    )
    assert a.error is None and a.mode == "generate"
    assert a.kv_cache is not None
    assert a.kv_cache.bytes == real_cache
    assert a.kv_cache.cache_type == type(out.past_key_values).__name__
    assert abs(a.peak_bytes - real_peak) <= 0.02 * real_peak, (a.peak_bytes, real_peak)
    kinds = [layer.kind for layer in a.kv_cache.layers]
    real_kinds = [
        "sliding" if getattr(layer, "is_sliding", False) else "full"
        for layer in out.past_key_values.layers
    ]
    assert kinds == real_kinds
    assert list(a.kv_cache.by_layer["kind"]) == real_kinds
    assert list(a.kv_cache.by_layer["tokens"]) == [
        layer.keys.shape[-2] for layer in out.past_key_values.layers
    ]


def test_gemma3_and_mistral_keep_a_window_in_their_sliding_layers() -> None:
    for name in ("gemma3", "mistral-window"):
        model, ids, _ = _case(name)
        a = mw.analyze(model, input_data=ids, mode="generate", new_tokens=NEW, device="cpu")
        assert a.kv_cache is not None
        window = model.config.sliding_window
        sliding = [layer for layer in a.kv_cache.layers if layer.kind == "sliding"]
        assert sliding and all(layer.tokens < PROMPT + NEW - 1 for layer in sliding)
        assert all(layer.window == window for layer in sliding)
        full = [layer for layer in a.kv_cache.layers if layer.kind == "full"]
        assert all(layer.tokens == PROMPT + NEW - 1 for layer in full)  # the last is not cached


def test_prefill_and_each_decode_step_are_marked_and_the_stop_check_is_assumed() -> None:
    model, ids, _ = _case("llama")
    a = mw.analyze(model, input_data=ids, mode="generate", new_tokens=NEW, device="cpu")
    runs = [name for _, name in a.memory.phase_runs]
    assert runs == ["prefill"] + ["decode"] * (NEW - 1)  # one forward per new token but the last
    roots = [c for c in a.calls if c.parent < 0]
    assert len(roots) == NEW
    assert [c.inputs[0][1].shape for c in roots][:2] == [(BATCH, PROMPT), (BATCH, 1)]
    stops = {
        a.value: a.count
        for a in a.assumptions
        if a.kind == "truth" and a.file and "utils" in a.file
    }
    assert stops.get("False") == NEW - 1 and stops.get("True") == 1  # finished after NEW tokens
    assert a.memory.peak_phase in ("prefill", "decode")


def test_max_length_alone_generates_to_that_length() -> None:
    model, ids, _ = _case("llama")
    a = mw.analyze(model, input_data=ids, mode="generate", max_length=PROMPT + 3, device="cpu")
    assert a.kv_cache is not None and a.kv_cache.new_tokens == 3
    assert len([c for c in a.calls if c.parent < 0]) == 3


def test_a_model_without_generate_is_an_option_error() -> None:
    with pytest.raises(OptionError, match="has none") as info:
        mw.analyze(T.LlamaModel(T.LlamaConfig(**SMALL, **HEADS)), (1, 8), mode="generate",
                   new_tokens=2)  # fmt: skip
    assert "\n" not in str(info.value)
    with pytest.raises(OptionError, match="has none"):
        mw.analyze(torch.nn.Linear(4, 4), (1, 4), mode="generate", new_tokens=2)
    with pytest.raises(OptionError, match="new_tokens"):
        mw.analyze(llama(), (1, 8), mode="generate")


def test_outside_generate_mode_there_is_no_cache() -> None:
    a = mw.analyze(llama(), (1, 8))
    assert a.kv_cache is None


@pytest.mark.parametrize("vary", ["batch", "seq"])
def test_max_fit_in_generate_mode_fits_and_one_more_does_not(vary: str) -> None:
    model = llama().eval()
    options = dict(mode="generate", new_tokens=4, device="cpu")
    base = mw.analyze(model, (1, 8), **options)  # type: ignore[arg-type]
    assert base.kv_cache is not None
    budget = base.peak_bytes + 40 * base.kv_cache.bytes  # room for a few more sequences / tokens
    fit = mw.max_fit(model, (1, 8), budget=budget, vary=vary, limit=4096, **options)
    size = (1, 8)

    def at(n: int) -> tuple[int, int]:
        return (n, size[1]) if vary == "batch" else (size[0], n)

    fits = mw.analyze(model, at(fit.size), **options)  # type: ignore[arg-type]
    over = mw.analyze(model, at(fit.size + 1), **options)  # type: ignore[arg-type]
    assert fit.size > 1
    assert fits.peak_bytes <= budget < over.peak_bytes


def test_paged_view_is_the_block_formula_of_the_config() -> None:
    for name in ("llama", "gemma3", "mistral-window"):
        model, ids, _ = _case(name)
        config = model.config
        a = mw.analyze(model, input_data=ids, mode="generate", new_tokens=NEW, device="cpu")
        assert a.kv_cache is not None
        head_dim = (
            getattr(config, "head_dim", None) or config.hidden_size // HEADS["num_attention_heads"]
        )
        per_layer_token = 2 * config.num_key_value_heads * head_dim * 4  # keys and values, fp32
        kinds = getattr(config, "layer_types", None) or (
            ["sliding_attention"] * config.num_hidden_layers
            if getattr(config, "sliding_window", None)
            else ["full_attention"] * config.num_hidden_layers
        )
        assert a.kv_cache.bytes_per_token == per_layer_token * len(kinds)
        weights = sum(p.numel() * p.element_size() for p in model.parameters())
        weights += sum(b.numel() * b.element_size() for b in model.buffers())
        for length, block in ((1000, 16), (4096, 16), (37, 8)):
            positions = sum(
                math.ceil(
                    (min(length, config.sliding_window) if k == "sliding_attention" else length)
                    / block
                )
                * block
                for k in kinds
            )
            budget = 64 * 2**20
            expected = (budget - weights) // (positions * per_layer_token)
            assert a.kv_cache.paged(budget, length, block=block) == expected


def test_generate_time_on_a_gpu_has_prefill_and_time_per_token() -> None:
    model, ids, _ = _case("llama")
    a = mw.analyze(model, input_data=ids, mode="generate", new_tokens=NEW, device="cpu", gpu="H100")
    t = a.time
    assert t is not None and t.prefill_s is not None and t.per_token_s is not None
    assert t.prefill_s > 0 and t.per_token_s > 0
    assert t.prefill_s + (NEW - 1) * t.per_token_s == pytest.approx(t.step_s)
    assert t.tokens_per_s == pytest.approx(BATCH * NEW / t.step_s)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    # each decode step reads every weight at least once: no faster than the HBM allows
    assert t.per_token_s >= weights / t.gpu.hbm_bytes_per_s


def test_generate_with_a_batch_logs_no_warning_about_values_meta_has_not_got(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # the eos check printed tensor(..., device='meta'); with a batch of 4, the attention mask
    # and right-padding checks warned of a padding that a prompt of one length cannot have
    config = T.LlamaConfig(**SMALL, **HEADS, architectures=["LlamaForCausalLM"])
    with caplog.at_level(logging.WARNING, logger="transformers"):
        a = mw.analyze(config, input_size=(4, PROMPT), mode="generate", new_tokens=NEW)
    assert a.error is None and a.kv_cache is not None
    generation = [r.getMessage() for r in caplog.records if r.name.startswith("transformers")]
    assert generation == []
