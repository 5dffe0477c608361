"""``analyze(..., widget=True)``: the placeholder output shown below the widget before the
analysis gets the static view when the analysis ends (once), and a view that mounts after a
stream hears how it ended."""

from __future__ import annotations

from typing import Any

import torch
from IPython.display import DisplayHandle

import meta_widget as mw
from meta_widget.views.widget import MetaWidget


class Handle(DisplayHandle):  # type: ignore[misc]
    """IPython's display handle, recording its updates instead of publishing them."""

    def __init__(self) -> None:
        super().__init__()
        self.updates: list[Any] = []

    def update(self, obj: Any, **kwargs: Any) -> None:
        assert kwargs.get("raw") is True  # a bundle, not an object to format
        self.updates.append(obj)


def streamed(model: torch.nn.Module, handle: Handle | None) -> tuple[mw.Analysis, MetaWidget]:
    view = MetaWidget()
    view.static_display = handle
    return mw.analyze(model, input_size=(2, 4), widget=view), view


def test_the_live_output_is_updated_once_with_the_static_view() -> None:
    handle = Handle()
    a, view = streamed(torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()), handle)
    assert a.widget() is view and view.analysis is a
    assert len(handle.updates) == 1
    data = handle.updates[0]
    assert "meta-widget-fallback" in data["text/html"] and "Sequential" in data["text/html"]
    assert "application/vnd.jupyter.widget-view+json" not in data  # the widget's is apart
    assert "Sequential" in data["text/plain"]  # the summary, for text front ends
    # a re-run from the switches streams into the same widget: that output is not updated again
    view.rerun(mode="training")
    assert len(handle.updates) == 1 and view.analysis is not a


def test_a_structural_analysis_updates_its_output_too() -> None:
    handle = Handle()
    view = MetaWidget()
    view.static_display = handle
    mw.analyze(torch.nn.Linear(4, 3), widget=view)  # no inputs: nothing streamed
    assert len(handle.updates) == 1 and "Linear" in handle.updates[0]["text/html"]


def test_a_view_mounting_after_the_stream_hears_how_it_ended() -> None:
    _a, view = streamed(torch.nn.Linear(4, 3), None)
    sent: list[Any] = []
    view.send = sent.append  # type: ignore[method-assign]  # the comm, as the front end sees it
    view._on_message(view, {"type": "hello"}, [])
    assert [m["type"] for m in sent] == ["ready", "done"]
    assert sent[1]["elapsed_s"] > 0


def test_a_view_mounting_while_a_stream_runs_is_not_told_it_ended() -> None:
    _a, view = streamed(torch.nn.Linear(4, 3), None)
    view.stream([], title="Linear", source="module", mode="inference")  # a re-run starts
    sent: list[Any] = []
    view.send = sent.append  # type: ignore[method-assign]
    view._on_message(view, {"type": "hello"}, [])
    assert sent == [{"type": "ready"}]


def test_done_says_how_long_the_whole_analysis_took() -> None:
    """Issue 28, item 6: the cell ran ~4.5 s and the widget said "in 0.71 s" (the trace only):
    ``total_s`` counts from ``analyze``'s start, the model's build included."""
    import time

    view = MetaWidget()
    sent: list[Any] = []
    view.send = sent.append  # type: ignore[method-assign]
    t0 = time.perf_counter()
    mw.analyze(
        torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()), input_size=(2, 4), widget=view
    )
    wall = time.perf_counter() - t0
    done = next(m for m in sent if m["type"] == "done")
    assert done["elapsed_s"] < done["total_s"] <= wall
