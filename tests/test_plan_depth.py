"""``mw.plan``'s per-layer rule (``meta_widget.explore.depth``): candidates traced at 2, 3 and
4 layers and extended to the full depth give the numbers a full-depth trace gives, to the byte;
a candidate whose traces break the rule, and a model whose layers differ, are traced at full
depth."""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any

import pytest

import meta_widget as mw
from meta_widget.explore import depth as depth_rule
from meta_widget.explore import depth_held, depth_reserve, plan_trace
from meta_widget.explore import plan as plan_module
from meta_widget.explore.alike_layers import alike_layers
from meta_widget.explore.layouts import Layout
from meta_widget.memory.allocator import FREES, INITIAL, KIND, NBYTES
from meta_widget.timing.gpus import resolve_gpu

transformers = pytest.importorskip("transformers")

LAYERS = 9
SIZE = (2, 32)
#: HSDP with tensor parallelism (every collective group), checkpointing or not, every precision,
#: two micro-batches (the accumulating backward): 6 candidates
SPACE: dict[str, Any] = dict(
    gpu="H100",
    devices=8,
    layouts=[{"replicate": 2, "fsdp": 2, "tp": 2}],
    micro_batches=[2],
    # over what any holds in parameters, gradients and optimizer state with the CUDA context
    # and NCCL's buffers (850.7 MB: none is pruned), under the least any holds on the GPU
    # (917.9 MB: the rule's numbers stand)
    budget="850MiB",
)


#: one candidate: FSDP 8, as given, no checkpointing, one micro-batch
FSDP8: dict[str, Any] = dict(
    gpu="H100",
    devices=8,
    layouts=[{"fsdp": 8}],
    precisions=["as given"],
    activation_checkpointing=[False],
    micro_batches=[1],
    # over its parameters, gradients, optimizer state and the CUDA context (581.6 MB), under the
    # least it holds on the GPU (651.8 MB): the rule's numbers stand (a candidate that may fit
    # is traced at full depth: tests/test_plan_pins.py)
    budget="600MiB",
)


def llama(layers: int = LAYERS, **extra: Any) -> Any:
    return transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        **{"num_attention_heads": 4, "num_key_value_heads": 2, **extra},
    )


def same_numbers(a: plan_module.Candidate, b: plan_module.Candidate) -> None:
    assert a.key == b.key
    assert a.peak_bytes == b.peak_bytes, a.key  # to the byte
    # the caching allocator's reserve too, where the rule gives it (``depth_reserve``); else
    # the least the GPU holds, under the budget
    assert a.device_bytes == b.device_bytes or (not a.fits and a.device_bytes < b.device_bytes)
    assert a.fits == b.fits
    for name in ("step_s", "mfu", "tokens_per_s"):
        assert math.isclose(getattr(a, name), getattr(b, name), rel_tol=1e-9), (a.key, name)


#: a candidate's depths by the rule: 3 and 4 layers, and 2 where the reserve needs them
RULED = ((3, 4), (2, 3, 4))


def test_rule_gives_the_full_depth_numbers_for_every_candidate() -> None:
    """Each candidate by the rule equals the same candidate traced at full depth (FSDP alone,
    micro-batches 1, is ``test_traces_that_break_the_rule...``'s and the benchmark's)."""
    by_rule = mw.plan(llama(), SIZE, **SPACE)
    full = mw.plan(llama(), SIZE, full_depth=True, **SPACE)
    assert len(by_rule.candidates) == 6
    # at 2 layers too where the caching allocator's steps need a third rank (``RULED``)
    assert all(c.traced_layers in RULED for c in by_rule.candidates)
    assert all(c.traced_layers == () for c in full.candidates)
    for a, b in zip(by_rule.candidates, full.candidates, strict=True):
        same_numbers(a, b)
    assert by_rule.traces == sum(len(c.traced_layers) for c in by_rule.candidates)
    assert full.traces == 6
    assert not by_rule.to_dataframe()["fits"].any() and not full.to_dataframe()["fits"].any()
    assert set(by_rule.to_dataframe()["traced_layers"]) <= {"3, 4", "2, 3, 4"}
    assert set(full.to_dataframe()["traced_layers"]) == {"all"}


