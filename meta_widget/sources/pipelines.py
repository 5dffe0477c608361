"""An object holding several models (a diffusers pipeline) passed to ``mw.analyze``: refused
with a pointer to ``mw.analyze_pipeline``, which analyzes each part with its own inputs.

Without this source, a diffusers pipeline (callable, every argument defaulted) would be taken
for a factory and called, and diffusers' own "Provide either `prompt` or `prompt_embeds`"
would reach the user.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .models import MetaModel, SourceError, register_source


def _module_names(obj: Any) -> list[str]:
    """The names of the modules a non-module object's ``components`` hold (diffusers)."""
    if isinstance(obj, (torch.nn.Module, type)):
        return []
    components = getattr(obj, "components", None)
    if not isinstance(components, Mapping):
        return []
    return [str(k) for k, v in components.items() if isinstance(v, torch.nn.Module)]


def _is_pipeline(obj: Any) -> bool:
    return bool(_module_names(obj))


@register_source("pipeline", _is_pipeline, first=True)
def _refuse_pipeline(obj: Any) -> MetaModel:
    names = _module_names(obj)
    raise SourceError(
        f"a {type(obj).__name__} holds several models ({', '.join(names)}): analyze them "
        f"part by part with mw.analyze_pipeline(pipe, inputs={{...}}), or one of them with "
        f"mw.analyze(pipe.{names[0]}, ...)."
    )
