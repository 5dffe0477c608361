"""Hugging Face Hub ids: ``analyze("org/name")`` from a cache holding only ``config.json``,
refusals in one line (offline and not cached, remote code), and ``inspect_checkpoint`` of a
sharded safetensors model read from the cache's headers.

The cache is laid out as huggingface_hub lays it out (``models--org--name/refs/main``,
``snapshots/<commit>/<file>`` linked to ``blobs/<hash>``), and huggingface_hub's own
``scan_cache_dir`` is asked to read it back before anything is analyzed; the process is offline
(``HF_HUB_OFFLINE``, set by ``conftest.py`` and here).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import huggingface_hub
import pytest
import torch
import transformers
from huggingface_hub import constants as hf_constants
from safetensors.torch import save_file

import meta_widget as mw
from meta_widget.checkpoints import CheckpointInfo

COMMIT = "0123456789abcdef0123456789abcdef01234567"
LLAMA: dict[str, Any] = dict(
    model_type="llama",
    architectures=["LlamaForCausalLM"],
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=300,
)


@pytest.fixture
def hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty Hugging Face cache in ``tmp_path``, offline, used by huggingface_hub."""
    home = tmp_path / "hf"
    cache = home / "hub"
    cache.mkdir(parents=True)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # huggingface_hub reads its environment once, at import: its constants follow it here
    monkeypatch.setattr(hf_constants, "HF_HOME", str(home))
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    return cache


def put(cache: Path, repo: str, name: str, data: bytes) -> Path:
    """Store ``data`` as ``name`` of ``repo`` at ``main``, as huggingface_hub does: the bytes in
    ``blobs/<sha256>``, a relative link in ``snapshots/<commit>/``, the commit in ``refs/main``."""
    folder = cache / f"models--{repo.replace('/', '--')}"
    blob = folder / "blobs" / hashlib.sha256(data).hexdigest()
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.write_bytes(data)
    link = folder / "snapshots" / COMMIT / name
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(blob, link.parent))
    (folder / "refs").mkdir(exist_ok=True)
    (folder / "refs" / "main").write_text(COMMIT)
    return link


def cached_files(cache: Path, repo: str) -> set[str]:
    """The files huggingface_hub itself sees for ``repo`` in ``cache``."""
    info = huggingface_hub.scan_cache_dir(cache)
    (entry,) = [r for r in info.repos if r.repo_id == repo]
    return {f.file_name for rev in entry.revisions for f in rev.files}


def test_config_only_cache_analyzes_with_the_real_parameter_count(hf_cache: Path) -> None:
    put(hf_cache, "tiny-org/tiny-llama", "config.json", json.dumps(LLAMA).encode())
    assert cached_files(hf_cache, "tiny-org/tiny-llama") == {"config.json"}
    a = mw.analyze("tiny-org/tiny-llama", input_size=(1, 8))
    real = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA))
    truth = sum(p.numel() for p in real.parameters())  # parameters() gives tied weights once
    assert a.error is None and a.source == "hub" and a.title == "LlamaForCausalLM"
    assert a.total_params == truth
    assert any("tiny-org/tiny-llama" in n and "no weights" in n for n in a.notes)


def test_revision_picks_the_commit(hf_cache: Path) -> None:
    put(hf_cache, "tiny-org/tiny-llama", "config.json", json.dumps(LLAMA).encode())
    a = mw.analyze("tiny-org/tiny-llama", revision=COMMIT)
    assert a.total_params > 0 and any(COMMIT in n for n in a.notes)
    with pytest.raises(mw.HubError) as info:
        mw.analyze("tiny-org/tiny-llama", revision="v9")
    assert "'v9'" in str(info.value)


def test_unknown_id_offline_is_one_line(hf_cache: Path) -> None:
    with pytest.raises(mw.HubError) as info:
        mw.analyze("nobody/nothing-here", input_size=(1, 8))
    message = str(info.value)
    assert "\n" not in message and "'nobody/nothing-here'" in message
    assert "HF_HUB_OFFLINE" in message and str(hf_cache) in message
    assert info.value.__cause__ is None and info.value.__suppress_context__
    assert isinstance(info.value, mw.MetaWidgetError)


def test_remote_code_is_refused_in_one_line(hf_cache: Path) -> None:
    custom = dict(
        model_type="my-own-arch",
        auto_map={"AutoConfig": "configuration_mine.MineConfig"},
        hidden_size=64,
    )
    put(hf_cache, "someone/custom", "config.json", json.dumps(custom).encode())
    with pytest.raises(mw.RemoteCodeError) as info:
        mw.analyze("someone/custom")
    message = str(info.value)
    assert "\n" not in message and "trust_remote_code=True" in message
    assert "'my-own-arch'" in message