def test_selective_checkpointing_follows_the_rule() -> None:
    """``"selective"`` (torchtitan's op list: every second matmul of a block recomputed, the
    count starting again in each block) checkpoints each layer alike: by the rule, with and
    without tensor parallelism, the numbers of the full depth."""
    space = {**SPACE, "layouts": [{"fsdp": 8}, {"replicate": 2, "fsdp": 2, "tp": 2}]}
    space.update(activation_checkpointing=["selective"], precisions=["as given"])
    config = llama(use_cache=False)
    by_rule = mw.plan(config, SIZE, **space)
    full = mw.plan(config, SIZE, full_depth=True, **space)
    assert [c.activation_checkpointing for c in by_rule.candidates] == ["selective"] * 2
    assert all(c.traced_layers in RULED for c in by_rule.candidates)
    for a, b in zip(by_rule.candidates, full.candidates, strict=True):
        same_numbers(a, b)


def test_modules_named_follow_the_rule_where_every_layer_has_them() -> None:
    """A checkpointing setting of module names: class names (``LlamaMLP``: the MLP of every
    layer) and paths outside the layers pick alike in every layer, and follow the rule; paths
    into some layers (``layers.0``) do not, and that candidate is traced at full depth. Each
    row is the full depth's; ``Plan.sort`` puts them between none and every block."""
    space = {**SPACE, "layouts": [{"fsdp": 8}], "precisions": ["as given"], "budget": "1GiB"}
    space["activation_checkpointing"] = [
        ["LlamaMLP"],
        ["layers.0", "layers.1"],
        ["norm", "LlamaAttention"],
        True,
    ]
    by_rule = mw.plan(llama(), SIZE, **space)
    full = mw.plan(llama(), SIZE, full_depth=True, **space)
    depths = [c.traced_layers for c in by_rule.candidates]
    assert depths[0] in RULED and depths[2] in RULED and depths[1] == ()
    assert by_rule.candidates[1].activation_checkpointing == ("layers.0", "layers.1")
    # found before any trace: none is spent on the 3- and 4-layer traces the rule would refuse
    assert by_rule.traces == sum(len(c.traced_layers) or 1 for c in by_rule.candidates)
    for a, b in zip(by_rule.candidates, full.candidates, strict=True):
        same_numbers(a, b)
    mlp, first_two, _, whole = (c.peak_bytes for c in by_rule.candidates)
    assert whole < mlp < first_two  # every block < every MLP < two blocks of nine
    order = by_rule.sort("activation_checkpointing").to_dataframe()["activation_checkpointing"]
    assert list(order)[-1] is True
    with pytest.raises(mw.OptionError, match=r"names \['layers.99'\], which picks no module"):
        mw.plan(llama(), SIZE, **{**space, "activation_checkpointing": [["layers.99"]]})


def test_a_candidates_analysis_is_traced_at_full_depth_when_asked_for() -> None:
    p = mw.plan(llama(), SIZE, **FSDP8)
    best = p.candidates[0]
    assert best.openable and best.traced_layers == (3, 4)
    traces = p.traces
    a = best.analysis  # traced now, at full depth
    assert a is not None and a.peak_bytes == best.peak_bytes
    assert sum(1 for m in a.modules if m.type == "LlamaDecoderLayer") == LAYERS
    assert p.traces == traces  # the plan's count is of the plan's own runs
    assert best.analysis is a  # once


def test_traces_that_break_the_rule_are_traced_at_full_depth(monkeypatch: Any) -> None:
    """Under FSDP the 2-layer trace is no 1-layer trace with a run doubled (the one layer is
    both the first and the last): with depths 1 and 2 the rule is not found, and the candidate
    is traced at full depth."""
    monkeypatch.setattr(plan_trace, "DEPTHS", (1, 2))
    p = mw.plan(llama(), SIZE, **FSDP8)
    (c,) = p.candidates
    assert c.traced_layers == () and c._analysis is not None
    assert c.peak_bytes == c._analysis.peak_bytes
    assert p.traces == 2 + 1


