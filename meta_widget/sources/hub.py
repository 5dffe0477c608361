"""A Hugging Face Hub id (``"org/name"``) as a source: its ``config.json`` alone, fetched through
``huggingface_hub`` (its cache, ``HF_HUB_OFFLINE``, ``revision``, the token it finds:
``HF_TOKEN`` or ``hf auth login``), turned into a transformers config and built on meta by the
config source. No weight is downloaded, and no code of the repository runs unless
``trust_remote_code=True``.

A string that names an existing file or folder is a path (a checkpoint, read by
``inspect_checkpoint``); any other string that is a valid repository id and does not end like a
checkpoint file (``.pt``, ``.safetensors``, ...) is a Hub id (:func:`hub_id`).

This module imports ``huggingface_hub``; the package loads it only when a string is analyzed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import huggingface_hub
import torch
from huggingface_hub import constants as hf_constants
from huggingface_hub import errors as hf_errors
from huggingface_hub.utils import validate_repo_id

from .. import heavy
from ..errors import MetaWidgetError
from ..undo import on_meta
from .config_limits import read_config
from .models import MetaModel, _from_config, register_source

__all__ = ["HubError", "HubModel", "RemoteCodeError", "config_file", "hub_id"]

#: endings of file names that are checkpoints (or their indexes), never Hub ids
_FILE_ENDINGS = (".pt", ".pth", ".bin", ".safetensors", ".json", ".ckpt", ".py", ".gguf")


class HubError(MetaWidgetError, LookupError):
    """A Hugging Face Hub id whose ``config.json`` cannot be had: not in the cache while
    offline, no such repository or revision, a gated repository without a token, or a
    ``config.json`` transformers cannot read."""


class RemoteCodeError(HubError):
    """A Hub model whose config needs code from its own repository (``auto_map`` and a
    ``model_type`` transformers does not know), refused unless ``trust_remote_code=True``."""


@dataclass(frozen=True)
class HubModel:
    """A model named by its Hub id, as ``analyze`` takes it: what to fetch and what may run."""

    repo_id: str
    revision: str | None = None
    trust_remote_code: bool = False


def hub_id(text: str | os.PathLike[str]) -> str | None:
    """``text`` as a Hub id, or None when it is a path: an existing file or folder, a name
    ending like a checkpoint file, or no valid ``org/name`` repository id (``huggingface_hub``'s
    rules; a bare name, the legacy ids like ``gpt2``, is taken for a missing path: its
    ``org/name`` form, ``openai-community/gpt2``, is the id)."""
    if not isinstance(text, str) or os.path.exists(text) or text.endswith(_FILE_ENDINGS):
        return None
    if text.count("/") != 1:
        return None
    try:
        validate_repo_id(text)
    except hf_errors.HFValidationError:
        return None
    return text


def config_file(model: HubModel) -> str:
    """The local path of ``model``'s ``config.json``: from the cache, or downloaded into it
    (that file only). Raises :class:`HubError` in one line, without huggingface_hub's chain."""
    repo, at = model.repo_id, f" at revision {model.revision!r}" if model.revision else ""
    try:
        path: str = huggingface_hub.hf_hub_download(repo, "config.json", revision=model.revision)
        return path
    except hf_errors.LocalEntryNotFoundError:
        why = _not_cached(repo, at)
    except hf_errors.GatedRepoError:
        why = (
            f"{repo!r} is gated: accept its terms on huggingface.co, then log in (hf auth login) "
            "or set HF_TOKEN, and analyze again."
        )
    except hf_errors.RepositoryNotFoundError:
        why = (
            f"no Hugging Face Hub repository {repo!r} (nor a file or folder of that name here): "
            "check the id, or log in (hf auth login / HF_TOKEN) if it is private."
        )
    except hf_errors.RevisionNotFoundError:
        why = f"{repo!r} has no revision {model.revision!r}: pass a branch, tag or commit it has."
    except hf_errors.EntryNotFoundError:
        why = f"{repo!r}{at} has no config.json: it is not a transformers model repository."
    except (hf_errors.HfHubHTTPError, OSError) as exc:
        why = (
            f"could not fetch config.json of {repo!r}{at} ({type(exc).__name__}: "
            f"{' '.join(str(exc).split())[:200]}); set HF_HUB_OFFLINE=1 to use the cache alone."
        )
    raise HubError(why) from None


def _not_cached(repo: str, at: str) -> str:
    offline = hf_constants.HF_HUB_OFFLINE
    where = "HF_HUB_OFFLINE is set" if offline else "it could not be downloaded"
    return (
        f"{repo!r}{at} is not in the Hugging Face cache ({hf_constants.HF_HUB_CACHE}) and "
        f"{where}: download its config once online (hf download {repo} config.json), or pass "
        "a path or a transformers config (nor is it a file or folder here)."
    )


