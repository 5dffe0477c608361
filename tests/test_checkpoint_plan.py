"""``mw.plan_checkpointing``: the plan re-traced fits, recomputes no more than the exhaustive
optimum over every subset of a 6-layer model's blocks (each subset traced by ``analyze`` here),
and its code, run on the real CPU model, checkpoints exactly the planned modules (checked by the
wrappers it leaves and by FlopCounterMode counting the recomputation)."""

from __future__ import annotations

import copy
import itertools
from typing import Any

import pytest
import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
from torch.utils.flop_counter import FlopCounterMode

import meta_widget as mw
from meta_widget.explore import checkpointing

SHAPE = (32, 128, 64)
BLOCKS = [f"blocks.{i}" for i in range(6)]


class Block(nn.Module):
    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(self.act(self.fc1(self.norm(x))))


class Net(nn.Module):
    """Six residual MLP blocks of the given hidden widths, then a head."""

    def __init__(self, hidden: tuple[int, ...], width: int = 64) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(width, h) for h in hidden)
        self.head = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


#: blocks of different sizes (savings and recompute differ: a knapsack), and identical ones
MIXED = (256, 512, 128, 384, 64, 256)
SAME = (256,) * 6


def exhaustive(model: nn.Module) -> dict[tuple[str, ...], tuple[int, int]]:
    """Every subset of the blocks traced by analyze: (peak bytes, recomputed FLOPs), the
    recompute being the step's FLOPs minus those with nothing checkpointed."""
    base = mw.analyze(model, SHAPE, mode="training").total_flops
    out = {}
    for k in range(len(BLOCKS) + 1):
        for subset in itertools.combinations(BLOCKS, k):
            a = mw.analyze(model, SHAPE, mode="training", activation_checkpointing=list(subset))
            assert a.error is None
            out[subset] = (a.peak_bytes, a.total_flops - base)
    return out


@pytest.fixture(scope="module", params=[MIXED, SAME], ids=["mixed", "same"])
def case(request: Any) -> tuple[nn.Module, dict[tuple[str, ...], tuple[int, int]]]:
    torch.manual_seed(0)
    model = Net(request.param)
    return model, exhaustive(model)


def budgets(table: dict[tuple[str, ...], tuple[int, int]]) -> list[int]:
    """Each distinct traced peak below the largest: the budget some subset fits exactly."""
    peaks = sorted({peak for peak, _ in table.values()})
    return peaks[:-1]


def test_plans_fit_when_retraced_and_recompute_no_more_than_the_exhaustive_optimum(
    case: tuple[nn.Module, dict[tuple[str, ...], tuple[int, int]]],
) -> None:
    model, table = case
    tried = budgets(table)
    assert len(tried) >= 5  # several budgets, the tightest (the smallest peak) included
    for budget in tried:
        best = min(flops for peak, flops in table.values() if peak <= budget)
        plan = mw.plan_checkpointing(model, SHAPE, budget=budget)
        again = mw.analyze(model, SHAPE, mode="training", activation_checkpointing=plan.modules)
        assert again.peak_bytes <= budget, (budget, plan.modules)
        assert plan.peak_bytes == again.peak_bytes
        assert plan.recompute_flops <= best, (budget, plan.modules, best)
        assert (plan.peak_bytes, plan.recompute_flops) == table[tuple(plan.modules)]
        assert plan.analysis.options.activation_checkpointing == plan.modules


def test_the_code_checkpoints_exactly_the_planned_modules_on_the_real_model() -> None:
    torch.manual_seed(0)
    model = Net(MIXED)
    budget = mw.analyze(model, SHAPE, mode="training").peak_bytes * 3 // 4
    plan = mw.plan_checkpointing(model, SHAPE, budget=budget)
    assert 0 < len(plan.modules) < len(BLOCKS)
    plain = copy.deepcopy(model)
    exec(plan.code, {"model": model})
    wrapped = {p for p, m in model.named_modules() if isinstance(m, CheckpointWrapper)}
    assert wrapped == set(plan.modules)
    assert model.state_dict().keys() == plain.state_dict().keys()

    x = torch.randn(SHAPE)

    def step(m: nn.Module) -> tuple[int, torch.Tensor]:
        with FlopCounterMode(display=False) as counter:
            m(x).square().mean().backward()
        return counter.get_total_flops(), m.blocks[0].fc1.weight.grad  # type: ignore[index]

    plain_flops, plain_grad = step(plain)
    flops, grad = step(model)
    # FlopCounterMode counts the recomputation of the real run: the plan's number
    assert flops - plain_flops == plan.recompute_flops
    inner = dict(model.named_parameters())
    assert "blocks.0.fc1.weight" in {k.replace("._checkpoint_wrapped_module", "") for k in inner}
    torch.testing.assert_close(grad, plain_grad)


