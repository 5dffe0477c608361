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

The format is told by the file's first bytes, not its extension. Every file is treated as
hostile: files an index names must stay inside its folder, safetensors headers are checked by the
safetensors library's own rules, pickles are walked once per shared object under caps, and each
refusal is a :class:`CheckpointError` that never quotes the file's bytes.

``checkpoint_diff(module, info)`` compares a model with a checkpoint: missing, unexpected,
mis-shaped and re-typed keys.
"""

from __future__ import annotations

import json
import os
import re
import zipfile
from collections import Counter
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

#: safetensors dtype codes (every code the safetensors library knows) -> dtype names as torch
#: spells them (the sub-byte ``F4``/``F6`` codes have no torch dtype of one element each)
SAFETENSORS_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2FNUZ": "float8_e5m2fnuz",
    "F8_E8M0": "float8_e8m0fnu",
    "F6_E2M3": "float6_e2m3fn",
    "F6_E3M2": "float6_e3m2fn",
    "F4": "float4_e2m1fn",
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
#: bits per element of each safetensors dtype (the library's ``Dtype::bitsize``)
_SAFETENSORS_BITS = {
    **dict.fromkeys(["F64", "C64", "I64", "U64"], 64),
    **dict.fromkeys(["F32", "I32", "U32"], 32),
    **dict.fromkeys(["F16", "BF16", "I16", "U16"], 16),
    **dict.fromkeys(["F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F8_E8M0"], 8),
    **dict.fromkeys(["I8", "U8", "BOOL"], 8),
    **dict.fromkeys(["F6_E2M3", "F6_E3M2"], 6),
    "F4": 4,
}
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
#
# Every file is treated as hostile: a downloaded folder may hold an index that names files
# outside it, headers that lie about sizes, and pickles built to exhaust memory. Each refusal is a
# CheckpointError that says what is wrong and where; no message ever quotes a file's bytes.

#: limits, each named in the refusal that enforces it
_MAX_HEADER = 100_000_000  # the safetensors library's MAX_HEADER_SIZE
_MAX_JSON_DEPTH = 127  # serde_json (inside safetensors) refuses a 128th nested array/object
_MAX_INDEX_BYTES = 100_000_000  # a real index is ~100 KB even for a 400B model
_MAX_PICKLE_BYTES = 64 * 1024 * 1024  # data.pkl: ~150 B per tensor, so ~450k tensors;
# a pickle becomes Python objects ~30x its size at worst, so this also bounds torch.load
_MAX_ENTRIES = 1_000_000  # tensors + other values listed from one torch.save file
_MAX_NESTING = 100  # containers inside containers in one torch.save file
_MAX_NAME_CHARS = 64 * 1024 * 1024  # all dotted names of one torch.save file together
_MAX_SECONDS = 60.0  # walking one torch.save file's objects
_U64 = 2**64 - 1  # safetensors sizes are Rust usize (u64)
_SHAPE_FIELDS = ("dtype", "shape", "data_offsets")
_DAMAGED = "The file is damaged or was not written by a checkpoint writer: download it again."


def inspect_checkpoint(path: str | os.PathLike[str]) -> CheckpointInfo:
    """Read a checkpoint's tensor names, shapes, dtypes and bytes, never its tensor data.

    Parameters
    ----------
    path
        A ``.safetensors`` file, a ``torch.save`` file (``.pt``, ``.pth``, ``.bin``), a sharded
        checkpoint's ``*.index.json``, or a folder holding one of these (a Hugging Face model
        folder: ``model.safetensors.index.json``, ``model.safetensors``, ``pytorch_model.bin``).
        Files an index names, and the file picked in a folder, must stay inside that folder
        (symlinks are resolved); in a Hugging Face cache snapshot they may also be its repo's
        ``blobs``.

    Returns
    -------
    CheckpointInfo
        Display it in a notebook to see the tree in the widget; ``summary()`` for text.

    Raises
    ------
    CheckpointError
        The file is missing, not a checkpoint, malformed (a safetensors header that breaks the
        safetensors library's rules, a pickle past the size limits), names a file outside its
        folder, or a shard index disagrees with its shards.
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
    return _read_file(path, path)


def _read_file(real: str, shown: str) -> CheckpointInfo:
    """One safetensors or torch.save file (never an index): ``real`` is opened, ``shown`` named."""
    kind = sniff(real, shown)
    if kind == "safetensors":
        entries, metadata = _read_safetensors(real, shown)
        return CheckpointInfo(
            path=shown, format="safetensors", tensors=entries, files=[shown], metadata=metadata
        )
    return _read_torch(real, shown, zip_format=kind == "torch-zip")


def _pick_in_folder(folder: str) -> str:
    for name in (*_INDEX_NAMES, *_SINGLE_NAMES):
        candidate = os.path.join(folder, name)
        if os.path.lexists(candidate):
            _resolve_inside(folder, name, f"the folder {folder!r} holds {name!r}, which")
            if os.path.isfile(candidate):
                return candidate
    found = sorted(
        n for n in os.listdir(folder) if n.endswith((".index.json", ".safetensors", ".bin", ".pt"))
    )
    if len(found) == 1:
        _resolve_inside(folder, found[0], f"the folder {folder!r} holds {found[0]!r}, which")
        return os.path.join(folder, found[0])
    raise CheckpointError(
        f"{folder!r} is a folder with {'no' if not found else 'several'} checkpoint files "
        f"{found if found else ''}: pass the file (or the *.index.json of a sharded checkpoint)."
    )


def _short(text: object, limit: int = 120) -> str:
    """``repr`` of a name from a file, cut to ``limit`` characters (names can be megabytes)."""
    r = repr(text)
    return r if len(r) <= limit else f"{r[: limit - 1]}…"


def _resolve_inside(folder: str, name: object, who: str) -> str:
    """The real path of the file ``name`` inside ``folder``; refused unless it stays there.

    ``who`` starts the refusal (``"<index> maps 'w' to 'x.safetensors', which"``). Nothing is
    opened: the path is checked as text, then resolved (``realpath`` reads links, not files).
    A Hugging Face cache snapshot's files are links into its repo's ``blobs`` folder: those are
    accepted when the folder is ``models--*/snapshots/<rev>`` and the link lands directly in that
    repo's (real, not linked) ``blobs``.
    """
    if not isinstance(name, str) or not name:
        raise CheckpointError(f"{who} is not a file name ({type(name).__name__}).")
    why = None
    try:
        os.fsencode(name)
    except UnicodeError:
        why = "is not a valid file name (it holds characters no file name can)"
    if why is None and "\x00" in name:
        why = "is not a valid file name (it holds a NUL character)"
    elif why is None and os.path.isabs(name):
        why = "is an absolute path"
    elif why is None and ".." in re.split(r"[/\\]", name):
        why = "climbs out of the folder with '..'"
    if why is None:
        root = os.path.realpath(folder)
        real = os.path.realpath(os.path.join(root, name))
        if _is_within(real, root) or _in_hub_blobs(root, real):
            return real
        why = "is a link to a file outside the folder"
    raise CheckpointError(
        f"{who} {why}: refused; a checkpoint reads files inside its own folder only, and nothing "
        "outside it was opened. If you wrote this index, name each shard by its file name; if "
        "you downloaded it, the folder is broken or hostile: do not use it."
    )


def _is_within(real: str, root: str) -> bool:
    return real != root and os.path.commonpath([real, root]) == root


def _in_hub_blobs(root: str, real: str) -> bool:
    """True when ``root`` is in a ``models--*/snapshots/<rev>`` folder and ``real`` is a file
    directly in that repo's own ``blobs`` folder (the Hugging Face cache layout)."""
    head = root
    while True:
        parent, leaf = os.path.split(head)
        if not leaf or parent == head:
            return False
        if os.path.basename(parent) == "snapshots":
            repo = os.path.dirname(parent)
            blobs = os.path.join(repo, "blobs")
            return (
                os.path.basename(repo).startswith("models--")
                and os.path.isdir(blobs)
                and not os.path.islink(blobs)
                and os.path.dirname(real) == blobs
            )
        head = parent


def sniff(path: str, shown: str | None = None) -> str:
    """``"safetensors"``, ``"torch-zip"`` (``torch.save`` since 1.6) or ``"torch-legacy"``.

    Told by the first bytes; the refusal describes the file and never quotes its bytes (it may
    be a file the user never named).
    """
    shown = path if shown is None else shown
    with open(path, "rb") as f:
        head = f.read(64)
    if len(head) > 8 and head[8:].lstrip(b" \t\r\n")[:1] == b"{":
        return "safetensors"
    if head[:4] == b"PK\x03\x04":
        if zipfile.is_zipfile(path):
            return "torch-zip"
        raise CheckpointError(
            f"{shown!r} starts like a zip (torch.save) file but its end, the zip's table of "
            "contents, is missing or broken: the file is truncated or damaged. Download or save "
            "it again."
        )
    if head[:1] == b"\x80":  # a pickle protocol opcode: the legacy torch.save format
        return "torch-legacy"
    raise CheckpointError(
        f"{shown!r} is neither a safetensors file nor a torch.save file "
        f"({len(head)}{'+' if len(head) == 64 else ''} bytes that start like neither). Pass a "
        ".safetensors, .pt/.pth/.bin or *.index.json file."
    )


# -- safetensors ------------------------------------------------------------------------------


def read_safetensors_header(path: str) -> list[TensorEntry]:
    """The tensors described by a safetensors file's JSON header (no tensor data read).

    The header is checked by the safetensors library's own rules; see :func:`_read_safetensors`.
    """
    return _read_safetensors(path, path)[0]


def _read_safetensors(path: str, shown: str) -> tuple[list[TensorEntry], dict[str, str]]:
    """Tensors and ``__metadata__`` of a safetensors file, refused where the library refuses.

    The rules of ``safetensors`` (``SafeTensors::read_metadata`` and ``Metadata::validate``):
    a header of 1..100,000,000 bytes of UTF-8 JSON holding an object; each entry an object with
    a known ``dtype``, a ``shape`` of non-negative integers and two non-negative integer
    ``data_offsets``; no element count or bit count past 2**64 - 1; sub-byte dtypes ending on a
    byte; each entry's byte length ``numel * dtype size``; the entries, sorted by offset, tile the
    data area from 0 to its end without gap, overlap or trailing bytes; ``__metadata__`` absent,
    null, or an object of strings.
    """
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little")
        if len(head) < 8 or n == 0 or n > _MAX_HEADER or 8 + n > size:
            raise CheckpointError(
                f"{shown!r}: the safetensors header length ({n} bytes) does not fit the file "
                f"({size} bytes) or the safetensors limit ({_MAX_HEADER} bytes): the file is "
                "truncated or not safetensors. Download it again."
            )
        raw = f.read(n)
    header = _header_json(raw, shown)
    metadata = _header_metadata(header.get("__metadata__"), shown)
    specs = [
        (name, _header_entry(name, spec, shown))
        for name, spec in header.items()
        if name != "__metadata__"
    ]
    _check_layout(specs, size - 8 - n, shown)
    entries = [
        TensorEntry(name, shape, SAFETENSORS_DTYPES[code], end - start, shown)
        for name, (code, shape, start, end) in specs
    ]
    entries.sort(key=lambda t: _natural_key(t.name))
    return entries, metadata


class _Object(dict):  # type: ignore[type-arg]
    """A JSON object that remembers the keys it held more than once (last one kept)."""

    repeated: frozenset[str] = frozenset()


def _pairs(pairs: list[tuple[str, Any]]) -> _Object:
    obj = _Object(pairs)
    if len(obj) != len(pairs):
        counts = Counter(k for k, _ in pairs)
        obj.repeated = frozenset(k for k, n in counts.items() if n > 1)
    return obj


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _header_json(raw: bytes, shown: str) -> dict[str, Any]:
    where = f"{shown!r}: the safetensors header"
    try:
        header = json.loads(
            raw.decode("utf-8"), object_pairs_hook=_pairs, parse_constant=_no_constant
        )
    except RecursionError:
        raise CheckpointError(
            f"{where} nests arrays or objects too deeply to read (the safetensors library "
            f"stops at {_MAX_JSON_DEPTH}). {_DAMAGED}"
        ) from None
    except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise CheckpointError(f"{where} is not valid UTF-8 JSON ({exc}). {_DAMAGED}") from exc
    if not isinstance(header, dict):
        raise CheckpointError(
            f"{where} is a JSON {type(header).__name__}, not an object of tensor name -> "
            f"{{dtype, shape, data_offsets}}. {_DAMAGED}"
        )
    return header


def _header_metadata(meta: object, shown: str) -> dict[str, str]:
    if meta is None:
        return {}
    if isinstance(meta, dict) and all(
        isinstance(v, str) and _is_text(k) and _is_text(v) for k, v in meta.items()
    ):
        return dict(meta)
    raise CheckpointError(
        f"{shown!r}: the safetensors header's __metadata__ must be an object of strings "
        f"(text -> text), not {_json_kind(meta)}. {_DAMAGED}"
    )


def _json_kind(value: object) -> str:
    if value is None:
        return "missing or null"
    if isinstance(value, dict):
        bad = next((v for v in value.values() if not isinstance(v, str)), None)
        return f"an object holding a {type(bad).__name__}" if bad is not None else "that"
    return f"a {type(value).__name__}"


def _is_text(s: str) -> bool:
    """True when ``s`` can be written as UTF-8 (JSON allows lone surrogates; Rust does not)."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _header_entry(name: str, spec: object, shown: str) -> tuple[str, tuple[int, ...], int, int]:
    """``(dtype code, shape, begin, end)`` of one header entry, checked field by field."""

    def refuse(what: str) -> CheckpointError:
        return CheckpointError(
            f"{shown!r}: the safetensors header entry for tensor {_short(name)} {what}. {_DAMAGED}"
        )

    if not _is_text(name):
        raise refuse("has a name that is not valid text")
    if not isinstance(spec, dict):
        raise refuse(f"is a {type(spec).__name__}, not an object {{dtype, shape, data_offsets}}")
    repeated = sorted(set(getattr(spec, "repeated", ())) & set(_SHAPE_FIELDS))
    if repeated:
        raise refuse(f"gives {repeated[0]!r} twice")
    missing = [k for k in _SHAPE_FIELDS if k not in spec]
    if missing:
        raise refuse(f"has no {missing[0]!r}")
    code = spec["dtype"]
    if not isinstance(code, str) or code not in SAFETENSORS_DTYPES:
        raise refuse(
            f"has dtype {_short(code, 40)}, which the safetensors library does not know "
            f"(it knows {', '.join(SAFETENSORS_DTYPES)})"
        )
    shape, offsets = spec["shape"], spec["data_offsets"]
    if not isinstance(shape, list) or not all(_is_u64(d) for d in shape):
        raise refuse(f"has shape {_short(shape, 80)}: a shape is a list of integers >= 0")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(map(_is_u64, offsets)):
        raise refuse(
            f"has data_offsets {_short(offsets, 80)}: they are two integers >= 0, [begin, end]"
        )
    extra = [v for k, v in spec.items() if k not in _SHAPE_FIELDS]
    if extra and max(map(_json_depth, extra)) > _MAX_JSON_DEPTH - 2:
        raise refuse(f"nests more than {_MAX_JSON_DEPTH} arrays or objects")
    begin, end = offsets
    if begin > end:
        raise refuse(f"begins after it ends (data_offsets [{begin}, {end}])")
    numel = 1
    for d in shape:  # in order, like the library's checked fold: [0, 2**63] is fine
        numel *= d
        if numel > _U64:
            raise refuse(f"has shape {_short(shape, 80)}, whose element count overflows 2**64")
    bits = numel * _SAFETENSORS_BITS[code]
    if bits > _U64:
        raise refuse(f"has shape {_short(shape, 80)}, whose size in bits overflows 2**64")
    if bits % 8:
        raise refuse(f"holds {numel} {code} elements, which do not end on a byte boundary")
    if end - begin != bits // 8:
        raise refuse(
            f"says {numel} {code} elements (shape {list(shape)}, {bits // 8} bytes) but its "
            f"data_offsets span {end - begin} bytes"
        )
    return code, tuple(shape), begin, end


def _is_u64(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= _U64


def _json_depth(value: object) -> int:
    """Nesting depth of parsed JSON (a scalar is 0), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            stack.extend(
                (v, depth + 1) for v in (item.values() if isinstance(item, dict) else item)
            )
    return deepest


def _check_layout(
    specs: list[tuple[str, tuple[str, tuple[int, ...], int, int]]], data_size: int, shown: str
) -> None:
    """The entries, by offset, must tile ``[0, data_size)`` exactly (no gap, overlap, tail)."""
    at, previous = 0, None
    for name, (_code, _shape, begin, end) in sorted(specs, key=lambda s: (s[1][2], s[1][3])):
        if begin != at:
            how = (
                f"overlaps {_short(previous)} (which ends at byte {at})"
                if begin < at
                else f"leaves a gap of {begin - at} bytes after "
                + (_short(previous) if previous is not None else "the header")
            )
            raise CheckpointError(
                f"{shown!r}: tensor {_short(name)} starts at byte {begin} of the data and "
                f"{how}; the safetensors library refuses this (InvalidOffset). {_DAMAGED}"
            )
        at, previous = end, name
    if at > data_size:
        raise CheckpointError(
            f"{shown!r}: its tensors end at byte {at} of the data, but the file holds only "
            f"{data_size} bytes of data: the file is truncated. Download it again."
        )
    if at < data_size:
        raise CheckpointError(
            f"{shown!r}: the file holds {data_size - at} bytes after its last tensor that no "
            f"tensor covers; the safetensors library refuses this (MetadataIncompleteBuffer). "
            f"{_DAMAGED}"
        )


# -- torch.save ---------------------------------------------------------------------------------


def _read_torch(path: str, shown: str, *, zip_format: bool) -> CheckpointInfo:
    import torch

    if zip_format:
        _check_zip(path, shown)
    try:
        obj = torch.load(path, map_location="meta", weights_only=True, mmap=zip_format)
    except Exception as exc:  # a malformed file can make torch.load raise almost anything
        raise _load_error(shown, exc, zip_format=zip_format) from _chained(exc)
    walk = _Flattener(shown, torch)
    walk.run(obj)
    info = CheckpointInfo(
        path=shown,
        format="torch",
        tensors=walk.tensors,
        files=[shown],
        others=walk.others,
        notes=walk.notes(),
    )
    if not zip_format:
        info.notes.append(
            "legacy (pre-1.6) torch.save format: it cannot be memory-mapped, so its data was "
            "read once while loading to meta; re-save it with torch.save to inspect it for free."
        )
    return info


def _check_zip(path: str, shown: str) -> None:
    """Refuse a zip whose pickle torch would inflate past :data:`_MAX_PICKLE_BYTES` in memory.

    ``torch.save`` stores records uncompressed, but torch also reads deflated ones: a 1 MB
    record can say it inflates to 1 GB. Only the zip's table of contents is read here.
    """
    try:
        with zipfile.ZipFile(path) as z:
            records = z.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        raise CheckpointError(
            f"{shown!r} is a damaged zip (torch.save) file ({type(exc).__name__}): its table of "
            "contents cannot be read. Download or save it again."
        ) from exc
    for r in records:
        is_pickle = r.filename.endswith(".pkl")
        inflates = r.compress_type != zipfile.ZIP_STORED
        if (is_pickle or inflates) and r.file_size > _MAX_PICKLE_BYTES:
            raise CheckpointError(
                f"{shown!r}: its record {_short(r.filename)} would take {r.file_size} bytes of "
                f"memory to read (limit {_MAX_PICKLE_BYTES}); torch.save never writes such a "
                "record. Refused: the file is damaged or built to exhaust memory."
            )


def _load_error(shown: str, exc: Exception, *, zip_format: bool) -> CheckpointError:
    import pickle

    if isinstance(exc, pickle.UnpicklingError) and "Weights only load failed" in str(exc):
        return UnsafeCheckpointError(_unsafe_message(shown, exc))
    detail = str(exc).splitlines()[0][:200] if str(exc) else "no detail"
    what = "zip (torch.save)" if zip_format else "legacy torch.save pickle"
    return CheckpointError(
        f"torch.load could not read {shown!r} as a {what} file ({type(exc).__name__}: "
        f"{detail}). The file is truncated or damaged: download or save it again."
    )


def _chained(exc: Exception) -> Exception | None:
    import pickle

    # torch's own weights-only refusal says the same at length; the refusal above is enough
    refusal = isinstance(exc, pickle.UnpicklingError) and "Weights only load failed" in str(exc)
    return None if refusal else exc


class _Flattener:
    """A ``torch.load`` result as dotted names: tensors, and the other values with their type.

    A pickle can share objects (``[x] * 20``, ten levels deep, is 20**10 paths to one list in a
    3.7 KB file) and hold cycles (a dict holding itself). Each container is expanded once, under
    the first name that reaches it; every later reference is listed in ``others`` as
    ``"same <type> as <first name>"`` and counted in a note. Tensors reached twice (tied weights)
    are listed under each name, as ``state_dict`` does. The walk has no recursion and stops with a
    :class:`CheckpointError` past :data:`_MAX_ENTRIES` entries, :data:`_MAX_NESTING` levels,
    :data:`_MAX_NAME_CHARS` characters of names or :data:`_MAX_SECONDS` seconds.
    """

    def __init__(self, file: str, torch: Any) -> None:
        self.file = file
        self.torch = torch
        self.tensors: list[TensorEntry] = []
        self.others: dict[str, str] = {}
        self.shared = 0
        self.first: dict[int, str] = {}  # id of an expanded container -> its first name
        self.chars = 0

    def run(self, obj: Any) -> None:
        import time

        # the objects stay alive in `obj` for the whole walk, so their ids are never reused
        deadline = time.monotonic() + _MAX_SECONDS
        stack: list[tuple[Any, str, int]] = [(obj, "", 0)]
        steps = 0
        while stack:
            item, name, depth = stack.pop()
            steps += 1
            if steps % 4096 == 0 and time.monotonic() > deadline:
                raise self._limit(f"took more than {_MAX_SECONDS:.0f} s to list", name)
            if len(self.tensors) + len(self.others) >= _MAX_ENTRIES:
                raise self._limit(f"holds more than {_MAX_ENTRIES} values", name)
            self.chars += len(name)
            if self.chars > _MAX_NAME_CHARS:
                raise self._limit(f"has more than {_MAX_NAME_CHARS} characters of names", name)
            stack.extend(reversed(self._visit(item, name, depth)))

    def _visit(self, item: Any, name: str, depth: int) -> list[tuple[Any, str, int]]:
        """Record ``item``; return its children to walk (in order)."""
        torch = self.torch
        label = name or "<root>"
        if isinstance(item, torch.Tensor):
            self.tensors.append(
                TensorEntry(
                    name,
                    tuple(item.shape),
                    str(item.dtype).removeprefix("torch."),
                    item.numel() * item.element_size(),
                    self.file,
                )
            )
            return []
        if not isinstance(item, dict | list | tuple):
            self.others[label] = type(item).__name__
            return []
        first = self.first.get(id(item))
        if first is not None:
            self.shared += 1
            self.others[label] = f"same {type(item).__name__} as {first}"
            self.chars += len(first)
            return []
        self.first[id(item)] = label
        pairs = item.items() if isinstance(item, dict) else enumerate(item)
        if not isinstance(item, dict) and not any(isinstance(v, torch.Tensor | dict) for v in item):
            self.others[label] = type(item).__name__  # a plain list of values: one entry
            return []
        if depth >= _MAX_NESTING:
            raise self._limit(f"nests containers more than {_MAX_NESTING} levels deep", name)
        return [(v, f"{name}.{_key(k)}" if name else _key(k), depth + 1) for k, v in pairs]

    def _limit(self, what: str, name: str) -> CheckpointError:
        return CheckpointError(
            f"{self.file!r} {what} (at {_short(name or '<root>')}): refused, it is not a model "
            "checkpoint a person would write, and listing it would exhaust time or memory. "
            "If you wrote it, save the model's state_dict() instead."
        )

    def notes(self) -> list[str]:
        if not self.shared:
            return []
        return [
            f"{self.shared} reference(s) to containers listed already (the pickle shares them): "
            "each container is listed once, under its first name; see 'others'."
        ]


def _key(k: object) -> str:
    try:
        return str(k)
    except ValueError:  # e.g. an int past sys.get_int_max_str_digits()
        return f"<{type(k).__name__}>"


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


# -- sharded indexes ----------------------------------------------------------------------------


def _load_index(path: str) -> tuple[dict[str, str], dict[str, Any]]:
    """``(weight_map, metadata)`` of an index file, each checked for type."""
    where = f"{path!r} is not a sharded-checkpoint index (a JSON object with a 'weight_map' of "
    where += "tensor name -> shard file)"
    size = os.path.getsize(path)
    if size > _MAX_INDEX_BYTES:
        raise CheckpointError(f"{where}: it is {size} bytes, past the {_MAX_INDEX_BYTES} limit.")
    try:
        with open(path, "rb") as f:
            index = json.loads(f.read().decode("utf-8-sig"), parse_constant=_no_constant)
    except RecursionError:
        raise CheckpointError(f"{where}: it nests arrays or objects too deeply.") from None
    except ValueError as exc:
        raise CheckpointError(f"{where}: not valid UTF-8 JSON ({exc}).") from exc
    if not isinstance(index, dict):
        raise CheckpointError(f"{where}: it is a JSON {type(index).__name__}.")
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict):
        raise CheckpointError(f"{where}: its 'weight_map' is {_json_kind(weight_map)}.")
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or not _is_text(name):
            raise CheckpointError(
                f"{where}: it maps the tensor {_short(name)} to {_short(shard, 60)}, not to a "
                "shard's file name."
            )
    metadata = index.get("metadata")
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        raise CheckpointError(f"{where}: its 'metadata' is {_json_kind(metadata)}, not an object.")
    return weight_map, metadata


