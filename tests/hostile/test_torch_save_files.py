"""Hostile ``torch.save`` files (zip and legacy pickles) and checkpoints that name a tensor twice
or cannot be read: each refused with a ``CheckpointError`` that says what is wrong, in bounded
time and memory, never described by its raw bytes (split from ``test_checkpoint_files.py``,
which keeps the folders, indexes and safetensors headers).
"""

from __future__ import annotations

import json
import os
import pathlib
import pickle
import re
import sys
import tracemalloc
import zipfile

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from meta_widget.checkpoints import CheckpointError, UnsafeCheckpointError, inspect_checkpoint

MiB = 1024 * 1024
#: text a refused file holds, which no message may quote
SECRET = "TOPSECRET-7f3a9c"
_BYTES_REPR = re.compile(r"(?<![\w'\"])b['\"]")  # b'...' or b"...": a repr of raw bytes


# -- torch.save pickles -------------------------------------------------------------------------


def _peak_bytes(path: pathlib.Path) -> tuple[object, int]:
    """inspect_checkpoint(path) (or the error it raised) and the Python memory peak it took."""
    tracemalloc.start()
    try:
        try:
            result: object = inspect_checkpoint(path)
        except CheckpointError as exc:
            result = exc
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_few_kb_pickle_of_shared_containers_is_listed_once(tmp_path: pathlib.Path) -> None:
    """20**10 paths to one tensor in a few KB: each container expanded once, bounded memory."""
    a: object = {"w": torch.zeros(2)}
    for _ in range(10):
        a = {str(i): a for i in range(20)}
    path = tmp_path / "bomb.pt"
    torch.save(a, path)
    assert path.stat().st_size < 8 * 1024
    info, peak = _peak_bytes(path)
    assert not isinstance(info, Exception), info
    assert [t.name for t in info] == [".".join(["0"] * 10) + ".w"]  # type: ignore[attr-defined]
    others = info.others  # type: ignore[attr-defined]
    assert len(others) == 10 * 19  # each level: 19 more references to the one container
    assert others["1"] == "same dict as 0" and others["0.0.5"] == "same dict as 0.0.0"
    assert "190 reference(s)" in info.notes[0]  # type: ignore[attr-defined]
    assert peak < 16 * MiB, peak


def test_the_list_bomb_from_the_issue_is_bounded(tmp_path: pathlib.Path) -> None:
    a: object = [torch.zeros(1)]
    for _ in range(10):
        a = [a] * 20 + [torch.zeros(1)]
    path = tmp_path / "bomb.pt"
    torch.save(a, path)
    assert path.stat().st_size < 8 * 1024
    info, peak = _peak_bytes(path)
    assert not isinstance(info, Exception), info
    assert len(info) == 11 and len(info.others) == 10 * 19  # type: ignore[arg-type, attr-defined]
    assert peak < 16 * MiB, peak
    plain: object = []
    for _ in range(10):  # the issue's literal file: lists of lists, no tensors
        plain = [plain] * 20
    torch.save(plain, path)
    assert inspect_checkpoint(path).others == {"<root>": "list"}


def test_self_referencing_pickles_are_listed(tmp_path: pathlib.Path) -> None:
    d: dict[str, object] = {"w": torch.zeros(3)}
    d["self"] = d
    path = tmp_path / "loop.pt"
    torch.save(d, path)
    info = inspect_checkpoint(path)
    assert [t.name for t in info] == ["w"] and info.others == {"self": "same dict as <root>"}
    loop: list[object] = [torch.zeros(1)]
    loop.append(loop)
    torch.save(loop, path)
    info = inspect_checkpoint(path)
    assert [t.name for t in info] == ["0"] and info.others == {"1": "same list as <root>"}


def test_nesting_past_the_cap_is_refused(tmp_path: pathlib.Path) -> None:
    deep: dict[str, object] = {"w": torch.zeros(1)}
    for _ in range(150):
        deep = {"x": deep}
    path = tmp_path / "deep.pt"
    torch.save(deep, path)
    with pytest.raises(CheckpointError, match="more than 100 levels deep"):
        inspect_checkpoint(path)


