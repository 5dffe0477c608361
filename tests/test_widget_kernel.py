"""The kernel-side widget answers a view's ``hello``: that is how a view tells a live widget from
one restored from a saved notebook, whose switches must stay off."""

from __future__ import annotations

from typing import Any

import torch

import meta_widget as mw
from meta_widget import protocol


def test_a_live_widget_answers_hello_with_ready() -> None:
    view = mw.analyze(torch.nn.Linear(4, 2), input_size=(2, 4)).widget()
    sent: list[Any] = []
    view.send = sent.append  # type: ignore[method-assign]  # the comm, as the front end sees it
    view._on_message(view, {"type": "hello"}, [])
    assert sent == [{"type": "ready"}]
    assert "ready" in protocol.MESSAGE_TYPES_TO_JS and "hello" in protocol.MESSAGE_TYPES_FROM_JS


def test_other_messages_get_no_ready() -> None:
    view = mw.analyze(torch.nn.Linear(4, 2), input_size=(2, 4)).widget()
    sent: list[Any] = []
    view.send = sent.append  # type: ignore[method-assign]
    view._on_message(view, {"type": "select", "module": 1}, [])
    assert sent == [] and view.selected == 1
