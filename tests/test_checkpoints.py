"""inspect_checkpoint and checkpoint_diff against real files, real loads and torch's own checks."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest
import torch
from models import gpt2_config, llama_config, real
from safetensors import safe_open
from safetensors.torch import load_file, save_file, save_model

import meta_widget as mw
from meta_widget.checkpoints import (
    CheckpointError,
    UnsafeCheckpointError,
    checkpoint_diff,
    inspect_checkpoint,
)

ROOT = pathlib.Path(__file__).resolve().parents[1]
MiB = 1024 * 1024


def _big_state() -> dict[str, torch.Tensor]:
    """1 GiB of tensors in three dtypes (uninitialized memory: only the sizes matter)."""
    state: dict[str, torch.Tensor] = {}
    for i in range(8):  # 8 x 64 MiB float32
        state[f"layers.{i}.mlp.weight"] = torch.empty(4096, 4096, dtype=torch.float32)
        state[f"layers.{i}.attn.weight"] = torch.empty(8192, 4096, dtype=torch.bfloat16)
    state["positions"] = torch.zeros(1000, dtype=torch.int64)
    state["mask"] = torch.zeros(7, 3, dtype=torch.bool)
    return state


@pytest.fixture(scope="module")
def big_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    folder = tmp_path_factory.mktemp("big")
    state = _big_state()
    truth = {
        k: (tuple(v.shape), str(v.dtype).removeprefix("torch."), v.numel() * v.element_size())
        for k, v in state.items()
    }
    save_file(state, str(folder / "big.safetensors"))
    torch.save(state, folder / "big.pt")
    del state
    return {"folder": folder, "truth": truth}


_MEASURE = textwrap.dedent(
    """
    import json, sys
    import torch, pandas
    from meta_widget.checkpoints import inspect_checkpoint
    path = sys.argv[1]
    def peak():
        # VmHWM: this process's own high-water mark. (getrusage's ru_maxrss would start at the
        # parent's peak: Linux carries it over fork + exec, and pytest's process is large.)
        with open("/proc/self/status") as f:
            line = next(x for x in f if x.startswith("VmHWM:"))
        return int(line.split()[1]) * 1024
    base = peak()
    info = inspect_checkpoint(path)
    grown = peak() - base
    # control: really reading 200 MiB of the file shows up in the same measure
    with open(path, "rb") as f:
        data = f.read(200 * 1024 * 1024)
    control = peak() - base
    print(json.dumps({"grown": grown, "control": control,
                      "tensors": [[t.name, list(t.shape), t.dtype, t.nbytes] for t in info]}))
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["big.safetensors", "big.pt"])
def test_a_1gb_checkpoint_is_inspected_without_reading_its_data(
    big_files: dict[str, object], name: str
) -> None:
    path = pathlib.Path(str(big_files["folder"])) / name
    assert path.stat().st_size > 1024 * MiB
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    out = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(path)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["grown"] < 50 * MiB, result["grown"]
    assert result["control"] > 150 * MiB  # the measure sees memory that is really read
    truth = big_files["truth"]
    assert isinstance(truth, dict)
    got = {n: (tuple(s), d, b) for n, s, d, b in result["tensors"]}
    assert got == truth


def test_the_1gb_safetensors_header_matches_the_librarys_own_reading(
    big_files: dict[str, object],
) -> None:
    path = pathlib.Path(str(big_files["folder"])) / "big.safetensors"
    info = inspect_checkpoint(path)
    names = {
        "F32": "float32",
        "BF16": "bfloat16",
        "I64": "int64",
        "BOOL": "bool",
    }
    with safe_open(str(path), framework="pt") as f:
        assert sorted(f.keys()) == sorted(t.name for t in info)
        for t in info:
            sl = f.get_slice(t.name)
            assert tuple(sl.get_shape()) == t.shape
            assert names[sl.get_dtype()] == t.dtype


@pytest.fixture
def small_model() -> torch.nn.Module:
    return real(llama_config())


def _real_state(path: pathlib.Path) -> dict[str, torch.Tensor]:
    if path.suffix == ".safetensors":
        return load_file(str(path))
    return torch.load(path, weights_only=True)