def _saved(tmp_path: pathlib.Path) -> bytes:
    path = tmp_path / "good.pt"
    torch.save({"w": torch.zeros(1000), "b": torch.ones(3)}, path)
    return path.read_bytes()


@pytest.mark.parametrize("cut", [0.5, 0.98])
def test_a_truncated_zip_says_truncated(tmp_path: pathlib.Path, cut: float) -> None:
    data = _saved(tmp_path)
    path = tmp_path / "cut.pt"
    path.write_bytes(data[: int(len(data) * cut)])
    with pytest.raises(CheckpointError) as info:
        inspect_checkpoint(path)
    message = str(info.value)
    assert (
        "truncated" in message and "incompatible" not in message and not _BYTES_REPR.search(message)
    )


def test_a_damaged_zip_is_a_checkpoint_error(tmp_path: pathlib.Path) -> None:
    data = bytearray(_saved(tmp_path))
    start = data.index(b"data.pkl") + 40  # inside the pickle record: bytes torch cannot decode
    data[start : start + 60] = b"\xff" * 60
    path = tmp_path / "bad.pt"
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="truncated or damaged"):
        inspect_checkpoint(path)


def test_a_truncated_legacy_pickle_is_a_checkpoint_error(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "legacy.pt"
    torch.save({"w": torch.zeros(10)}, path, _use_new_zipfile_serialization=False)
    path.write_bytes(path.read_bytes()[:50])
    with pytest.raises(CheckpointError) as info:
        inspect_checkpoint(path)
    assert not isinstance(info.value, UnsafeCheckpointError)
    assert "truncated or damaged" in str(info.value) and "incompatible" not in str(info.value)


def test_a_zip_bomb_pickle_is_refused_before_it_is_inflated(tmp_path: pathlib.Path) -> None:
    good = tmp_path / "good.pt"
    torch.save({"w": torch.zeros(2)}, good)
    path = tmp_path / "bomb.pt"
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as out:
        for record in src.infolist():
            body = src.read(record.filename)
            if record.filename.endswith("data.pkl"):  # torch stops at STOP; the rest inflates
                body += bytes(65 * MiB)
            out.writestr(record.filename, body)
    assert path.stat().st_size < 2 * MiB
    result, peak = _peak_bytes(path)
    assert isinstance(result, CheckpointError) and "would take" in str(result)
    assert peak < 16 * MiB, peak


def test_a_plain_pickle_that_would_run_code_stays_unsafe(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "evil.pt"
    path.write_bytes(pickle.dumps({"w": 1, "x": os.system}, protocol=4))
    with pytest.raises(UnsafeCheckpointError, match="nothing was executed"):
        inspect_checkpoint(path)


def test_neither_format_is_described_without_its_bytes(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "notes.bin"
    path.write_text(SECRET)
    with pytest.raises(CheckpointError, match="neither a safetensors file") as info:
        inspect_checkpoint(path)
    assert SECRET[:8] not in str(info.value)


# -- one shard named two ways -------------------------------------------------------------------


def test_one_shard_named_two_ways_is_one_shard(tmp_path: pathlib.Path) -> None:
    save_file({"a.w": torch.zeros(2, 3), "b.w": torch.zeros(4)}, str(tmp_path / "a.safetensors"))
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"a.w": "a.safetensors", "b.w": "./a.safetensors"}}))
    info = inspect_checkpoint(index)
    with safe_open(str(tmp_path / "a.safetensors"), framework="pt") as f:  # the truth
        truth = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
    assert {t.name: t.shape for t in info} == truth
    assert len(info.files) == 1 and info.notes == []


# -- integers no weights-only load can read -----------------------------------------------------