def test_layers_that_differ_are_not_extended() -> None:
    """The rule needs alike layers: a per-layer list with two kinds, too few layers, a model that
    is not a config, or options that name the full model's modules turn it off."""
    mixed = llama()
    mixed.layer_types = ["sliding_attention", "full_attention"] * 4 + ["full_attention"]
    assert depth_rule.depth_of(mixed) is None
    assert depth_rule.depth_of(llama(4)) is None
    assert depth_rule.depth_of(llama()) == LAYERS
    assert depth_rule.depth_of(transformers.LlamaForCausalLM) is None
    p = mw.plan(llama(), SIZE, assume={}, **FSDP8)
    assert p.candidates[0].traced_layers == ()


def test_alike_layers_compare_settings_not_only_shapes() -> None:
    """Two layers with the same parameters but another attribute (a window) are not alike."""
    model = transformers.LlamaForCausalLM(llama(6)).to("meta")
    assert alike_layers(model, 6)
    model.model.layers[3].self_attn.sliding_window = 16
    assert not alike_layers(model, 6)


def test_full_depth_must_be_a_bool() -> None:
    with pytest.raises(mw.OptionError, match="full_depth"):
        mw.plan(llama(), SIZE, gpu="H100", full_depth="yes")


SMALL = dict(
    hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
    vocab_size=256,
)  # fmt: skip
ONE = dict(FSDP8, devices=4, layouts=[{"fsdp": 4}])


@pytest.mark.parametrize(
    "config",
    [
        lambda: transformers.Qwen2Config(num_hidden_layers=7, **SMALL),
        lambda: transformers.MistralConfig(num_hidden_layers=7, sliding_window=16, **SMALL),
        lambda: transformers.MixtralConfig(
            num_hidden_layers=7, num_local_experts=4, num_experts_per_tok=2, **SMALL
        ),
    ],
    ids=["qwen2", "mistral-sliding-window", "mixtral-moe"],
)
def test_rule_holds_on_other_decoders(config: Any) -> None:
    by_rule = mw.plan(config(), SIZE, **ONE)
    full = mw.plan(config(), SIZE, full_depth=True, **ONE)
    assert by_rule.candidates[0].traced_layers in RULED
    same_numbers(by_rule.candidates[0], full.candidates[0])


@pytest.mark.parametrize(
    "config",
    [
        lambda: transformers.GPT2Config(
            n_layer=7, n_embd=64, n_head=4, vocab_size=256, bos_token_id=0, eos_token_id=0
        ),
        lambda: transformers.OPTConfig(
            num_hidden_layers=7,
            hidden_size=64,
            ffn_dim=128,
            num_attention_heads=4,
            vocab_size=256,
            word_embed_proj_dim=64,
        ),
    ],
    ids=["gpt2", "opt"],
)
def test_a_layer_the_diff_splits_is_one_run_again(config: Any) -> None:
    """GPT-2's and OPT's optimizer loops: the diff matches one layer's update at an event that
    also ends the run before it (``[free, sqrt, div, free]``), splitting it in two; two runs
    repeated apart are not the layer repeated, so the check failed until the two were joined
    (``depth._joined``). Now each candidate by the rule equals its full-depth trace.

    Since training traces hold a second, steady step, the rule no longer holds for them: the
    multi-tensor AdamW step of the second step (no state to make, every ``_foreach_sqrt``
    output a 32-byte token like its neighbours) is matched at another place by the diff. The
    plan then traces the candidate at full depth: its numbers stay exact, only slower."""
    by_rule = mw.plan(config(), SIZE, **ONE)
    full = mw.plan(config(), SIZE, full_depth=True, **ONE)
    assert by_rule.candidates[0].traced_layers in (*RULED, ())
    same_numbers(by_rule.candidates[0], full.candidates[0])


