"""The pickle reader's work is counted, never timed (issue 36, items 1, 2 and 8, and two blind
spots): names are charged before they are built, a shape is checked before it is multiplied
out, the limits are steps and bytes (exact at their boundary), the answer does not depend on the
clock, and an opcode ``torch.load(weights_only=True)`` cannot read is refused.

Memory is measured with ``tracemalloc`` in a child process whose address space is capped
(``resource.RLIMIT_AS``), so that a reader that builds gigabytes dies there (a MemoryError), not
in the test session. No test here reads a clock.
"""

from __future__ import annotations

import json
import os
import pathlib
import pickle
import subprocess
import sys
import textwrap
import time
import zipfile
from typing import Any, ClassVar

import pytest
import torch

from meta_widget.checkpoints import CheckpointError, inspect_checkpoint, torch_files
from meta_widget.checkpoints.pickle_budget import MAX_STEPS, Budget, allowance
from meta_widget.checkpoints.pickle_reader import PickleMachine

ROOT = pathlib.Path(__file__).resolve().parents[2]
MiB = 2**20

_CHILD = textwrap.dedent(
    """
    import json, resource, sys, tracemalloc
    import torch
    from meta_widget.checkpoints import CheckpointError, inspect_checkpoint

    def vm():
        with open("/proc/self/status") as f:
            return int(next(x for x in f if x.startswith("VmSize:")).split()[1]) * 1024

    limit = vm() + int(sys.argv[2])
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    tracemalloc.start()
    try:
        inspect_checkpoint(sys.argv[1])
        outcome = "accepted"
    except CheckpointError as exc:
        outcome = "refused: " + str(exc)
    except MemoryError:
        outcome = "MemoryError"
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    print(json.dumps({"outcome": outcome, "peak": peak}))
    """
)


def _inspect_capped(path: pathlib.Path, extra: int = 1536 * MiB) -> dict[str, Any]:
    """inspect_checkpoint(path) in a child with ``extra`` more address space than after its
    imports: its outcome and the peak of Python's allocations (tracemalloc) while reading."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path), str(extra)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=900,  # a hang fails the test; no time is asserted
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
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


def _deflated_save(obj: object, path: pathlib.Path) -> int:
    """``torch.save(obj)`` with its data.pkl deflated (as an attacker ships it); the bytes the
    pickle inflates to."""
    plain = path.with_suffix(".plain")
    torch.save(obj, plain)
    with zipfile.ZipFile(plain) as z:
        name = next(n for n in z.namelist() if n.endswith("data.pkl"))
        data = z.read(name)
    plain.unlink()
    _zip_with_pickle(path, data, zipfile.ZIP_DEFLATED)
    return len(data)


# -- item 1: names are charged before they are built ------------------------------------------


@pytest.mark.parametrize(
    ("key_bytes", "entries", "file_kb"),
    [(2**22, 2000, 9), (2**20, 300, 3)],  # the 8 KB file (+6.8 GB), and its 2.6 KB one
)
def test_a_huge_key_above_many_entries_is_refused_within_the_allowance(
    tmp_path: pathlib.Path, key_bytes: int, entries: int, file_kb: int
) -> None:
    """Every child of the key is named ``kkk…k.N``: 2,000 names of 4 MB were built before the
    first was charged. Now each is charged before it is built: refused within the allowance
    of the file's size, in a child capped at +1.5 GiB (the old reader dies there)."""
    path = tmp_path / "names.pt"
    inflated = _deflated_save({"k" * key_bytes: dict.fromkeys(range(entries), 0)}, path)
    assert path.stat().st_size <= file_kb * 1024
    _, nbytes = allowance(min(inflated, 8 * path.stat().st_size))
    result = _inspect_capped(path)
    assert result["outcome"].startswith("refused: "), result["outcome"][:300]
    assert "MiB to list" in result["outcome"]
    # what the names took (at most the allowance), beside the pickle read whole
    assert result["peak"] <= nbytes + 2 * inflated + 8 * MiB, result