def read_config_json(path: str, shown: str) -> dict[str, Any]:
    """The JSON object of a ``config.json`` someone else wrote, within the limits of
    ``sources.config_limits`` (size, nesting, the sizes it asks for); :class:`HubError` in
    one line otherwise (``shown`` names it)."""
    raw, why = read_config(path)
    if raw is not None:
        return raw
    raise HubError(
        f"{shown} ({path}): {why}. If the file is genuine, load the config yourself and pass "
        "the object (mw.analyze(transformers.AutoConfig.from_pretrained(...))): a config "
        "object is built as it is."
    )


def load_config(model: HubModel, path: str) -> tuple[Any, list[str]]:
    """The transformers config of ``config.json`` at ``path``, and notes. A config whose
    ``model_type`` transformers does not know needs the repository's code:
    :class:`RemoteCodeError` unless ``trust_remote_code``. A file past the limits of
    ``sources.config_limits``, or one its config class refuses: :class:`HubError`."""
    transformers = heavy.transformers()
    raw = read_config_json(path, f"the config.json of {model.repo_id!r}")
    kind = raw.get("model_type")
    known = isinstance(kind, str) and kind in transformers.CONFIG_MAPPING
    remote = isinstance(raw.get("auto_map"), dict)
    if model.trust_remote_code and remote:
        config = transformers.AutoConfig.from_pretrained(
            model.repo_id, revision=model.revision, trust_remote_code=True
        )
        return config, [f"Built with the code of {model.repo_id!r} (trust_remote_code=True)."]
    if not known:
        raise RemoteCodeError(_remote_message(model.repo_id, kind, remote, transformers))
    try:
        config = transformers.CONFIG_MAPPING[kind].from_dict(raw)
    except Exception as exc:  # a config class checks its fields with errors of its own
        raise HubError(
            f"transformers' {transformers.CONFIG_MAPPING[kind].__name__} refuses the "
            f"config.json of {model.repo_id!r} ({path}): {_one_line(exc)}"
        ) from None
    notes = []
    if remote:
        notes.append(
            f"{model.repo_id!r} ships code of its own (auto_map); transformers knows its "
            f"model_type {kind!r}, so its own classes were used (trust_remote_code=True runs "
            "the repository's code instead)."
        )
    return config, notes


def _one_line(exc: BaseException) -> str:
    """``exc`` as ``Type: message`` on one line, at most 300 characters."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:300]


def _remote_message(repo: str, kind: Any, remote: bool, transformers: Any) -> str:
    what = (
        f"its model_type {kind!r} is unknown to transformers {transformers.__version__}"
        if isinstance(kind, str)
        else "its config.json names no model_type"
    )
    return (
        f"{repo!r} needs code from its repository ({what}"
        f"{'; config.json has an auto_map' if remote else ''}), and meta_widget runs no "
        f"downloaded code unless asked: after reading that code, pass "
        f"mw.analyze({repo!r}, trust_remote_code=True) (--trust-remote-code on the command "
        "line), or upgrade transformers."
    )


def _is_hub_model(obj: Any) -> bool:
    return isinstance(obj, HubModel)


@register_source("hub", _is_hub_model, first=True)
def _from_hub(model: HubModel) -> MetaModel:
    config, notes = load_config(model, config_file(model))
    where = f"{model.repo_id}@{model.revision}" if model.revision else model.repo_id
    fetched = f"Read config.json of {where} from the Hugging Face Hub (no weights)."
    if model.trust_remote_code and isinstance(getattr(config, "auto_map", None), dict):
        built = _remote_built(config)
        meta = MetaModel(built(), "hub", owned=True, rebuild=built)
    else:
        try:
            meta = _from_config(config)
        except MetaWidgetError:
            raise
        except Exception as exc:  # transformers' model code, on numbers from a file
            raise HubError(
                f"building the model of {where} from its config.json failed: "
                f"{_one_line(exc)}. Check the config's sizes (hidden_size divisible by "
                "num_attention_heads, ...)."
            ) from None
        meta.source = "hub"
    meta.notes = [fetched, *notes, *meta.notes]
    return meta


def _remote_built(config: Any) -> Any:
    """How to build a config whose classes come from its repository: the causal-LM class its
    ``auto_map`` names, else its base model."""
    transformers = heavy.transformers()
    auto = (
        transformers.AutoModelForCausalLM
        if "AutoModelForCausalLM" in config.auto_map
        else transformers.AutoModel
    )

    def build() -> torch.nn.Module:
        return on_meta(lambda: auto.from_config(config, trust_remote_code=True))  # type: ignore[no-any-return]

    return build
