"""What a checkpoint holds, as plain data: :class:`TensorEntry` per tensor, :class:`CheckpointInfo`
for the file (or shards), and the errors reading raises.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import MetaWidgetError
from ..units import DTYPE_BYTES, format_bytes, format_count, is_floating
from . import view

if TYPE_CHECKING:
    import pandas as pd

    from ..data.tree import ModuleNode

__all__ = [
    "CheckpointError",
    "CheckpointInfo",
    "TensorEntry",
    "UnsafeCheckpointError",
    "is_floating",
]


class CheckpointError(MetaWidgetError, ValueError):
    """A checkpoint cannot be read: not found, not a known format, or inconsistent."""


class UnsafeCheckpointError(CheckpointError):
    """A pickled checkpoint would run code when loaded; it was refused and nothing ran."""


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a checkpoint: never its data.

    ``nbytes`` is the bytes of the tensor's own elements (``numel * element size``; for
    safetensors, the length of its data in the file, which is the same).
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    file: str

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def module(self) -> str:
        """The dotted prefix: the module the tensor belongs to (``""`` at the top)."""
        return self.name.rpartition(".")[0]


@dataclass
class CheckpointInfo:
    """What a checkpoint holds, read without its tensor data.

    ``tensors`` are in the file's order (``torch.save``) or natural name order (safetensors,
    shards). ``others`` names the entries that are not tensors (``epoch``, ``config``...) with
    their Python type. Bytes are each tensor's ``numel * element size``: a ``torch.save`` file
    whose tensors share storage (views, tied weights saved under two names) holds fewer bytes
    on disk than ``total_bytes`` says. ``duplicates`` are tensors of a ``torch.save`` file
    reached under a name already listed (``"fc.weight"`` beside ``{"fc": {"weight": ...}}``):
    not in ``tensors``, and :func:`checkpoint_diff` reports them.
    """

    path: str
    format: str
    tensors: list[TensorEntry]
    files: list[str]
    others: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    duplicates: list[TensorEntry] = field(default_factory=list)

    # -- totals -------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.tensors)

    def __iter__(self) -> Iterator[TensorEntry]:
        return iter(self.tensors)

    def __getitem__(self, name: str) -> TensorEntry:
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(f"no tensor {name!r} in {self.path}")

    def __contains__(self, name: object) -> bool:
        return any(t.name == name for t in self.tensors)

    @property
    def total_numel(self) -> int:
        """Elements over all tensors (the "parameters" of the checkpoint, buffers included)."""
        return sum(t.numel for t in self.tensors)

    @property
    def total_bytes(self) -> int:
        """Bytes of all tensors at their stored dtypes."""
        return sum(t.nbytes for t in self.tensors)

    @property
    def bytes_by_dtype(self) -> dict[str, int]:
        """Bytes by stored dtype."""
        out: dict[str, int] = {}
        for t in self.tensors:
            out[t.dtype] = out.get(t.dtype, 0) + t.nbytes
        return out

    @property
    def numel_by_dtype(self) -> dict[str, int]:
        """Elements by stored dtype."""
        out: dict[str, int] = {}
        for t in self.tensors:
            out[t.dtype] = out.get(t.dtype, 0) + t.numel
        return out

    def bytes_at(self, dtype: str) -> int:
        """Bytes to hold the checkpoint with every floating-point tensor cast to ``dtype``.

        Integer and bool tensors keep their stored size. ``dtype`` is one of
        ``meta_widget.units.DTYPE_BYTES`` (``int4`` packs two elements per byte).
        """
        if dtype not in DTYPE_BYTES:
            raise ValueError(f"dtype must be one of {sorted(DTYPE_BYTES)}, not {dtype!r}")
        size = DTYPE_BYTES[dtype]
        return int(sum(t.numel * size if is_floating(t.dtype) else t.nbytes for t in self.tensors))

    def memory(self) -> dict[str, int]:
        """Bytes to load the checkpoint at each what-if dtype (see :meth:`bytes_at`)."""
        return {d: self.bytes_at(d) for d in DTYPE_BYTES}

    # -- views --------------------------------------------------------------------------------

    # -- views (formatted in view.py) ----------------------------------------------------------

    def tree(self) -> view.CheckpointNode:
        """The tensors as a tree by dotted names; each node holds its own tensors."""
        return view.tree(self)

    def to_dataframe(self) -> pd.DataFrame:
        """One row per tensor: ``name``, ``module``, ``shape`` (tuple), ``dtype``, ``numel``,
        ``bytes``, ``file``."""
        return view.to_dataframe(self)

    def summary(self, depth: int | None = 2) -> str:
        """A text report: totals, bytes by dtype, memory at each dtype, the tree to ``depth``."""
        return view.summary(self, depth)

    def module_nodes(self) -> list[ModuleNode]:
        """The name tree as :class:`meta_widget.data.tree.ModuleNode` rows (pre-order)."""
        return view.module_nodes(self)

    def to_payload(self) -> dict[str, Any]:
        """The checkpoint in the widget's payload format (``meta_widget.views.protocol``, version
        1)."""
        return view.to_payload(self)

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return view.mimebundle(self, **kwargs)

    def __repr__(self) -> str:
        dtypes = "/".join(self.bytes_by_dtype) or "no tensors"
        return (
            f"<CheckpointInfo {os.path.basename(self.path)}: {len(self.tensors)} tensors, "
            f"{format_count(self.total_numel)} elements, {format_bytes(self.total_bytes)} "
            f"({dtypes})>"
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON-serializable)."""
        out = asdict(self)
        out["tensors"] = [
            {**asdict(t), "shape": list(t.shape), "numel": t.numel} for t in self.tensors
        ]
        out["total_bytes"] = self.total_bytes
        out["bytes_by_dtype"] = self.bytes_by_dtype
        out["memory"] = self.memory()
        return out


def natural_key(name: str) -> list[Any]:
    return [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", name)]


def quoted(text: object, limit: int = 120) -> str:
    """``repr`` of a name from a file, cut to ``limit`` characters (names can be megabytes)."""
    r = repr(text)
    return r if len(r) <= limit else f"{r[: limit - 1]}…"


DAMAGED = "The file is damaged or was not written by a checkpoint writer: download it again."
