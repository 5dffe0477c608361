from __future__ import annotations

import os
import sys
from typing import Any

import pytest

sys.path.insert(0, os.path.dirname(__file__))
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(autouse=True)
def _no_global_hooks_leak():
    """Every test must leave no global module hooks behind."""
    from torch.nn.modules import module as m

    before = (len(m._global_forward_hooks), len(m._global_forward_pre_hooks))
    yield
    assert (len(m._global_forward_hooks), len(m._global_forward_pre_hooks)) == before


@pytest.fixture
def remote(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """The keys of the plan's candidates another process traced (a pool's child, a cluster's
    worker), in the order their numbers arrived."""
    from meta_widget.explore import plan as plan_module

    keys: list[tuple[Any, ...]] = []
    take = plan_module.take

    def watched(c: Any, numbers: dict[str, Any], *rest: Any) -> None:
        keys.append(c.key)
        take(c, numbers, *rest)

    monkeypatch.setattr(plan_module, "take", watched)
    return keys
