"""``torch.save`` files, read without ``torch.load``: the pickle is run by
:mod:`.pickle_reader`'s machine (tensors are stand-ins, no global is called, no tensor byte is
read) under one budget of objects, bytes and seconds per file, and its objects are walked into
dotted names charged to the same budget. A pickle that would run code is refused (nothing runs).

Zip files (``torch.save`` since 1.6): only the ``data.pkl`` record is read, after the zip's
table of contents says it is at most :data:`_MAX_PICKLE_BYTES`. Legacy (pre-zip) files: the
pickles at the file's start are read from a memory map, and the tensor data after them never is.
"""

from __future__ import annotations

import mmap
import os
import re
import zipfile
from typing import Any

from .entries import CheckpointError, CheckpointInfo, TensorEntry, quoted
from .pickle_globals import Global, Opaque, StoredTensor
from .pickle_reader import LEGACY_MAGIC, LEGACY_PROTOCOL, Budget, PickleMachine

_MAX_PICKLE_BYTES = 64 * 1024 * 1024  # data.pkl: ~150 B per tensor, so ~450k tensors


_MAX_NESTING = 100  # containers inside containers in one torch.save file


def read_torch_file(path: str, shown: str, *, zip_format: bool) -> CheckpointInfo:
    """The tensors (names, shapes, dtypes) and other values of a ``torch.save`` file."""
    budget = Budget(shown)
    obj = _read_zip(path, shown, budget) if zip_format else _read_legacy(path, shown, budget)
    walk = _Flattener(shown, budget)
    walk.run(obj)
    info = CheckpointInfo(
        path=shown,
        format="torch",
        tensors=walk.tensors,
        files=[shown],
        others=walk.others,
        notes=walk.notes(),
        duplicates=walk.duplicates,
    )
    if not zip_format:
        info.notes.append(
            "legacy (pre-1.6) torch.save format: listed without its data, but it cannot be "
            "memory-mapped, so loading it reads it whole; re-save it with torch.save."
        )
    return info


def _run(machine: PickleMachine, shown: str) -> Any:
    """One pickle's value; refused when it needs opcodes torch.load(weights_only=True) lacks."""
    value = machine.load()
    if machine.not_weights_only is not None:
        raise CheckpointError(
            f"{shown!r}: its pickle holds {machine.not_weights_only}, which torch.save never "
            "writes with its default protocol and torch.load(weights_only=True) cannot read, so "
            "it cannot be loaded safely. Nothing was run. If you wrote it, save it again with "
            "torch.save(obj, path) and no pickle_protocol."
        )
    return value


def _read_zip(path: str, shown: str, budget: Budget) -> Any:
    record = _check_zip(path, shown)
    try:
        with zipfile.ZipFile(path) as z:
            data = z.read(record)
    except (zipfile.BadZipFile, EOFError, ValueError, RuntimeError) as exc:
        raise CheckpointError(
            f"{shown!r}: its pickle record {quoted(record)} cannot be read from the zip "
            f"({type(exc).__name__}: {str(exc)[:120]}). The file is truncated or damaged: "
            "download or save it again."
        ) from exc
    return _run(PickleMachine(data, 0, budget), shown)


