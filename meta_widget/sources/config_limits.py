"""Bounds on what a ``config.json`` read from a file may ask for, checked before anything is
built: a Hub id's config and a pipeline folder's parts are files someone else wrote.

A meta build costs no memory, but its time grows with the modules the config asks for (a
``LlamaForCausalLM`` of 1,000 layers: 13,007 modules, 2.6 s of CPU to build here; 10**9 layers
would never return), and sizes far past any model make byte counts overflow PyTorch's int64
(``hidden_size=2**40``: "Storage size calculation overflowed"). So, in every JSON object of the
file (sub-configs such as ``text_config`` included):

- **the core sizes** (``hidden_size``, ``intermediate_size``, ``vocab_size``,
  ``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads`` and GPT-2's and T5's
  names for them) are whole numbers of at least 1 (or ``null``);
- **every count** (a key naming layers, heads, experts, positions, a ``*_size`` or ``*_dim``)
  that is a whole number, or a list of them, is at most: layers 1,000 (the largest published
  models have ~130), attention heads 65,536, experts 65,536 (Doge's default config has 16,384
  small ones; the largest mixtures of experts have 384-512), positions 2**30, any other size
  or dimension 2**24 (16,777,216: hidden sizes are ~25,000 at most, vocabularies ~260,000).
  Every default config of transformers 5.24 (820 of them) is within these;
- **the parameter count** the config implies (per layer ``4·h² + 3·h·i·experts``, plus
  ``2·vocab·h``; a rough upper bound) is at most 10**14, fifty times the largest published
  model, so that every byte count stays well inside int64;
- a ``dtype`` / ``torch_dtype`` names a torch dtype;
- objects nest at most 32 deep, and the file is at most 16 MiB (a real one is a few KB).

The limits guard files, not the user's own choice: a config object built or loaded by the
user (``transformers.AutoConfig.from_pretrained(path)``) and passed to ``mw.analyze`` is
built as it is. That is the way to go past them deliberately.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator, Mapping
from typing import Any

import torch

__all__ = [
    "EXPERT_FIELDS",
    "MAX_CONFIG_BYTES",
    "MAX_DEPTH",
    "MAX_PARAMS",
    "config_problem",
    "estimated_params",
    "read_config",
]

MAX_CONFIG_BYTES = 16 * 2**20
MAX_DEPTH = 32
MAX_PARAMS = 10**14
#: (kind, largest value) of each kind of count
_CAPS = {
    "layers": 1_000,
    "heads": 2**16,
    "experts": 2**16,
    "positions": 2**30,
    "size": 2**24,
}
#: the core sizes: a whole number of at least 1 where given (not null)
_CORE = frozenset(
    {
        "hidden_size",
        "vocab_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "n_embd",
        "n_layer",
        "n_head",
        "d_model",
    }
)
_SIZE_NAMES = frozenset({"n_embd", "d_model", "d_ff", "d_kv", "dim", "n_inner", "n_ctx"})
_HIDDEN = ("hidden_size", "n_embd", "d_model", "dim")
_LAYERS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
_INNER = ("intermediate_size", "n_inner", "d_ff", "ffn_dim")
#: the config fields transformers' mixtures of experts name their routed experts by (Mixtral,
#: Qwen-MoE, DeepSeek-V3)
EXPERT_FIELDS = ("num_local_experts", "num_experts", "n_routed_experts")


def _kind(key: str) -> str | None:
    """Which kind of count a config key holds, or None for a key not bounded."""
    if key.endswith("layers") or key.endswith("n_layer"):
        return "layers"
    if "heads" in key or key.endswith("n_head"):
        return "heads"
    if "experts" in key:
        return "experts"
    if "positions" in key:
        return "positions"
    if key.endswith(("_size", "_dim", "_dims")) or key in _SIZE_NAMES:
        return "size"
    return None


def _objects(obj: Any, where: str, depth: int = 0) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every JSON object in ``obj`` with its path (``text_config``); ValueError past
    :data:`MAX_DEPTH`."""
    if depth > MAX_DEPTH:
        raise ValueError(f"objects nested more than {MAX_DEPTH} deep (at {where or 'the top'})")
    if isinstance(obj, Mapping):
        yield where, obj
        for k, v in obj.items():
            if isinstance(v, (Mapping, list)):
                yield from _objects(v, f"{where}.{k}" if where else str(k), depth + 1)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            if isinstance(v, (Mapping, list)):
                yield from _objects(v, f"{where}[{i}]", depth + 1)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _count_problem(key: str, value: Any, kind: str) -> str | None:
    """A core size (:data:`_CORE`) must be a whole number of at least 1 (or null); any other
    count is bounded where it is a whole number or a list of them (a negative one is a
    sentinel, ``-1``; other values are the config class's to check)."""
    core = key in _CORE
    values = value if isinstance(value, list) else [value]
    if not core and not all(_is_int(v) for v in values):
        return None
    for v in values:
        if v is None and core and not isinstance(value, list):
            return None
        if not _is_int(v):
            return f"{key}={value!r} is not a whole number"
        if core and v < 1:
            return f"{key}={v} is below 1"
        if v > _CAPS[kind]:
            return f"{key}={v:,} is past the limit of {_CAPS[kind]:,} ({kind})"
    return None


