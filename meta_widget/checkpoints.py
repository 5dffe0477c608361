"""Look inside a checkpoint without loading it: tensor names, shapes, dtypes and bytes.

``inspect_checkpoint(path)`` reads

- ``.safetensors``: the JSON header only (8 bytes of length, then the header); no tensor byte is
  read, and the ``safetensors`` package is not needed;
- ``.pt`` / ``.pth`` / ``.bin`` written by ``torch.save``: ``torch.load(map_location="meta",
  weights_only=True, mmap=True)``: the pickle is read, the tensor data is not (the file is mapped,
  never paged in). A pickle that would run code (a ``__reduce__`` naming a global that is not a
  tensor, dict, list or number) is refused with :class:`UnsafeCheckpointError`: nothing runs;
- sharded Hugging Face checkpoints: a ``*.index.json`` (or a folder holding one), every shard's
  header merged into one view.

The format is told by the file's first bytes, not its extension. ``checkpoint_diff(module, info)``
compares a model with a checkpoint: missing, unexpected, mis-shaped and re-typed keys.
"""

from __future__ import annotations

import json
import os
import re
import zipfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from .memory import DTYPE_BYTES

if TYPE_CHECKING:
    import pandas as pd
    import torch

    from .analysis import ModuleNode

__all__ = [
    "CheckpointDiff",
    "CheckpointError",
    "CheckpointInfo",
    "TensorEntry",
    "UnsafeCheckpointError",
    "checkpoint_diff",
    "inspect_checkpoint",
]

#: safetensors dtype codes -> torch dtype names
SAFETENSORS_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "F8_E8M0": "float8_e8m0fnu",
    "C64": "complex64",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U64": "uint64",
    "U32": "uint32",
    "U16": "uint16",
    "U8": "uint8",
    "BOOL": "bool",
}
_MAX_HEADER = 100 * 1024 * 1024  # the safetensors library refuses larger headers too
_INDEX_NAMES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
_SINGLE_NAMES = ("model.safetensors", "pytorch_model.bin", "model.pt", "model.pth")


class CheckpointError(ValueError):
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


def is_floating(dtype: str) -> bool:
    """True for floating-point dtype names (``float32``, ``bfloat16``, ``float8_e4m3fn``...)."""
    return dtype.startswith(("float", "bfloat", "complex"))


