"""``mw.analyze_pipeline(folder)`` of folders built to read outside themselves, or malformed.

A ``model_index.json`` key that is an absolute path or ``../``, or a part folder (or its
``config.json``) that links outside, was followed and the config found there built. The truth is
an audit hook that sees every Python ``open``: the config planted outside the folder is never
opened, and each refusal is one line of ``PipelineError`` (a ``MetaWidgetError``), with nothing
left behind in the folder.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

import meta_widget as mw
from meta_widget import heavy

TEXT = {
    "model_type": "clip_text_model",
    "architectures": ["CLIPTextModel"],
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "vocab_size": 100,
    "max_position_embeddings": 20,
}
ENTRY = ["transformers", "CLIPTextModel"]

_WATCH: list[list[str]] = []


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event == "open" and _WATCH and isinstance(args[0], (str, bytes, os.PathLike)):
        _WATCH[-1].append(os.path.realpath(os.fsdecode(args[0])))


sys.addaudithook(_audit)


def files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def refused(folder: Path) -> tuple[mw.PipelineError, list[str]]:
    """analyze_pipeline(folder)'s PipelineError and every path opened meanwhile."""
    opened: list[str] = []
    before = files(folder)
    _WATCH.append(opened)
    try:
        with pytest.raises(mw.PipelineError) as info:
            mw.analyze_pipeline(folder)
    finally:
        _WATCH.pop()
    assert "\n" not in str(info.value) and isinstance(info.value, mw.MetaWidgetError)
    assert info.value.__cause__ is None or isinstance(info.value.__cause__, mw.MetaWidgetError)
    assert files(folder) == before
    return info.value, opened


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder beside the pipeline's, holding a config a part must never be built from."""
    there = tmp_path / "outside"
    there.mkdir()
    (there / "config.json").write_text(json.dumps(TEXT))
    return there


def pipeline(tmp_path: Path, index: Any) -> Path:
    folder = tmp_path / "pipe"
    folder.mkdir(exist_ok=True)
    (folder / "model_index.json").write_text(json.dumps(index))
    return folder


def never_opened(opened: list[str], outside: Path) -> None:
    assert not [p for p in opened if p.startswith(str(outside.resolve()))], opened


# -- 4. keys and links that lead outside ---------------------------------------------------------


def test_an_absolute_key_is_refused_unread(tmp_path: Path, outside: Path) -> None:
    folder = pipeline(tmp_path, {"_class_name": "X", str(outside): ENTRY})
    exc, opened = refused(folder)
    assert repr(str(outside)) in str(exc) and "no folder name" in str(exc)
    never_opened(opened, outside)


@pytest.mark.parametrize("key", ["../outside", "..", "text/../../outside"])
def test_a_dotdot_key_is_refused_unread(tmp_path: Path, outside: Path, key: str) -> None:
    folder = pipeline(tmp_path, {key: ENTRY})
    exc, opened = refused(folder)
    assert repr(key) in str(exc)
    never_opened(opened, outside)


def test_a_part_folder_linked_outside_is_refused_unread(tmp_path: Path, outside: Path) -> None:
    folder = pipeline(tmp_path, {"text_encoder": ENTRY})
    (folder / "text_encoder").symlink_to(outside, target_is_directory=True)
    exc, opened = refused(folder)
    assert "outside the pipeline's folder" in str(exc) and "'text_encoder'" in str(exc)
    never_opened(opened, outside)


def test_a_config_linked_outside_is_refused_unread(tmp_path: Path, outside: Path) -> None:
    folder = pipeline(tmp_path, {"text_encoder": ENTRY})
    (folder / "text_encoder").mkdir()
    (folder / "text_encoder" / "config.json").symlink_to(outside / "config.json")
    exc, opened = refused(folder)
    assert "text_encoder/config.json is a link" in str(exc)
    never_opened(opened, outside)


