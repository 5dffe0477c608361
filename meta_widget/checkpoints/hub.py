"""``inspect_checkpoint("org/name")``: a Hub model's tensors from its safetensors headers only.

From the Hugging Face cache first (``try_to_load_from_cache``: the index, else
``model.safetensors``), read by the project's own header reader (``reading.py``: the index and
each shard's header, never a tensor byte); when the cache lacks them and the Hub may be reached,
``huggingface_hub.get_safetensors_metadata``, which reads each shard's header by HTTP range
requests (no weights downloaded). Offline, a repository whose safetensors are not in the cache
is one :class:`~meta_widget.sources.hub.HubError`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import huggingface_hub
from huggingface_hub import constants as hf_constants
from huggingface_hub import errors as hf_errors

from ..sources.hub import HubError, hub_id
from .entries import CheckpointError, CheckpointInfo, TensorEntry, natural_key
from .safetensors_header import SAFETENSORS_DTYPES

__all__ = ["inspect_hub", "is_hub_id"]


def is_hub_id(text: str) -> bool:
    """Whether ``text`` names a Hub model rather than a path (``sources.hub.hub_id``)."""
    return hub_id(text) is not None


#: what a safetensors repository holds, in the order looked for (huggingface_hub's names)
_NAMES = (hf_constants.SAFETENSORS_INDEX_FILE, hf_constants.SAFETENSORS_SINGLE_FILE)


def inspect_hub(
    repo_id: str, revision: str | None, read: Callable[[str], CheckpointInfo]
) -> CheckpointInfo:
    """The tensors of the Hub model ``repo_id`` (at ``revision``) from safetensors headers;
    ``read`` reads a local file or index (``inspect_checkpoint``).

    Raises
    ------
    HubError
        Neither in the cache nor reachable (offline, no such repository, no safetensors).
    CheckpointError
        A cached file is malformed, or an index names a shard the cache does not hold (while
        offline).
    """
    for name in _NAMES:
        cached = huggingface_hub.try_to_load_from_cache(repo_id, name, revision=revision)
        if isinstance(cached, str):
            try:
                return read(cached)
            except CheckpointError as exc:
                if hf_constants.HF_HUB_OFFLINE or "download every shard" not in str(exc):
                    raise
                break  # shards not cached: their headers are read from the Hub
    at = f" at revision {revision!r}" if revision else ""
    if hf_constants.HF_HUB_OFFLINE:
        raise HubError(
            f"{repo_id!r}{at} has no safetensors in the Hugging Face cache "
            f"({hf_constants.HF_HUB_CACHE}) and HF_HUB_OFFLINE is set: download them once "
            f"online (hf download {repo_id} --include '*.safetensors*'), or unset HF_HUB_OFFLINE "
            "to read their headers from the Hub."
        )
    try:
        meta = huggingface_hub.get_safetensors_metadata(repo_id, revision=revision)
    except hf_errors.NotASafetensorsRepoError:
        why = f"{repo_id!r}{at} has no safetensors weights (model.safetensors or its index)."
    except hf_errors.GatedRepoError:
        why = f"{repo_id!r} is gated: accept its terms, then log in (hf auth login / HF_TOKEN)."
    except hf_errors.RepositoryNotFoundError:
        why = f"no Hugging Face Hub repository {repo_id!r} (nor a file or folder of that name)."
    except Exception as exc:  # the HTTP library's own errors (httpx, httpx2: by version)
        why = (
            f"could not read the safetensors headers of {repo_id!r}{at} from the Hub "
            f"({hf_constants.ENDPOINT}: {type(exc).__name__}: {' '.join(str(exc).split())[:160]}) "
            "and they are not in the Hugging Face cache: connect, or download them once "
            f"(hf download {repo_id} --include '*.safetensors*') and set HF_HUB_OFFLINE=1."
        )
    else:
        return _from_metadata(repo_id, meta)
    raise HubError(why) from None


def _from_metadata(repo_id: str, meta: Any) -> CheckpointInfo:
    """A :class:`CheckpointInfo` of huggingface_hub's ``SafetensorsRepoMetadata``."""
    tensors = [
        TensorEntry(
            name,
            tuple(int(d) for d in info.shape),
            SAFETENSORS_DTYPES.get(info.dtype, info.dtype),
            int(info.data_offsets[1]) - int(info.data_offsets[0]),
            f"{repo_id}/{file}",
        )
        for file, header in meta.files_metadata.items()
        for name, info in header.tensors.items()
    ]
    tensors.sort(key=lambda t: natural_key(t.name))
    return CheckpointInfo(
        path=repo_id,
        format="sharded safetensors (Hub headers)" if meta.sharded else "safetensors (Hub header)",
        tensors=tensors,
        files=[f"{repo_id}/{f}" for f in meta.files_metadata],
        metadata=dict(meta.metadata or {}),
    )
