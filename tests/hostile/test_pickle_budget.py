"""Small files that would eat memory or time: every torch.save file is read under one budget
(steps taken, bytes built; never seconds), enforced as the pickle is read, for zip and legacy
(pre-zip) files alike; legacy files are read without torch.load.

Each hostile file is inspected in a fresh process whose address space is capped at what it had
after its imports plus the file's allowance of bytes and a margin (``resource.RLIMIT_AS``): a
reader that went past the budget would die there with a MemoryError instead of a
CheckpointError. No test here reads a clock: work is bounded by counts, which are the same on a
busy machine as on an idle one.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap
import zipfile

import pytest
import torch

from meta_widget.checkpoints import CheckpointError, inspect_checkpoint
from meta_widget.checkpoints.pickle_budget import MAX_BYTES, MAX_STEPS, allowance

ROOT = pathlib.Path(__file__).resolve().parents[2]
MiB = 1024 * 1024

_MEASURE = textwrap.dedent(
    """
    import json, resource, sys
    import torch
    from meta_widget.checkpoints import CheckpointError, inspect_checkpoint

    def status(key):
        with open("/proc/self/status") as f:
            return int(next(x for x in f if x.startswith(key)).split()[1]) * 1024

    extra = int(sys.argv[2])
    base_vm, base_rss = status("VmSize:"), status("VmHWM:")
    resource.setrlimit(resource.RLIMIT_AS, (base_vm + extra, base_vm + extra))
    try:
        inspect_checkpoint(sys.argv[1])
        outcome = "accepted"
    except CheckpointError as exc:
        outcome = "refused: " + str(exc)
    except MemoryError:
        outcome = "MemoryError"
    print(json.dumps({"outcome": outcome,
                      "peak_rss": status("VmHWM:") - base_rss,
                      "peak_vm": status("VmPeak:") - base_vm}))
    """
)


def _measure(path: pathlib.Path, extra: int = MAX_BYTES + 256 * MiB) -> dict[str, object]:
    """inspect_checkpoint(path) in a fresh process limited to ``extra`` more address space (by
    default the most bytes any file may build, and room for the pickle itself)."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    out = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(path), str(extra)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=900,  # a hang fails the test; no time is asserted
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _zip_with_pickle(path: pathlib.Path, pickle_bytes: bytes, compression: int) -> None:
    """A torch.save zip whose data.pkl is ``pickle_bytes`` (its other records kept)."""
    good = path.with_suffix(".good")
    torch.save({"w": torch.zeros(2)}, good)
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(path, "w", compression) as out:
        for record in src.infolist():
            body = src.read(record.filename)
            out.writestr(
                record.filename, pickle_bytes if record.filename.endswith("data.pkl") else body
            )
    good.unlink()


def _legacy_with_pickle(path: pathlib.Path, main_pickle: bytes) -> None:
    """A legacy torch.save file: its magic number, protocol and system-info pickles from a real
    one, then ``main_pickle``."""
    good = path.with_suffix(".good")
    torch.save({}, good, _use_new_zipfile_serialization=False)
    data = good.read_bytes()
    good.unlink()
    head = _legacy_head(data)
    path.write_bytes(head + main_pickle)


def _legacy_head(data: bytes) -> bytes:
    """The first three pickles of a legacy torch.save file."""
    import io
    import pickle

    f = io.BytesIO(data)
    for _ in range(3):
        pickle.load(f)
    return data[: f.tell()]


_EMPTY_DICTS = b"\x80\x02](" + b"}" * (8 << 20) + b"e."  # the pickle: 8 M empty dicts
_STORED_DICTS = b"\x80\x02](" + b"}" * ((16 << 20) - 6) + b"e."  # 16 MiB, stored


def _deflated_dicts(path: pathlib.Path) -> None:
    _zip_with_pickle(path, _EMPTY_DICTS, zipfile.ZIP_DEFLATED)
    assert path.stat().st_size < 64 * 1024  # a few KB on disk


def _stored_dicts(path: pathlib.Path) -> None:
    _zip_with_pickle(path, _STORED_DICTS, zipfile.ZIP_STORED)
    assert path.stat().st_size > 16 * MiB


def _legacy_string(path: pathlib.Path) -> None:
    size = 200_000_000  # a 200 MB string (BINUNICODE) as the object
    _legacy_with_pickle(path, b"\x80\x02X" + size.to_bytes(4, "little") + b"a" * size + b".")


def _legacy_ints(path: pathlib.Path) -> None:
    count = 20_000_000  # a 100 MB list of ints (BININT, 5 bytes each)
    body = b"J\x00\x00\x01\x00" * count
    _legacy_with_pickle(path, b"\x80\x02](" + body + b"e.")