@pytest.mark.parametrize("suffix", [".safetensors", ".pt", ".bin"])
def test_every_tensor_matches_a_real_load(
    tmp_path: pathlib.Path, small_model: torch.nn.Module, suffix: str
) -> None:
    state = {k: v.clone() for k, v in small_model.state_dict().items()}
    state["model.norm.weight"] = state["model.norm.weight"].to(torch.bfloat16)
    state["step"] = torch.tensor(3, dtype=torch.int64)
    path = tmp_path / f"model{suffix}"
    if suffix == ".safetensors":
        save_file(state, str(path))
    else:
        torch.save(state, path)
    info = inspect_checkpoint(path)
    loaded = _real_state(path)
    assert {t.name for t in info} == set(loaded)
    for t in info:
        real_t = loaded[t.name]
        assert t.shape == tuple(real_t.shape)
        assert t.dtype == str(real_t.dtype).removeprefix("torch.")
        assert t.nbytes == real_t.numel() * real_t.element_size()
    assert info.total_numel == sum(v.numel() for v in loaded.values())
    assert info.bytes_by_dtype["bfloat16"] == loaded["model.norm.weight"].nbytes
    # memory at each dtype: what casting the real tensors gives
    for dtype in ("float32", "bfloat16", "float16"):
        cast = sum(
            v.to(getattr(torch, dtype)).nbytes if v.is_floating_point() else v.nbytes
            for v in loaded.values()
        )
        assert info.bytes_at(dtype) == cast
    frame = info.to_dataframe()
    assert frame["bytes"].sum() == sum(v.nbytes for v in loaded.values())
    assert "model.layers.1.mlp.up_proj" in frame["module"].tolist()


def test_the_tree_and_the_widget_payload(
    tmp_path: pathlib.Path, small_model: torch.nn.Module
) -> None:
    path = tmp_path / "m.safetensors"
    save_model(small_model, str(path))
    info = mw.inspect_checkpoint(path)
    payload = info.to_payload()
    mods = payload["modules"]
    strings = payload["strings"]
    paths: list[str] = []
    for parent, name in zip(mods["parent"], mods["name"], strict=True):
        paths.append(
            strings[name]
            if parent < 0
            else ".".join(p for p in (paths[parent], strings[name]) if p)
        )
    # every tensor is an own_param of the row of its dotted prefix, with its shape and dtype
    seen = {}
    for row, own in enumerate(mods["own_params"]):
        for name_sid, tid in own:
            shape_id, dtype_sid, _stride, _rg = payload["tensors"][tid]
            full = ".".join(p for p in (paths[row], strings[name_sid]) if p)
            seen[full] = (tuple(payload["shapes"][shape_id]), strings[dtype_sid])
    truth = {
        k: (tuple(v.shape), str(v.dtype).removeprefix("torch."))
        for k, v in small_model.state_dict().items()
    }
    assert seen == truth
    assert mods["params"][0] == sum(v.numel() for v in small_model.state_dict().values())
    layer = paths.index("model.layers.1")
    assert mods["params"][layer] == sum(p.numel() for p in small_model.model.layers[1].parameters())
    assert payload["source"] == "checkpoint" and payload["calls"]["module"] == []
    text = info.summary()
    assert "0–1 · 2 ×" in info.summary(depth=3) and "bfloat16 48.8 KiB" in text
    bundle = info._repr_mimebundle_()
    data = bundle[0] if isinstance(bundle, tuple) else bundle
    assert "application/vnd.jupyter.widget-view+json" in data
    assert data["text/plain"] == text


def test_a_sharded_index_is_merged(tmp_path: pathlib.Path, small_model: torch.nn.Module) -> None:
    state = {k: v.contiguous() for k, v in small_model.state_dict().items()}
    names = list(state)
    shards = [names[0::3], names[1::3], names[2::3]]
    weight_map = {}
    for i, part in enumerate(shards):
        file = f"model-{i + 1:05d}-of-00003.safetensors"
        save_file({k: state[k] for k in part}, str(tmp_path / file))
        weight_map.update(dict.fromkeys(part, file))
    total = sum(v.nbytes for v in state.values())
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    for where in (index, tmp_path):  # the index, or the folder holding it
        info = inspect_checkpoint(where)
        assert len(info.files) == 3 and info.format == "sharded safetensors"
        assert {t.name: (t.shape, t.nbytes) for t in info} == {
            k: (tuple(v.shape), v.nbytes) for k, v in state.items()
        }
        assert {t.name: os.path.basename(t.file) for t in info} == weight_map
        assert info.total_bytes == total and info.notes == []
    # an index naming a shard that is not there, and one naming a tensor no shard holds
    weight_map["extra.weight"] = "model-00009-of-00009.safetensors"
    index.write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(CheckpointError, match=re.escape("model-00009-of-00009.safetensors")):
        inspect_checkpoint(index)
    weight_map["extra.weight"] = "model-00001-of-00003.safetensors"
    index.write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(CheckpointError, match=re.escape("extra.weight")):
        inspect_checkpoint(index)


class _Evil:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        return (pathlib.Path.touch, (pathlib.Path(self.marker),))