def test_a_model_that_fits_needs_no_checkpointing() -> None:
    model = Net(SAME)
    peak = mw.analyze(model, SHAPE, mode="training").peak_bytes
    plan = mw.plan_checkpointing(model, SHAPE, budget=peak)
    assert plan.modules == [] and plan.recompute_flops == 0 and plan.peak_bytes == peak
    exec(plan.code, {"model": model})
    assert not any(isinstance(m, CheckpointWrapper) for m in model.modules())


def test_nothing_fits_says_the_smallest_peak_reached() -> None:
    model = Net(MIXED)
    smallest = min(
        mw.analyze(model, SHAPE, mode="training", activation_checkpointing=s).peak_bytes
        for s in (False, True)
    )
    with pytest.raises(mw.NothingFitsError, match=f"{smallest:,} bytes") as error:
        mw.plan_checkpointing(model, SHAPE, budget=smallest - 1)
    assert "6 candidate modules" in str(error.value)
    with pytest.raises(mw.NothingFitsError):
        mw.plan_checkpointing(model, SHAPE, budget="1 MiB")


@pytest.mark.parametrize("budget", ["24 G", "lots", 0, -5, 1.5, True, None])
def test_a_bad_budget_is_an_option_error(budget: Any) -> None:
    with pytest.raises(mw.OptionError, match="budget"):
        mw.plan_checkpointing(Net(SAME), SHAPE, budget=budget)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"mode": "inference"}, "training step"),
        ({"activation_checkpointing": True}, "chooses"),
        ({"candidates": ["blocks.9"]}, "blocks.9"),
        ({"candidates": "blocks.0"}, "list of module paths"),
        ({"max_iterations": 0}, "max_iterations"),
    ],
)
def test_options_it_cannot_use_are_option_errors(options: dict[str, Any], match: str) -> None:
    with pytest.raises(mw.OptionError, match=match):
        mw.plan_checkpointing(Net(SAME), SHAPE, budget="20 MiB", **options)


def test_a_budget_with_a_unit_and_progress() -> None:
    model = Net(SAME)
    peak = mw.analyze(model, SHAPE, mode="training").peak_bytes
    seen: list[tuple[int, int, str]] = []
    budget = f"{(peak * 3 // 4) / 2**20:.2f} MiB"
    plan = mw.plan_checkpointing(model, SHAPE, budget=budget, progress=lambda *a: seen.append(a))
    assert plan.budget == round(float(budget.split()[0]) * 2**20)
    assert plan.peak_bytes <= plan.budget and plan.modules
    assert seen[-1][:2] == (plan.traces, plan.traces)  # the last report: all done
    assert len(seen) == plan.traces  # one per trace after the first, and the end


def test_nested_candidates_are_never_both_chosen() -> None:
    model = Net(MIXED)
    peak = mw.analyze(model, SHAPE, mode="training").peak_bytes
    inner = ["blocks.1.fc1", "blocks.1.act", "blocks.3.fc1"]
    plan = mw.plan_checkpointing(
        model, SHAPE, budget=peak * 9 // 10, candidates=["blocks.1", "blocks.3", *inner]
    )
    chosen = set(plan.modules)
    assert not ({"blocks.1"} & chosen and {"blocks.1.fc1", "blocks.1.act"} & chosen)
    assert not ({"blocks.3"} & chosen and {"blocks.3.fc1"} & chosen)
    again = mw.analyze(model, SHAPE, mode="training", activation_checkpointing=plan.modules)
    assert again.peak_bytes == plan.peak_bytes <= plan.budget


