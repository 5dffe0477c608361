"""Hub ids and their ``config.json``, as someone else wrote them: bounded before anything is
built, only model classes ever called, one line of the project's own error for each mistake.

The cache is laid out as huggingface_hub lays it out (``tests/test_hub.py``'s ``put``), offline.
The truths: the global RNG states (``transformers.Trainer(config)`` reseeds them), spies standing
in for the classes a config names (a call is seen), the files in the cache and the working folder
before and after (nothing left behind), a subprocess (the command line, and a Hub that cannot be
reached: ``HF_ENDPOINT`` on a closed local port, so no test reaches the network), and every
default config of transformers (none refused by the limits).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import transformers

import meta_widget as mw
from tests.test_hub import LLAMA, hf_cache, put

__all__ = ["hf_cache"]  # the fixture, used by name

ROOT = Path(__file__).resolve().parents[2]


def files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def one_line_error(exc: BaseException) -> None:
    """The project's own error, on one line, with no library's error chained to it."""
    assert isinstance(exc, mw.MetaWidgetError), type(exc)
    assert "\n" not in str(exc), str(exc)
    assert exc.__cause__ is None or isinstance(exc.__cause__, mw.MetaWidgetError)


# -- 6. sizes a config asks for ------------------------------------------------------------------


@pytest.mark.parametrize("layers", [10**9, 100_000, 1_001])
def test_a_config_asking_for_too_many_layers_is_refused_before_building(
    hf_cache: Path, layers: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    put(
        hf_cache,
        "org/deep",
        "config.json",
        json.dumps({**LLAMA, "num_hidden_layers": layers}).encode(),
    )
    built: list[Any] = []
    real_init = transformers.LlamaForCausalLM.__init__

    def spy(self: Any, *args: Any, **kwargs: Any) -> None:
        built.append(self)
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(transformers.LlamaForCausalLM, "__init__", spy)
    with pytest.raises(mw.HubError) as info:
        mw.analyze("org/deep", input_size=(1, 8))
    one_line_error(info.value)
    assert f"num_hidden_layers={layers:,}" in str(info.value) and "1,000" in str(info.value)
    assert "AutoConfig.from_pretrained" in str(info.value)  # how to go past it deliberately
    assert built == []  # refused before any module was built


def test_the_layer_limit_itself_still_builds(hf_cache: Path) -> None:
    put(
        hf_cache,
        "org/tall",
        "config.json",
        json.dumps({**LLAMA, "num_hidden_layers": 1000}).encode(),
    )
    a = mw.analyze("org/tall")
    real = transformers.LlamaConfig(**{**LLAMA, "num_hidden_layers": 1000})
    with torch.device("meta"):
        truth = sum(p.numel() for p in transformers.LlamaForCausalLM(real).parameters())
    assert a.total_params == truth


def test_a_config_past_the_limits_is_refused_from_the_command_line(hf_cache: Path) -> None:
    put(
        hf_cache,
        "org/deep",
        "config.json",
        json.dumps({**LLAMA, "num_hidden_layers": 10**9}).encode(),
    )
    env = {**os.environ, "HF_HUB_CACHE": str(hf_cache), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "meta_widget.cli", "org/deep", "--input", "1,8"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert done.returncode == 1, done.stdout
    assert done.stderr.count("\n") == 1 and "num_hidden_layers=1,000,000,000" in done.stderr


def test_every_default_config_of_transformers_is_within_the_limits() -> None:
    from meta_widget.sources.config_limits import config_problem

    refused = {}
    for kind, cls in transformers.CONFIG_MAPPING.items():
        try:
            raw = json.loads(cls().to_json_string())
        except Exception:  # a config class that needs arguments: nothing to check
            continue
        problem = config_problem(raw)
        if problem is not None:
            refused[kind] = problem
    assert refused == {}


def test_a_parameter_count_past_the_limit_is_refused(hf_cache: Path) -> None:
    # every size within its own cap, the product far past 10**14 parameters
    big = {**LLAMA, "hidden_size": 2**24, "intermediate_size": 2**24, "num_hidden_layers": 1000}
    put(hf_cache, "org/huge", "config.json", json.dumps(big).encode())
    with pytest.raises(mw.HubError, match="parameters, past the limit") as info:
        mw.analyze("org/huge")
    one_line_error(info.value)


# -- 12. configs and ids a user or an attacker gets wrong ----------------------------------------

BAD_CONFIGS = {
    "negative hidden": ({"hidden_size": -64}, "hidden_size=-64 is below 1"),
    "hidden 2**40": ({"hidden_size": 2**40}, "hidden_size=1,099,511,627,776 is past"),
    "hidden 2**62": ({"hidden_size": 2**62}, "hidden_size=4,611,686,018,427,387,904 is past"),
    "no heads": ({"num_attention_heads": 0}, "num_attention_heads=0 is below 1"),
    "vocab a word": ({"vocab_size": "big"}, "vocab_size='big' is not a whole number"),
    "half a layer": ({"num_hidden_layers": 2.5}, "num_hidden_layers=2.5 is not a whole number"),
    "float128": ({"dtype": "float128"}, "dtype='float128' is not a torch dtype"),
    "torch_dtype float128": ({"torch_dtype": "float128"}, "is not a torch dtype"),
    "heads not dividing": ({"num_attention_heads": 5}, "LlamaConfig refuses"),
    "no such activation": ({"hidden_act": "no-such-act"}, "building the model"),
    "nested sub-config": ({"text_config": {"hidden_size": -1}}, "(in text_config)"),
}


@pytest.mark.parametrize("case", list(BAD_CONFIGS))
def test_a_bad_config_is_one_line_of_our_own(hf_cache: Path, tmp_path: Path, case: str) -> None:
    change, said = BAD_CONFIGS[case]
    put(hf_cache, "org/bad", "config.json", json.dumps({**LLAMA, **change}).encode())
    before = files(tmp_path)
    with pytest.raises(mw.MetaWidgetError) as info:
        mw.analyze("org/bad", input_size=(1, 8))
    one_line_error(info.value)
    assert said in str(info.value)
    assert files(tmp_path) == before


def test_json_nested_100000_deep_is_one_line(hf_cache: Path) -> None:
    deep = '{"model_type": "llama", "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
    put(hf_cache, "org/deep-json", "config.json", deep.encode())
    with pytest.raises(mw.HubError, match=r"nests too deep|nested more than") as info:
        mw.analyze("org/deep-json")
    one_line_error(info.value)


def test_a_config_json_that_is_a_list_or_too_large_is_one_line(hf_cache: Path) -> None:
    put(hf_cache, "org/list", "config.json", b"[1, 2]")
    with pytest.raises(mw.HubError, match="not an object") as info:
        mw.analyze("org/list")
    one_line_error(info.value)
    put(hf_cache, "org/large", "config.json", b'{"a": "' + b"x" * (17 * 2**20) + b'"}')
    with pytest.raises(mw.HubError, match="larger than") as info:
        mw.analyze("org/large")
    one_line_error(info.value)


@pytest.mark.parametrize("call", ["analyze", "inspect_checkpoint"])
def test_a_nul_byte_is_one_line(call: str) -> None:
    for name in ("org/x\x00y", "model\x00.pt"):
        with pytest.raises(mw.CheckpointError, match="NUL byte") as info:
            getattr(mw, call)(name)
        one_line_error(info.value)


def test_a_revision_that_is_no_string_is_one_line(hf_cache: Path) -> None:
    with pytest.raises(mw.OptionError, match="revision"):
        mw.analyze("org/x", revision=5)  # type: ignore[arg-type]
    with pytest.raises(mw.CheckpointError, match="revision") as info:
        mw.inspect_checkpoint("org/x", revision=5)  # type: ignore[arg-type]
    one_line_error(info.value)


def test_bytes_paths_read_as_their_str(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    path = tmp_path / "m.safetensors"
    save_file({"w": torch.zeros(2, 3)}, str(path))
    for given in (os.fsencode(path), path):
        info = mw.inspect_checkpoint(given)
        assert info["w"].shape == (2, 3)
        assert mw.analyze(given)["w"].shape == (2, 3)  # type: ignore[index]


_UNREACHABLE = """
import json, meta_widget as mw
out = {}
for call in ("inspect_checkpoint", "analyze"):
    try:
        getattr(mw, call)("org/x")
        out[call] = "no error"
    except Exception as exc:
        out[call] = [type(exc).__name__, isinstance(exc, mw.MetaWidgetError), str(exc)]
