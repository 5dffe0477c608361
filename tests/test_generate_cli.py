"""``--mode generate`` from the command and ``%meta``: the same analysis as ``analyze``, its
KV cache and time in the summary."""

from __future__ import annotations

import pathlib

import pytest

import meta_widget as mw
from meta_widget.cli import main
from meta_widget.magics import parse_magic_line
from meta_widget.units import format_bytes

transformers = pytest.importorskip("transformers")

CONFIG = """
import transformers
config = transformers.LlamaConfig(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, vocab_size=100, architectures=["LlamaForCausalLM"],
)
"""


def test_the_command_generates_and_prints_the_cache(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "tiny.py").write_text(CONFIG)
    spec = f"{tmp_path / 'tiny.py'}:config"
    status = main([spec, "--input", "2,8", "--mode", "generate", "--new-tokens", "3"])
    out = capsys.readouterr().out
    assert status == 0
    namespace: dict[str, object] = {}
    exec(CONFIG, namespace)  # the same config, analyzed here
    a = mw.analyze(namespace["config"], (2, 8), mode="generate", new_tokens=3)
    assert a.kv_cache is not None
    line = next(s for s in out.splitlines() if s.startswith("KV cache"))
    assert f"{format_bytes(a.kv_cache.bytes)} at the end" in line and "2 full" in line


def test_the_command_says_in_one_line_that_generate_needs_a_count(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "tiny.py").write_text(CONFIG)
    with pytest.raises(SystemExit) as stop:
        main([f"{tmp_path / 'tiny.py'}:config", "--input", "1,8", "--mode", "generate"])
    assert stop.value.code != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "new_tokens" in err


def test_meta_magic_takes_generate_and_new_tokens() -> None:
    args = parse_magic_line("model --input 1,8 --mode generate --new-tokens 5")
    assert (args.mode, args.new_tokens) == ("generate", 5)
    with pytest.raises(Exception, match=r"invalid choice: 'decode'.*generate"):
        parse_magic_line("model --mode decode")


def test_the_summary_times_generate_on_a_gpu() -> None:
    namespace: dict[str, object] = {}
    exec(CONFIG, namespace)
    a = mw.analyze(namespace["config"], (2, 8), mode="generate", new_tokens=4, gpu="L4")
    assert a.time is not None and a.time.prefill_s is not None
    line = next(s for s in a.summary().splitlines() if s.startswith("Time on L4"))
    assert "prefill" in line and "per output token" in line
