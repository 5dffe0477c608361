"""``torch.save`` files, read on meta with ``torch.load(weights_only=True, mmap=True)``: the pickle
is read, tensor data is not. A pickle that would run code is refused (nothing runs); its objects
are walked once per shared container, under caps on entries, nesting, names and time.
"""

from __future__ import annotations

import pickle
import re
import time
import zipfile
from typing import Any

import torch

from .entries import CheckpointError, CheckpointInfo, TensorEntry, UnsafeCheckpointError, quoted

_MAX_PICKLE_BYTES = 64 * 1024 * 1024  # data.pkl: ~150 B per tensor, so ~450k tensors;


# a pickle becomes Python objects ~30x its size at worst, so this also bounds torch.load
_MAX_ENTRIES = 1_000_000  # tensors + other values listed from one torch.save file


_MAX_NESTING = 100  # containers inside containers in one torch.save file


_MAX_NAME_CHARS = 64 * 1024 * 1024  # all dotted names of one torch.save file together


_MAX_SECONDS = 60.0  # walking one torch.save file's objects


def read_torch_file(path: str, shown: str, *, zip_format: bool) -> CheckpointInfo:

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
                f"{shown!r}: its record {quoted(r.filename)} would take {r.file_size} bytes of "
                f"memory to read (limit {_MAX_PICKLE_BYTES}); torch.save never writes such a "
                "record. Refused: the file is damaged or built to exhaust memory."
            )


def _load_error(shown: str, exc: Exception, *, zip_format: bool) -> CheckpointError:

    if isinstance(exc, pickle.UnpicklingError) and "Weights only load failed" in str(exc):
        return UnsafeCheckpointError(_unsafe_message(shown, exc))
    detail = str(exc).splitlines()[0][:200] if str(exc) else "no detail"
    what = "zip (torch.save)" if zip_format else "legacy torch.save pickle"
    return CheckpointError(
        f"torch.load could not read {shown!r} as a {what} file ({type(exc).__name__}: "
        f"{detail}). The file is truncated or damaged: download or save it again."
    )


def _chained(exc: Exception) -> Exception | None:

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
            f"{self.file!r} {what} (at {quoted(name or '<root>')}): refused, it is not a model "
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