print(json.dumps(out))
"""


def test_a_hub_that_cannot_be_reached_is_a_hub_error(tmp_path: Path) -> None:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("HF_") and "PROXY" not in k.upper()
    }
    env.update(
        HF_HOME=str(tmp_path / "hf"), HF_ENDPOINT="http://127.0.0.1:9", HF_HUB_ETAG_TIMEOUT="1"
    )
    env.update(HF_HUB_DOWNLOAD_TIMEOUT="1", TRANSFORMERS_VERBOSITY="error")
    done = subprocess.run(
        [sys.executable, "-c", _UNREACHABLE],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    for call, (kind, ours, message) in out.items():
        assert kind == "HubError" and ours, (call, kind, message)
        assert "\n" not in message and "'org/x'" in message
    assert "127.0.0.1:9" in out["inspect_checkpoint"][2]


# -- 7. only model classes are called ------------------------------------------------------------


def rng_states() -> tuple[Any, ...]:
    return (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy())


def same_rng(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return bool(torch.equal(a[0], b[0]) and a[1] == b[1] and np.array_equal(a[2], b[2]))


NOT_MODELS = [
    "Trainer",
    "pipeline",
    "AutoTokenizer",
    "LlamaConfig",
    "DataCollatorWithPadding",
    "__class__",
]


@pytest.mark.parametrize("name", NOT_MODELS)
def test_architectures_naming_no_model_class_calls_nothing(
    hf_cache: Path, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    called: list[str] = []
    if not name.startswith("_"):
        monkeypatch.setattr(transformers, name, lambda *a, **k: called.append(name))
    put(hf_cache, "org/odd", "config.json", json.dumps({**LLAMA, "architectures": [name]}).encode())
    torch.manual_seed(1234)
    random.seed(1234)
    np.random.seed(1234)
    before = rng_states()
    a = mw.analyze("org/odd", input_size=(1, 8))
    assert same_rng(before, rng_states())
    assert called == []
    assert a.title == "LlamaModel"  # AutoModel's choice for a llama config
    assert any("no model class" in n for n in a.notes)


def test_trainer_named_by_a_config_does_not_reseed(hf_cache: Path) -> None:
    """The real ``Trainer``, no spy: the RNG states alone say whether it ran."""
    put(
        hf_cache,
        "org/trainer",
        "config.json",
        json.dumps({**LLAMA, "architectures": ["Trainer"]}).encode(),
    )
    torch.manual_seed(99)
    random.seed(99)
    np.random.seed(99)
    before = rng_states()
    error = None
    try:
        mw.analyze("org/trainer")
    except Exception as exc:  # Trainer(config) reseeds first and then fails
        error = exc
    assert same_rng(before, rng_states())
    assert error is None


def test_a_model_class_is_still_built(hf_cache: Path) -> None:
    put(hf_cache, "org/ok", "config.json", json.dumps(LLAMA).encode())
    before = rng_states()
    a = mw.analyze("org/ok", input_size=(1, 8))
    assert a.title == "LlamaForCausalLM" and same_rng(before, rng_states())


# -- a bare name is never a Hub id -----------------------------------------------------------------


@pytest.mark.parametrize("name", ["gpt2", "my_model", "bert-base-uncased"])
def test_a_bare_name_is_a_missing_path_not_a_hub_id(
    hf_cache: Path, tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the legacy id is in the cache: only the rule keeps it from being taken for one
    put(hf_cache, name, "config.json", json.dumps(LLAMA).encode())
    monkeypatch.chdir(tmp_path)
    for call in (mw.analyze, mw.inspect_checkpoint):
        with pytest.raises(mw.CheckpointError, match="no checkpoint file") as info:
            call(name)
        one_line_error(info.value)
    # its org/name form is the id
    put(hf_cache, f"openai-community/{name}", "config.json", json.dumps(LLAMA).encode())
    assert mw.analyze(f"openai-community/{name}").source == "hub"
    for not_ids in ("a/b/c", "/org/name", "org/name.pt", "org/", "./gpt2"):
        with pytest.raises(mw.CheckpointError):
            mw.analyze(not_ids)