@dataclass
class CheckpointInfo:
    """What a checkpoint holds, read without its tensor data.

    ``tensors`` are in the file's order (``torch.save``) or natural name order (safetensors,
    shards). ``others`` names the entries that are not tensors (``epoch``, ``config``...) with
    their Python type. Bytes are each tensor's ``numel * element size``: a ``torch.save`` file
    whose tensors share storage (views, tied weights saved under two names) holds fewer bytes
    on disk than ``total_bytes`` says.
    """

    path: str
    format: str
    tensors: list[TensorEntry]
    files: list[str]
    others: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

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
        ``meta_widget.memory.DTYPE_BYTES`` (``int4`` packs two elements per byte).
        """
        if dtype not in DTYPE_BYTES:
            raise ValueError(f"dtype must be one of {sorted(DTYPE_BYTES)}, not {dtype!r}")
        size = DTYPE_BYTES[dtype]
        return int(sum(t.numel * size if is_floating(t.dtype) else t.nbytes for t in self.tensors))

    def memory(self) -> dict[str, int]:
        """Bytes to load the checkpoint at each what-if dtype (see :meth:`bytes_at`)."""
        return {d: self.bytes_at(d) for d in DTYPE_BYTES}

    # -- views --------------------------------------------------------------------------------

    def tree(self) -> CheckpointNode:
        """The tensors as a tree by dotted names; each node holds its own tensors."""
        root = CheckpointNode(path="", name="")
        by_path = {"": root}
        for t in self.tensors:
            node = root
            prefix = ""
            for part in t.module.split(".") if t.module else ():
                prefix = f"{prefix}.{part}" if prefix else part
                child = by_path.get(prefix)
                if child is None:
                    child = by_path[prefix] = CheckpointNode(path=prefix, name=part)
                    node.children.append(child)
                node = child
            node.tensors.append(t)
        return root

    def to_dataframe(self) -> pd.DataFrame:
        """One row per tensor: ``name``, ``module``, ``shape`` (tuple), ``dtype``, ``numel``,
        ``bytes``, ``file``."""
        import pandas as pd

        return pd.DataFrame(
            [
                {
                    "name": t.name,
                    "module": t.module,
                    "shape": t.shape,
                    "dtype": t.dtype,
                    "numel": t.numel,
                    "bytes": t.nbytes,
                    "file": t.file,
                }
                for t in self.tensors
            ],
            columns=["name", "module", "shape", "dtype", "numel", "bytes", "file"],
        )

    def summary(self, depth: int | None = 2) -> str:
        """A text report: totals, bytes by dtype, memory at each dtype, the tree to ``depth``."""
        from .units import format_bytes, format_count, format_shape

        lines = [
            f"Checkpoint {self.path} ({self.format}, {len(self.files)} file"
            f"{'s' if len(self.files) != 1 else ''})",
            f"  {len(self.tensors)} tensors, {format_count(self.total_numel)} elements, "
            f"{format_bytes(self.total_bytes)}",
        ]
        for dtype, n in sorted(self.bytes_by_dtype.items(), key=lambda kv: -kv[1]):
            lines.append(
                f"    {dtype:<14} {format_count(self.numel_by_dtype[dtype]):>10} elements "
                f"{format_bytes(n):>12}"
            )
        lines.append(
            "  Memory to load at: "
            + ", ".join(f"{d} {format_bytes(b)}" for d, b in self.memory().items())
        )
        if self.others:
            lines.append(
                "  Not tensors: " + ", ".join(f"{k} ({v})" for k, v in self.others.items())
            )
        lines.extend(f"  Note: {n}" for n in self.notes)
        lines.append("")

        def walk(node: CheckpointNode, level: int) -> None:
            indent = "  " * level
            for t in node.tensors:
                lines.append(
                    f"{indent}{t.name.rpartition('.')[2]:<28} {format_shape(t.shape):<22} "
                    f"{t.dtype:<9} {format_bytes(t.nbytes):>11}"
                )
            for group in _fold(node.children):
                first = group[0]
                label = first.name if len(group) == 1 else f"{first.name}–{group[-1].name}"
                count = f" · {len(group)} ×" if len(group) > 1 else ""
                lines.append(
                    f"{indent}{label}{count}".ljust(52)
                    + f"{format_count(first.numel * len(group)):>10} "
                    f"{format_bytes(first.nbytes * len(group)):>11}"
                )
                if depth is None or level + 1 < depth:
                    walk(first, level + 1)

        walk(self.tree(), 0)
        return "\n".join(lines)

    def __repr__(self) -> str:
        from .units import format_bytes, format_count

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

    def module_nodes(self) -> list[ModuleNode]:
        """The name tree as :class:`meta_widget.analysis.ModuleNode` rows (pre-order).

        A dotted prefix is a module row; a tensor is one of its ``own_params``. Types are
        ``Checkpoint`` (the root), ``Group`` (has sub-groups) and ``Tensors`` (tensors only).
        """
        from .analysis import ModuleNode
        from .recorder import TensorInfo

        nodes: list[ModuleNode] = []

        def add(node: CheckpointNode, parent: int, depth: int) -> None:
            row = ModuleNode(
                index=len(nodes),
                path=node.path,
                name=node.name,
                type="Checkpoint" if parent < 0 else ("Group" if node.children else "Tensors"),
                depth=depth,
                parent=parent,
                params=node.numel,
                trainable_params=0,
                param_bytes=node.nbytes,
                float_params=node.float_numel,
                buffer_bytes=0,
                own_params=[
                    (
                        t.name.rpartition(".")[2],
                        TensorInfo(t.shape, t.dtype, _contiguous(t.shape), False),
                    )
                    for t in node.tensors
                ],
            )
            nodes.append(row)
            if parent >= 0:
                nodes[parent].children.append(row)
            for child in node.children:
                add(child, row.index, depth + 1)

        add(self.tree(), -1, 0)
        return nodes

    def to_payload(self) -> dict[str, Any]:
        """The checkpoint in the widget's payload format (``meta_widget.protocol``, version 1).

        Modules are the name tree (see :meth:`module_nodes`), ``source`` is ``"checkpoint"``,
        ``status`` ``"structural"``, there are no calls; ``totals.params`` counts every element.
        """
        from .protocol import Dictionary, encode_header

        title = os.path.basename(self.path.rstrip(os.sep)) or self.path
        payload = encode_header(
            self.module_nodes(),
            Dictionary(),
            title=title,
            source="checkpoint",
            mode="inference",
            status="structural",
        )
        payload["totals"] = {
            "params": self.total_numel,
            "trainable_params": 0,
            "flops": 0,
            "param_bytes": self.total_bytes,
            "buffer_bytes": 0,
            "input_bytes": 0,
            "activation_bytes": 0,
            "peak_bytes": self.total_bytes,
        }
        payload["notes"] = [
            f"{self.format} checkpoint read without its tensor data: {len(self.tensors)} tensors "
            f"in {len(self.files)} file(s).",
            *self.notes,
        ]
        return payload

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        from .widget import MetaWidget

        bundle = MetaWidget(payload=self.to_payload())._repr_mimebundle_(**kwargs)
        data = bundle[0] if isinstance(bundle, tuple) else bundle
        if isinstance(data, dict):
            data["text/plain"] = self.summary()
        return bundle


@dataclass
class CheckpointNode:
    """A dotted prefix of tensor names, with its own tensors and its sub-prefixes."""

    path: str
    name: str
    tensors: list[TensorEntry] = field(default_factory=list)
    children: list[CheckpointNode] = field(default_factory=list)

    @property
    def numel(self) -> int:
        return sum(t.numel for t in self.tensors) + sum(c.numel for c in self.children)

    @property
    def float_numel(self) -> int:
        own = sum(t.numel for t in self.tensors if is_floating(t.dtype))
        return own + sum(c.float_numel for c in self.children)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors) + sum(c.nbytes for c in self.children)

    def signature(self) -> tuple[Any, ...]:
        return (
            tuple((t.name.rpartition(".")[2], t.shape, t.dtype) for t in self.tensors),
            tuple((c.name, c.signature()) for c in self.children),
        )


def _fold(children: list[CheckpointNode]) -> list[list[CheckpointNode]]:
    """Runs of consecutive numbered siblings with the same tensors (``layers.0``–``layers.79``)."""
    groups: list[list[CheckpointNode]] = []
    for child in children:
        if (
            groups
            and child.name.isdigit()
            and groups[-1][0].name.isdigit()
            and groups[-1][0].signature() == child.signature()
        ):
            groups[-1].append(child)
        else:
            groups.append([child])
    return groups


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    stride, acc = [], 1
    for d in reversed(shape):
        stride.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(stride))


def _natural_key(name: str) -> list[Any]:
    return [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", name)]


# ---------------------------------------------------------------------------------------------
# reading


def inspect_checkpoint(path: str | os.PathLike[str]) -> CheckpointInfo:
    """Read a checkpoint's tensor names, shapes, dtypes and bytes, never its tensor data.

    Parameters
    ----------
    path
        A ``.safetensors`` file, a ``torch.save`` file (``.pt``, ``.pth``, ``.bin``), a sharded
        checkpoint's ``*.index.json``, or a folder holding one of these (a Hugging Face model
        folder: ``model.safetensors.index.json``, ``model.safetensors``, ``pytorch_model.bin``).

    Returns
    -------
    CheckpointInfo
        Display it in a notebook to see the tree in the widget; ``summary()`` for text.

    Raises
    ------
    CheckpointError
        The file is missing, not a checkpoint, or a shard index disagrees with its shards.
    UnsafeCheckpointError
        A pickle would run code when loaded (nothing was run).
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        path = _pick_in_folder(path)
    if not os.path.isfile(path):
        raise CheckpointError(f"no checkpoint file at {path!r}: check the path.")
    if path.endswith(".index.json"):
        return _read_index(path)
    kind = sniff(path)
    if kind == "safetensors":
        return _from_entries(path, "safetensors", read_safetensors_header(path))
    return _read_torch(path, zip_format=kind == "torch-zip")