@pytest.mark.parametrize("how", ["torch.save", "pickle"])
def test_a_pickle_that_would_run_code_is_refused(tmp_path: pathlib.Path, how: str) -> None:
    marker = tmp_path / "PWNED"
    path = tmp_path / "evil.pt"
    payload = {"weight": torch.zeros(2), "x": _Evil(str(marker))}
    if how == "torch.save":
        torch.save(payload, path)
    else:
        import pickle

        path.write_bytes(pickle.dumps(payload, protocol=2))
    with pytest.raises(UnsafeCheckpointError) as info:
        inspect_checkpoint(path)
    message = str(info.value)
    assert str(path) in message and "nothing was executed" in message
    assert "would call the global " in message
    assert "torch.save(model.state_dict()" in message and "weights_only=False" in message
    assert not marker.exists()
    if how == "torch.save":
        # control: loading it the unsafe way really runs the payload
        code = (
            "import sys, torch; sys.path.insert(0, sys.argv[2]); "
            "torch.load(sys.argv[1], weights_only=False)"
        )
        subprocess.run(
            [sys.executable, "-c", code, str(path), str(pathlib.Path(__file__).parent)],
            check=False,
            capture_output=True,
            timeout=120,
        )
        assert marker.exists()


def test_not_a_checkpoint_and_missing_files(tmp_path: pathlib.Path) -> None:
    with pytest.raises(CheckpointError, match="no checkpoint file"):
        inspect_checkpoint(tmp_path / "nope.safetensors")
    bad = tmp_path / "notes.bin"
    bad.write_text("hello, world")
    with pytest.raises(
        CheckpointError, match=re.escape("neither a safetensors file nor a torch.save")
    ):
        inspect_checkpoint(bad)
    truncated = tmp_path / "t.safetensors"
    save_file({"w": torch.zeros(100)}, str(truncated))
    truncated.write_bytes(truncated.read_bytes()[:-10])
    with pytest.raises(CheckpointError, match="truncated"):
        inspect_checkpoint(truncated)


def test_checkpoint_diff_agrees_with_load_state_dict(
    tmp_path: pathlib.Path, small_model: torch.nn.Module
) -> None:
    state = {k: v.clone() for k, v in small_model.state_dict().items()}
    del state["model.layers.0.mlp.up_proj.weight"]
    state["model.layers.0.mlp.extra.weight"] = torch.zeros(3)
    state["model.layers.1.self_attn.q_proj.weight"] = torch.zeros(16, 32)
    state["model.norm.weight"] = state["model.norm.weight"].half()
    path = tmp_path / "doctored.safetensors"
    save_file(state, str(path))
    with torch.device("meta"):
        import transformers

        meta_model = transformers.LlamaForCausalLM(llama_config())
    diff = checkpoint_diff(meta_model, inspect_checkpoint(path))

    # the truth: torch's own load_state_dict on the real model
    target = real(llama_config())
    with pytest.raises(RuntimeError) as err:
        target.load_state_dict(load_file(str(path)), strict=True)
    message = str(err.value)
    bad = "model.layers.1.self_attn.q_proj.weight"
    loadable = {k: v for k, v in load_file(str(path)).items() if k != bad}
    result = target.load_state_dict(loadable, strict=False)
    assert diff.missing == [k for k in result.missing_keys if k != bad]
    assert diff.unexpected == list(result.unexpected_keys)
    assert [n for n, *_ in diff.shape_mismatches] == ["model.layers.1.self_attn.q_proj.weight"]
    assert "size mismatch for model.layers.1.self_attn.q_proj.weight" in message
    assert diff.shape_mismatches[0][1:] == ((32, 32), (16, 32))
    assert diff.dtype_mismatches == [("model.norm.weight", "float32", "float16")]
    assert not diff.ok
    as_dict = json.loads(json.dumps(diff.to_dict()))
    assert as_dict["missing"] == ["model.layers.0.mlp.up_proj.weight"]
    assert "missing" in str(diff) and "q_proj" in str(diff)

    # and a clean checkpoint fits
    clean = tmp_path / "clean.safetensors"
    save_model(small_model, str(clean))
    assert checkpoint_diff(meta_model, inspect_checkpoint(clean)).ok


def test_tied_weights_and_prefixes_are_recognized(tmp_path: pathlib.Path) -> None:
    model = real(gpt2_config())
    assert model.lm_head.weight is model.transformer.wte.weight
    path = tmp_path / "gpt2.safetensors"
    save_model(model, str(path))  # stores one of the two tied names
    info = inspect_checkpoint(path)
    diff = checkpoint_diff(model, info)
    stored = {t.name for t in info}
    assert diff.missing == [] and diff.unexpected == [] and diff.ok
    assert len(diff.tied) == 1 and diff.tied[0][1] in stored and diff.tied[0][0] not in stored
    # a DataParallel-style prefix on every key
    prefixed = tmp_path / "ddp.pt"
    torch.save({f"module.{k}": v for k, v in model.state_dict().items()}, prefixed)
    diff = checkpoint_diff(model, inspect_checkpoint(prefixed))
    assert not diff.ok and any("'module.'" in h for h in diff.hints)
