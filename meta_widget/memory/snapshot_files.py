"""Reading a recording's bytes (``mw.load_snapshot``), bounded before anything is built.

A recording is a file someone else may have written: a snapshot pickle or a chrome trace JSON,
gzipped or not. Before a single object is built:

- **the file** must be a regular file (a FIFO would block ``open``; ``/dev/zero`` never ends);
- **its bytes**, gunzipped, are at most ``max_bytes`` (default :data:`MAX_BYTES`). A ``.gz`` is
  first gunzipped in :data:`CHUNK` pieces that are counted and dropped, so a gzip bomb costs one
  piece of memory, never its size; only a file within the bounds is gunzipped again, whole;
- **the containers** it can build are at most ``max_objects`` (default :data:`MAX_OBJECTS`):
  an upper bound counted in the bytes themselves, before parsing. In JSON each object or array
  starts with ``{`` or ``[``; in a pickle each dict, list, tuple or set is made by an opcode of
  one byte (``}`` ``]`` ``)`` ``(`` ``\\x85``-``\\x87`` ``\\x8f`` ``\\x91``), so counting those
  bytes (in strings and numbers too) can only count more. A container costs 56-232 bytes in
  Python: 5,000,000 of them at most ~1 GiB in the worst case (empty dicts), where the 19 KB
  gzip of a pickle of 20,000,000 ``{}`` used to build 1.5 GB. A real snapshot of 100,000
  events with 30 frames each builds ~3,100,000.
- **nesting**: a JSON nested deeper than Python's recursion limit is refused, not a
  ``RecursionError``.

The pickle is read by an unpickler that allows no global at all: a snapshot holds dicts, lists,
strings and numbers only, so a pickle naming any class or function (``os.system``) is refused
unread.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import pickle
import stat
from typing import Any

from .snapshot import SnapshotError

__all__ = ["CHUNK", "MAX_BYTES", "MAX_OBJECTS", "check_objects", "read_file", "read_recording"]

#: the most bytes a recording is read as (gunzipped); ``max_bytes=`` raises it
MAX_BYTES = 2 * 2**30
#: the most containers (dicts, lists, tuples) a recording may build; ``max_objects=`` raises it
MAX_OBJECTS = 5_000_000
#: the piece a ``.gz`` is gunzipped in while it is measured
CHUNK = 2**20
#: the pickle opcodes that make a container, each one byte
_PICKLE_CONTAINERS = tuple(bytes([op]) for op in b"}])(\x85\x86\x87\x8f\x91")


def _containers(chunk: bytes, is_pickle: bool) -> int:
    """An upper bound of the containers ``chunk`` can build (module docstring)."""
    if is_pickle:
        return sum(chunk.count(op) for op in _PICKLE_CONTAINERS)
    return chunk.count(b"{") + chunk.count(b"[")


def _too_many(shown: str, count: int, max_objects: int) -> SnapshotError:
    return SnapshotError(
        f"{shown} could build up to {count:,} dicts and lists, more than max_objects="
        f"{max_objects:,}: refused before any was built (a bomb or the wrong file?). A real "
        "recording that large: pass a larger max_objects= to load_snapshot."
    )


def check_objects(data: bytes, shown: str, max_objects: int = MAX_OBJECTS) -> None:
    """Refuse ``data`` when it could build more than ``max_objects`` containers."""
    count = _containers(data, data[:1] == b"\x80")
    if count > max_objects:
        raise _too_many(shown, count, max_objects)


def _regular(path: str | os.PathLike[str], shown: str) -> int:
    """The size of the regular file at ``path``; anything else refused unopened."""
    try:
        info = os.stat(path)
    except (OSError, ValueError) as exc:
        why = getattr(exc, "strerror", None) or str(exc)
        raise SnapshotError(f"cannot read {shown!r}: {why}.") from None
    if not stat.S_ISREG(info.st_mode):
        raise SnapshotError(
            f"cannot read {shown!r}: it is not a regular file (a pipe, a device or a socket, "
            "which could block or never end); pass the file of a snapshot or trace."
        )
    return info.st_size


def _measure_gzip(raw: Any, shown: str, max_bytes: int, max_objects: int) -> None:
    """Gunzip ``raw`` piece by piece, counting bytes and containers, keeping none."""
    total = count = 0
    is_pickle: bool | None = None
    with gzip.GzipFile(fileobj=raw) as f:
        while chunk := f.read(CHUNK):
            if is_pickle is None:
                is_pickle = chunk[:1] == b"\x80"
            total += len(chunk)
            count += _containers(chunk, is_pickle)
            if total > max_bytes:
                raise _too_large(shown, max_bytes, True)
            if count > max_objects:
                raise _too_many(shown, count, max_objects)


def _too_large(shown: str, max_bytes: int, gzipped: bool) -> SnapshotError:
    return SnapshotError(
        f"{shown!r} holds more than max_bytes={max_bytes:,} bytes"
        f"{' once gunzipped' if gzipped else ''}: it was not read further. A recording "
        "that large is rare (a gzip bomb or the wrong file?); pass a larger max_bytes= to "
        "load_snapshot to read it anyway."
    )


def read_file(
    path: str | os.PathLike[str], max_bytes: int = MAX_BYTES, max_objects: int = MAX_OBJECTS
) -> bytes:
    """The bytes of a recording's file, gunzipped when it is a ``.gz``, within the bounds of
    the module docstring (:class:`SnapshotError` past one, having kept at most one
    :data:`CHUNK` of a ``.gz``, or read at most ``max_bytes + 1`` of a plain file)."""
    shown = os.fsdecode(os.fspath(path))
    size = _regular(path, shown)
    try:
        with open(path, "rb") as raw:
            gzipped = raw.read(2) == b"\x1f\x8b"
            raw.seek(0)
            if not gzipped and size > max_bytes:
                raise _too_large(shown, max_bytes, False)
            if gzipped:
                _measure_gzip(raw, shown, max_bytes, max_objects)
                raw.seek(0)
                with gzip.GzipFile(fileobj=raw) as f:
                    data = f.read(max_bytes + 1)
            else:
                data = raw.read(max_bytes + 1)
    except (OSError, EOFError) as exc:
        why = getattr(exc, "strerror", None) or str(exc)
        raise SnapshotError(f"cannot read {shown!r}: {why}.") from exc
    if len(data) > max_bytes:
        raise _too_large(shown, max_bytes, gzipped)
    check_objects(data, shown, max_objects)
    return data


class _NoGlobals(pickle.Unpickler):
    """Builds dicts, lists, strings and numbers; refuses every global and persistent id."""

    def find_class(self, module: str, name: str) -> Any:
        raise SnapshotError(
            f"this snapshot pickle names the global {module}.{name}: a memory snapshot holds "
            "only dicts, lists, strings and numbers, so it was refused unread (nothing was "
            "imported or run). Check where the file came from."
        )

    def persistent_load(self, pid: Any) -> Any:
        raise SnapshotError(
            "this snapshot pickle holds a persistent id (a torch.save file?): not a memory "
            "snapshot; refused unread. Pass the file torch.cuda.memory._dump_snapshot wrote."
        )


def read_recording(data: bytes, shown: str) -> Any:
    """The recording in ``data``: a snapshot pickle (no globals allowed) or a trace's JSON."""
    if data[:1] == b"\x80":
        try:
            return _NoGlobals(io.BytesIO(data)).load()
        except SnapshotError:
            raise
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError) as exc:
            raise SnapshotError(f"{shown}: a damaged pickle ({exc}).") from None
        except RecursionError:
            raise SnapshotError(f"{shown}: a pickle nested too deep to read.") from None
    try:
        return json.loads(data)
    except RecursionError:
        raise SnapshotError(f"{shown}: a JSON nested too deep to read.") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SnapshotError(
            f"{shown} is neither a memory snapshot pickle (torch.cuda.memory._dump_snapshot) nor "
            f"a chrome trace JSON (torch.profiler's export_chrome_trace): {exc}"
        ) from None