def _pick_in_folder(folder: str) -> str:
    for name in (*_INDEX_NAMES, *_SINGLE_NAMES):
        candidate = os.path.join(folder, name)
        if os.path.isfile(candidate):
            return candidate
    found = sorted(
        n for n in os.listdir(folder) if n.endswith((".index.json", ".safetensors", ".bin", ".pt"))
    )
    if len(found) == 1:
        return os.path.join(folder, found[0])
    raise CheckpointError(
        f"{folder!r} is a folder with {'no' if not found else 'several'} checkpoint files "
        f"{found if found else ''}: pass the file (or the *.index.json of a sharded checkpoint)."
    )


def sniff(path: str) -> str:
    """``"safetensors"``, ``"torch-zip"`` (``torch.save`` since 1.6) or ``"torch-legacy"``."""
    with open(path, "rb") as f:
        head = f.read(9)
    if len(head) >= 9 and head[8:9] == b"{":
        return "safetensors"
    if zipfile.is_zipfile(path):
        return "torch-zip"
    if head[:1] == b"\x80":  # a pickle protocol opcode: the legacy torch.save format
        return "torch-legacy"
    raise CheckpointError(
        f"{path!r} is neither a safetensors file nor a torch.save file (it starts with "
        f"{head[:8]!r}). Pass a .safetensors, .pt/.pth/.bin or *.index.json file."
    )