def test_fsdp_with_checkpointing_follows_the_rule() -> None:
    """FSDP 4 with checkpointing: the optimizer phase holds a layer's update at the end of one
    group and at the start of the next (``AB`` at 3 layers), which the fourth layer extends
    each on its own (``AABB``): two runs meeting where the diff inserts (``depth._run_doubled``;
    ``depth._regrouped`` cuts such a run, below). Diffed a phase run at a time
    (``depth._chunks``), the 4-layer trace is the 3-layer one with each run found doubled, and
    the peak and step time by the rule are the full depth's."""
    kwargs = dict(mode="training", gpu="H100", parallel={"fsdp": 4}, activation_checkpointing=True)
    samples = [
        depth_rule.sample(mw.analyze(llama(d), SIZE, **kwargs), d) for d in depth_rule.DEPTHS
    ]
    runs = depth_rule.doubled(samples[0], samples[1])
    assert runs is not None
    assert depth_rule._repeat(samples[0].events, runs, 2) == list(samples[1].events)
    full = depth_rule.extend(samples, LAYERS, resolve_gpu("H100"), 4)
    whole = mw.analyze(llama(), SIZE, **kwargs)
    assert full is not None and whole.time is not None
    assert full.peak_bytes == whole.peak_bytes
    assert math.isclose(full.time.step_s, whole.time.step_s, rel_tol=1e-9)


def test_the_runs_a_layer_more_doubles_are_found_wherever_the_diff_inserts() -> None:
    """``depth._doubled``: the block the diff sees inserted is a run of the shorter trace next to
    it, around it (a rotation: the diff may insert ``b, a`` inside ``a, b``) or two runs
    meeting there (``AB`` to ``AABB``), each checked by doubling; a change, or a block that
    doubles nothing, is no rule."""
    x, a, b, c, y = ((n, "op", "forward") for n in (1, 2, 3, 4, 5))
    three = [x, a, b, c, y]
    four = [x, a, b, c, a, b, c, y]
    runs = depth_rule._doubled(three, four)
    assert runs == [(1, 4)] and depth_rule._repeat(three, runs, 2) == four
    assert depth_rule._run_doubled(three, 2, [b, c, a]) == [(1, 4)]  # inserted inside the run
    assert depth_rule._run_doubled(three, 4, [a, b, c]) == [(1, 4)]  # after it
    assert depth_rule._run_doubled(three, 1, [a, b, c]) == [(1, 4)]  # before it
    ab = [x, a, b, y]
    assert depth_rule._doubled(ab, [x, a, a, b, b, y]) == [(1, 2), (2, 3)]
    assert depth_rule._doubled(ab, [x, a, b, c, y]) is None  # c doubles nothing
    assert depth_rule._doubled(ab, [x, a, c, y]) is None  # a change
    assert depth_rule._doubled(ab, ab) is None  # nothing added


def test_a_run_is_cut_only_where_one_cut_gives_the_next_depth() -> None:
    x, a, b, y = ((n, "op", "optimizer") for n in (1, 2, 3, 4))
    events = [x, a, b, y]
    assert depth_rule._regrouped(events, [(1, 3)], [x, a, b, a, b, y]) == [(1, 3)]
    assert depth_rule._regrouped(events, [(1, 3)], [x, a, a, b, b, y]) == [(1, 2), (2, 3)]
    assert depth_rule._regrouped(events, [(1, 3)], [x, b, a, a, b, y]) is None
    assert depth_rule._regrouped(events, [(1, 3)], [x, a, a, b, b]) is None


def test_a_run_of_alike_events_is_spread_over_equal_parts_of_their_block() -> None:
    """``depth._spread``: a run of 2 alike events in a block of 6 is one at the end of each
    third; a run that is not all alike, or a block that does not split evenly, is not spread."""
    x, a, y = ((n, "aten.empty", "forward") for n in (1, 2, 3))
    block = [x, a, a, a, a, a, a, y]
    assert depth_rule._spread(block, [(1, 3)]) == [(3, 4), (6, 7)]
    assert depth_rule._spread(block, [(0, 2)]) is None  # x, a: not alike
    assert depth_rule._spread([x, a, a, a, a, a, y], [(1, 3)]) is None  # 5 in 2 parts
    assert depth_rule._spread(block, [(1, 3), (6, 7)]) is None  # would meet the next run