def test_the_names_of_a_real_checkpoint_fit_its_allowance(tmp_path: pathlib.Path) -> None:
    """The same charge does not refuse long names a person would write (1 KB keys)."""
    state = {f"{'x' * 1000}.{i}": {"w": torch.zeros(1)} for i in range(2000)}
    path = tmp_path / "long.pt"
    torch.save(state, path)
    assert len(inspect_checkpoint(path)) == 2000


# -- item 2: a shape is checked before it is multiplied out ------------------------------------


def _tensor_pickle(size: bytes) -> bytes:
    """A data.pkl of ``{"w": tensor}`` whose ``_rebuild_tensor_v2`` size is the opcodes
    ``size`` (a tuple built on the stack), written by hand as torch.save writes it."""
    storage = (
        b"((X\x07\x00\x00\x00storagectorch\nFloatStorage\n"
        b"X\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x01tQ"
    )
    hooks = b"\x89ccollections\nOrderedDict\n)R"
    return (
        b"\x80\x02}X\x01\x00\x00\x00wctorch._utils\n_rebuild_tensor_v2\n"
        + storage
        + b"K\x00"
        + size
        + b")"  # the stride: not read
        + hooks
        + b"tRs."
    )


def _memoized_dims(copies: int, value: int = 2) -> bytes:
    """A tuple of ``copies`` copies of one number: the number once, then a memo reference
    (2 bytes) for each other copy."""
    return b"(K" + bytes([value]) + b"q\x01" + b"h\x01" * (copies - 1) + b"t"


@pytest.mark.parametrize("copies", [30_000, 900_000])
def test_a_shape_of_many_copies_of_one_number_is_refused_for_its_rank(
    tmp_path: pathlib.Path, copies: int
) -> None:
    """The old reader multiplied 2**30000 out (11 s; 300 s for 900,000 copies) and then said
    "Exceeds the limit (4300 digits)"; the rank is checked first, and said."""
    path = tmp_path / "rank.pt"
    _zip_with_pickle(path, _tensor_pickle(_memoized_dims(copies)), zipfile.ZIP_DEFLATED)
    with pytest.raises(CheckpointError) as refused:
        inspect_checkpoint(path)
    message = str(refused.value)
    assert f"a shape of {copies:,} dimensions, past the 64" in message
    assert "digits" not in message


def test_the_rank_limit_sits_past_what_torch_saves_and_loads(tmp_path: pathlib.Path) -> None:
    """64 dimensions are read as torch.load reads them; 65 are refused (torch would build any
    rank; no model has such a tensor)."""
    path = tmp_path / "r64.pt"
    torch.save({"w": torch.zeros((1,) * 63 + (3,))}, path)
    loaded = torch.load(path, weights_only=True)["w"]
    [entry] = inspect_checkpoint(path)
    assert (entry.shape, entry.nbytes) == (tuple(loaded.shape), loaded.nbytes)
    torch.save({"w": torch.zeros((1,) * 65)}, path)
    with pytest.raises(CheckpointError, match="65 dimensions"):
        inspect_checkpoint(path)


