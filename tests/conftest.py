from __future__ import annotations

import os
import sys

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
