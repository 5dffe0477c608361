"""The kernel-side widget answers a view's ``hello``: that is how a view tells a live widget from
one restored from a saved notebook, whose switches must stay off."""

from __future__ import annotations

import json
import os
from typing import Any

import torch
from make_fixtures import FIXTURES

import meta_widget as mw
from meta_widget.views import protocol, widget


def _front_end_choices() -> dict[str, list[str]]:
    """The name sets ``js/choices.test.ts`` checks ``js/protocol.ts`` against."""
    with open(os.path.join(FIXTURES, "choices.json"), encoding="utf-8") as f:
        data: dict[str, list[str]] = json.load(f)
    return data


def test_a_live_widget_answers_hello_with_ready() -> None:
    view = mw.analyze(torch.nn.Linear(4, 2), input_size=(2, 4)).widget()
    sent: list[Any] = []
    view.send = sent.append  # type: ignore[method-assign]  # the comm, as the front end sees it
    view._on_message(view, {"type": "hello"}, [])
    assert sent == [{"type": "ready"}]


def test_other_messages_get_no_ready() -> None:
    view = mw.analyze(torch.nn.Linear(4, 2), input_size=(2, 4)).widget()
    sent: list[Any] = []
    view.send = sent.append  # type: ignore[method-assign]
    view._on_message(view, {"type": "select", "module": 1}, [])
    assert sent == [] and view.selected == 1


def test_every_message_type_the_front_end_sends_is_handled() -> None:
    # the front end's list (js/protocol.ts VIEW_MESSAGE_TYPES, checked against this fixture by
    # js/choices.test.ts) is the set the widget dispatches on, and each handler does its job
    view_types = _front_end_choices()["view_messages"]
    assert sorted(view_types) == sorted(protocol.MESSAGE_TYPES_FROM_JS)
    assert sorted(widget.MESSAGE_HANDLERS) == sorted(view_types)
    view = mw.analyze(torch.nn.Sequential(torch.nn.Linear(4, 2)), input_size=(2, 4)).widget()
    sent: list[Any] = []
    view.send = sent.append  # type: ignore[method-assign]
    before = view.analysis
    messages = {
        "hello": {"type": "hello"},
        "select": {"type": "select", "module": 1},
        "rerun": {"type": "rerun", "mode": "training", "optimizer": "sgd", "device": "cpu"},
    }
    assert sorted(messages) == sorted(view_types)  # a new type needs its check here
    for kind in view_types:
        view._on_message(view, messages[kind], [])
    assert {"type": "ready"} in sent
    assert view.selected == 1
    assert view.analysis is not None and view.analysis is not before
    assert view.analysis.mode == "training"


def test_a_message_of_no_known_type_does_nothing() -> None:
    view = mw.analyze(torch.nn.Linear(4, 2), input_size=(2, 4)).widget()
    sent: list[Any] = []
    view.send = sent.append  # type: ignore[method-assign]
    before = (view.analysis, view.selected)
    view._on_message(view, {"type": "nonsense", "module": 3}, [])
    view._on_message(view, ["select", 3], [])
    assert sent == [] and (view.analysis, view.selected) == before
