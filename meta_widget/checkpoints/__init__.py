"""Look inside a checkpoint without loading it: tensor names, shapes, dtypes and bytes.

``inspect_checkpoint(path)`` reads

- ``.safetensors``: the JSON header only (8 bytes of length, then the header); no tensor byte is
  read, and the ``safetensors`` package is not needed (``safetensors_header.py``);
- ``.pt`` / ``.pth`` / ``.bin`` written by ``torch.save`` (zip or legacy format): the pickle is
  run by a small machine of our own that reads what ``torch.load(weights_only=True)`` reads, but
  builds a shape and dtype for each tensor and calls no global; ``torch.load`` is never called
  and no tensor byte is read. A pickle that would run code (a global that is not a tensor, dict,
  list or number) is refused with :class:`UnsafeCheckpointError`: nothing runs. Each file is
  read under one budget of steps and bytes, enforced as it goes and growing with the pickle's
  size, never timed (``torch_files.py``, ``pickle_reader.py``, ``pickle_globals.py``,
  ``pickle_keys.py``, ``pickle_names.py``, ``pickle_budget.py``);
- sharded Hugging Face checkpoints: a ``*.index.json`` (or a folder holding one), every shard's
  header merged into one view (``reading.py``).

The format is told by the file's first bytes, not its extension. Every file is treated as
hostile: files an index names must stay inside its folder, safetensors headers are checked by the
safetensors library's own rules, pickles are walked once per shared object under the budget,
read errors are refusals too, and each refusal is a :class:`CheckpointError` that never quotes
the file's bytes.

``checkpoint_diff(module, info)`` compares a model with a checkpoint: missing, unexpected,
mis-shaped and re-typed keys, and names given twice (``diff.py``). How a checkpoint is shown is
``view.py``.
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