def read_safetensors_header(path: str) -> list[TensorEntry]:
    """The tensors described by a safetensors file's JSON header (no data read)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        if n <= 0 or n > _MAX_HEADER or 8 + n > size:
            raise CheckpointError(
                f"{path!r}: the safetensors header length ({n} bytes) does not fit the file "
                f"({size} bytes): the file is truncated or not safetensors. Download it again."
            )
        raw = f.read(n)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(
            f"{path!r}: the safetensors header is not valid JSON ({exc})."
        ) from exc
    entries = []
    data_size = size - 8 - n
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        try:
            start, end = (int(v) for v in spec["data_offsets"])
            shape = tuple(int(d) for d in spec["shape"])
            code = str(spec["dtype"])
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(
                f"{path!r}: malformed header entry for {name!r}: {spec!r}"
            ) from exc
        if not 0 <= start <= end <= data_size:
            raise CheckpointError(
                f"{path!r}: tensor {name!r} points past the end of the file "
                f"(bytes {start}..{end} of {data_size}): the file is truncated."
            )
        entries.append(
            TensorEntry(name, shape, SAFETENSORS_DTYPES.get(code, code.lower()), end - start, path)
        )
    entries.sort(key=lambda t: _natural_key(t.name))
    return entries


def _safetensors_metadata(path: str) -> dict[str, Any]:
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        meta = json.loads(f.read(n)).get("__metadata__") or {}
    return dict(meta)


def _from_entries(path: str, fmt: str, entries: list[TensorEntry]) -> CheckpointInfo:
    return CheckpointInfo(
        path=path,
        format=fmt,
        tensors=entries,
        files=[path],
        metadata=_safetensors_metadata(path) if fmt == "safetensors" else {},
    )


def _read_torch(path: str, *, zip_format: bool) -> CheckpointInfo:
    import pickle

    import torch

    try:
        obj = torch.load(path, map_location="meta", weights_only=True, mmap=zip_format)
    except pickle.UnpicklingError as exc:
        raise UnsafeCheckpointError(_unsafe_message(path, exc)) from None
    except (RuntimeError, EOFError, OSError) as exc:
        raise CheckpointError(
            f"torch.load could not read {path!r} ({type(exc).__name__}: {exc}). The file may be "
            "truncated or written by an incompatible torch version."
        ) from exc
    tensors: list[TensorEntry] = []
    others: dict[str, str] = {}
    _flatten(obj, "", tensors, others, path, torch)
    info = CheckpointInfo(path=path, format="torch", tensors=tensors, files=[path], others=others)
    if not zip_format:
        info.notes.append(
            "legacy (pre-1.6) torch.save format: it cannot be memory-mapped, so its data was "
            "read once while loading to meta; re-save it with torch.save to inspect it for free."
        )
    return info


def _flatten(
    obj: Any,
    prefix: str,
    tensors: list[TensorEntry],
    others: dict[str, str],
    file: str,
    torch: Any,
) -> None:
    if isinstance(obj, torch.Tensor):
        tensors.append(
            TensorEntry(
                prefix,
                tuple(obj.shape),
                str(obj.dtype).removeprefix("torch."),
                obj.numel() * obj.element_size(),
                file,
            )
        )
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _flatten(v, f"{prefix}.{k}" if prefix else str(k), tensors, others, file, torch)
    elif isinstance(obj, (list, tuple)) and any(isinstance(v, (torch.Tensor, dict)) for v in obj):
        for i, v in enumerate(obj):
            _flatten(v, f"{prefix}.{i}" if prefix else str(i), tensors, others, file, torch)
    else:
        others[prefix or "<root>"] = type(obj).__name__


def _unsafe_message(path: str, exc: BaseException) -> str:
    match = re.search(r"(?:unsupported|Unsupported global:) GLOBAL ([\w.]+)", str(exc))
    what = f"the global {match.group(1)}" if match else "a Python object that is not a tensor"
    return (
        f"Refused to load {path!r}: its pickle would call {what} when loaded, which can run "
        "arbitrary code; nothing was executed (torch.load(weights_only=True) stopped it). "
        "What to do: if you made this file, re-save only the tensors with "
        "torch.save(model.state_dict(), path) or safetensors.torch.save_file(...); load it "
        "with torch.load(path, weights_only=False) ONLY if you trust where it came from."
    )


def _read_index(path: str) -> CheckpointInfo:
    try:
        with open(path, encoding="utf-8") as f:
            index = json.load(f)
        weight_map: dict[str, str] = dict(index["weight_map"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(
            f"{path!r} is not a sharded-checkpoint index (a JSON object with a 'weight_map' of "
            f"tensor name -> shard file): {type(exc).__name__}: {exc}"
        ) from exc
    folder = os.path.dirname(path)
    shards = list(dict.fromkeys(weight_map.values()))
    tensors: list[TensorEntry] = []
    others: dict[str, str] = {}
    formats = set()
    for shard in shards:
        shard_path = os.path.join(folder, shard)
        if not os.path.isfile(shard_path):
            raise CheckpointError(
                f"{path!r} names the shard {shard!r}, which is not in {folder!r}: download "
                "every shard the index lists."
            )
        info = inspect_checkpoint(shard_path)
        formats.add(info.format)
        tensors.extend(info.tensors)
        others.update(info.others)
    seen: dict[str, str] = {}
    notes: list[str] = []
    for t in tensors:
        if t.name in seen:
            raise CheckpointError(
                f"tensor {t.name!r} is in two shards ({seen[t.name]!r} and {t.file!r}) of {path!r}"
            )
        seen[t.name] = t.file
    listed_missing = [n for n, shard in weight_map.items() if n not in seen]
    if listed_missing:
        raise CheckpointError(
            f"{path!r} lists {len(listed_missing)} tensor(s) that their shards do not hold, "
            f"e.g. {listed_missing[0]!r} (said to be in {weight_map[listed_missing[0]]!r}): "
            "a shard is outdated or the index belongs to another checkpoint."
        )
    misplaced = [
        t.name
        for t in tensors
        if t.name in weight_map and os.path.join(folder, weight_map[t.name]) != t.file
    ]
    unlisted = [t.name for t in tensors if t.name not in weight_map]
    if misplaced:
        notes.append(f"{len(misplaced)} tensor(s) are in another shard than the index says.")
    if unlisted:
        notes.append(f"{len(unlisted)} tensor(s) in the shards are not in the index.")
    total = (index.get("metadata") or {}).get("total_size")
    if isinstance(total, int) and total != sum(t.nbytes for t in tensors):
        notes.append(
            f"the index says total_size={total} bytes; the shards hold "
            f"{sum(t.nbytes for t in tensors)}."
        )
    tensors.sort(key=lambda t: _natural_key(t.name))
    fmt = "sharded " + "/".join(sorted(formats))
    return CheckpointInfo(
        path=path,
        format=fmt,
        tensors=tensors,
        files=[os.path.join(folder, s) for s in shards],
        others=others,
        metadata=dict(index.get("metadata") or {}),
        notes=notes,
    )


# ---------------------------------------------------------------------------------------------
# model vs checkpoint


@dataclass
class CheckpointDiff:
    """How a model's state dict and a checkpoint disagree. Plain data (``to_dict()``).

    - ``missing``: keys the model expects that the checkpoint lacks (they would stay
      uninitialized); tied names whose partner is in the checkpoint are in ``tied`` instead.
    - ``unexpected``: checkpoint keys the model has no place for.
    - ``shape_mismatches``: ``(name, model shape, checkpoint shape)``: ``load_state_dict``
      raises on these.
    - ``dtype_mismatches``: ``(name, model dtype, checkpoint dtype)``: loading casts to the
      model's dtype (or, with ``assign=True``, keeps the checkpoint's); usually harmless.
    - ``tied``: ``(missing name, the tied name it shares its tensor with)``.
    - ``hints``: likely causes, e.g. a ``module.`` prefix left by DataParallel.
    """

    matched: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    shape_mismatches: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = field(
        default_factory=list
    )
    dtype_mismatches: list[tuple[str, str, str]] = field(default_factory=list)
    tied: list[tuple[str, str]] = field(default_factory=list)
    hints: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when ``load_state_dict(strict=True)`` would accept the checkpoint."""
        return not (self.missing or self.unexpected or self.shape_mismatches)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["shape_mismatches"] = [
            {"name": n, "model": list(m), "checkpoint": list(c)}
            for n, m, c in self.shape_mismatches
        ]
        out["dtype_mismatches"] = [
            {"name": n, "model": m, "checkpoint": c} for n, m, c in self.dtype_mismatches
        ]
        out["tied"] = [{"name": n, "tied_to": t} for n, t in self.tied]
        out["ok"] = self.ok
        return out

    def __str__(self) -> str:
        def some(names: list[str]) -> str:
            return ", ".join(names[:5]) + (f", … ({len(names)} in all)" if len(names) > 5 else "")

        lines = [
            f"{len(self.matched)} keys match"
            + ("; the checkpoint fits the model." if self.ok else ".")
        ]
        if self.missing:
            lines.append(f"missing from the checkpoint ({len(self.missing)}): {some(self.missing)}")
        if self.unexpected:
            lines.append(f"unexpected ({len(self.unexpected)}): {some(self.unexpected)}")
        lines.extend(
            f"shape mismatch: {n}: model {list(m)}, checkpoint {list(c)}"
            for n, m, c in self.shape_mismatches[:8]
        )
        if len(self.shape_mismatches) > 8:
            lines.append(f"… and {len(self.shape_mismatches) - 8} more shape mismatches")
        if self.dtype_mismatches:
            n, m, c = self.dtype_mismatches[0]
            lines.append(
                f"dtype differs for {len(self.dtype_mismatches)} key(s), e.g. {n}: model {m}, "
                f"checkpoint {c}"
            )
        lines.extend(f"tied: {n} shares {t}" for n, t in self.tied)
        lines.extend(f"hint: {h}" for h in self.hints)
        return "\n".join(lines)