def _dtype_problem(key: str, value: Any) -> str | None:
    if value is None or value == "auto":
        return None
    name = value.removeprefix("torch.") if isinstance(value, str) else None
    if name is None or not isinstance(getattr(torch, name, None), torch.dtype):
        return f"{key}={value!r} is not a torch dtype"
    return None


def _first(obj: Mapping[str, Any], keys: tuple[str, ...], default: int) -> int:
    for k in keys:
        v = obj.get(k)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return default


def estimated_params(obj: Mapping[str, Any]) -> int:
    """A rough upper bound of the parameters one config object implies: ``layers · (4·h² +
    3·h·intermediate·experts) + 2·vocab·h`` (0 without a hidden size)."""
    h = _first(obj, _HIDDEN, 0)
    if h <= 0:
        return 0
    layers = _first(obj, _LAYERS, 1)
    inner = _first(obj, _INNER, 4 * h)
    experts = max(_first(obj, EXPERT_FIELDS, 1), 1)
    vocab = _first(obj, ("vocab_size",), 0)
    return layers * (4 * h * h + 3 * h * inner * experts) + 2 * vocab * h


def config_problem(raw: Any) -> str | None:
    """What in a config file's JSON goes past the limits of the module docstring, in words
    (``"num_hidden_layers=1,000,000,000 is past the limit of 1,000 layers"``), or None."""
    if not isinstance(raw, Mapping):
        return f"it is a JSON {type(raw).__name__}, not an object"
    total = 0
    try:
        for where, obj in _objects(raw, ""):
            at = f" (in {where})" if where else ""
            for key, value in obj.items():
                kind = _kind(str(key))
                problem = (
                    _dtype_problem(key, value)
                    if key in ("dtype", "torch_dtype")
                    else _count_problem(key, value, kind)
                    if kind is not None and not isinstance(value, Mapping)
                    else None
                )
                if problem is not None:
                    return problem + at
            total += estimated_params(obj)
    except ValueError as exc:
        return str(exc)
    if total > MAX_PARAMS:
        return f"it implies about {total:.3g} parameters, past the limit of {MAX_PARAMS:.0e}"
    return None


def read_config(path: str) -> tuple[dict[str, Any] | None, str]:
    """The JSON object of the config file at ``path`` when it is within the limits of the
    module docstring, else None and why not, in words (the file is read once, at most
    :data:`MAX_CONFIG_BYTES` + 1 of it)."""
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            return None, "it is not a regular file (a pipe, a device or a socket)"
        if info.st_size > MAX_CONFIG_BYTES:
            return None, f"it is larger than {MAX_CONFIG_BYTES:,} bytes"
        with open(path, "rb") as f:
            data = f.read(info.st_size + 1)
        if len(data) > MAX_CONFIG_BYTES:
            return None, f"it is larger than {MAX_CONFIG_BYTES:,} bytes"
        raw = json.loads(data)
    except RecursionError:
        return None, "its JSON nests too deep to read"
    except (OSError, ValueError) as exc:  # JSONDecodeError and UnicodeDecodeError included
        return None, f"it cannot be read ({' '.join(str(exc).split())[:200]})"
    problem = config_problem(raw)
    if problem is not None:
        return None, f"{problem}: refused before anything was built"
    return dict(raw), ""
