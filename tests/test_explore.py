"""sweep, max_fit and compare, each checked against separate ``analyze`` calls."""

from __future__ import annotations

import copy
import dataclasses
import io
from collections.abc import Callable

import pytest
import torch
from models import SmallCNN, llama_config
from torch import nn

import meta_widget as mw
from meta_widget.explore.sweeps import Progress
from meta_widget.memory.report import CATEGORIES
from meta_widget.units import format_bytes
from meta_widget.views.estimates import (
    distributed,
    largest_block_bytes,
    root_unit_bytes,
    tp_activation_fraction,
    tp_fraction,
)

CNN_INPUT = (1, 3, 32, 32)


def mha_config():  # type: ignore[no-untyped-def]
    config = copy.deepcopy(llama_config())
    config.num_key_value_heads = config.num_attention_heads
    return config


# ---------------------------------------------------------------------------------------------
# max_fit


def test_max_fit_batch_of_a_cnn_fits_and_the_next_does_not() -> None:
    fit = mw.max_fit(SmallCNN(), input_size=CNN_INPUT, budget="8MiB", progress=False)
    budget = 8 * 2**20
    at = mw.analyze(SmallCNN(), input_size=(fit.size, 3, 32, 32))
    after = mw.analyze(SmallCNN(), input_size=(fit.size + 1, 3, 32, 32))
    assert at.peak_bytes <= budget < after.peak_bytes
    assert (fit.peak_bytes, fit.next_peak_bytes) == (at.peak_bytes, after.peak_bytes)
    assert fit.analysis.peak_bytes == at.peak_bytes and fit.budget == budget
    # exponential then binary search: about 2 log2(size) traces, far fewer than size
    assert fit.traces <= 2 * fit.size.bit_length() + 2 < fit.size
    # the repr gives the margins, which three figures of peaks near the budget hide
    spare = format_bytes(budget - at.peak_bytes)
    over = format_bytes(after.peak_bytes - budget)
    assert f"{spare} to spare; batch={fit.size + 1} does not fit: " in repr(fit)
    assert repr(fit).endswith(f"over by {over}; {fit.traces} traces>")


def test_max_fit_sequence_length_of_a_decoder_in_training() -> None:
    budget = 3 * 2**20
    fit = mw.max_fit(llama_config(), input_size=(1, 8), budget=budget, vary="seq", mode="training")
    at = mw.analyze(llama_config(), input_size=(1, fit.size), mode="training")
    after = mw.analyze(llama_config(), input_size=(1, fit.size + 1), mode="training")
    assert at.peak_bytes <= budget < after.peak_bytes
    assert fit.size > 8 and fit.analysis.options.input_data[0].shape == (1, fit.size)


def test_max_fit_per_device_uses_the_distributed_estimate() -> None:
    budget = 700 * 2**10
    fit = mw.max_fit(
        llama_config(), (1, 8), budget=budget, vary="seq", mode="training",
        devices=8, strategy="zero3",
    )  # fmt: skip

    def per_device(size: int) -> int:
        a = mw.analyze(llama_config(), input_size=(1, size), mode="training")
        m = a.memory
        units = {
            "largest_unit_bytes": largest_block_bytes(a),
            "root_unit_bytes": root_unit_bytes(a),
            "tp_fraction": tp_fraction(a),
            "tp_activation_fraction": tp_activation_fraction(a),
        }
        at_peak = distributed(m, 8, "zero3", **units)["total"]
        # at the end of the forward pass: every saved activation live, no gradient yet
        live = m.timeline[m.phases["backward"] - 1][0]
        cats = dict.fromkeys(m.categories, 0)
        cats.update(parameters=m.param_bytes, buffers=m.buffer_bytes, inputs=m.input_bytes)
        cats["activations"] = live - m.param_bytes - m.buffer_bytes - m.input_bytes
        at_end = distributed(
            dataclasses.replace(m, categories=cats, peak_phase="forward"), 8, "zero3", **units
        )["total"]
        return max(at_peak, at_end)

    assert per_device(fit.size) == fit.peak_bytes <= budget < per_device(fit.size + 1)
    one = mw.max_fit(
        llama_config(), (1, 8), budget=budget, vary="seq", mode="training",
        devices=1, strategy="zero3",
    )  # fmt: skip
    assert one.size < fit.size  # sharding 8 ways leaves room for a longer sequence


