"""``inspect_checkpoint``: a file, a folder or a sharded ``*.index.json``, each file told by its
first bytes. Files an index names must stay inside its folder (symlinks resolved) before anything
is opened.
"""

from __future__ import annotations

import json
import os
import re
import stat
import zipfile
from typing import Any

from .entries import CheckpointError, CheckpointInfo, TensorEntry, natural_key, quoted
from .hostile_json import is_text, json_kind, no_constant
from .safetensors_header import read_safetensors
from .torch_files import read_torch_file

_INDEX_NAMES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


_SINGLE_NAMES = ("model.safetensors", "pytorch_model.bin", "model.pt", "model.pth")


_MAX_INDEX_BYTES = 100_000_000  # a real index is ~100 KB even for a 400B model

#: endings of checkpoint files: a missing path ending so is never taken for a Hub id
_ENDINGS = (".pt", ".pth", ".bin", ".safetensors", ".json", ".ckpt")


def inspect_checkpoint(
    path: str | bytes | os.PathLike[str] | os.PathLike[bytes], *, revision: str | None = None
) -> CheckpointInfo:
    """Read a checkpoint's tensor names, shapes, dtypes and bytes, never its tensor data.

    Parameters
    ----------
    path
        A ``.safetensors`` file, a ``torch.save`` file (``.pt``, ``.pth``, ``.bin``), a sharded
        checkpoint's ``*.index.json``, or a folder holding one of these (a Hugging Face model
        folder: ``model.safetensors.index.json``, ``model.safetensors``, ``pytorch_model.bin``).
        Files an index names, and the file picked in a folder, must stay inside that folder
        (symlinks are resolved); in a Hugging Face cache snapshot they may also be its repo's
        ``blobs``. A string that is no file or folder here and is a Hugging Face Hub id
        (``"org/name"``) names that model's safetensors: their headers are read from the
        Hugging Face cache (offline too), else from the Hub (``get_safetensors_metadata``:
        headers only, no weights).
    revision
        A Hub id's branch, tag or commit (default ``main``); not used for a path.

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
    HubError
        A Hub id whose safetensors are neither in the cache nor reachable (offline, no such
        repository, no safetensors weights).
    """
    path = _checked_path(path, revision)
    if not os.path.lexists(path) and not path.endswith(_ENDINGS):
        try:  # huggingface_hub: loaded only for a name that is no path, and optional
            from .hub import inspect_hub, is_hub_id
        except ImportError:
            pass  # no huggingface_hub: a missing path, said below
        else:
            if is_hub_id(path):
                return inspect_hub(path, revision, inspect_checkpoint)
    try:
        if os.path.isdir(path):
            path = _pick_in_folder(path)
        _check_regular(path)
        if path.endswith(".index.json"):
            return _read_index(path)
        return _read_file(path, path)
    except OSError as exc:
        raise _read_error(path, exc) from exc


def _checked_path(path: Any, revision: Any) -> str:
    """``path`` as a ``str`` (a ``bytes`` path decoded as ``os.fsdecode`` does); a path with a
    NUL byte, another type, or a ``revision`` that is no string: :class:`CheckpointError`."""
    if revision is not None and (not isinstance(revision, str) or not revision.strip()):
        raise CheckpointError(
            f"revision must be a branch, tag or commit of the Hub repository (a non-empty "
            f"string) or None, not {revision!r}."
        )
    try:
        text = os.fsdecode(os.fspath(path))
    except TypeError:
        raise CheckpointError(
            f"inspect_checkpoint takes a path (a str, bytes or os.PathLike) or a Hub id, not a "
            f"{type(path).__name__}."
        ) from None
    if "\0" in text:
        raise CheckpointError(
            f"{quoted(text)} holds a NUL byte: no file or Hub id can be named so; check the path."
        )
    return text