def _read_legacy(path: str, shown: str, budget: Budget) -> Any:
    """The legacy format: four pickles (magic number, protocol, system info, the object), read
    from a memory map of the file's first :data:`_MAX_PICKLE_BYTES` (the data after them is
    never touched)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        window = min(size, _MAX_PICKLE_BYTES)
        data: Any = mmap.mmap(f.fileno(), window, access=mmap.ACCESS_READ) if window else b""
    try:
        at = 0
        values = []
        for _ in range(4):
            machine = PickleMachine(data, at, budget, more=size > window)
            values.append(_run(machine, shown))
            at = machine.pos
            if len(values) == 2 and values != [LEGACY_MAGIC, LEGACY_PROTOCOL]:
                raise CheckpointError(
                    f"{shown!r} is a pickle, but not one torch.save wrote (it does not start "
                    "with torch.save's magic number and protocol version). Pass a .safetensors, "
                    ".pt/.pth/.bin or *.index.json file."
                )
        return values[3]
    finally:
        if isinstance(data, mmap.mmap):
            data.close()


def _check_zip(path: str, shown: str) -> str:
    """The name of the zip's ``data.pkl`` record, refused when torch would inflate any record
    past :data:`_MAX_PICKLE_BYTES` in memory.

    ``torch.save`` stores records uncompressed, but torch also reads deflated ones: a 1 MB
    record can say it inflates to 1 GB. Only the zip's table of contents is read here.
    """
    try:
        with zipfile.ZipFile(path) as z:
            records = z.infolist()
    except (zipfile.BadZipFile, ValueError, EOFError) as exc:
        raise CheckpointError(
            f"{shown!r} is a damaged zip (torch.save) file ({type(exc).__name__}): its table of "
            "contents cannot be read. Download or save it again."
        ) from exc
    for r in records:
        is_pickle = r.filename.endswith(".pkl")
        inflates = r.compress_type != zipfile.ZIP_STORED
        if (is_pickle or inflates) and r.file_size > _MAX_PICKLE_BYTES:
            raise CheckpointError(
                f"{shown!r}: its record {quoted(r.filename)} would take {r.file_size} bytes of "
                f"memory to read (limit {_MAX_PICKLE_BYTES}); torch.save never writes such a "
                "record. Refused: the file is damaged or built to exhaust memory."
            )
    found = [r.filename for r in records if re.fullmatch(r"[^/]+/data\.pkl", r.filename)]
    if not found:
        raise CheckpointError(
            f"{shown!r} is a zip file without the 'data.pkl' record torch.save writes: it is not "
            "a torch.save checkpoint (or it is damaged)."
        )
    return found[0]


class _Flattener:
    """A pickle's value as dotted names: tensors, and the other values with their type.

    A pickle can share objects (``[x] * 20``, ten levels deep, is 20**10 paths to one list in a
    3.7 KB file) and hold cycles (a dict holding itself). Each container is expanded once, under
    the first name that reaches it; every later reference is listed in ``others`` as
    ``"same <type> as <first name>"`` and counted in a note. Tensors reached twice (tied weights)
    are listed under each name, as ``state_dict`` does; two tensors reached under one name
    (``"fc.weight"`` beside ``{"fc": {"weight": ...}}``) are a duplicate: the first is listed,
    the others are in ``duplicates``. The walk has no recursion, stops past
    :data:`_MAX_NESTING` levels, and charges every name and entry to the file's budget.
    """

    def __init__(self, file: str, budget: Budget) -> None:
        self.file = file
        self.budget = budget
        self.tensors: list[TensorEntry] = []
        self.duplicates: list[TensorEntry] = []
        self.others: dict[str, str] = {}
        self.shared = 0
        self.first: dict[int, str] = {}  # id of an expanded container -> its first name
        self.named: set[str] = set()  # names of the tensors listed

    def run(self, obj: Any) -> None:
        # the objects stay alive in `obj` for the whole walk, so their ids are never reused
        stack: list[tuple[Any, str, int]] = [(obj, "", 0)]
        steps = 0
        while stack:
            item, name, depth = stack.pop()
            steps += 1
            if not steps & 0xFFF:
                self.budget.tick()
            self.budget.charge(len(name) + 160)  # the name, its entry, its place on the stack
            stack.extend(reversed(self._visit(item, name, depth)))

    def _visit(self, item: Any, name: str, depth: int) -> list[tuple[Any, str, int]]:
        """Record ``item``; return its children to walk (in order)."""
        label = name or "<root>"
        if isinstance(item, StoredTensor):
            self._tensor(item, name)
            return []
        if not isinstance(item, dict | list | tuple):
            self.others[label] = _kind(item)
            return []
        first = self.first.get(id(item))
        if first is not None:
            self.shared += 1
            self.others[label] = f"same {type(item).__name__} as {first}"
            return []
        self.first[id(item)] = label
        pairs = item.items() if isinstance(item, dict) else enumerate(item)
        if not isinstance(item, dict) and not any(isinstance(v, StoredTensor | dict) for v in item):
            self.others[label] = type(item).__name__  # a plain list of values: one entry
            return []
        if depth >= _MAX_NESTING:
            raise CheckpointError(
                f"{self.file!r} nests containers more than {_MAX_NESTING} levels deep (at "
                f"{quoted(label)}): refused, it is not a model checkpoint a person would write. "
                "If you wrote it, save the model's state_dict() instead."
            )
        return [(v, f"{name}.{_key(k)}" if name else _key(k), depth + 1) for k, v in pairs]

    def _tensor(self, item: StoredTensor, name: str) -> None:
        entry = TensorEntry(name, item.shape, item.dtype, item.nbytes, self.file)
        if name in self.named:
            self.duplicates.append(entry)
            return
        self.named.add(name)
        self.tensors.append(entry)

    def notes(self) -> list[str]:
        notes = []
        if self.shared:
            notes.append(
                f"{self.shared} reference(s) to containers listed already (the pickle shares "
                "them): each container is listed once, under its first name; see 'others'."
            )
        if self.duplicates:
            d = self.duplicates[0]
            notes.append(
                f"{len(self.duplicates)} tensor name(s) are given twice, e.g. {quoted(d.name)} "
                "(a key with dots beside nested keys that read the same): the first is listed, "
                "the others are in 'duplicates'. Which one a loader keeps depends on how it "
                "flattens the keys: fix the file."
            )
        return notes


def _kind(item: Any) -> str:
    if isinstance(item, Opaque):
        return item.kind.rpartition(".")[2]
    if isinstance(item, Global):  # a global kept as a value (a dtype, a storage type)
        return item.name
    return type(item).__name__


def _key(k: object) -> str:
    try:
        return str(k)
    except ValueError:  # e.g. an int past sys.get_int_max_str_digits()
        return f"<{type(k).__name__}>"
