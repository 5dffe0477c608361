"""``walk`` gives what PyTorch's own walks give (``named_modules``, ``named_parameters``,
``named_buffers``), in one pass: the trace and the report rely on its order and deduplication."""

from __future__ import annotations

import pytest
import torch
import transformers
from models import bert_config, gpt2_config, llama_config, t5_config
from torch import nn

from meta_widget.data.walk import modules, walk


def _shared() -> nn.Module:
    """A module shared by two parents (its children then have two paths each), a tied weight,
    a child set to None, and a buffer registered twice under two names."""
    inner = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    model = nn.Module()
    model.a = nn.Sequential(inner, nn.Linear(4, 4))
    model.b = nn.ModuleDict({"again": inner, "gone": None})  # type: ignore[dict-item]
    model.head = nn.Linear(4, 4)
    model.head.weight = model.a[1].weight
    model.register_buffer("scale", torch.ones(4))
    model.a.register_buffer("scale_again", model.scale)
    return model


def _models() -> list[nn.Module]:
    with torch.device("meta"):
        return [
            _shared(),
            transformers.GPT2LMHeadModel(gpt2_config()),  # lm_head tied to wte
            transformers.LlamaForCausalLM(llama_config()),
            transformers.BertModel(bert_config()),
            transformers.T5ForConditionalGeneration(t5_config()),  # shared embeddings
        ]


@pytest.mark.parametrize("model", _models(), ids=lambda m: type(m).__name__)
def test_walk_equals_pytorchs_walks(model: nn.Module) -> None:
    found = walk(model)
    assert list(zip(found.names, found.modules, strict=True)) == list(model.named_modules())
    every: dict[int, list[str]] = {}
    for path, m in model.named_modules(remove_duplicate=False):
        every.setdefault(id(m), []).append(path)
    assert found.paths == every
    assert found.parameters == list(model.named_parameters())
    assert [(n, id(b)) for n, b in found.buffers] == [(n, id(b)) for n, b in model.named_buffers()]
    assert list(modules(model)) == list(model.modules())


def test_shared_module_has_both_paths() -> None:
    model = _shared()
    found = walk(model)
    assert found.paths[id(model.a[0][0])] == ["a.0.0", "b.again.0"]
    assert [n for n, _ in found.parameters].count("head.weight") == 0  # tied: listed once


def test_a_module_inside_itself_is_not_entered_again() -> None:
    # PyTorch's named_modules(remove_duplicate=False) recurses without end here
    model = nn.Sequential(nn.Linear(2, 2))
    model.add_module("loop", model)
    found = walk(model)
    assert found.modules == [model, model[0]]
    assert list(modules(model)) == [model, model[0]]
    assert found.paths[id(model)] == ["", "loop"]
