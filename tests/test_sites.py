"""Assumption sites users can act on: the model's own line, not a shared helper's; backward
sites by module and forward call; notebook cells by ``In[N]``; the root module by its class."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from fakelib.utils.import_utils import compilable_check
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output
from torch import nn

import meta_widget as mw


class Checked(nn.Module):
    """Two checks made through the library's shared helper, at two lines of the model."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        compilable_check(h.isfinite(), "non-finite activations")  # FIRST_CHECK
        compilable_check(x.abs() < 1e6, "inputs out of range")  # SECOND_CHECK
        return h


def _line(marker: str) -> int:
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if line.rstrip().endswith(marker))


def test_a_helper_made_check_is_sited_at_the_models_line_and_assume_on_it_takes_effect() -> None:
    a = mw.analyze(Checked(), input_size=(2, 4))
    assert a.error is None, a.error
    sites = [x.site for x in a.assumptions]
    first, second = (
        f"test_sites.py:{_line('FIRST_CHECK')}",
        f"test_sites.py:{_line('SECOND_CHECK')}",
    )
    assert sites == [first, second]
    helper = a.assumptions[0]
    assert helper.stack[0].startswith("import_utils.py:") and helper.stack[-1].startswith(first)
    assert helper.code == 'compilable_check(h.isfinite(), "non-finite activations")  # FIRST_CHECK'
    # deciding the first check False makes that check (and only it) fail
    b = mw.analyze(Checked(), input_size=(2, 4), assume={first: False})
    assert b.error is not None and "non-finite activations" in b.error.message
    assert f"assume={{'{first}': True}}" in b.error.fix
    c = mw.analyze(Checked(), input_size=(2, 4), assume={second: False})
    assert c.error is not None and "inputs out of range" in c.error.message


def llava_config() -> Any:
    import transformers

    vision = transformers.CLIPVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=32,
        patch_size=8,
        projection_dim=32,
    )
    text = transformers.LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        max_position_embeddings=64,
    )
    return transformers.LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_id=100,
        vision_feature_layer=-1,
        architectures=["LlavaForConditionalGeneration"],
    )


def test_llavas_check_is_sited_in_modeling_llava_and_assume_on_it_takes_effect() -> None:
    """LLaVA checks its image tokens through transformers' ``torch_compilable_check``."""
    config = llava_config()
    torch.manual_seed(0)
    inputs = {
        "input_ids": torch.cat([torch.full((1, 16), 100), torch.randint(3, 90, (1, 8))], 1),
        "pixel_values": torch.randn(1, 3, 32, 32),
    }
    a = mw.analyze(config, input_data=inputs)
    assert a.error is None, a.error
    (check,) = [x for x in a.assumptions if "torch_compilable_check" in x.stack[0]]
    assert check.site.startswith("modeling_llava.py:") and check.module == "model"
    assert check.stack[0].startswith("import_utils.py:")
    b = mw.analyze(config, input_data=inputs, assume={check.site: False})
    assert b.error is not None and "Image features and image tokens do not match" in str(b.error)


class Scatter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        y = h.clone()
        y[h > 0] = h.sum()  # its backward indexes the gradient with the mask again
        return y


def test_backward_assumptions_are_keyed_by_the_module_and_forward_call_that_made_the_node() -> None:
    model = nn.Sequential(Scatter(), Scatter())
    a = mw.analyze(model, input_size=(2, 4), mode="training")
    assert a.error is None, a.error
    backward = [x for x in a.assumptions if x.backward]
    assert {x.module for x in backward} == {"0", "1"}
    for x in backward:
        assert x.file is None and x.stack == []
        assert a.calls[x.call].path == x.module  # the forward call that made the node
        assert x.site == f"{x.module}@{x.call}"


def test_the_root_module_is_named_by_its_class() -> None:
    class Root(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * x.sum().item()  # FAIL_ITEM

    a = mw.analyze(Root(), input_size=(2,))
    assert a.error is not None
    assert "in module 'Root'" in str(a.error) and "in module ''" not in str(a.error)
    assert f"test_sites.py:{_line('FAIL_ITEM')}" in a.error.message


_CELL = """import torch
from torch import nn

class Gated(nn.Module):
    def forward(self, x):
        if (x > 0).all():
            return x * 2
        return x
"""


@pytest.fixture
def ip() -> InteractiveShell:
    return InteractiveShell.instance()


def test_notebook_cells_are_keyed_by_their_number_not_a_temporary_file(
    ip: InteractiveShell,
) -> None:
    with capture_output():
        number = ip.execution_count
        ip.run_cell(_CELL)
        ip.run_cell("import meta_widget as mw\na = mw.analyze(Gated(), input_size=(2,))")
    a = ip.user_ns["a"]
    line = _CELL.splitlines().index("        if (x > 0).all():") + 1
    assert [x.site for x in a.assumptions] == [f"In[{number}]:{line}"]
    with capture_output():
        ip.run_cell(
            f"b = mw.analyze(Gated(), input_size=(2,), assume={{'In[{number}]:{line}': False}})"
        )
    assert [x.value for x in ip.user_ns["b"].assumptions] == ["False"]
