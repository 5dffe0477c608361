"""The one shape of every registry (sources, explanations, bounds, collectives): entries in
lookup order, ``first=`` to go before the others, ``scoped()`` to put a registry back as it
was whatever happens inside; and the frozen result and options around the pipeline."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

import meta_widget as mw
from meta_widget.distributed.comms import COLLECTIVES
from meta_widget.registry import Registry
from meta_widget.sources.models import SOURCES
from meta_widget.trace.bounds import BOUNDS
from meta_widget.trace.known_errors import EXPLANATIONS
from meta_widget.views.analyzed import Analyzed


def test_entries_keep_their_order_and_first_goes_before_all() -> None:
    r: Registry[str, int] = Registry("number")
    r.register("a", 1)
    r.register("b", 2)
    r.register("c", 3, first=True)
    r.register("a", 10)  # again: same place, new entry
    assert r.items() == [("c", 3), ("a", 10), ("b", 2)]
    assert r["a"] == 10 and r.get("z") is None and "b" in r and len(r) == 3
    with pytest.raises(KeyError, match="no number 'z' is registered"):
        r.unregister("z")


def test_scoped_puts_the_registry_back_on_every_path() -> None:
    r: Registry[str, int] = Registry("number")
    r.register("a", 1)
    with pytest.raises(RuntimeError), r.scoped():
        r.register("b", 2)
        r.unregister("a")
        raise RuntimeError("inside")
    assert r.items() == [("a", 1)]


@pytest.mark.parametrize(
    "registry", [SOURCES, EXPLANATIONS, BOUNDS, COLLECTIVES], ids=lambda r: r.what
)
def test_every_registry_of_the_package_has_the_one_shape(registry: Registry) -> None:
    assert isinstance(registry, Registry) and len(registry) > 0
    before = registry.items()
    with registry.scoped():
        registry.unregister(next(iter(registry)))
    assert registry.items() == before


def test_a_users_explanation_goes_first_and_leaves_with_its_scope() -> None:
    with EXPLANATIONS.scoped():
        mw.register_explanation("mine", "item", title="Mine", explanation="e", fix="f", first=True)
        assert mw.explain(RuntimeError("Tensor.item() cannot be called on meta tensors")).title == (
            "Mine"
        )
    assert mw.explain(RuntimeError("Tensor.item() cannot be called on meta tensors")).title != (
        "Mine"
    )


def test_an_analysis_is_not_changed_after_it_is_built() -> None:
    a = mw.analyze(nn.Linear(4, 4), input_size=(2, 4))
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.title = "x"  # type: ignore[misc]
    b = a.rerun(mode="training")
    assert a.mode == "inference" and b.mode == "training"
    assert a.widget() is a.widget()  # one widget per analysis, made on first use


def test_the_views_read_only_what_an_analysis_has() -> None:
    """Every member of the Analyzed protocol the views are typed against is an Analysis's."""
    a = mw.analyze(nn.Linear(4, 4), input_size=(2, 4))
    members = [m for m in vars(Analyzed) if not m.startswith("_")]
    assert members
    for name in members:
        assert hasattr(a, name), name


def test_options_give_the_trace_spec_field_by_field() -> None:
    options, notes = mw.Options(
        mode="training", micro_batches=2, autocast="bfloat16", input_size=(2, 4)
    ).checked()
    spec = options.trace_spec()
    assert isinstance(spec, mw.TraceSpec) and not isinstance(spec, mw.Options)
    assert spec.training and spec.micro_batches == 2 and spec.autocast is torch.bfloat16
    assert {f.name for f in dataclasses.fields(mw.TraceSpec)} < {
        f.name for f in dataclasses.fields(mw.Options)
    }
    assert notes == []
    with pytest.raises(mw.OptionError, match="micro_batches"):
        mw.Options(mode="inference", micro_batches=2).checked()


def test_analyze_passes_every_option_it_takes() -> None:
    """Each parameter of analyze that names an Options field reaches the options (analyze
    gathers them from its own signature: none can be forgotten)."""
    import inspect

    params = set(inspect.signature(mw.analyze).parameters) - {"model", "widget", "listeners"}
    fields = {f.name for f in dataclasses.fields(mw.Options)} - {"input_notes"}
    assert params == fields
    a = mw.analyze(nn.Linear(4, 4), input_size=(2, 4), mode="training", micro_batches=3)
    assert a.options.micro_batches == 3 and a.options.mode == "training"