def _check_regular(path: str) -> None:
    """Refuse a path that is missing or not a regular file (a FIFO would block a reader)."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        raise CheckpointError(f"no checkpoint file at {path!r}: check the path.") from None
    if not stat.S_ISREG(mode):
        raise CheckpointError(
            f"{path!r} is not a regular file (a pipe, a device or a socket): pass a checkpoint "
            "file, its folder, or a sharded checkpoint's *.index.json."
        )


def _read_error(path: str, exc: OSError) -> CheckpointError:
    """An operating-system error while reading, as a refusal naming the file and the cause."""
    where = exc.filename if isinstance(exc.filename, str) else path
    why = exc.strerror or type(exc).__name__
    hint = (
        "check its permissions (or run as a user who may read it)"
        if isinstance(exc, PermissionError)
        else "it is not a regular file on a working disk (a device, a /proc file, a broken "
        "network mount?): copy the checkpoint to a local disk and pass that"
    )
    return CheckpointError(f"{where!r} cannot be read ({why}): {hint}.")


def _read_file(real: str, shown: str) -> CheckpointInfo:
    """One safetensors or torch.save file (never an index): ``real`` is opened, ``shown`` named."""
    kind = sniff(real, shown)
    if kind == "safetensors":
        entries, metadata = read_safetensors(real, shown)
        return CheckpointInfo(
            path=shown, format="safetensors", tensors=entries, files=[shown], metadata=metadata
        )
    return read_torch_file(real, shown, zip_format=kind == "torch-zip")


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


def _load_index(path: str) -> tuple[dict[str, str], dict[str, Any]]:
    """``(weight_map, metadata)`` of an index file, each checked for type."""
    where = f"{path!r} is not a sharded-checkpoint index (a JSON object with a 'weight_map' of "
    where += "tensor name -> shard file)"
    size = os.path.getsize(path)
    if size > _MAX_INDEX_BYTES:
        raise CheckpointError(f"{where}: it is {size} bytes, past the {_MAX_INDEX_BYTES} limit.")
    try:
        with open(path, "rb") as f:
            index = json.loads(f.read().decode("utf-8-sig"), parse_constant=no_constant)
    except RecursionError:
        raise CheckpointError(f"{where}: it nests arrays or objects too deeply.") from None
    except ValueError as exc:
        raise CheckpointError(f"{where}: not valid UTF-8 JSON ({exc}).") from exc
    if not isinstance(index, dict):
        raise CheckpointError(f"{where}: it is a JSON {type(index).__name__}.")
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict):
        raise CheckpointError(f"{where}: its 'weight_map' is {json_kind(weight_map)}.")
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or not is_text(name):
            raise CheckpointError(
                f"{where}: it maps the tensor {quoted(name)} to {quoted(shard, 60)}, not to a "
                "shard's file name."
            )
    metadata = index.get("metadata")
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        raise CheckpointError(f"{where}: its 'metadata' is {json_kind(metadata)}, not an object.")
    return weight_map, metadata


def _read_index(path: str) -> CheckpointInfo:
    weight_map, metadata = _load_index(path)
    folder = os.path.dirname(path)
    itself = os.path.realpath(path)
    shards: dict[str, str] = {}  # name in the index -> real path, in the index's order
    real_of: dict[str, str] = {}  # every name in the index (``a``, ``./a``) -> real path
    for tensor, shard in weight_map.items():
        if shard in real_of:
            continue
        who = f"{path!r} maps the tensor {quoted(tensor)} to {quoted(shard)}, which"
        real = _resolve_inside(folder or os.curdir, shard, who)
        if real == itself or shard.endswith(".index.json"):
            raise CheckpointError(
                f"{who} is {'the index itself' if real == itself else 'another index'}: a shard "
                "is a safetensors or torch.save file, never an index. Fix the index's weight_map."
            )
        if not os.path.isfile(real):
            raise CheckpointError(
                f"{path!r} names the shard {quoted(shard)}, which is not a file in "
                f"{folder or os.curdir!r}: download every shard the index lists."
            )
        real_of[shard] = real
        if real not in shards.values():  # one file named two ways ("a", "./a") is read once
            shards[shard] = real
    tensors: list[TensorEntry] = []
    duplicates: list[TensorEntry] = []
    others: dict[str, str] = {}
    formats = set()
    real_of_shown: dict[str, str] = {}
    for shard, real in shards.items():
        shown = os.path.join(folder, shard)
        real_of_shown[shown] = real
        info = _read_file(real, shown)
        formats.add(info.format)
        tensors.extend(info.tensors)
        duplicates.extend(info.duplicates)
        others.update(info.others)
    seen: dict[str, str] = {}
    notes: list[str] = []
    for t in tensors:
        if t.name in seen:
            raise CheckpointError(
                f"tensor {quoted(t.name)} is in two shards ({seen[t.name]!r} and {t.file!r}) of "
                f"{path!r}"
            )
        seen[t.name] = t.file
    listed_missing = [n for n in weight_map if n not in seen]
    if listed_missing:
        raise CheckpointError(
            f"{path!r} lists {len(listed_missing)} tensor(s) that their shards do not hold, "
            f"e.g. {quoted(listed_missing[0])} (said to be in "
            f"{quoted(weight_map[listed_missing[0]])}): a shard is outdated or the index belongs "
            "to another checkpoint."
        )
    misplaced = [
        t.name
        for t in tensors
        if t.name in weight_map and real_of[weight_map[t.name]] != real_of_shown[t.file]
    ]
    unlisted = [t.name for t in tensors if t.name not in weight_map]
    if misplaced:
        notes.append(f"{len(misplaced)} tensor(s) are in another shard than the index says.")
    if unlisted:
        notes.append(f"{len(unlisted)} tensor(s) in the shards are not in the index.")
    if duplicates:
        notes.append(
            f"{len(duplicates)} tensor name(s) are given twice inside one shard, e.g. "
            f"{quoted(duplicates[0].name)}: see 'duplicates'."
        )
    total = metadata.get("total_size")
    if isinstance(total, int) and not isinstance(total, bool):
        held = sum(t.nbytes for t in tensors)
        if total != held:
            notes.append(f"the index says total_size={total} bytes; the shards hold {held}.")
    tensors.sort(key=lambda t: natural_key(t.name))
    return CheckpointInfo(
        path=path,
        format="sharded " + "/".join(sorted(formats)),
        tensors=tensors,
        files=[os.path.join(folder, s) for s in shards],
        others=others,
        metadata=dict(metadata),
        notes=notes,
        duplicates=duplicates,
    )