def test_a_model_that_overstates_peaks_is_corrected_by_traces(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Savings guessed too small (the model over-states peaks, so the program would rule out
    plans that fit): once traces show it, savings are raised by what they fell short, and the
    search still finds the exhaustive optimum."""
    model = Net(MIXED)
    table = exhaustive(model)
    start = checkpointing._Search.start

    def pessimistic(self: Any, candidates: list[str]) -> None:
        start(self, candidates)
        self.saving = self.saving / 2

    monkeypatch.setattr(checkpointing._Search, "start", pessimistic)
    for budget in budgets(table)[::2]:
        best = min(flops for peak, flops in table.values() if peak <= budget)
        plan = mw.plan_checkpointing(model, SHAPE, budget=budget)
        assert table[tuple(plan.modules)][0] <= budget
        assert plan.recompute_flops == best, budget


def test_no_blocks_is_a_plan_error_and_candidates_name_others() -> None:
    def mlp() -> nn.Module:
        return nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))

    model = nn.Sequential(mlp(), mlp(), mlp())  # no ModuleList: no blocks
    peak = mw.analyze(model, SHAPE, mode="training").peak_bytes
    with pytest.raises(mw.PlanError, match="candidates="):
        mw.plan_checkpointing(model, SHAPE, budget=peak - 1)
    plan = mw.plan_checkpointing(model, SHAPE, budget=peak - 1, candidates=["0", "1", "2"])
    again = mw.analyze(model, SHAPE, mode="training", activation_checkpointing=plan.modules)
    assert plan.modules and again.peak_bytes == plan.peak_bytes < peak


class Broken(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(64, 64)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks[0](x).view(-1, 7, 3)  # 64 does not divide into 7 x 3


def test_a_failed_trace_is_a_plan_error_that_says_where() -> None:
    with pytest.raises(mw.PlanError, match="nothing checkpointed"):
        mw.plan_checkpointing(Broken(), SHAPE, budget="1 MiB")


def test_with_a_gpu_the_plan_recomputes_the_fewest_seconds() -> None:
    """With ``gpu=``, recompute is the seconds the backward pass gains on it (analyze's time
    model): no more than the exhaustive optimum in seconds, which may differ from FLOPs'."""
    model = Net(MIXED)
    base = mw.analyze(model, SHAPE, mode="training", gpu="H100")
    table = {}
    for k in range(len(BLOCKS) + 1):
        for subset in itertools.combinations(BLOCKS, k):
            a = base.rerun(activation_checkpointing=list(subset))
            table[subset] = (a.peak_bytes, a.time.backward_s - base.time.backward_s)
    # what the GPU holds beside the tensors (allocator's reserve, CUDA context) is held back
    held_back = base.footprint_bytes - base.peak_bytes
    assert held_back > 0
    for budget in budgets(table)[::3]:
        best = min(seconds for peak, seconds in table.values() if peak <= budget)
        plan = mw.plan_checkpointing(model, SHAPE, budget=budget + held_back, gpu="H100")
        assert plan.held_back_bytes == held_back and plan.budget == budget + held_back
        assert plan.recompute_s is not None and plan.recompute_s <= best * (1 + 1e-9)
        peak, seconds = table[tuple(plan.modules)]
        assert peak <= budget and plan.recompute_s == pytest.approx(seconds, rel=1e-12)
    assert mw.plan_checkpointing(model, SHAPE, budget=budget).recompute_s is None


def test_alike_blocks_are_traced_alone_at_the_ends_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """A decoder's layers before its last save and recompute the same alone (each traced here
    to show it; the last saves less: its recomputation begins the backward): the search
    traces four of eight alone, and finds the plan it finds tracing all eight."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=8192, hidden_size=64, intermediate_size=256, num_hidden_layers=8,
        num_attention_heads=4, num_key_value_heads=2, use_cache=False,
    )  # fmt: skip
    size = (4, 256)
    layers = [f"layers.{i}" for i in range(8)]
    alone = [
        mw.analyze(config, size, mode="training", activation_checkpointing=[p]).peak_bytes
        for p in layers
    ]
    assert len(set(alone[:-1])) == 1  # what the search takes for granted after three
    base = mw.analyze(config, size, mode="training").peak_bytes
    budget = base - 5 * (base - alone[0]) // 2  # about three layers' savings
    plan = mw.plan_checkpointing(config, size, budget=budget)
    singles = [t.modules for t in plan.history if len(t.modules) == 1]
    assert singles == [("layers.0",), ("layers.1",), ("layers.6",), ("layers.7",)]
    monkeypatch.setattr(
        checkpointing._Search, "_singles", lambda self, c: [self.trace([p]) for p in c]
    )
    traced_all = mw.plan_checkpointing(config, size, budget=budget)
    assert 0 < len(plan.modules) < 8
    assert (plan.modules, plan.peak_bytes, plan.recompute_flops) == (
        traced_all.modules, traced_all.peak_bytes, traced_all.recompute_flops,
    )  # fmt: skip
    assert plan.traces < traced_all.traces


def test_alike_blocks_that_disagree_alone_are_each_traced_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where the first, second and second-to-last of alike blocks do not agree alone, each is
    traced alone (here the second-to-last of six identical MLP blocks made to differ: its
    trace is taken from the last's)."""
    torch.manual_seed(0)
    model = Net(SAME)
    trace = checkpointing._Search.trace

    def unlike(self: Any, modules: Any) -> Any:
        if list(modules) == ["blocks.4"]:
            return trace(self, ["blocks.5"])
        return trace(self, modules)

    monkeypatch.setattr(checkpointing._Search, "trace", unlike)
    budget = mw.analyze(model, SHAPE, mode="training").peak_bytes - 1
    plan = mw.plan_checkpointing(model, SHAPE, budget=budget)
    singles = sorted(t.modules for t in plan.history if len(t.modules) == 1)
    assert singles == [(b,) for b in BLOCKS if b != "blocks.4"]  # blocks.4's is blocks.5's