def test_a_model_index_linked_outside_is_refused_unread(tmp_path: Path, outside: Path) -> None:
    (outside / "model_index.json").write_text(json.dumps({"text_encoder": ENTRY}))
    folder = tmp_path / "pipe"
    folder.mkdir()
    (folder / "model_index.json").symlink_to(outside / "model_index.json")
    exc, opened = refused(folder)
    assert "model_index.json is a link" in str(exc)
    never_opened(opened, outside)


def test_a_part_inside_still_builds(tmp_path: Path) -> None:
    import transformers

    folder = pipeline(tmp_path, {"text_encoder": ENTRY, "scheduler": ["diffusers", "X"]})
    (folder / "text_encoder").mkdir()
    (folder / "text_encoder" / "config.json").write_text(json.dumps(TEXT))
    p = mw.analyze_pipeline(folder)
    real = transformers.CLIPTextModel(transformers.CLIPTextConfig(**TEXT))
    assert list(p.parts) == ["text_encoder"]
    assert p["text_encoder"].total_params == sum(t.numel() for t in real.parameters())


# -- 13. malformed folders ------------------------------------------------------------------------


def test_a_model_index_that_is_a_list(tmp_path: Path) -> None:
    exc, _ = refused(pipeline(tmp_path, [["transformers", "CLIPTextModel"]]))
    assert "is a JSON list, not an object" in str(exc)


def test_a_model_index_nested_deep(tmp_path: Path) -> None:
    folder = tmp_path / "pipe"
    folder.mkdir()
    (folder / "model_index.json").write_text('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}")
    exc, _ = refused(folder)
    assert "nests too deep" in str(exc)


def test_a_diffusers_part_without_diffusers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = pipeline(tmp_path, {"unet": ["diffusers", "UNet2DModel"]})
    (folder / "unet").mkdir()
    (folder / "unet" / "config.json").write_text(json.dumps({"_class_name": "UNet2DModel"}))

    def missing() -> Any:
        raise ImportError("No module named 'diffusers'")

    monkeypatch.setattr(heavy, "diffusers", missing)
    exc, _ = refused(folder)
    assert "pip install diffusers" in str(exc) and "unet" in str(exc)


def test_a_transformers_part_with_its_own_code(tmp_path: Path) -> None:
    folder = pipeline(tmp_path, {"text_encoder": ["transformers", "MyModel"]})
    (folder / "text_encoder").mkdir()
    own = {"model_type": "my-own", "auto_map": {"AutoModel": "modeling_mine.MyModel"}}
    (folder / "text_encoder" / "config.json").write_text(json.dumps(own))
    (folder / "text_encoder" / "modeling_mine.py").write_text("raise SystemExit('ran')\n")
    exc, _ = refused(folder)
    assert "auto_map" in str(exc) and "'my-own'" in str(exc)


def test_a_diffusers_part_with_its_own_code(tmp_path: Path) -> None:
    pytest.importorskip("diffusers")
    folder = pipeline(tmp_path, {"unet": ["diffusers", "UNet2DModel"]})
    (folder / "unet").mkdir()
    own = {"_class_name": "UNet2DModel", "auto_map": {"AutoModel": "mine.MyUNet"}}
    (folder / "unet" / "config.json").write_text(json.dumps(own))
    exc, _ = refused(folder)
    assert "auto_map" in str(exc)


def test_a_part_past_the_config_limits(tmp_path: Path) -> None:
    folder = pipeline(tmp_path, {"text_encoder": ENTRY})
    (folder / "text_encoder").mkdir()
    deep = {**TEXT, "num_hidden_layers": 10**9}
    (folder / "text_encoder" / "config.json").write_text(json.dumps(deep))
    exc, _ = refused(folder)
    assert "num_hidden_layers=1,000,000,000 is past the limit" in str(exc)


def test_a_part_naming_no_model_class_builds_nothing(tmp_path: Path) -> None:
    folder = pipeline(tmp_path, {"text_encoder": ["transformers", "Trainer"]})
    (folder / "text_encoder").mkdir()
    (folder / "text_encoder" / "config.json").write_text(json.dumps(TEXT))
    exc, _ = refused(folder)
    assert "names no part" in str(exc)