def test_a_run_slides_on_while_the_events_let_it() -> None:
    """``depth._slid``: the run holding the event moves on one event at a time while the event
    it leaves is the one it takes in, short of the next run; None where it cannot move."""
    f, a, b, y = ((n, "op", "forward") for n in (-1, 2, 3, 4))
    events = [f, a, f, a, f, a, y]
    assert depth_rule._slid(events, [(0, 2)], 1) == [(4, 6)]  # two alike blocks on
    assert depth_rule._slid(events, [(0, 2), (5, 6)], 0) == [(3, 5), (5, 6)]  # short of the next
    assert depth_rule._slid(events, [(4, 6)], 4) is None  # y differs from f
    assert depth_rule._slid(events, [(0, 2)], 3) is None  # no run holds event 3
    assert depth_rule._slid([f, b, f, a], [(0, 2)], 0) == [(1, 3)]  # f, b doubled = b, f
    assert depth_rule._repeat([f, b, f, a], [(1, 3)], 2) == depth_rule._repeat(
        [f, b, f, a], [(0, 2)], 2
    )


def test_a_trace_that_fails_is_not_traced_again_at_full_depth() -> None:
    """Tensor parallelism alone leaves the norms plain tensors beside DTensors, and PyTorch's
    multi-tensor AdamW (its default on CUDA) fails on the mix, as a real run does: the 3-layer
    trace's error is the candidate's, with no full-depth trace; ``foreach=False`` traces."""
    space: dict[str, Any] = dict(FSDP8, devices=4, layouts=[{"tp": 4}])
    config = llama(num_key_value_heads=4)
    p = mw.plan(config, SIZE, **space)
    (c,) = p.candidates
    # the reason in words (issue 40): what failed and the fix, not the raw RuntimeError
    assert c.error is not None and c.error.startswith("A multi-tensor optimizer step over DTensors")
    assert "foreach=False" in c.error and "RuntimeError" not in c.error
    assert c.traced_layers == (3,) and p.traces == 1 and not c.fits
    assert c.analysis is not None and c.analysis.error is not None  # the full depth, when asked
    assert "mixed torch.Tensor and DTensor" in c.analysis.error.message  # type: ignore[union-attr]
    (ok,) = mw.plan(config, SIZE, foreach=False, **space).candidates
    assert ok.error is None and ok.traced_layers in RULED and ok.peak_bytes


def test_a_layouts_multi_tensor_failure_is_traced_once_a_precision() -> None:
    """The failure above is the layout's (which parameters are DTensors) and the precision's
    (their dtypes): the other candidates of the layout and precision are not traced, and each
    of them, traced alone, fails the same way."""
    space: dict[str, Any] = dict(
        gpu="H100", devices=4, layouts=[{"tp": 4}], activation_checkpointing=[False, True],
        micro_batches=[1, 2], budget="80GiB",
    )  # fmt: skip
    config = llama(num_key_value_heads=4)
    p = mw.plan(config, SIZE, workers=1, **space)
    assert len(p.candidates) == 12 and all(c.error for c in p.candidates)
    first = {c.precision: c for c in reversed(p.candidates)}  # the first of each precision
    traced = [c for c in p.candidates if c.traced_layers]
    # autocast holds what the precision as given holds: one group (HELD_AS)
    assert traced == [first["as given"], first["param_dtype bf16"]] and p.traces == 2
    for c in p.candidates:
        assert c.error.startswith(plan_trace.FOREACH_MIXED_TITLE), c.key  # type: ignore[union-attr]
        if c not in traced:
            assert "Not traced: every candidate of tp=4" in c.error and not c.openable  # type: ignore[operator]
            alone = mw.analyze(config, SIZE, mode="training", gpu="H100", **c.options())
            assert alone.error is not None and alone.error.title == plan_trace.FOREACH_MIXED_TITLE