def test_auto_map_of_a_known_type_uses_transformers_classes(hf_cache: Path) -> None:
    config = {**LLAMA, "auto_map": {"AutoConfig": "configuration_llama.LlamaConfig"}}
    put(hf_cache, "someone/llama-with-code", "config.json", json.dumps(config).encode())
    a = mw.analyze("someone/llama-with-code")
    assert a.title == "LlamaForCausalLM"
    assert any("auto_map" in n and "trust_remote_code=True" in n for n in a.notes)


def test_an_existing_path_is_a_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "org").mkdir()
    save_file({"w": torch.zeros(2, 3)}, str(tmp_path / "org" / "name"))
    monkeypatch.chdir(tmp_path)
    info = mw.analyze("org/name")  # a file of that name here: a checkpoint, not a Hub id
    assert isinstance(info, CheckpointInfo) and info["w"].shape == (2, 3)
    with pytest.raises(mw.CheckpointError, match="no checkpoint file"):
        mw.analyze("missing/model.safetensors")


def test_inspect_checkpoint_reads_two_shards_headers_from_the_cache(
    hf_cache: Path, tmp_path: Path
) -> None:
    repo = "tiny-org/sharded"
    shards = {
        "model-00001-of-00002.safetensors": {
            "embed.weight": torch.zeros(30, 8),
            "layers.0.w": torch.zeros(8, 8, dtype=torch.bfloat16),
        },
        "model-00002-of-00002.safetensors": {
            "layers.1.w": torch.zeros(8, 16),
            "head.bias": torch.zeros(30, dtype=torch.float16),
        },
    }
    weight_map = {}
    for name, tensors in shards.items():
        save_file(tensors, str(tmp_path / name))
        put(hf_cache, repo, name, (tmp_path / name).read_bytes())
        weight_map.update(dict.fromkeys(tensors, name))
    total = sum(t.numel() * t.element_size() for ts in shards.values() for t in ts.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    put(hf_cache, repo, "model.safetensors.index.json", json.dumps(index).encode())
    assert len(cached_files(hf_cache, repo)) == 3

    info = mw.inspect_checkpoint(repo)
    expected = {n: (tuple(t.shape), t.numel()) for ts in shards.values() for n, t in ts.items()}
    assert {t.name: (t.shape, t.numel) for t in info.tensors} == expected
    assert info.total_bytes == total and not info.notes
    assert info["layers.0.w"].dtype == "bfloat16" and info["head.bias"].dtype == "float16"
    assert {os.path.basename(f) for f in info.files} == set(shards)


def test_inspect_checkpoint_of_an_unknown_id_offline_is_one_line(hf_cache: Path) -> None:
    with pytest.raises(mw.HubError) as info:
        mw.inspect_checkpoint("nobody/nothing-here")
    assert "\n" not in str(info.value) and "HF_HUB_OFFLINE" in str(info.value)


def test_cli_takes_a_hub_id(hf_cache: Path) -> None:
    put(hf_cache, "tiny-org/tiny-llama", "config.json", json.dumps(LLAMA).encode())
    env = {**os.environ, "HF_HUB_CACHE": str(hf_cache), "HF_HUB_OFFLINE": "1"}
    run = [sys.executable, "-m", "meta_widget.cli"]
    done = subprocess.run(
        [*run, "tiny-org/tiny-llama", "--input", "1,8", "--depth", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "LlamaForCausalLM" in done.stdout
    missing = subprocess.run(
        [*run, "nobody/nothing-here"], env=env, capture_output=True, text=True, timeout=300
    )
    assert missing.returncode == 1
    assert missing.stderr.count("\n") == 1 and "HF_HUB_OFFLINE" in missing.stderr


def test_meta_magic_takes_a_hub_id(hf_cache: Path) -> None:
    from IPython.core.interactiveshell import InteractiveShell

    put(hf_cache, "tiny-org/tiny-llama", "config.json", json.dumps(LLAMA).encode())
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "meta_widget")
    try:
        quoted = shell.run_line_magic("meta", "'tiny-org/tiny-llama' --input 1,8")
        bare = shell.run_line_magic("meta", f"tiny-org/tiny-llama --revision {COMMIT}")
    finally:
        shell.run_line_magic("unload_ext", "meta_widget")
    assert quoted.source == "hub" and quoted.traced and quoted.title == "LlamaForCausalLM"
    assert bare.total_params == quoted.total_params and not bare.traced
