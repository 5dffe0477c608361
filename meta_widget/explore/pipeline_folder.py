"""A pipeline's config folder (what diffusers' ``save_pretrained`` or ``save_config`` wrote),
read as files someone else wrote: ``model_index.json`` and each part's ``config.json``.

- A part is named by a key of ``model_index.json``: it must be one folder name inside the
  pipeline's folder. A key that is an absolute path, holds a separator or ``..``, or a part
  folder (or its ``config.json``) that is a link resolving outside the folder, is refused
  before anything there is opened.
- Each ``config.json`` is read by ``sources.config_limits`` (its size, nesting and the sizes it
  asks for bounded before anything is built), and the config made from it by transformers'
  config class of its ``model_type`` (never the repository's own code: a part whose config has
  an ``auto_map`` and a type transformers does not know, or any diffusers part with one, is
  refused).
- Only model classes are built: a transformers ``PreTrainedModel`` or a diffusers
  ``ModelMixin``; any other class a part names (a tokenizer, a scheduler) is no part.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import heavy
from ..errors import MetaWidgetError
from ..sources.config_limits import MAX_CONFIG_BYTES, read_config

__all__ = ["PipelineError", "parts_of_folder"]

#: a part: (a builder of its module on meta, its config)
Part = tuple[Callable[[], Any], Any]


class PipelineError(MetaWidgetError, ValueError):
    """``mw.analyze_pipeline`` cannot take the object or its inputs as given."""


def _inside(path: Path, root: Path, what: str) -> Path:
    """``path`` with its links resolved, refused when that is outside ``root`` (resolved)."""
    real = path.resolve()
    if real != root and root not in real.parents:
        raise PipelineError(
            f"{root}: {what} is a link to {real}, outside the pipeline's folder: refused, "
            "nothing there was read. Copy the part into the folder."
        )
    return real


def _index(folder: Path) -> dict[str, Any]:
    index = folder / "model_index.json"
    if not index.is_file():
        raise PipelineError(
            f"no model_index.json in {folder}: pass the folder a diffusers pipeline's "
            "save_pretrained or save_config wrote."
        )
    real = _inside(index, folder.resolve(), "model_index.json")
    try:
        size = real.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise ValueError(f"it is larger than {MAX_CONFIG_BYTES:,} bytes")
        with open(real, "rb") as f:
            data = f.read(size + 1)
        if len(data) > MAX_CONFIG_BYTES:
            raise ValueError(f"it is larger than {MAX_CONFIG_BYTES:,} bytes")
        raw = json.loads(data)
    except RecursionError:
        raise PipelineError(f"{index}: its JSON nests too deep to read.") from None
    except (OSError, ValueError) as exc:
        raise PipelineError(f"cannot read {index}: {' '.join(str(exc).split())[:200]}") from None
    if not isinstance(raw, dict):
        raise PipelineError(
            f"{index} is a JSON {type(raw).__name__}, not an object of part names "
            '({"unet": ["diffusers", "UNet2DConditionModel"], ...}): not a pipeline\'s index.'
        )
    return raw


def _part_folder(folder: Path, name: str) -> Path:
    """The folder of part ``name``: a plain folder name, no path."""
    plain = (
        name not in ("", ".", "..")
        and "\0" not in name
        and not any(sep in name for sep in ("/", "\\", os.sep))
        and not os.path.isabs(name)
    )
    if not plain:
        raise PipelineError(
            f"{folder}: model_index.json names the part {name!r}, which is no folder name "
            "inside the pipeline's folder (an absolute path, '..' or a separator): refused, "
            "nothing outside was read."
        )
    return folder / name


def parts_of_folder(folder: Path) -> dict[str, Part]:
    """Each part of the pipeline saved in ``folder`` that is a model (see the module
    docstring), by its name in ``model_index.json``."""
    root = folder.resolve()
    parts: dict[str, Part] = {}
    for name, entry in _index(folder).items():
        if name.startswith("_") or not isinstance(entry, list) or len(entry) != 2:
            continue
        library, cls_name = entry
        if not isinstance(library, str) or not isinstance(cls_name, str):
            continue  # absent (null)
        part = _part_folder(folder, name)
        if os.path.lexists(part):
            _inside(part, root, f"the part folder {name!r}")
        config_file = part / "config.json"
        if not config_file.is_file():
            continue  # no model config (a scheduler, a tokenizer)
        real = _inside(config_file, root, f"{name}/config.json")
        made = _part(library, cls_name, name, real)
        if made is not None:
            parts[name] = made
    if not parts:
        raise PipelineError(f"{folder}: model_index.json names no part with a config.json.")
    return parts


def _model_class(lib: Any, cls_name: str, base: type) -> Any:
    """``lib.<cls_name>`` when it is a subclass of ``base``, else None (nothing else named by
    a file is ever called)."""
    if not cls_name.isidentifier() or cls_name.startswith("_"):
        return None
    try:
        cls = getattr(lib, cls_name, None)
    except Exception:  # a lazy import whose optional library is missing
        return None
    return cls if isinstance(cls, type) and issubclass(cls, base) else None


def _part(library: str, cls_name: str, name: str, config_file: Path) -> Part | None:
    """(builder on meta, config) of one part; None if its class is not a model."""
    if library not in ("transformers", "diffusers"):
        raise PipelineError(
            f"{name}: a {library}.{cls_name} part; only diffusers and transformers parts are "
            "built from a config folder (a part of any other library would run its code)."
        )
    raw, why = read_config(str(config_file))
    if raw is None:
        raise PipelineError(f"{name}/config.json ({config_file}): {why}.")
    if library == "diffusers":
        return _diffusers_part(cls_name, name, raw)
    return _transformers_part(cls_name, name, raw)


def _diffusers_part(cls_name: str, name: str, raw: dict[str, Any]) -> Part | None:
    try:
        lib = heavy.diffusers()
    except ImportError:
        raise PipelineError(
            f"{name} is a diffusers.{cls_name} part, and diffusers cannot be imported here: "
            "pip install diffusers, or pass the pipeline object (or a dict of its modules)."
        ) from None
    if "auto_map" in raw:
        raise PipelineError(
            f"{name}/config.json has an auto_map: the part is built by code of its own, and "
            "meta_widget runs none from a folder; load the pipeline yourself (after reading "
            "that code) and pass the object."
        )
    cls = _model_class(lib, cls_name, lib.ModelMixin)
    if cls is None:
        return None
    return (lambda: cls.from_config(raw)), raw


def _transformers_part(cls_name: str, name: str, raw: dict[str, Any]) -> Part | None:
    lib = heavy.transformers()
    kind = raw.get("model_type")
    if not isinstance(kind, str) or kind not in lib.CONFIG_MAPPING:
        code = " and has an auto_map (code of its own)" if "auto_map" in raw else ""
        raise PipelineError(
            f"{name}/config.json names the model_type {kind!r}, which transformers "
            f"{lib.__version__} does not know{code}: meta_widget runs no code from a folder; "
            "load the part yourself (after reading that code) and pass the pipeline object."
        )
    cls = _model_class(lib, cls_name, lib.PreTrainedModel)
    if cls is None:
        return None
    try:
        config = lib.CONFIG_MAPPING[kind].from_dict(raw)
    except Exception as exc:  # a config class checks its fields with errors of its own
        raise PipelineError(
            f"{name}/config.json: transformers' {lib.CONFIG_MAPPING[kind].__name__} refuses it "
            f"({type(exc).__name__}: {' '.join(str(exc).split())[:200]})."
        ) from None
    return (lambda: cls(config)), config