def test_max_fit_stops_at_the_limit_when_everything_fits() -> None:
    fit = mw.max_fit(SmallCNN(), input_size=CNN_INPUT, budget="1GiB", limit=5)
    assert fit.size == 5 and fit.next_peak_bytes is None
    assert fit.history[-1][0] == 5 and len(fit.history) <= 4


def test_max_fit_errors_say_what_does_not_fit() -> None:
    weights = mw.analyze(SmallCNN()).param_bytes
    with pytest.raises(mw.NothingFitsError, match=r"weights .* alone take"):
        mw.max_fit(SmallCNN(), input_size=CNN_INPUT, budget=weights // 2)
    with pytest.raises(mw.NothingFitsError, match="even batch=1 needs"):
        mw.max_fit(SmallCNN(), input_size=CNN_INPUT, budget=weights + 1000)
    with pytest.raises(MemoryError):  # also the builtin a caller would catch
        mw.max_fit(SmallCNN(), input_size=CNN_INPUT, budget=100)
    for bad in ("80G", "eighty GiB", "80 parsecs", "-1GiB", "GiB", "nanGB"):
        with pytest.raises(mw.OptionError, match="budget"):
            mw.max_fit(SmallCNN(), input_size=CNN_INPUT, budget=bad)
    with pytest.raises(mw.OptionTypeError):
        mw.max_fit(SmallCNN(), input_size=CNN_INPUT, budget=80.5)
    with pytest.raises(mw.OptionError, match="devices and strategy go together"):
        mw.max_fit(SmallCNN(), input_size=CNN_INPUT, budget="1GiB", devices=8)
    with pytest.raises(mw.OptionError, match="strategy must be one of"):
        mw.max_fit(SmallCNN(), input_size=CNN_INPUT, budget="1GiB", devices=8, strategy="zero4")


def test_budget_units() -> None:
    from meta_widget.options import check_budget

    assert check_budget("80GiB") == 80 * 2**30
    assert check_budget("80 GB") == 80 * 10**9
    assert check_budget("1.5tib") == int(1.5 * 2**40)
    assert check_budget(1234) == 1234


def test_max_fit_reports_a_failed_trace() -> None:
    with pytest.raises(mw.FitError, match="the analysis at batch=2 failed"):
        mw.max_fit(lambda: nn.Sequential(nn.Linear(4, 4), nn.Unflatten(0, (1, 1))), (1, 4),
                   budget="1GiB")  # fmt: skip


# ---------------------------------------------------------------------------------------------
# sweep


def _row(a: mw.Analysis) -> dict[str, object]:
    cats = a.memory.by_category()
    return {
        "peak_bytes": a.peak_bytes,
        "total_flops": a.total_flops,
        "param_bytes": a.param_bytes,
        "activation_bytes": a.activation_bytes,
        **{c: cats[c] for c in CATEGORIES},
    }


def test_sweep_rows_equal_single_analyze_calls() -> None:
    s = mw.sweep(
        llama_config(), (1, 8), vary={"batch": [1, 3], "seq": [8, 24]}, mode="training",
        progress=False,
    )  # fmt: skip
    frame = s.to_dataframe()
    assert list(frame.columns[:6]) == [
        "batch", "seq", "peak_bytes", "total_flops", "param_bytes", "activation_bytes",
    ]  # fmt: skip
    assert len(frame) == 4 and frame["error"].isna().all()
    for (batch, seq), row in zip(s.points, frame.to_dict("records"), strict=True):
        single = mw.analyze(llama_config(), input_size=(batch, seq), mode="training")
        assert {k: row[k] for k in _row(single)} == _row(single), (batch, seq)
        assert (row["batch"], row["seq"]) == (batch, seq)
    assert frame.loc[3, "total_flops"] > frame.loc[0, "total_flops"]


def test_sweep_of_a_cnn_and_its_figure() -> None:
    stream = io.StringIO()
    s = mw.sweep(
        SmallCNN(), CNN_INPUT, vary={"batch": [1, 2, 4]}, budget="1MiB",
        progress=Progress("sweep", stream),
    )  # fmt: skip
    for batch, a in zip([1, 2, 4], s.analyses, strict=True):
        assert _row(a) == _row(mw.analyze(SmallCNN(), input_size=(batch, 3, 32, 32)))
    assert "3/3 done" in stream.getvalue()
    fig = s.figure()
    assert [list(t.x) for t in fig.data] == [[1, 2, 4], [1, 2, 4]]
    assert list(fig.data[0].y) == [a.peak_bytes for a in s.analyses]
    assert list(fig.data[1].y) == [a.total_flops for a in s.analyses]
    assert [shape.y0 for shape in fig.layout.shapes] == [2**20]
    # the memory axis in the budget's own units (issue 40: plotly wrote "80B" beside "80.0 GiB")
    budget_label = next(a.text for a in fig.layout.annotations if a.text.startswith("budget"))
    assert budget_label == "budget 1.00 MiB"
    ticks = dict(zip(fig.layout.yaxis.tickvals, fig.layout.yaxis.ticktext, strict=True))
    assert ticks[2**20] == "1.00 MiB" and all(t.endswith("B") and " " in t for t in ticks.values())


def test_seq_is_dimension_1_of_token_inputs_or_said_ambiguous() -> None:
    class TwoInputs(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(10, 8)

        def forward(self, ids: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
            return self.emb(ids).sum(1) + x.sum(1)

    s = mw.sweep(
        TwoInputs(), [(2, 5), (2, 7, 8)], vary={"seq": [3]}, dtypes=["long", "float32"],
        progress=False,
    )  # fmt: skip
    ids, x = s.analyses[0].options.input_data
    assert (ids.shape, x.shape) == ((2, 3), (2, 7, 8)) and not s.notes  # ids only
    floats = mw.sweep(nn.Linear(8, 8), (2, 7, 8), vary={"seq": [3]}, progress=False)
    assert floats.analyses[0].options.input_data[0].shape == (2, 3, 8)
    assert "ambiguous" in floats.notes[0]
    explicit = mw.sweep(
        nn.Linear(8, 8), (2, 7, 8), vary={"seq": [3]}, dims={"seq": [(0, 1)]}, progress=False
    )
    assert not explicit.notes
    with pytest.raises(mw.OptionError, match="not 'batch' or 'seq'"):
        mw.sweep(nn.Linear(8, 8), (2, 8), vary={"width": [3]}, progress=False)
    with pytest.raises(mw.OptionError, match="list of sizes"):
        mw.sweep(nn.Linear(8, 8), (2, 8), vary={"batch": [0]}, progress=False)
    with pytest.raises(mw.OptionError, match="input_data"):
        mw.sweep(nn.Linear(8, 8), (2, 8), vary={"batch": [1]}, input_data=torch.ones(1, 8))


# ---------------------------------------------------------------------------------------------
# compare


def test_compare_a_model_with_itself_has_no_differences() -> None:
    a = mw.analyze(llama_config(), input_size=(1, 16))
    b = mw.analyze(llama_config(), input_size=(1, 16))
    cmp = mw.compare(a, b)
    frame = cmp.to_dataframe()
    assert len(frame) == len(a.modules) and not frame["changed"].any()
    for name in ("params", "flops", "activation_bytes"):
        assert (frame[f"{name}_diff"] == 0).all()
        assert list(frame[f"{name}_a"]) == list(a.to_dataframe()[name])
    assert frame["only_in"].isna().all()
    assert "No module differs." in cmp.summary()


def test_compare_gqa_with_mha_flags_the_kv_projections_and_attention() -> None:
    gqa = mw.analyze(llama_config(), input_size=(1, 16))
    mha = mw.analyze(mha_config(), input_size=(1, 16))
    cmp = mw.compare(gqa, mha)
    frame = cmp.to_dataframe()
    changed = set(frame.loc[frame["changed"], "module"])
    layers = range(llama_config().num_hidden_layers)
    assert changed == {
        f"model.layers.{i}.self_attn{p}" for i in layers for p in ("", ".k_proj", ".v_proj")
    }
    k = frame.set_index("module").loc["model.layers.0.self_attn.k_proj"]
    real_gqa = nn.Linear(32, 16, bias=False)
    real_mha = nn.Linear(32, 32, bias=False)
    assert (k["params_a"], k["params_b"]) == (real_gqa.weight.numel(), real_mha.weight.numel())
    assert k["params_diff"] == real_mha.weight.numel() - real_gqa.weight.numel()
    assert (k["output_shapes_a"], k["output_shapes_b"]) == ([[(1, 16, 16)]], [[(1, 16, 32)]])
    assert cmp.totals["total_params"] == (gqa.total_params, mha.total_params)
    text = cmp.summary()
    assert "model.layers.0–1.self_attn.k_proj · 2 ×" in text  # repeated layers folded


def test_compare_modules_on_one_side_only() -> None:
    a = mw.analyze(nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2)), input_size=(1, 4))
    b = mw.analyze(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)), input_size=(1, 4))
    frame = mw.compare(a, b).to_dataframe()
    assert list(frame["module"]) == ["", "0", "1", "2"]
    assert [x if isinstance(x, str) else None for x in frame["only_in"]] == [None, None, None, "b"]
    # "1" is a Linear in a and a ReLU in b: changed; "2" exists only in b
    assert list(frame["changed"]) == [False, False, True, True]
    with pytest.raises(TypeError, match="must be an Analysis"):
        mw.compare(a, nn.Linear(1, 1))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "peak",
    [
        lambda n: 1000 + 37 * n,  # linear (activations)
        lambda n: 1000 + 3 * n * n,  # quadratic (attention scores)
        lambda n: 1000 + 512 * ((n + 63) // 64),  # steps (allocation granularity)
        lambda n: 1000 + int(500 * n**0.5),  # concave
        # a tiny Llama's training step by sequence length (eager attention: seq^2 scores)
        lambda n: 20_338_248 + 264 * n + 176 * n * n,
    ],
    ids=["linear", "quadratic", "steps", "concave", "steep"],
)
def test_the_search_finds_what_a_scan_finds(peak: Callable[[int], int]) -> None:
    from meta_widget.explore.fit import _search

    for budget in (1100, 5000, 123_457, 10**6, 200 * 2**20):
        traced: list[int] = []

        def at(n: int, traced: list[int] = traced) -> int:
            traced.append(n)
            return peak(n)

        if peak(1) > budget:
            continue
        size, after = _search(at, budget, limit=2**24)
        if after is None:  # the limit fits
            assert size == 2**24 and peak(size) <= budget
            continue
        assert after == size + 1 and peak(size) <= budget < peak(size + 1)
        assert all(peak(n) <= budget for n in range(1, size))  # monotone: a scan agrees
        assert len(set(traced)) <= 2 * size.bit_length() + 4


