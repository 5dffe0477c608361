"""Mistakes said in one line of the project's own errors, and nothing else on the terminal
(issue 36, item 16): ``a.graph()``'s ``depth`` and ``fold``, ``time_on`` of a structural
analysis; a tensor-parallel trace that fails (tp=3 over an intermediate size of 128) explains
its error without the ~20 ``[rank0]:E`` lines of a traceback ``FakeTensorMode`` logs; a
``generate`` run prints no transformers warning about a meta tensor it was asked about."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
import transformers
from torch import nn

import meta_widget as mw

T = transformers


@pytest.fixture(scope="module")
def traced() -> mw.Analysis:
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    return mw.analyze(model, input_size=(2, 8))


@contextmanager
def heard(name: str) -> Iterator[list[str]]:
    """The messages logged under the logger ``name`` (its children included) while inside:
    under pytest a library's handler writes to the captured ``sys.stderr`` that ``capfd``
    does not see, so both are checked."""
    messages: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    logger, handler = logging.getLogger(name), Collect(logging.DEBUG)
    logger.addHandler(handler)
    try:
        yield messages
    finally:
        logger.removeHandler(handler)


def one_line(info: pytest.ExceptionInfo[BaseException]) -> str:
    assert isinstance(info.value, mw.MetaWidgetError)
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("depth", [-1, True, 1.5, "1", None])
def test_a_graph_depth_that_is_not_a_level_is_an_option_error(
    traced: mw.Analysis, depth: Any
) -> None:
    with pytest.raises(mw.OptionError) as info:
        traced.graph(depth=depth)
    assert "depth=" in one_line(info) and "root is 0" in str(info.value)


@pytest.mark.parametrize("fold", ["no", "yes", 0, None])
def test_fold_is_true_or_false(traced: mw.Analysis, fold: Any) -> None:
    with pytest.raises(mw.OptionTypeError) as info:
        traced.graph(fold=fold)
    assert "fold=" in one_line(info)
    nodes = traced.graph(depth=1, fold=False).nodes
    assert sorted(nodes.module) == ["0", "1", "2", "<input>", "<output>"]


def test_time_on_a_structural_analysis_says_what_to_give() -> None:
    a = mw.analyze(nn.Linear(4, 4))
    with pytest.raises(mw.OptionError) as info:
        a.time_on("H100")
    assert "input_size=" in one_line(info)


def test_a_failing_tensor_parallel_trace_is_explained_once(capfd: pytest.CaptureFixture) -> None:
    config = T.LlamaConfig(
        hidden_size=96, intermediate_size=128, num_hidden_layers=2, num_attention_heads=6,
        num_key_value_heads=3, vocab_size=128,
    )  # fmt: skip
    capfd.readouterr()
    with heard("torch._subclasses.fake_tensor") as logged:  # its own handler, not propagated
        a = mw.analyze(config, input_size=(1, 8), parallel={"tp": 3}, mode="training")
    out, err = capfd.readouterr()
    assert not [m for m in logged if "failed while attempting" in m], logged
    assert a.error is not None and "same reduction dim" in a.error.message  # explained, kept
    assert "[rank0]" not in err and "Traceback" not in err, err[:2000]
    assert "failed while attempting to run meta" not in out + err


def test_generate_prints_no_warning_about_meta_values(capfd: pytest.CaptureFixture) -> None:
    torch.manual_seed(0)
    config = T.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=64,
    )  # fmt: skip
    model = T.LlamaForCausalLM(config).eval()
    level = T.logging.get_verbosity()
    T.logging.set_verbosity_warning()  # transformers' default: its warnings are printed
    try:
        capfd.readouterr()
        with heard("transformers") as logged:
            for _ in range(2):
                a = mw.analyze(model, input_size=(1, 8), mode="generate", new_tokens=3)
                assert a.error is None and a.kv_cache is not None and a.kv_cache.bytes > 0
        out, err = capfd.readouterr()
    finally:
        T.logging.set_verbosity(level)
    said = out + err + "\n".join(logged)
    assert "eos_token_id" not in said and "will not stop" not in said, said
    assert "device='meta'" not in said and "deprecated" not in said, said