def test_a_huge_integer_key_is_refused_for_what_it_is(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "bigkey.pt"
    torch.save({10**10000: torch.zeros(1)}, path)
    with pytest.raises(Exception) as truth:  # torch cannot load it safely either
        torch.load(path, weights_only=True)
    assert "Unsupported operand" in str(truth.value)
    with pytest.raises(CheckpointError) as info:
        inspect_checkpoint(path)
    message = str(info.value)
    assert not isinstance(info.value, UnsafeCheckpointError)
    assert "arbitrary code" not in message and "would call" not in message
    assert "LONG4 (an integer of more than 255 bytes" in message and str(path) in message


# -- one name, two tensors ----------------------------------------------------------------------


class _TwoLayers(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)
        self.out = torch.nn.Linear(3, 2)


def test_a_name_given_twice_is_reported_and_never_said_to_fit(tmp_path: pathlib.Path) -> None:
    from meta_widget.checkpoints import checkpoint_diff

    model = _TwoLayers()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state["fc.weight"] = torch.zeros(5, 4)  # listed first, the wrong shape ...
    state["fc"] = {"weight": torch.zeros(3, 4)}  # ... and the same name again, nested
    path = tmp_path / "twice.pt"
    torch.save(state, path)
    loaded = torch.load(path, weights_only=True)  # the truth: two tensors behind one name
    assert loaded["fc.weight"].shape != loaded["fc"]["weight"].shape

    info = inspect_checkpoint(path)
    assert [t.name for t in info].count("fc.weight") == 1
    assert [(t.name, t.shape) for t in info.duplicates] == [("fc.weight", (3, 4))]
    assert any("given twice" in n for n in info.notes)
    diff = checkpoint_diff(model, info)
    assert not diff.ok
    assert diff.duplicates == [("fc.weight", (5, 4), (3, 4))]
    assert ("fc.weight", tuple(model.fc.weight.shape), (5, 4)) in diff.shape_mismatches
    text = str(diff)
    assert "fits" not in text and "given twice in the checkpoint: fc.weight" in text


# -- read errors --------------------------------------------------------------------------------


def test_an_io_error_is_a_checkpoint_error() -> None:
    """/proc/self/mem is a regular file whose first page cannot be read (EIO)."""
    with pytest.raises(OSError), open("/proc/self/mem", "rb") as f:  # the truth: it fails
        f.read(64)
    with pytest.raises(CheckpointError, match=r"'/proc/self/mem' cannot be read \(") as info:
        inspect_checkpoint("/proc/self/mem")
    assert isinstance(info.value.__cause__, OSError)


_UNREADABLE = """
import os, sys
from meta_widget.checkpoints import CheckpointError, inspect_checkpoint
if os.getuid() == 0:
    os.setgid(65534)
    os.setuid(65534)  # nobody: root reads every file
try:
    open(sys.argv[1], "rb").close()
    print("readable")
except PermissionError:
    try:
        inspect_checkpoint(sys.argv[1])
        print("accepted")
    except CheckpointError as exc:
        print("CheckpointError:", exc)
"""


def test_an_unreadable_file_is_a_checkpoint_error(tmp_path: pathlib.Path) -> None:
    import subprocess
    import tempfile

    folder = pathlib.Path(tempfile.mkdtemp())  # under /tmp, which every user may cross
    try:
        folder.chmod(0o711)
        path = folder / "model.safetensors"
        save_file({"w": torch.zeros(2)}, str(path))
        path.chmod(0o000)
        root = pathlib.Path(__file__).resolve().parents[2]
        out = subprocess.run(
            [sys.executable, "-c", _UNREADABLE, str(path)],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(root)},
            check=False,
            timeout=300,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        if out.stdout.strip() == "readable":
            pytest.skip("this user reads a file with mode 000 (no way to drop the right)")
        assert out.stdout.startswith("CheckpointError:"), out.stdout + out.stderr[-2000:]
        assert "cannot be read (Permission denied)" in out.stdout
        assert "check its permissions" in out.stdout
    finally:
        for p in folder.iterdir():
            p.unlink()
        folder.rmdir()
