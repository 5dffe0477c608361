"""What the user has, turned into a meta module and meta inputs: modules, classes,
factories, transformers configs, exported and compiled programs (``programs``), Hugging Face
Hub ids (``hub``, loaded with huggingface_hub when a string is analyzed), pipelines
(``pipelines``: refused, pointing to ``mw.analyze_pipeline``); inputs after
torchinfo's conventions; low-precision copies.
"""

import os
from typing import Any

from . import pipelines, programs  # register their sources

__all__ = ["hub_model", "pipelines", "programs"]


def hub_model(model: Any, revision: str | None, trust_remote_code: bool) -> Any:
    """A Hub id that is no file or folder here: its ``HubModel`` (``sources.hub``), else None."""
    if not isinstance(model, str) or os.path.lexists(model):
        return None
    try:
        from . import hub  # huggingface_hub: only for a string that is no path
    except ImportError:
        return None  # no huggingface_hub: a missing path, which inspect_checkpoint says
    repo = hub.hub_id(model)
    if repo is None:
        return None
    return hub.HubModel(repo, revision, trust_remote_code)