def test_a_candidate_that_may_fit_has_the_full_depths_numbers() -> None:
    """Within the budget, what the GPU holds comes from the caching allocator replayed over the
    full depth's steps by the rule (``depth_reserve``) where the allocator's steps follow it
    (2 traces; a third, at 2 layers, where a free outside the layers' runs needs a third rank:
    5 of these 6 tiny models), else from a full-depth trace: either way every row is the
    full-depth plan's, what the GPU holds included."""
    space = {**SPACE, "budget": None}  # the H100's memory: every candidate fits
    by_rule = mw.plan(llama(), SIZE, **space)
    full = mw.plan(llama(), SIZE, full_depth=True, **space)
    assert all(c.fits for c in by_rule.candidates)
    assert [c.traced_layers for c in by_rule.candidates] == [(2, 3, 4)] * 5 + [(3, 4)]
    for a, b in zip(by_rule.candidates, full.candidates, strict=True):
        same_numbers(a, b)
        assert a.device_bytes == b.device_bytes
    assert by_rule.traces == 3 * 5 + 2 and full.traces == 6


CHECKPOINTING = {"activation_checkpointing": True}
RESERVE_CASES = [
    ({"fsdp": 8}, {}, 1, SIZE, False),
    ({"replicate": 2, "fsdp": 2, "tp": 2}, {"param_dtype": "bfloat16"}, 2, (4, 128), True),
    ({"fsdp": 4, "tp": 2, "sequence_parallel": True}, {"autocast": "bfloat16"}, 1, SIZE, True),
    ({"replicate": 8}, {**CHECKPOINTING, "param_dtype": "bfloat16"}, 1, SIZE, False),
    # a free whose rank among the live allocations of its size moves with the copy
    ({"fsdp": 8}, {}, 2, (4, 128), True),
    ({"fsdp": 8}, {**CHECKPOINTING, "autocast": "bfloat16"}, 1, SIZE, False),
    # ... and one outside the runs whose rank moves with the depth: a third rank, at 2 layers
    ({"replicate": 2, "fsdp": 4}, CHECKPOINTING, 2, (4, 128), True),
]


@pytest.mark.parametrize(
    ("layout", "options", "micro_batches", "size", "needs_two"),
    RESERVE_CASES,
    ids=[
        "fsdp",
        "hsdp-tp-bf16-mb2",
        "fsdp-tp-sp-autocast",
        "ddp-ckpt-bf16",
        "fsdp-mb2",
        "fsdp-ckpt-autocast",
        "hsdp-ckpt-mb2",
    ],
)
def test_the_allocators_reserve_by_the_rule_is_the_full_depths(
    layout: Any, options: Any, micro_batches: int, size: Any, needs_two: bool
) -> None:
    """The caching allocator's steps the rule builds from 3 and 4 layers (and 2, where a free
    outside the layers' runs needs a third rank: ``needs_two``, and only there) are the
    full-depth trace's, step by step (each free freeing the allocation the full depth's
    frees), so its reserve replayed over them equals the full-depth trace's to the byte, and
    with it what the GPU holds (``Analysis.footprint_bytes``), for each layout, precision,
    checkpointing and micro-batches; at 3 layers less than that."""
    gpu = resolve_gpu("H100")
    kwargs = dict(mode="training", gpu="H100", parallel=layout, micro_batches=micro_batches)
    depths = (2, *depth_rule.DEPTHS)
    analyses = [mw.analyze(llama(d), size, **kwargs, **options) for d in depths]
    two, *samples = (depth_rule.sample(a, d) for a, d in zip(analyses, depths, strict=True))
    dp = layout.get("replicate", 1) * layout.get("fsdp", 1)
    full = depth_rule.extend(samples, LAYERS, gpu, dp)
    assert full is not None and (full.device_bytes is None) == needs_two
    if needs_two:
        full = depth_rule.extend(samples, LAYERS, gpu, dp, two=two)
    assert full is not None
    whole = mw.analyze(llama(), size, **kwargs, **options)
    assert full.peak_bytes == whole.peak_bytes
    assert full.device_bytes == whole.footprint_bytes == whole.memory.device_bytes
    assert full.least_device_bytes <= full.device_bytes
    assert analyses[1].footprint_bytes < full.device_bytes
    runs = depth_rule.doubled(samples[0], samples[1])
    assert runs is not None
    tables = [s.allocator_steps for s in samples]
    earlier = two.allocator_steps if needs_two else None
    reserve = depth_reserve.Reserve(tables, depth_rule._doubled, depth_rule._repeat, earlier)
    built = reserve.build(runs, LAYERS)
    assert isinstance(built, tuple)
    steps, places = built
    table = depth_rule.sample(whole, LAYERS).allocator_steps
    initial = len(steps) - len(places)
    assert [n for _, n in steps[:initial]] == table[:initial, NBYTES].tolist()
    assert table[initial, KIND] != INITIAL and len(steps) == len(table)
    index = {place: i for i, place in enumerate(places)}
    for (place, nbytes), row in zip(steps[initial:], table[initial:], strict=True):
        if nbytes is None:  # a free: of the allocation the full depth's frees
            assert index[place] + initial == row[FREES]
        else:
            assert nbytes == row[NBYTES]


