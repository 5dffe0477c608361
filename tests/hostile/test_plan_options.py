"""``plan``, ``plan_checkpointing``, ``KVCache.paged`` and ``mw.GPU`` refuse sizes no device has
and options no function takes, up front, in one line of the project's own errors (issue 36,
item 15): a budget of ``"1e300GiB"`` or ``10**400``, a GPU with ``10**400`` bytes or half a GPU
per node, ``plan(..., foo=1)``, ``micro_batches=[1, 5000]`` (before any trace), and
``workers=10**9`` (capped at the cores this process may use, not a process per candidate)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import transformers
from torch import nn

import meta_widget as mw
from meta_widget.explore import checkpointing as checkpointing_module
from meta_widget.explore import plan as plan_module
from meta_widget.explore import plan_trace
from meta_widget.options import MAX_BUDGET_BYTES

HUGE = ["1e300GiB", 10**400, 2**64 + 1, "17000000TiB", 10**5000]
HUGE_IDS = ["1e300GiB", "10**400", "2**64+1", "17000000TiB", "10**5000"]


def llama() -> Any:
    return transformers.LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2,
    )  # fmt: skip


def one_line(info: pytest.ExceptionInfo[BaseException]) -> str:
    message = str(info.value)
    # one line a person reads at once; the longest is the list of analyze's ~30 option names
    assert "\n" not in message and len(message) < 500
    return message


@pytest.fixture
def no_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any trace fails the test: the refusal must come first."""

    def traced(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a trace ran before the options were checked")

    monkeypatch.setattr(plan_trace, "analyze", traced)
    monkeypatch.setattr(checkpointing_module, "analyze", traced)


@pytest.mark.parametrize("budget", HUGE, ids=HUGE_IDS)
def test_a_budget_past_any_device_is_refused(budget: Any, no_trace: None) -> None:
    with pytest.raises(mw.OptionError) as info:
        mw.plan(llama(), (1, 8), gpu="H100", budget=budget)
    assert "16 EiB" in one_line(info)
    with pytest.raises(mw.OptionError) as info:
        mw.plan_checkpointing(nn.Linear(4, 4), (2, 4), budget=budget)
    assert "16 EiB" in one_line(info)


def test_the_largest_budget_is_still_a_budget() -> None:
    assert mw.options.check_budget(MAX_BUDGET_BYTES) == 2**64
    assert mw.options.check_budget("16384TiB") == 16384 * 2**40


def test_paged_refuses_a_budget_past_any_device() -> None:
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(llama()).eval()
    transformers.logging.set_verbosity_error()
    a = mw.analyze(model, input_size=(1, 8), mode="generate", new_tokens=2)
    assert a.kv_cache is not None
    for budget in HUGE:
        with pytest.raises(mw.OptionError) as info:
            a.kv_cache.paged(budget)
        assert "16 EiB" in one_line(info)
    assert a.kv_cache.paged("1GiB") > 0


def gpu(**figures: Any) -> mw.GPU:
    base = dict(name="card", memory_bytes=80 * 2**30, hbm_bytes_per_s=3e12, fp32_flops=6e13)
    return mw.GPU(**{**base, **figures})


@pytest.mark.parametrize(
    "figures",
    [
        {"memory_bytes": 10**400},
        {"memory_bytes": 1e30},
        {"memory_bytes": 10**5000},
        {"hbm_bytes_per_s": 10**400},
        {"gpus_per_node": 0.5},
        {"gpus_per_node": 8.0},
        {"gpus_per_node": 10**9},
    ],
    ids=[
        "mem-10**400",
        "mem-1e30",
        "mem-10**5000",
        "hbm-10**400",
        "node-0.5",
        "node-8.0",
        "node-10**9",
    ],
)
def test_a_gpu_no_one_can_build_is_refused(figures: dict[str, Any]) -> None:
    with pytest.raises(mw.OptionError) as info:
        gpu(**figures)
    assert "GPU('card')" in one_line(info)


def test_an_option_of_no_function_is_said_before_any_trace(no_trace: None) -> None:
    with pytest.raises(mw.OptionTypeError, match="'foo' is an option of neither plan") as info:
        mw.plan(llama(), (1, 8), gpu="H100", foo=1)
    assert "optimizer" in one_line(info)  # analyze's options are listed
    with pytest.raises(mw.OptionTypeError, match="did you mean 'optimizer'") as info:
        mw.plan(llama(), (1, 8), gpu="H100", optimzer="adamw")
    assert "\n" not in str(info.value)
    with pytest.raises(
        mw.OptionTypeError, match="'foo' is an option of neither plan_checkpointing"
    ):
        mw.plan_checkpointing(nn.Linear(4, 4), (2, 4), budget="1GiB", foo=1)


def test_too_many_micro_batches_are_refused_before_any_trace(no_trace: None) -> None:
    with pytest.raises(mw.OptionError, match="micro_batches=5000 is more than 1024") as info:
        mw.plan(llama(), (1, 8), gpu="H100", micro_batches=[1, 5000])
    one_line(info)


def test_workers_are_capped_at_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    used: list[int] = []

    @contextlib.contextmanager
    def recorded(processes: int) -> Iterator[None]:
        used.append(processes)
        yield None  # no pool: every candidate traced here, the count is what is checked

    monkeypatch.setattr(plan_module, "local_pool", recorded)
    monkeypatch.setattr(plan_module, "cores", lambda: 2)
    p = mw.plan(
        llama(), (1, 8), gpu="H100", precisions=["as given"], micro_batches=[1], workers=10**9
    )
    assert len(p.candidates) == 2 and used == [1]  # 2 cores: 1 child, not 10**9 processes