def _read_index(path: str) -> CheckpointInfo:
    weight_map, metadata = _load_index(path)
    folder = os.path.dirname(path)
    itself = os.path.realpath(path)
    shards: dict[str, str] = {}  # name in the index -> real path, in the index's order
    for tensor, shard in weight_map.items():
        if shard in shards:
            continue
        who = f"{path!r} maps the tensor {_short(tensor)} to {_short(shard)}, which"
        real = _resolve_inside(folder or os.curdir, shard, who)
        if real == itself or shard.endswith(".index.json"):
            raise CheckpointError(
                f"{who} is {'the index itself' if real == itself else 'another index'}: a shard "
                "is a safetensors or torch.save file, never an index. Fix the index's weight_map."
            )
        if not os.path.isfile(real):
            raise CheckpointError(
                f"{path!r} names the shard {_short(shard)}, which is not a file in "
                f"{folder or os.curdir!r}: download every shard the index lists."
            )
        shards[shard] = real
    tensors: list[TensorEntry] = []
    others: dict[str, str] = {}
    formats = set()
    for shard, real in shards.items():
        info = _read_file(real, os.path.join(folder, shard))
        formats.add(info.format)
        tensors.extend(info.tensors)
        others.update(info.others)
    seen: dict[str, str] = {}
    notes: list[str] = []
    for t in tensors:
        if t.name in seen:
            raise CheckpointError(
                f"tensor {_short(t.name)} is in two shards ({seen[t.name]!r} and {t.file!r}) of "
                f"{path!r}"
            )
        seen[t.name] = t.file
    listed_missing = [n for n in weight_map if n not in seen]
    if listed_missing:
        raise CheckpointError(
            f"{path!r} lists {len(listed_missing)} tensor(s) that their shards do not hold, "
            f"e.g. {_short(listed_missing[0])} (said to be in "
            f"{_short(weight_map[listed_missing[0]])}): a shard is outdated or the index belongs "
            "to another checkpoint."
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
    total = metadata.get("total_size")
    if isinstance(total, int) and not isinstance(total, bool):
        held = sum(t.nbytes for t in tensors)
        if total != held:
            notes.append(f"the index says total_size={total} bytes; the shards hold {held}.")
    tensors.sort(key=lambda t: _natural_key(t.name))
    return CheckpointInfo(
        path=path,
        format="sharded " + "/".join(sorted(formats)),
        tensors=tensors,
        files=[os.path.join(folder, s) for s in shards],
        others=others,
        metadata=dict(metadata),
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