def test_allocator_steps_that_break_the_rule_give_no_reserve() -> None:
    """A free in the 4-layer trace that frees another allocation than the rule says (two
    frees' allocations swapped): no reserve by the rule (``plan`` then traces the candidate at
    full depth when it may fit)."""
    gpu = resolve_gpu("H100")
    kwargs = dict(mode="training", gpu="H100", parallel={"fsdp": 8})
    samples = [
        depth_rule.sample(mw.analyze(llama(d), SIZE, **kwargs), d) for d in depth_rule.DEPTHS
    ]
    assert depth_rule.extend(samples, LAYERS, gpu, 8).device_bytes is not None  # type: ignore[union-attr]
    table = samples[1].allocator_steps.copy()
    frees = [i for i in range(len(table)) if table[i, 1] < 0]
    # two neighbouring frees of allocations of one size, made before either: swapped
    i, j = next(
        (i, j)
        for i, j in itertools.pairwise(frees)
        if table[table[i, 2], 1] == table[table[j, 2], 1] and table[j, 2] < i
    )
    table[[i, j], 2] = table[[j, i], 2]
    broken = dataclasses.replace(samples[1], allocator_steps=table)
    full = depth_rule.extend([samples[0], broken], LAYERS, gpu, 8)
    assert full is not None and full.device_bytes is None


@pytest.mark.parametrize(
    ("layout", "options"),
    [
        ({"fsdp": 8}, {}),
        ({"replicate": 2, "fsdp": 2, "tp": 2}, {"param_dtype": "bfloat16"}),
        ({"fsdp": 2, "tp": 2}, {"autocast": "bfloat16", "activation_checkpointing": True}),
    ],
    ids=["fsdp", "hsdp-tp-bf16", "fsdp-tp-autocast-checkpointing"],
)
def test_held_state_from_3_and_4_layers_is_the_full_depths(layout: Any, options: Any) -> None:
    """The pruning bound (``depth.held_state``): the parameters, buffers, gradients and
    optimizer state a rank holds, at 3 and 4 layers extended, equal the full depth's to the byte
    (no rule to check), and every traced peak and footprint is at least them."""
    job = plan_trace.Job(llama(), SIZE, None, "training", resolve_gpu("H100"))
    options = {"parallel": mw.Parallel(**layout), **options}
    counts = plan_trace.Counts()
    with plan_trace.planning():
        three, four, full = (plan_trace.run_analyze(job, counts, options, d) for d in (3, 4, None))
    held = depth_rule.held_state(full)
    assert held > 0
    at = depth_rule.held_state_at(depth_rule.sample(three, 3), depth_rule.sample(four, 4), LAYERS)
    assert at == held
    for a in (three, four, full):
        assert a.peak_bytes >= depth_rule.held_state(a)
        assert a.footprint_bytes >= depth_rule.held_state(a) + depth_rule.overheads(a)
        assert depth_rule.overheads(a) == depth_rule.overheads(full) > 0  # alike at every depth