def _legacy_dicts(path: pathlib.Path) -> None:
    _legacy_with_pickle(path, _STORED_DICTS)


HOSTILE = {
    "9kb-deflated-empty-dicts": _deflated_dicts,
    "16mib-stored-empty-dicts": _stored_dicts,
    "legacy-200mb-string": _legacy_string,
    "legacy-100mb-list-of-ints": _legacy_ints,
    "legacy-16mib-empty-dicts": _legacy_dicts,
}


@pytest.mark.parametrize("case", HOSTILE)
def test_a_small_hostile_pickle_is_refused_within_its_allowance(
    tmp_path: pathlib.Path, case: str
) -> None:
    path = tmp_path / "hostile.pt"
    HOSTILE[case](path)
    result = _measure(path)
    outcome = str(result["outcome"])
    assert outcome.startswith("refused: "), outcome[:500]
    assert str(path) in outcome and "refused after" in outcome, outcome[:500]
    assert _spent(outcome) <= MAX_STEPS, outcome[:500]
    # beside what it builds, the pickle's own bytes are in memory (64 MiB at most)
    pickle_bytes = min(path.stat().st_size, 64 * MiB)
    assert result["peak_rss"] <= MAX_BYTES + 2 * pickle_bytes + 64 * MiB, result  # type: ignore[operator]


def _spent(refusal: str) -> int:
    """The steps a refusal says were taken."""
    found = re.search(r"refused after ([\d,]+) steps", refusal)
    assert found is not None, refusal
    return int(found[1].replace(",", ""))


def test_legacy_files_are_not_given_to_torch_load(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A legacy file is read to the same truth torch.load gives, without torch.load."""
    state = {
        "fc.weight": torch.zeros(5, 4),
        "fc.bias": torch.zeros(5, dtype=torch.float16),
        "emb": torch.nn.Parameter(torch.zeros(3, 2, dtype=torch.bfloat16)),
        "steps": torch.tensor(7),
        "view": torch.arange(10.0)[2:5],
        "epoch": 3,
    }
    path = tmp_path / "legacy.pt"
    torch.save(state, path, _use_new_zipfile_serialization=False)
    truth = torch.load(path, weights_only=True)

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("torch.load was called on the file")

    monkeypatch.setattr(torch, "load", refuse)
    info = inspect_checkpoint(path)
    assert {t.name: (t.shape, t.dtype) for t in info} == {
        k: (tuple(v.shape), str(v.dtype).removeprefix("torch."))
        for k, v in truth.items()
        if isinstance(v, torch.Tensor)
    }
    assert info.others == {"epoch": "int"}


def test_a_real_checkpoint_within_the_budget_is_read(tmp_path: pathlib.Path) -> None:
    """20,000 tensors (an optimizer state of a large model) stay well within the budget."""
    state = {f"layers.{i}.w": torch.empty(0) for i in range(20_000)}
    path = tmp_path / "many.pt"
    torch.save(state, path)
    result = _measure(path)
    assert result["outcome"] == "accepted", str(result["outcome"])[:500]
    info = inspect_checkpoint(path)
    assert len(info) == 20_000


def test_the_budget_is_a_checkpoint_error_in_process(tmp_path: pathlib.Path) -> None:
    """The 9 KB bomb gets the allowance of its size in the file (deflated 1,000 times: counted
    as at most 8 times its compressed size), not of the 8 MB it inflates to."""
    path = tmp_path / "dicts.pt"
    _deflated_dicts(path)
    with zipfile.ZipFile(path) as z:
        record = next(r for r in z.infolist() if r.filename.endswith("data.pkl"))
    assert record.file_size > 8 * MiB and record.compress_size < 16 * 1024
    _, nbytes = allowance(8 * record.compress_size)
    assert nbytes < 70 * MiB
    with pytest.raises(CheckpointError, match="refused after") as refused:
        inspect_checkpoint(path)
    assert f"would take more than {nbytes / MiB:.0f} MiB" in str(refused.value)


_CRASHERS = {
    # hashing a tuple nested 500,000 deep overflows CPython's C stack (a segfault, no error)
    "deep-tuple-as-key": b"\x80\x02})" + b"\x85" * 500_000 + b"K\x01s.",
    "text-not-utf8": b"\x80\x02X\x02\x00\x00\x00\xff\xfe.",
}


@pytest.mark.parametrize("case", _CRASHERS)
def test_a_pickle_that_would_crash_the_reader_is_refused(tmp_path: pathlib.Path, case: str) -> None:
    path = tmp_path / "crash.pt"
    _zip_with_pickle(path, _CRASHERS[case], zipfile.ZIP_DEFLATED)
    result = _measure(path)  # in a child process: a crash fails the test, not the session
    assert str(result["outcome"]).startswith("refused: "), result
    assert "truncated or damaged" in str(result["outcome"])
