"""Hostile checkpoint files: each refused with a CheckpointError that says what is wrong, nothing
outside the checkpoint's folder opened, bounded time and memory; legitimate files still read.

Every file is real and built here. Two independent truths: an audit hook that sees every Python
``open`` (the outside files must never be opened), and the ``safetensors`` library itself (every
header refused here, it refuses too; every file it accepts is accepted here, with the same
names, shapes and dtypes).

Shared references in a pickle (``a = [a] * 20``, ten levels deep: 20**10 paths in a few KB) are
listed once: each container is expanded under the first name that reaches it and every later
reference is one ``others`` entry, ``"same <type> as <first name>"``; a cycle (a dict holding
itself) is just such a reference. Past the walk's caps (nesting, entries, names, time) the file
is refused.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import struct
import sys
from collections.abc import Callable

import pytest
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from meta_widget.checkpoints import CheckpointError, inspect_checkpoint

MiB = 1024 * 1024

# -- watching opens -----------------------------------------------------------------------------
# Audit hooks cannot be removed, so one hook is installed for the session and records only while
# a test has put a list in _WATCH.

_WATCH: list[list[str]] = []


def _audit(event: str, args: tuple[object, ...]) -> None:
    if event == "open" and _WATCH and isinstance(args[0], str | bytes | os.PathLike):
        _WATCH[-1].append(os.path.realpath(os.fsdecode(args[0])))  # type: ignore[arg-type]


sys.addaudithook(_audit)


def _inspect_watched(path: pathlib.Path | str) -> tuple[BaseException | None, list[str]]:
    """inspect_checkpoint(path): the exception it raised (or None) and every path it opened."""
    opened: list[str] = []
    _WATCH.append(opened)
    try:
        inspect_checkpoint(path)
    except Exception as exc:
        return exc, opened
    finally:
        _WATCH.pop()
    return None, opened


# -- a checkpoint folder beside an outside folder -----------------------------------------------

SECRET = "TOPSECRET-7f3a9c"
_BYTES_REPR = re.compile(r"(?<![\w'\"])b['\"]")  # b'...' or b"...": a repr of raw bytes


class Scene:
    """``ckpt/`` holds one valid shard; ``outside/`` holds a checkpoint and a secret text file."""

    def __init__(self, root: pathlib.Path) -> None:
        self.ckpt = root / "ckpt"
        self.outside = root / "outside"
        self.ckpt.mkdir()
        self.outside.mkdir()
        save_file({"w": torch.zeros(4)}, str(self.ckpt / "model-00001.safetensors"))
        self.outside_ckpt = self.outside / "secret.safetensors"
        save_file({"outside_only_tensor": torch.zeros(3)}, str(self.outside_ckpt))
        self.outside_text = self.outside / "secret.txt"
        self.outside_text.write_text(f"{SECRET}\nroot:x:0:0:root:/root:/bin/bash\n")
        self.index = self.ckpt / "model.safetensors.index.json"

    def write_index(self, weight_map: object, **extra: object) -> pathlib.Path:
        self.index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map, **extra}))
        return self.index

    def shard_to(self, target: str) -> pathlib.Path:
        return self.write_index({"w": "model-00001.safetensors", "w2": target})

    @property
    def watched(self) -> list[str]:
        return [
            os.path.realpath(p)
            for p in (self.outside_ckpt, self.outside_text, "/proc/self/environ")
        ]


def _dotdot(s: Scene) -> pathlib.Path:
    return s.shard_to("../outside/secret.safetensors")


def _dotdot_deep(s: Scene) -> pathlib.Path:
    return s.shard_to("../" * 30 + str(s.outside_text).lstrip("/"))


def _dotdot_inside(s: Scene) -> pathlib.Path:
    # climbs and comes back: refused all the same (no '..' at all)
    return s.shard_to("../ckpt/model-00001.safetensors")


def _absolute_tmp(s: Scene) -> pathlib.Path:
    return s.shard_to(str(s.outside_ckpt))


def _absolute_environ(s: Scene) -> pathlib.Path:
    return s.shard_to("/proc/self/environ")


def _symlink_file(s: Scene) -> pathlib.Path:
    (s.ckpt / "evil.safetensors").symlink_to(s.outside_ckpt)
    return s.shard_to("evil.safetensors")


def _symlink_text(s: Scene) -> pathlib.Path:
    (s.ckpt / "evil.safetensors").symlink_to(s.outside_text)
    return s.shard_to("evil.safetensors")


def _symlink_folder(s: Scene) -> pathlib.Path:
    (s.ckpt / "sub").symlink_to(s.outside, target_is_directory=True)
    return s.shard_to("sub/secret.safetensors")


def _symlink_relative(s: Scene) -> pathlib.Path:
    (s.ckpt / "evil.safetensors").symlink_to("../outside/secret.safetensors")
    return s.shard_to("evil.safetensors")


def _fake_hub_blobs_link(s: Scene) -> pathlib.Path:
    # shaped like a Hugging Face cache snapshot, but its "blobs" is a link to the outside
    repo = s.ckpt / "models--x--y"
    snap = repo / "snapshots" / "abc"
    snap.mkdir(parents=True)
    (repo / "blobs").symlink_to(s.outside, target_is_directory=True)
    (snap / "model-00001.safetensors").symlink_to("../../blobs/secret.safetensors")
    s.index = snap / "model.safetensors.index.json"
    return s.write_index({"w2": "model-00001.safetensors"})


def _names_itself(s: Scene) -> pathlib.Path:
    return s.shard_to("model.safetensors.index.json")


def _names_itself_via_link(s: Scene) -> pathlib.Path:
    (s.ckpt / "alias.safetensors").symlink_to(s.index)
    return s.shard_to("alias.safetensors")


def _cycle_of_two(s: Scene) -> pathlib.Path:
    (s.ckpt / "b.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"w2": "model.safetensors.index.json"}})
    )
    return s.shard_to("b.safetensors.index.json")


def _index_disguised_as_shard(s: Scene) -> pathlib.Path:
    (s.ckpt / "b.safetensors").write_text(
        json.dumps({"weight_map": {"w2": "model.safetensors.index.json"}})
    )
    return s.shard_to("b.safetensors")


def _fifo(s: Scene) -> pathlib.Path:
    os.mkfifo(s.ckpt / "pipe.safetensors")  # opening it would block forever
    return s.shard_to("pipe.safetensors")


def _directory(s: Scene) -> pathlib.Path:
    (s.ckpt / "dir.safetensors").mkdir()
    return s.shard_to("dir.safetensors")


def _text_shard(s: Scene) -> pathlib.Path:
    (s.ckpt / "notes.safetensors").write_text(SECRET * 4)
    return s.shard_to("notes.safetensors")


def _raw_index(text: str) -> Callable[[Scene], pathlib.Path]:
    def build(s: Scene) -> pathlib.Path:
        s.index.write_text(text)
        return s.index

    return build


_NESTED = "[" * 100_000 + "]" * 100_000

INDEX_CASES: dict[str, tuple[Callable[[Scene], pathlib.Path], str]] = {
    "dotdot": (_dotdot, "climbs out of the folder with '..'"),
    "dotdot-deep": (_dotdot_deep, "climbs out of the folder with '..'"),
    "dotdot-back-inside": (_dotdot_inside, "climbs out of the folder with '..'"),
    "absolute-tmp-file": (_absolute_tmp, "is an absolute path"),
    "absolute-proc-environ": (_absolute_environ, "is an absolute path"),
    "symlink-to-outside-checkpoint": (_symlink_file, "is a link to a file outside the folder"),
    "symlink-to-outside-text": (_symlink_text, "is a link to a file outside the folder"),
    "symlinked-subfolder": (_symlink_folder, "is a link to a file outside the folder"),
    "relative-symlink": (_symlink_relative, "is a link to a file outside the folder"),
    "fake-hub-blobs-link": (_fake_hub_blobs_link, "is a link to a file outside the folder"),
    "names-itself": (_names_itself, "is the index itself"),
    "names-itself-via-link": (_names_itself_via_link, "is the index itself"),
    "cycle-of-two-indexes": (_cycle_of_two, "is another index"),
    "index-disguised-as-shard": (_index_disguised_as_shard, "neither a safetensors file"),
    "fifo": (_fifo, "is not a file in"),
    "directory": (_directory, "is not a file in"),
    "text-shard": (_text_shard, "neither a safetensors file"),
    "int-values": (_raw_index('{"weight_map": {"w": 1}}'), "not to a shard's file name"),
    "null-value": (_raw_index('{"weight_map": {"w": null}}'), "not to a shard's file name"),
    "empty-name": (_raw_index('{"weight_map": {"w": ""}}'), "is not a file name"),
    "nul-in-name": (_raw_index('{"weight_map": {"w": "a\\u0000b"}}'), "NUL"),
    "surrogate-name": (_raw_index('{"weight_map": {"w": "\\ud800"}}'), "not a valid file name"),
    "weight-map-list": (_raw_index('{"weight_map": ["a"]}'), "'weight_map' is a list"),
    "weight-map-missing": (_raw_index('{"metadata": {}}'), "'weight_map' is missing"),
    "metadata-list": (
        _raw_index('{"metadata": [1], "weight_map": {"w": "model-00001.safetensors"}}'),
        "'metadata' is a list",
    ),
    "top-level-list": (_raw_index("[1, 2]"), "is a JSON list"),
    "deeply-nested": (_raw_index('{"weight_map": {}, "x": ' + _NESTED + "}"), "too deeply"),
    "not-json": (_raw_index("{'weight_map': }"), "not valid UTF-8 JSON"),
}


@pytest.mark.parametrize("case", INDEX_CASES)
def test_a_hostile_index_is_refused_and_nothing_outside_is_opened(
    tmp_path: pathlib.Path, case: str
) -> None:
    build, expected = INDEX_CASES[case]
    scene = Scene(tmp_path)
    index = build(scene)
    error, opened = _inspect_watched(index)
    assert isinstance(error, CheckpointError), repr(error)
    message = str(error)
    assert expected in message
    assert str(index) in message or "neither" in message  # names the index (or the shard)
    for path in scene.watched:
        assert path not in opened, f"{path} was opened"
    # no byte of any outside file, nor of the environment, in the message
    assert SECRET not in message and "root:x:0" not in message
    assert "outside_only_tensor" not in message
    environ = [v for v in os.environ.values() if len(v) >= 8 and v not in str(tmp_path)]
    assert not [v for v in environ if v in message]
    assert not _BYTES_REPR.search(message)  # never a repr of raw bytes


def test_the_offending_entry_is_named(tmp_path: pathlib.Path) -> None:
    scene = Scene(tmp_path)
    error, _ = _inspect_watched(_dotdot(scene))
    assert "'w2'" in str(error) and "'../outside/secret.safetensors'" in str(error)


def test_a_folder_whose_only_checkpoint_links_outside_is_refused(tmp_path: pathlib.Path) -> None:
    scene = Scene(tmp_path)
    folder = tmp_path / "downloaded"
    folder.mkdir()
    (folder / "model.safetensors").symlink_to(scene.outside_ckpt)
    error, opened = _inspect_watched(folder)
    assert isinstance(error, CheckpointError)
    assert "is a link to a file outside the folder" in str(error)
    assert os.path.realpath(scene.outside_ckpt) not in opened


# -- legitimate layouts stay accepted -----------------------------------------------------------


def _sharded(folder: pathlib.Path, names: list[str]) -> dict[str, tuple[int, ...]]:
    """Write one shard per name under ``folder`` (names may hold subfolders); the truth."""
    truth, weight_map = {}, {}
    for i, name in enumerate(names):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        save_file({f"t{i}": torch.zeros(i + 1, 2)}, str(folder / name))
        truth[f"t{i}"] = (i + 1, 2)
        weight_map[f"t{i}"] = name
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return truth


def test_symlinks_and_subfolders_inside_the_folder_are_accepted(tmp_path: pathlib.Path) -> None:
    folder = tmp_path / "ckpt"
    (folder / "real").mkdir(parents=True)
    save_file({"linked": torch.zeros(5)}, str(folder / "real" / "target.safetensors"))
    (folder / "link.safetensors").symlink_to("real/target.safetensors")
    truth = _sharded(folder, ["sub/a.safetensors", "sub/deeper/b.safetensors", "c.safetensors"])
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    index["weight_map"]["linked"] = "link.safetensors"
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    truth["linked"] = (5,)
    info = inspect_checkpoint(folder)
    assert {t.name: t.shape for t in info} == truth
    assert info.format == "sharded safetensors" and len(info.files) == 4


def test_a_relative_index_path_is_read(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    truth = _sharded(tmp_path, ["a.safetensors", "b.safetensors"])
    monkeypatch.chdir(tmp_path)
    info = inspect_checkpoint("model.safetensors.index.json")
    assert {t.name: t.shape for t in info} == truth


def _hub_cache(root: pathlib.Path) -> pathlib.Path:
    """A Hugging Face cache repo as huggingface_hub lays it out: files in ``blobs/<hash>``,
    ``snapshots/<rev>/<name>`` relative links to them."""
    repo = root / "hub" / "models--org--tiny"
    blobs, snap = repo / "blobs", repo / "snapshots" / "0123abcd"
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    weight_map = {}
    for i in range(2):
        save_file({f"layer{i}.weight": torch.zeros(3, i + 1)}, str(blobs / f"blob{i}"))
        name = f"model-0000{i + 1}-of-00002.safetensors"
        (snap / name).symlink_to(f"../../blobs/blob{i}")
        weight_map[f"layer{i}.weight"] = name
    (blobs / "blobindex").write_text(json.dumps({"weight_map": weight_map}))
    (snap / "model.safetensors.index.json").symlink_to("../../blobs/blobindex")
    return snap


def test_a_hugging_face_cache_snapshot_is_read(tmp_path: pathlib.Path) -> None:
    snap = _hub_cache(tmp_path)
    for where in (snap, snap / "model.safetensors.index.json"):
        info = inspect_checkpoint(where)
        assert {t.name: t.shape for t in info} == {"layer0.weight": (3, 1), "layer1.weight": (3, 2)}
    single = tmp_path / "hub" / "models--org--tiny" / "snapshots" / "single"
    single.mkdir()
    (single / "model.safetensors").symlink_to("../../blobs/blob0")
    assert [t.name for t in inspect_checkpoint(single)] == ["layer0.weight"]


# -- safetensors headers: refused where the safetensors library refuses -------------------------


def _st(
    header: object, data: bytes = b"", *, raw: bytes | None = None, n: int | None = None
) -> bytes:
    text = raw if raw is not None else json.dumps(header).encode()
    return struct.pack("<Q", len(text) if n is None else n) + text + data


def _t(shape: object, offsets: object, dtype: object = "U8") -> dict[str, object]:
    return {"dtype": dtype, "shape": shape, "data_offsets": offsets}


_DEEP = b'{"t": {"dtype":"U8","shape":[4],"data_offsets":[0,4],"x":'
_ONE_U8 = b'"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}'  # the end of a header

HEADER_CASES: dict[str, tuple[bytes, str]] = {
    "bytes-do-not-match-shape": (_st({"t": _t([4], [0, 8], "F32")}, b"\0" * 8), "span 8 bytes"),
    "negative-dim": (_st({"t": _t([-4], [0, 4])}, b"\0" * 4), "integers >= 0"),
    "fractional-dim": (_st({"t": _t([4.0], [0, 4])}, b"\0" * 4), "integers >= 0"),
    "bool-dim": (_st({"t": _t([True], [0, 1])}, b"\0"), "integers >= 0"),
    "string-dim": (_st({"t": _t(["4"], [0, 4])}, b"\0" * 4), "integers >= 0"),
    "shape-not-list": (_st({"t": _t(4, [0, 4])}, b"\0" * 4), "integers >= 0"),
    "numel-past-u64": (_st({"t": _t([2**32, 2**32], [0, 0])}), "overflows 2**64"),
    "numel-past-u64-before-zero": (_st({"t": _t([2**62, 4, 4, 0], [0, 0])}), "overflows"),
    "bits-past-u64": (_st({"t": _t([2**62], [0, 0], "F32")}), "overflows 2**64"),
    "dim-past-u64": (_st({"t": _t([2**64, 0], [0, 0])}), "integers >= 0"),
    "unknown-dtype": (_st({"t": _t([4], [0, 4], "F128")}, b"\0" * 4), "does not know"),
    "lowercase-dtype": (_st({"t": _t([4], [0, 16], "f32")}, b"\0" * 16), "does not know"),
    "dtype-not-string": (_st({"t": _t([4], [0, 4], 5)}, b"\0" * 4), "does not know"),
    "offsets-overlap": (
        _st({"a": _t([4], [0, 4]), "b": _t([4], [2, 6])}, b"\0" * 6),
        "overlaps 'a'",
    ),
    "offsets-gap": (_st({"a": _t([4], [0, 4]), "b": _t([4], [5, 9])}, b"\0" * 9), "gap of 1"),
    "offsets-not-from-zero": (_st({"a": _t([4], [2, 6])}, b"\0" * 6), "gap of 2"),
    "begin-after-end": (_st({"a": _t([0], [4, 0])}, b"\0" * 4), "begins after it ends"),
    "three-offsets": (_st({"t": _t([4], [0, 4, 4])}, b"\0" * 4), "two integers"),
    "fractional-offset": (_st({"t": _t([4], [0.0, 4])}, b"\0" * 4), "two integers"),
    "negative-offset": (_st({"t": _t([0], [-1, -1])}), "two integers"),
    "trailing-bytes": (_st({"t": _t([4], [0, 4])}, b"\0" * 5), "MetadataIncompleteBuffer"),
    "missing-shape": (_st({"t": {"dtype": "U8", "data_offsets": [0, 4]}}, b"\0" * 4), "no 'shape'"),
    "entry-is-list": (_st({"t": [1]}, b"\0" * 4), "is a list"),
    "header-is-list": (_st([1]), "neither a safetensors file"),
    "metadata-list": (_st({"__metadata__": [1], "t": _t([4], [0, 4])}, b"\0" * 4), "__metadata__"),
    "metadata-int-value": (_st({"__metadata__": {"a": 1}}), "holding a int"),
    "metadata-nested": (_st({"__metadata__": {"a": {"b": "c"}}}), "__metadata__"),
    "nested-200": (_st(None, b"\0" * 4, raw=_DEEP + b"[" * 200 + b"]" * 200 + b"}}"), "127"),
    "nested-100000": (
        _st(None, b"\0" * 4, raw=_DEEP + b"[" * 100_000 + b"]" * 100_000 + b"}}"),
        "too deeply",
    ),
    "nan": (_st(None, b"\0" * 4, raw=_DEEP + b"NaN}}"), "not valid UTF-8 JSON"),
    "repeated-field": (
        _st(
            None,
            b"\0" * 4,
            raw=b'{"t":{"dtype":"U8","shape":[4],"shape":[4],"data_offsets":[0,4]}}',
        ),
        "gives 'shape' twice",
    ),
    "sub-byte-misaligned": (_st({"t": _t([3], [0, 2], "F4")}, b"\0" * 2), "byte boundary"),
    "not-utf8": (_st(None, b"", raw=b'{"\xff": 1}'), "not valid UTF-8 JSON"),
    "bom": (_st(None, b"", raw=b"\xef\xbb\xbf{}"), "start like neither"),
    "header-length-past-file": (_st({}, n=1000), "does not fit the file"),
    "header-length-zero": (_st(None, b"{}", raw=b"", n=0), "does not fit"),
    "header-length-past-limit": (_st({}, n=100_000_001), "does not fit"),
    "surrogate-name": (
        _st(None, b"\0" * 4, raw=b'{"\\ud800": {"dtype":"U8","shape":[4],"data_offsets":[0,4]}}'),
        "not valid text",
    ),
    # the library reads -0 as the float -0.0 (Python's json gives the int 0)
    "negative-zero-dim": (
        _st(None, raw=b'{"t":{"dtype":"U8","shape":[-0],"data_offsets":[0,0]}}'),
        "integers >= 0",
    ),
    "negative-zero-offset": (
        _st(None, raw=b'{"t":{"dtype":"U8","shape":[0],"data_offsets":[-0,0]}}'),
        "two integers",
    ),
    # __metadata__ text: a lone surrogate is valid JSON but not text (the library refuses it)
    "metadata-surrogate-value": (
        _st(
            None,
            b"\0",
            raw=b'{"__metadata__":{"a":"\\ud800"},' + _ONE_U8,
        ),
        "__metadata__",
    ),
    "metadata-surrogate-key": (
        _st(
            None,
            b"\0",
            raw=b'{"__metadata__":{"\\udc00":"a"},' + _ONE_U8,
        ),
        "__metadata__",
    ),
}


@pytest.mark.parametrize("case", HEADER_CASES)
def test_a_malformed_safetensors_header_is_refused_as_the_library_refuses_it(
    tmp_path: pathlib.Path, case: str
) -> None:
    content, expected = HEADER_CASES[case]
    path = tmp_path / "bad.safetensors"
    path.write_bytes(content)
    with pytest.raises(SafetensorError):  # the truth: the library refuses it too
        safe_open(str(path), framework="pt")
    error, _ = _inspect_watched(path)
    assert isinstance(error, CheckpointError), repr(error)
    assert expected in str(error) and str(path) in str(error)
    assert not _BYTES_REPR.search(str(error))


def test_a_truncated_safetensors_file_says_so(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "t.safetensors"
    save_file({"a": torch.zeros(10), "b": torch.zeros(100)}, str(path))
    path.write_bytes(path.read_bytes()[:-7])
    with pytest.raises(CheckpointError, match="the file is truncated"):
        inspect_checkpoint(path)


# -- what the library accepts is accepted, with the same contents -------------------------------

_F8 = [torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e8m0fnu]

LIBRARY_FILES: dict[str, Callable[[pathlib.Path], None]] = {
    "every-torch-dtype": lambda p: save_file(
        {
            **{f"f8_{i}": torch.zeros(3, 2).to(d) for i, d in enumerate(_F8)},
            "bf16": torch.zeros(2, 3, dtype=torch.bfloat16),
            "f16": torch.zeros(1, dtype=torch.float16),
            "f64": torch.zeros(2, dtype=torch.float64),
            "c64": torch.zeros(2, dtype=torch.complex64),
            "u16": torch.zeros(2, dtype=torch.uint16),
            "u32": torch.zeros(2, dtype=torch.uint32),
            "u64": torch.zeros(2, dtype=torch.uint64),
            "i8": torch.zeros(2, dtype=torch.int8),
            "bool": torch.zeros(7, dtype=torch.bool),
        },
        str(p),
        metadata={"format": "pt", "note": "ünïcode"},
    ),
    "empty-and-0-dim": lambda p: save_file(
        {"empty": torch.zeros(0), "empty2": torch.zeros(3, 0, 2), "scalar": torch.tensor(1.5)},
        str(p),
    ),
    "no-tensors": lambda p: save_file({}, str(p)),
    "leading-whitespace": lambda p: p.write_bytes(
        _st(None, b"\0" * 4, raw=b'  {"t": {"dtype":"U8","shape":[4],"data_offsets":[0,4]}}')
    ),
    "unknown-extra-field": lambda p: p.write_bytes(
        _st({"t": {**_t([4], [0, 4]), "x": [[1, {"y": None}]]}}, b"\0" * 4)
    ),
    "nested-125-in-extra-field": lambda p: p.write_bytes(
        _st(None, b"\0" * 4, raw=_DEEP + b"[" * 125 + b"]" * 125 + b"}}")
    ),
    "out-of-offset-order": lambda p: p.write_bytes(
        _st({"b": _t([4], [4, 8]), "a": _t([2, 2], [0, 4])}, b"\0" * 8)
    ),
    "empties-sharing-an-offset": lambda p: p.write_bytes(
        _st({"a": _t([0], [0, 0]), "b": _t([5, 0], [0, 0]), "c": _t([1], [0, 1])}, b"\0")
    ),
    "huge-dim-times-zero": lambda p: p.write_bytes(_st({"t": _t([2**63, 0], [0, 0])})),
    "zero-then-huge": lambda p: p.write_bytes(_st({"t": _t([0, 2**62, 4, 4], [0, 0])})),
    "sub-byte-dtypes": lambda p: p.write_bytes(
        _st({"f4": _t([4], [0, 2], "F4"), "f6": _t([4], [2, 5], "F6_E2M3")}, b"\0" * 5)
    ),
    "metadata-null": lambda p: p.write_bytes(
        _st({"__metadata__": None, "t": _t([1], [0, 1])}, b"\0")
    ),
}


@pytest.mark.parametrize("case", LIBRARY_FILES)
def test_what_the_safetensors_library_accepts_is_read_the_same(
    tmp_path: pathlib.Path, case: str
) -> None:
    path = tmp_path / "ok.safetensors"
    LIBRARY_FILES[case](path)
    with safe_open(str(path), framework="pt") as f:
        truth = {
            k: (tuple(f.get_slice(k).get_shape()), f.get_slice(k).get_dtype())
            for k in f.keys()  # noqa: SIM118
        }
        metadata = f.metadata() or {}
    info = inspect_checkpoint(path)
    codes = {
        "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2", "float8_e8m0fnu": "F8_E8M0",
        "bfloat16": "BF16", "float16": "F16", "float32": "F32", "float64": "F64",
        "complex64": "C64", "uint16": "U16", "uint32": "U32", "uint64": "U64", "uint8": "U8",
        "int8": "I8", "bool": "BOOL", "float4_e2m1fn": "F4", "float6_e2m3fn": "F6_E2M3",
    }  # fmt: skip
    assert {t.name: (t.shape, codes[t.dtype]) for t in info} == truth
    assert info.metadata == metadata
    for t in info:  # bytes: numel * element size (sub-byte: bits / 8), against torch
        if t.dtype in ("float4_e2m1fn", "float6_e2m3fn"):
            continue
        assert t.nbytes == t.numel * torch.empty(0, dtype=getattr(torch, t.dtype)).element_size()


# -- path containment: a sibling folder whose name starts with the folder's ----------------------


def test_a_link_into_a_sibling_folder_sharing_the_name_prefix_is_refused(
    tmp_path: pathlib.Path,
) -> None:
    """``ckpt-private/`` is outside ``ckpt/`` though its path starts with ``ckpt``."""
    scene = Scene(tmp_path)
    private = tmp_path / "ckpt-private"
    private.mkdir()
    secret = private / "secret.safetensors"
    save_file({"private_only_tensor": torch.zeros(3)}, str(secret))
    (scene.ckpt / "evil.safetensors").symlink_to(secret)
    index = scene.shard_to("evil.safetensors")
    error, opened = _inspect_watched(index)
    assert isinstance(error, CheckpointError), repr(error)
    assert "is a link to a file outside the folder" in str(error)
    assert os.path.realpath(secret) not in opened  # the truth: nothing outside was opened
    assert "private_only_tensor" not in str(error)


# -- read errors --------------------------------------------------------------------------------


def test_a_pipe_is_refused_without_being_opened(tmp_path: pathlib.Path) -> None:
    pipe = tmp_path / "model.safetensors"
    os.mkfifo(pipe)  # opening it would block forever
    error, opened = _inspect_watched(pipe)
    assert isinstance(error, CheckpointError) and "not a regular file" in str(error)
    assert os.path.realpath(pipe) not in opened
