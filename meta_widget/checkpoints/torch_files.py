"""``torch.save`` files, read without ``torch.load``: the pickle is run by
:mod:`.pickle_reader`'s machine (tensors are stand-ins, no global is called, no tensor byte is
read) under one budget of steps and bytes per file (:mod:`.pickle_budget`), and its objects are
walked into dotted names charged to the same budget (:mod:`.pickle_names`). A pickle that would
run code is refused (nothing runs).

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

from .entries import CheckpointError, CheckpointInfo, quoted
from .pickle_budget import MAX_RATIO, Budget
from .pickle_names import Flattener
from .pickle_reader import LEGACY_MAGIC, LEGACY_PROTOCOL, PickleMachine

_MAX_PICKLE_BYTES = 64 * 1024 * 1024  # data.pkl: ~150 B per tensor, so ~450k tensors


def read_torch_file(path: str, shown: str, *, zip_format: bool) -> CheckpointInfo:
    """The tensors (names, shapes, dtypes) and other values of a ``torch.save`` file."""
    obj, budget = _read_zip(path, shown) if zip_format else _read_legacy(path, shown)
    walk = Flattener(shown, budget)
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


def _read_zip(path: str, shown: str) -> tuple[Any, Budget]:
    """The value of the zip's ``data.pkl``, and the budget it was read under (the allowance of
    its size in the file: what it inflates to, up to :data:`MAX_RATIO` times what it takes)."""
    record = _check_zip(path, shown)
    budget = Budget(shown, min(record.file_size, MAX_RATIO * record.compress_size))
    try:
        with zipfile.ZipFile(path) as z:
            data = z.read(record.filename)
    except (zipfile.BadZipFile, EOFError, ValueError, RuntimeError) as exc:
        raise CheckpointError(
            f"{shown!r}: its pickle record {quoted(record.filename)} cannot be read from the zip "
            f"({type(exc).__name__}: {str(exc)[:120]}). The file is truncated or damaged: "
            "download or save it again."
        ) from exc
    return _run(PickleMachine(data, 0, budget), shown), budget


def _read_legacy(path: str, shown: str) -> tuple[Any, Budget]:
    """The legacy format: four pickles (magic number, protocol, system info, the object), read
    from a memory map of the file's first :data:`_MAX_PICKLE_BYTES` (the data after them is
    never touched), under the allowance of that window's size."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        window = min(size, _MAX_PICKLE_BYTES)
        data: Any = mmap.mmap(f.fileno(), window, access=mmap.ACCESS_READ) if window else b""
    budget = Budget(shown, window)
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
        return values[3], budget
    finally:
        if isinstance(data, mmap.mmap):
            data.close()


#: how zip records may be stored: what torch's reader (miniz) reads; it refuses bzip2 and lzma
_METHODS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflated"}


def _check_zip(path: str, shown: str) -> zipfile.ZipInfo:
    """The zip's ``data.pkl`` record, refused when torch would inflate any record past
    :data:`_MAX_PICKLE_BYTES` in memory, or could not read a record at all.

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
        if r.compress_type not in _METHODS:
            raise CheckpointError(
                f"{shown!r}: its record {quoted(r.filename)} is compressed with method "
                f"{r.compress_type} (bzip2 is 12, lzma 14), which torch.load cannot read (it "
                "reads stored and deflated records only). Refused: re-save it with torch.save."
            )
        is_pickle = r.filename.endswith(".pkl")
        inflates = r.compress_type != zipfile.ZIP_STORED
        if (is_pickle or inflates) and r.file_size > _MAX_PICKLE_BYTES:
            raise CheckpointError(
                f"{shown!r}: its record {quoted(r.filename)} would take {r.file_size} bytes of "
                f"memory to read (limit {_MAX_PICKLE_BYTES}); torch.save never writes such a "
                "record. Refused: the file is damaged or built to exhaust memory."
            )
    found = [r for r in records if re.fullmatch(r"[^/]+/data\.pkl", r.filename)]
    if not found:
        raise CheckpointError(
            f"{shown!r} is a zip file without the 'data.pkl' record torch.save writes: it is not "
            "a torch.save checkpoint (or it is damaged)."
        )
    return found[0]
