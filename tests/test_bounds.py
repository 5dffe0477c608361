"""Data-dependent sizes with a known upper bound: ``unique``, custom ops via ``register_bound``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch import nn

import meta_widget as mw
from meta_widget.trace.bounds import BOUNDS


@torch.library.custom_op("mwtest::keep_positive", mutates_args=())
def keep_positive(x: torch.Tensor) -> torch.Tensor:
    """The positive elements of ``x``: as many as its values say (nms is shaped the same)."""
    return x[x > 0]


@keep_positive.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    n = torch.library.get_ctx().new_dynamic_size()
    return x.new_empty(n)


class Filters(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc, self.out = nn.Linear(8, 8), nn.Linear(1, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kept = keep_positive(self.fc(x).flatten())
        return self.out(kept[:, None])


@pytest.fixture
def bound() -> Iterator[None]:
    with BOUNDS.scoped():
        mw.register_bound("mwtest::keep_positive", lambda x: x.numel())
        yield
    assert "mwtest::keep_positive" not in BOUNDS


def test_a_custom_op_without_a_bound_fails_with_the_way_to_give_one() -> None:
    a = mw.analyze(Filters(), input_size=(3, 8))
    assert a.error is not None
    assert "mwtest::keep_positive" in a.error.message and "register_bound" in a.error.fix
    assert "assume=" not in a.error.fix


def test_a_custom_op_whose_fake_kernel_needs_an_unbacked_size_traces_with_a_bound(
    bound: None,
) -> None:
    torch.manual_seed(0)
    model = Filters()
    with torch.no_grad():  # every activation positive: the real size is the bound
        model.fc.weight.abs_()
        model.fc.bias.abs_()
    x = torch.rand(3, 8)
    a = mw.analyze(model, input_data=x)
    assert a.error is None, a.error
    with torch.no_grad():
        real = model(x)
    assert a.calls[0].outputs[0][1].shape == tuple(real.shape) == (24, 4)
    (site,) = a.assumptions
    assert site.kind == "bound" and site.op == "mwtest::keep_positive" and "24" in site.value
    assert site.site.startswith("test_bounds.py:")
    assert a.to_dataframe().set_index("module").loc["out", "assumed"]


def test_register_bound_takes_the_op_itself_and_works_as_a_decorator() -> None:
    @mw.register_bound(torch.ops.mwtest.keep_positive)
    def _half(x: torch.Tensor) -> int:
        return x.numel() // 2

    try:
        a = mw.analyze(Filters(), input_size=(3, 8))
        assert a.error is None, a.error
        assert a.calls[0].outputs[0][1].shape == (12, 4)
        mw.register_bound(keep_positive, lambda x: x.sum())  # a tensor: no value on meta
        b = mw.analyze(Filters(), input_size=(3, 8))
        assert b.error is not None and "not a non-negative int" in b.error.message
    finally:
        BOUNDS.unregister("mwtest::keep_positive")
    with pytest.raises(mw.BoundError, match="namespace::name"):
        mw.register_bound("keep_positive", lambda x: 1)


@pytest.mark.parametrize(
    "call",
    [
        lambda x: torch.unique(x),
        lambda x: torch.unique(x, return_inverse=True, return_counts=True),
        lambda x: torch.unique(x, sorted=False, return_counts=True),
        lambda x: torch.unique(x.view(6, 4), dim=0, return_inverse=True),
        lambda x: torch.unique(x.view(6, 4), dim=1, return_counts=True),
        lambda x: torch.unique_consecutive(x, return_counts=True),
        lambda x: torch.unique_consecutive(x.view(6, 4), dim=0, return_inverse=True),
    ],
)
def test_unique_gets_every_value_distinct_as_a_real_run_on_distinct_values(call) -> None:  # type: ignore[no-untyped-def]
    class Unique(nn.Module):
        def forward(self, x: torch.Tensor) -> object:
            return call(x)

    x = torch.randperm(24)  # all distinct: the real sizes are the upper bounds
    a = mw.analyze(Unique(), input_data=x)
    assert a.error is None, a.error
    real = call(x)
    real = real if isinstance(real, tuple) else (real,)
    assert [info.shape for _, info in a.calls[0].outputs] == [tuple(t.shape) for t in real]
    assert [x.kind for x in a.assumptions] == ["bound"]
    assert a.assumptions[0].value == "every value distinct"


def test_a_failure_after_upper_bounds_only_suggests_what_takes_effect(bound: None) -> None:
    class After(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            kept = keep_positive(x.flatten())
            return kept.view(5, -1)  # 24 elements (the bound) do not make rows of 5

    a = mw.analyze(After(), input_size=(3, 8))
    assert a.error is not None and "bound: mwtest::keep_positive" in a.error.explanation
    assert "assume=" not in a.error.fix  # an upper bound is not decided per site