def test_a_shape_past_int64_is_refused_without_printing_it(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "big.pt"
    dims = b"(" + b"\x8a\x09" + (2**64).to_bytes(9, "little") + b"K\x02t"  # (2**64, 2)
    _zip_with_pickle(path, _tensor_pickle(dims), zipfile.ZIP_STORED)
    with pytest.raises(CheckpointError, match=r"< 2\*\*63") as refused:
        inspect_checkpoint(path)
    assert "18446744073709551616" not in str(refused.value)


# -- item 8: counted, never timed ----------------------------------------------------------------


class _Recorded(Budget):
    """A budget that keeps itself in :attr:`made`, to read what a file spent."""

    made: ClassVar[list[Budget]] = []

    def __init__(self, shown: str, pickle_bytes: int = 0, **limits: Any) -> None:
        super().__init__(shown, pickle_bytes, **limits)
        _Recorded.made.append(self)


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[Budget]:
    _Recorded.made = []
    monkeypatch.setattr(torch_files, "Budget", _Recorded)
    return _Recorded.made


@pytest.mark.parametrize("tensors", [20_000, pytest.param(100_000, marks=pytest.mark.slow)])
def test_a_large_state_dict_is_read_in_half_its_allowance(
    tmp_path: pathlib.Path, recorded: list[Budget], tensors: int
) -> None:
    """A state dict of 20,000 tensors was refused on a busy machine (after 311,296 steps, by
    the clock). Counted, it takes ~31 steps and ~2.7 KB per tensor, whatever the load: half
    the allowance at most, 100,000 tensors included."""
    state = {f"model.layers.{i}.mlp.up_proj.weight": torch.empty(0) for i in range(tensors)}
    path = tmp_path / "many.pt"
    torch.save(state, path)
    info = inspect_checkpoint(path)
    assert len(info) == tensors
    [budget] = recorded
    assert 31 * tensors <= budget.steps <= 32 * tensors  # counted: the same on every machine
    assert budget.steps <= budget.max_steps / 2 and budget.bytes <= budget.max_bytes / 2


def test_the_answer_does_not_depend_on_the_clock(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A machine so loaded that every look at the clock finds an hour gone: the file is read
    all the same (the old reader refused it after its 10 s)."""
    state = {f"layers.{i}.w": torch.empty(0) for i in range(20_000)}
    path = tmp_path / "many.pt"
    torch.save(state, path)
    hours = iter(range(0, 10**9, 3600))
    for clock in ("monotonic", "perf_counter", "time", "process_time", "thread_time"):
        monkeypatch.setattr(time, clock, lambda: float(next(hours)))
    assert len(inspect_checkpoint(path)) == 20_000


def _nones(count: int) -> bytes:
    """A pickle of PROTO, ``count`` NONEs (8 bytes each on the stack) and STOP: ``count + 2``
    steps."""
    return b"\x80\x02" + b"N" * count + b"."


def _run_machine(data: bytes, **limits: int) -> Budget:
    budget = Budget("x.pt", **limits)
    assert PickleMachine(data, 0, budget).load() is None
    return budget


def test_the_step_limit_is_exact() -> None:
    """A pickle of exactly the limit's steps is read; one step more is refused (a check made
    before the step is counted would let it through)."""
    assert _run_machine(_nones(98), max_steps=100).steps == 100
    with pytest.raises(
        CheckpointError, match="more than 100 steps to read and list; refused after 100 steps"
    ):
        _run_machine(_nones(99), max_steps=100)


def test_the_byte_limit_is_exact() -> None:
    assert _run_machine(_nones(100), max_bytes=800).bytes == 800
    with pytest.raises(CheckpointError, match="more than 0 MiB to list; refused after 101 steps"):
        _run_machine(_nones(101), max_bytes=800)


def test_a_charge_is_checked_with_itself_added() -> None:
    budget = Budget("x.pt", max_steps=10, max_bytes=1000)
    budget.charge(1000, 10)
    for nbytes, steps in ((1, 0), (0, 1)):
        with pytest.raises(CheckpointError, match="refused after 10 steps"):
            budget.charge(nbytes, steps)
    with pytest.raises(CheckpointError, match="refused after 0 steps"):
        Budget("x.pt", max_bytes=1000).charge(1001, 0)  # one charge past the limit, at once
    with pytest.raises(CheckpointError, match="refused after 0 steps"):
        Budget("x.pt", max_steps=10).charge(0, 11)


def test_the_allowance_grows_with_the_pickle_up_to_a_ceiling() -> None:
    assert allowance(0) == (1_000_000, 64 * MiB)
    assert allowance(1000) == (1_001_000, 64 * MiB + 64_000)
    assert allowance(64 * MiB) == (MAX_STEPS, 512 * MiB)


@pytest.mark.parametrize(
    "pickle_bytes",
    [
        # a 1,000-value key used 2,000 times through the memo: 2 million values hashed
        b"\x80\x02}(" + b"K\x01" * 1000 + b"tq\x01K\x00s" + b"h\x01K\x00s" * 1999 + b".",
        # a set built 2,000 times from one memoized list of 1,000 numbers
        b"\x80\x02](]("
        + b"K\x01" * 1000
        + b"eq\x01"
        + b"c__builtin__\nset\nh\x01\x85R" * 2000
        + b"e.",
    ],
    ids=["memoized-key", "memoized-set"],
)
def test_hashing_is_counted(pickle_bytes: bytes) -> None:
    """A memoized value hashed again and again costs a step per value it holds, each time: a
    few KB of pickle cannot buy more hashing than its allowance of steps."""
    budget = Budget("x.pt", max_steps=10**8, max_bytes=2**30)
    PickleMachine(pickle_bytes, 0, budget).load()
    assert budget.steps >= 2000 * 1000


def test_writing_a_huge_integer_key_is_counted(
    tmp_path: pathlib.Path, recorded: list[Budget]
) -> None:
    """Writing an int's digits takes time quadratic in its size (17 us for the 2,040 bits a
    LONG1 holds, ~50 steps): one memoized in 1,000 dicts names 1,000 entries, 50 steps each."""
    big = b"\x8a\xff" + b"\xff" * 254 + b"\x7f"  # 2**2039 - 1: LONG1 of 255 bytes
    dicts = b"}" + big + b"q\x01Ns" + b"}h\x01Ns" * 999
    path = tmp_path / "bigkeys.pt"
    _zip_with_pickle(path, b"\x80\x02](" + dicts + b"e.", zipfile.ZIP_STORED)
    info = inspect_checkpoint(path)
    assert len(info.others) == 1000 and f"999.{2**2039 - 1}" in info.others
    [budget] = recorded
    assert budget.steps >= 1000 * 50


def test_a_key_of_too_many_values_is_refused() -> None:
    key = b"(" + b"K\x01" * 1025 + b"t"
    with pytest.raises(CheckpointError, match="a key of more than 1024 values"):
        PickleMachine(b"\x80\x02}" + key + b"K\x00s.", 0, Budget("x.pt")).load()


# -- blind spot: opcodes torch.load(weights_only=True) cannot read --------------------------------

#: a pickle using each opcode the reader reads but torch.load(weights_only=True) refuses
_NOT_WEIGHTS_ONLY = {
    "DUP": b"\x80\x02}2.",
    "POP": b"\x80\x02}N0.",
    "FRAME": b"\x80\x04\x95\x02\x00\x00\x00\x00\x00\x00\x00}.",
    "SHORT_BINUNICODE": b"\x80\x02}\x8c\x01aK\x01s.",
    "MEMOIZE": b"\x80\x02}\x94.",
    "STACK_GLOBAL": b"\x80\x02X\x0b\x00\x00\x00collectionsX\x0b\x00\x00\x00OrderedDict\x93)R.",
    "SHORT_BINBYTES": b"\x80\x02}X\x01\x00\x00\x00aC\x01bs.",
    "BINBYTES": b"\x80\x02}X\x01\x00\x00\x00aB\x01\x00\x00\x00bs.",
    "BINSTRING": b"\x80\x02}X\x01\x00\x00\x00aT\x01\x00\x00\x00bs.",
    "LONG4": b"\x80\x02}X\x01\x00\x00\x00a\x8b\x01\x00\x00\x00\x05s.",
}


@pytest.mark.filterwarnings("ignore:Detected pickle protocol 4:UserWarning")
@pytest.mark.parametrize("opcode", _NOT_WEIGHTS_ONLY)
def test_an_opcode_torch_load_refuses_is_refused(tmp_path: pathlib.Path, opcode: str) -> None:
    data = _NOT_WEIGHTS_ONLY[opcode]
    assert pickle.loads(data) is not None  # a valid pickle, which plain pickle reads
    path = tmp_path / "op.pt"
    _zip_with_pickle(path, data, zipfile.ZIP_STORED)
    with pytest.raises(pickle.UnpicklingError, match="Unsupported operand"):
        torch.load(path, weights_only=True)  # the truth
    with pytest.raises(CheckpointError, match=f"holds {opcode}") as refused:
        inspect_checkpoint(path)
    assert "torch.load(weights_only=True) cannot read" in str(refused.value)