@pytest.mark.parametrize(
    "peak",
    [
        # Llama-3-8B's generate() peaks, 16 prompts (notebooks/08-serving): the prompt's
        # activations, then from about 8,700 tokens the KV cache and logits, 4,006,272 B a token
        lambda n: max(
            16_111_018_893 + 2_097_664 * (n - 1), 85_873_818_761 + 4_006_272 * (n - 17_426)
        ),
        # Gemma 3 4B's, one prompt: linear, and a little convex (full-attention layers)
        lambda n: 7_768_875_049 + 168_848 * n + 4 * n * n,
    ],
    ids=["kinked", "convex"],
)
def test_a_peak_nearly_linear_near_the_answer_is_found_in_a_few_traces(
    peak: Callable[[int], int],
) -> None:
    """The line through a guess and its neighbour has the slope where the answer is; the line
    through the bracket's far ends, under the peak, crept up on it one halving at a time (18 to
    22 traces where these take 7 to 11)."""
    from meta_widget.explore.fit import _search

    for budget in (22 * 2**30, 40 * 2**30, 80 * 2**30):
        traced: set[int] = set()

        def at(n: int, traced: set[int] = traced) -> int:
            traced.add(n)
            return peak(n)

        size, after = _search(at, budget, limit=2**17)
        assert after == size + 1 and peak(size) <= budget < peak(size + 1)
        assert len(traced) <= 11, (budget, sorted(traced))