def test_a_layout_whose_state_is_over_the_budget_is_pruned_and_cannot_fit() -> None:
    """Between what FSDP 8 holds in parameters, gradients and optimizer state as given and in
    bf16, the budget prunes the fp32 ones: the first candidate of "as given" stops at its
    3-layer trace (``depth_held``: what its middle layer holds, once per layer more), and the
    rest of "as given" and "autocast bf16" (which holds the same) are not traced; "param_dtype
    bf16" is traced by the rule. Each row pruned cannot fit: traced at full depth, its footprint
    is over the budget by at least the bound's margin, and the bound is the full depth's."""
    job = plan_trace.Job(llama(), SIZE, None, "training", resolve_gpu("H100"))
    counts = plan_trace.Counts()
    with plan_trace.planning():
        fp32 = plan_trace.run_analyze(job, counts, {"parallel": mw.Parallel(fsdp=8)})
    budget = depth_rule.held_state(fp32) + depth_rule.overheads(fp32) - 1
    space = {**FSDP8, "budget": budget, "precisions": None, "activation_checkpointing": None}
    p = mw.plan(llama(), SIZE, **space)
    assert len(p.candidates) == 6  # checkpointing or not, 3 precisions, 1 micro-batch
    rows = p.to_dataframe()
    pruned = rows[rows["precision"] != "param_dtype bf16"]
    assert list(pruned["traced_layers"]) == ["3"] + ["none"] * 3
    assert pruned["error"].str.startswith("Cannot fit: its parameters, gradients").all()
    assert (pruned["device_bytes"] == budget + 1).all() and not pruned["fits"].any()
    assert pruned["step_s"].isna().all() and pruned["peak_bytes"].isna().all()
    ruled = rows[rows["precision"] == "param_dtype bf16"]
    assert set(ruled["traced_layers"]) == {"3, 4"} and ruled["error"].isna().all()
    assert p.traces == 1 + 2 * 2
    for c in p.candidates:
        if c.error is not None:
            a = plan_trace.run_analyze(job, plan_trace.Counts(), c.options())
            assert a.error is None and a.footprint_bytes > budget, c.key
    with pytest.raises(mw.NothingFitsError, match="least any holds on the GPU"):
        _ = p.best


@pytest.mark.parametrize(
    ("config", "layout", "precision"),
    [
        (llama(), {"fsdp": 8}, "as given"),
        (llama(), {**SPACE["layouts"][0], "sequence_parallel": True}, "param_dtype bf16"),
        (llama(), {"replicate": 4, "tp": 2, "sequence_parallel": True}, "autocast bf16"),
        (llama(tie_word_embeddings=True), {"replicate": 8}, "as given"),
    ],
)  # fmt: skip
def test_the_middle_layers_state_gives_the_two_traces_number(
    config: Any, layout: dict[str, Any], precision: str
) -> None:
    """``depth_held``: what one rank holds besides activations at full depth, from the 3-layer
    trace's middle layer, is the number of the 3- and 4-layer traces, to the byte."""
    c = plan_module.Candidate(Layout(**layout), True, precision, 2)
    job = plan_trace.Job(config, SIZE, None, "training", resolve_gpu("H100"))
    with plan_trace.planning():
        three, four = (
            plan_trace.run_analyze(job, plan_trace.Counts(), c.options(), d) for d in (3, 4)
        )
    two = depth_rule.held_state_at(depth_rule.sample(three, 3), depth_rule.sample(four, 4), LAYERS)
    assert depth_held.held_from_three(three, LAYERS) == two
    assert depth_held.held_from_three(four, LAYERS) is None  # 4 layers: no single middle one


def test_the_one_trace_bound_stops_at_its_first_difference(monkeypatch: Any) -> None:
    """Where the 3-layer trace's number is not the two traces' (never seen; forced here), the
    plan stops pruning by it: the next candidate, whose forced number is over any budget, is
    traced as before."""
    calls: list[int] = []
    real = depth_held.held_from_three

    def off(a: Any, layers: int) -> int | None:
        calls.append(layers)
        found = real(a, layers)
        assert found is not None
        return found + 1 if len(calls) == 1 else 10**15

    monkeypatch.setattr(plan_trace, "held_from_three", off)
    p = mw.plan(llama(), SIZE, **{**FSDP8, "activation_checkpointing": [False, True]})
    assert len(calls) == 1 and [c.error for c in p.candidates] == [None, None]
    assert [c.traced_layers for c in p.candidates][1] in RULED
