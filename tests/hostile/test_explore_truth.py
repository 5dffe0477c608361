"""``sweep`` and ``compare`` against truths of their own (issue 23, the suite's blind spots).

- Every point of a sweep is the model run at that point's shapes *and dtypes*: a real CPU forward
  pass gives the input and output shapes and dtypes, ``FlopCounterMode`` the FLOPs, and a direct
  ``mw.analyze`` at the same shapes and dtypes the memory; no point may fail.
- ``compare`` flags every module path whose class differs between the two models, read from the
  models themselves (``named_modules``), also when nothing else about the module differs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import meta_widget as mw


class TwoBatchedInputs(nn.Module):
    """Two inputs that both carry the batch, each through its own layer (no broadcasting that
    could hide an input left at the wrong batch)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc_a = nn.Linear(8, 4)
        self.fc_b = nn.Linear(6, 5)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.fc_a(x), self.fc_b(y)


class TokensAndWeights(nn.Module):
    """Token ids (long) and a float weight per token: an embedding needs integer ids."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(100, 16)
        self.head = nn.Linear(16, 3)

    def forward(self, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(ids) * weights.unsqueeze(-1))


class CastsItsInput(nn.Module):
    """Long inputs that the model casts itself: a float input would run too, so only the dtypes
    given say that the inputs are long (8 bytes an element, not 4)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 4)

    def forward(self, counts: torch.Tensor) -> torch.Tensor:
        return self.fc(counts.float())


class IndexedTable(nn.Module):
    """int32 indices into a table, and bfloat16 weights: dtypes no default guesses."""

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.randn(100, 16))
        self.head = nn.Linear(16, 3)

    def forward(self, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        return self.head(self.table[ids] * weights.unsqueeze(-1))


def _real_inputs(shapes: Sequence[tuple[int, ...]], dtypes: Sequence[torch.dtype]) -> list[Any]:
    torch.manual_seed(0)
    return [
        torch.randint(0, 100, s, dtype=dt) if not dt.is_floating_point else torch.randn(s, dtype=dt)
        for s, dt in zip(shapes, dtypes, strict=True)
    ]


def _real_run(model: nn.Module, inputs: list[Any]) -> tuple[int, list[tuple[Any, str]]]:
    """FLOPs (FlopCounterMode) and (shape, dtype) of every output of a real CPU forward."""
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        out = model(*inputs)
    outs = out if isinstance(out, tuple) else (out,)
    dtype_name = lambda t: str(t.dtype).removeprefix("torch.")  # noqa: E731
    return counter.get_total_flops(), [(tuple(t.shape), dtype_name(t)) for t in outs]


def _check_every_point(
    model_type: Callable[[], nn.Module],
    s: mw.Sweep,
    shapes_at: Callable[[tuple[int, ...]], list[tuple[int, ...]]],
    dtypes: list[torch.dtype],
) -> None:
    model = model_type()
    for values, a in zip(s.points, s.analyses, strict=True):
        shapes = shapes_at(values)
        assert a.error is None, (values, a.error)
        flops, outputs = _real_run(model, _real_inputs(shapes, dtypes))
        root = a.calls[0]
        assert root.path == ""
        seen_inputs = [(info.shape, info.dtype) for _, info in root.inputs]
        names = [str(dt).removeprefix("torch.") for dt in dtypes]
        assert seen_inputs == list(zip(shapes, names, strict=True)), values
        assert [(info.shape, info.dtype) for _, info in root.outputs] == outputs, values
        assert a.total_flops == flops, values
        direct = mw.analyze(model_type(), input_size=shapes, dtypes=dtypes)
        assert direct.error is None
        assert (a.peak_bytes, a.activation_bytes) == (direct.peak_bytes, direct.activation_bytes)


def test_batch_sets_dimension_0_of_every_input() -> None:
    s = mw.sweep(TwoBatchedInputs(), [(2, 8), (2, 6)], vary={"batch": [1, 3, 5]}, progress=False)
    _check_every_point(
        TwoBatchedInputs, s, lambda v: [(v[0], 8), (v[0], 6)], [torch.float32, torch.float32]
    )


@pytest.mark.parametrize("given", [["long", "float32"], [torch.int64, torch.float32]])
def test_every_point_keeps_the_dtypes(given: list[Any]) -> None:
    s = mw.sweep(
        TokensAndWeights(), [(2, 5), (2, 5)], vary={"batch": [1, 3], "seq": [4, 7]},
        dims={"seq": [(0, 1), (1, 1)]}, dtypes=given, progress=False,
    )  # fmt: skip
    assert len(s.analyses) == 4
    assert s.to_dataframe()["error"].isna().all()
    _check_every_point(
        TokensAndWeights, s, lambda v: [(v[0], v[1]), (v[0], v[1])], [torch.int64, torch.float32]
    )


def test_a_long_input_alone_keeps_its_dtype() -> None:
    emb = lambda: nn.Sequential(nn.Embedding(100, 16), nn.Linear(16, 3))  # noqa: E731
    s = mw.sweep(emb(), (2, 5), vary={"seq": [3, 9]}, dtypes=[torch.long], progress=False)
    _check_every_point(emb, s, lambda v: [(2, v[0])], [torch.int64])


def test_long_inputs_a_float_would_also_fit_stay_long() -> None:
    s = mw.sweep(CastsItsInput(), (2, 6), vary={"batch": [1, 4]}, dtypes=["long"], progress=False)
    _check_every_point(CastsItsInput, s, lambda v: [(v[0], 6)], [torch.int64])


def test_dtypes_no_default_would_choose_stay() -> None:
    s = mw.sweep(
        IndexedTable(), [(2, 5), (2, 5)], vary={"batch": [1, 3], "seq": [2, 6]},
        dims={"seq": [(0, 1), (1, 1)]}, dtypes=[torch.int32, torch.bfloat16], progress=False,
    )  # fmt: skip
    _check_every_point(
        IndexedTable, s, lambda v: [(v[0], v[1]), (v[0], v[1])], [torch.int32, torch.bfloat16]
    )


# ---------------------------------------------------------------------------------------------
# compare


def _class_changes(a: nn.Module, b: nn.Module) -> set[str]:
    """The truth: the paths present in both models whose module classes differ."""
    in_b = dict(b.named_modules())
    return {p for p, m in a.named_modules() if p in in_b and type(m) is not type(in_b[p])}


@pytest.mark.parametrize("traced", [True, False], ids=["traced", "structure only"])
@pytest.mark.parametrize(
    ("first", "second"),
    [
        (nn.ReLU, nn.GELU),
        (nn.Tanh, nn.Sigmoid),
        (nn.Identity, nn.Dropout),  # identical in inference: only the class tells them apart
    ],
)
def test_compare_flags_a_changed_class(first: type, second: type, traced: bool) -> None:
    def build(act: type) -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(8, 16), act(), nn.Sequential(nn.Linear(16, 4), act()))

    a_model, b_model = build(first), build(second)
    truth = _class_changes(a_model, b_model)
    assert truth == {"1", "2.1"}
    size = (2, 8) if traced else None
    cmp = mw.compare(mw.analyze(a_model, size), mw.analyze(b_model, size))
    changed = {r.module for r in cmp.changed}
    # every class change is flagged; the other modules are the same classes with the same
    # parameters, run on the same shapes: nothing else differs
    assert changed == truth
    frame = cmp.to_dataframe().set_index("module")
    assert frame.loc["1", "changed"] and not frame.loc["0", "changed"]
    assert f"type {first.__name__} -> {second.__name__}" in cmp.summary()
