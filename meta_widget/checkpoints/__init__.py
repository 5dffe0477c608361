"""Look inside a checkpoint without loading it: tensor names, shapes, dtypes and bytes.

``inspect_checkpoint(path)`` reads

- ``.safetensors``: the JSON header only (8 bytes of length, then the header); no tensor byte is
  read, and the ``safetensors`` package is not needed (``safetensors_header.py``);
- ``.pt`` / ``.pth`` / ``.bin`` written by ``torch.save``: ``torch.load(map_location="meta",
  weights_only=True, mmap=True)``: the pickle is read, the tensor data is not (the file is mapped,
  never paged in). A pickle that would run code (a ``__reduce__`` naming a global that is not a
  tensor, dict, list or number) is refused with :class:`UnsafeCheckpointError`: nothing runs
  (``torch_files.py``);
- sharded Hugging Face checkpoints: a ``*.index.json`` (or a folder holding one), every shard's
  header merged into one view (``reading.py``).

The format is told by the file's first bytes, not its extension. Every file is treated as
hostile: files an index names must stay inside its folder, safetensors headers are checked by the
safetensors library's own rules, pickles are walked once per shared object under caps, and each
refusal is a :class:`CheckpointError` that never quotes the file's bytes.

``checkpoint_diff(module, info)`` compares a model with a checkpoint: missing, unexpected,
mis-shaped and re-typed keys (``diff.py``). How a checkpoint is shown is ``view.py``.
"""

from __future__ import annotations

from .diff import CheckpointDiff, checkpoint_diff
from .entries import (
    CheckpointError,
    CheckpointInfo,
    TensorEntry,
    UnsafeCheckpointError,
    is_floating,
)
from .reading import inspect_checkpoint, sniff
from .safetensors_header import SAFETENSORS_DTYPES, read_safetensors_header

__all__ = [
    "SAFETENSORS_DTYPES",
    "CheckpointDiff",
    "CheckpointError",
    "CheckpointInfo",
    "TensorEntry",
    "UnsafeCheckpointError",
    "checkpoint_diff",
    "inspect_checkpoint",
    "is_floating",
    "read_safetensors_header",
    "sniff",
]