def checkpoint_diff(module: torch.nn.Module, info: CheckpointInfo) -> CheckpointDiff:
    """Compare ``module``'s state dict with the checkpoint ``info`` (names, shapes, dtypes).

    ``module`` may be on any device, meta included; it is only read (``state_dict`` with
    ``keep_vars=True``, no data touched). This is what ``mw.analyze(model, checkpoint=path)``
    runs to report the diff on the Analysis (``analysis.checkpoint_diff``).

    Parameters
    ----------
    module
        The model, as it would receive ``load_state_dict``.
    info
        The checkpoint, from :func:`inspect_checkpoint`.

    Returns
    -------
    CheckpointDiff
        Missing, unexpected, mis-shaped and re-typed keys, each by name.
    """
    expected = module.state_dict(keep_vars=True)
    stored = {t.name: t for t in info.tensors}
    by_tensor: dict[int, list[str]] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        by_tensor.setdefault(id(p), []).append(name)
    tied_to = {n: names for names in by_tensor.values() if len(names) > 1 for n in names}

    diff = CheckpointDiff()
    for name, tensor in expected.items():
        entry = stored.get(name)
        if entry is None:
            partner = next((n for n in tied_to.get(name, ()) if n in stored), None)
            if partner is not None:
                diff.tied.append((name, partner))
            else:
                diff.missing.append(name)
            continue
        diff.matched.append(name)
        shape = tuple(tensor.shape)
        if shape != entry.shape:
            diff.shape_mismatches.append((name, shape, entry.shape))
        dtype = str(tensor.dtype).removeprefix("torch.")
        if dtype != entry.dtype:
            diff.dtype_mismatches.append((name, dtype, entry.dtype))
    diff.unexpected = [n for n in stored if n not in expected]
    diff.hints = _prefix_hints(list(expected), diff.missing, diff.unexpected)
    return diff


def _prefix_hints(expected: list[str], missing: list[str], unexpected: list[str]) -> list[str]:
    """Spot a prefix added or dropped on every key (``module.`` from DataParallel, ``model.``)."""
    if not missing or not unexpected:
        return []
    hints = []
    want = set(expected)
    for u in unexpected[:1]:
        for m in missing[:1]:
            if u.endswith("." + m):
                prefix = u[: -len(m)]
                fixed = sum(
                    1 for n in unexpected if n.startswith(prefix) and n[len(prefix) :] in want
                )
                hints.append(
                    f"{fixed} checkpoint keys carry an extra prefix {prefix!r} (e.g. {u!r}): strip "
                    f"it, {{k.removeprefix({prefix!r}): v for k, v in state_dict.items()}}."
                )
            elif m.endswith("." + u):
                prefix = m[: -len(u)]
                hints.append(
                    f"the model's keys start with {prefix!r} but the checkpoint's do not (e.g. "
                    f"{m!r} vs {u!r}): load it into the {prefix.rstrip('.')!r} submodule."
                )
    return hints
