"""Sources never copy real tensor data, wherever the user's module holds a tensor (issue 10.2).

A real 1 GiB CPU tensor is made with ``torch.empty``: its pages are never touched, so it costs
no resident memory until something copies it (a deepcopy writes every byte). Resident memory is
read from ``/proc/self/statm`` (current) and ``getrusage`` (the process's peak).
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import resource
import subprocess
import sys
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch

import meta_widget as mw
from meta_widget.sources.models import SourceError, meta_copy, reachable_tensors

GIB = 2**30
LIMIT = 64 * 2**20
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


def _peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x).relu()


class Holder:
    def __init__(self, t: Any) -> None:
        self.t = t


@dataclasses.dataclass
class Record:
    name: str
    tensor: Any


class Slotted:
    __slots__ = ("t",)

    def __init__(self, t: Any) -> None:
        self.t = t


#: where the tensor is put: a name, and how to hold it / how to read it back from a copy
PLACES: dict[str, tuple[Callable[[Any], Any], Callable[[Any], Any]]] = {
    "list": (lambda t: [1, t], lambda s: s[1]),
    "dict": (lambda t: {"w": t}, lambda s: s["w"]),
    "tuple": (lambda t: (t,), lambda s: s[0]),
    "set": (lambda t: {t}, lambda s: next(iter(s))),
    "object attribute": (Holder, lambda s: s.t),
    "nested object": (lambda t: Holder(Holder([{"deep": t}])), lambda s: s.t.t[0]["deep"]),
    "dataclass": (lambda t: Record("r", t), lambda s: s.tensor),
    "slots": (Slotted, lambda s: s.t),
    "view in a list": (lambda t: [t[16:].view(-1, 16)], lambda s: s[0]),
}


def _real_big_storages() -> set[int]:
    """Storages of real tensors of 1 GiB or more alive in the process (an independent look)."""
    with warnings.catch_warnings():  # isinstance() wakes deprecated lazy attributes of torch
        warnings.simplefilter("ignore")
        tensors = [o for o in gc.get_objects() if isinstance(o, torch.Tensor)]
    return {
        t.untyped_storage()._cdata
        for t in tensors
        if not t.is_meta and t.untyped_storage().nbytes() >= GIB
    }


@pytest.fixture(scope="module", autouse=True)
def _warm() -> None:
    # the first analysis of a process imports and caches things: not what is measured
    mw.analyze(Net(), input_size=(2, 8))


@pytest.mark.parametrize("place", list(PLACES))
def test_real_tensor_held_anywhere_is_not_copied(place: str) -> None:
    hold, read = PLACES[place]
    big = torch.empty(GIB // 4)  # float32: 1 GiB, untouched
    model = Net()
    model.stash = hold(big)
    held = read(model.stash)
    gc.collect()
    rss, peak = _rss(), _peak()
    a = mw.analyze(model, input_size=(2, 8))
    grown, peak_grown = _rss() - rss, _peak() - peak
    try:
        assert a.error is None
        assert grown < LIMIT, f"{place}: RSS grew by {grown / 2**20:.0f} MiB"
        assert peak_grown < LIMIT, f"{place}: peak RSS grew by {peak_grown / 2**20:.0f} MiB"
        # no real 1 GiB storage alive but the user's own
        assert _real_big_storages() == {big.untyped_storage()._cdata}
        # the copy holds a meta stand-in with the same layout as what the user holds
        copy = read(a.source_model.module.stash)
        assert copy.is_meta
        assert (copy.shape, copy.stride(), copy.storage_offset(), copy.dtype) == (
            held.shape,
            held.stride(),
            held.storage_offset(),
            held.dtype,
        )
        # the user's tensor is untouched: still real, still where it was
        assert read(model.stash) is held and not held.is_meta
    finally:
        del a, model, big, held
        gc.collect()


def test_views_and_ties_stay_views_and_ties() -> None:
    base = torch.arange(64.0)
    model = Net()
    model.stash = [base, base[8:].view(7, 8), {"again": base}]
    model.fc.weight = torch.nn.Parameter(base[:32].view(4, 8))  # a parameter that is a view
    copy = meta_copy(model)
    a, view, again = copy.stash[0], copy.stash[1], copy.stash[2]["again"]
    assert a.is_meta and view.is_meta
    assert again is a  # one object stays one object
    key = a.untyped_storage()._cdata
    assert view.untyped_storage()._cdata == key  # a view stays a view of the same storage
    assert copy.fc.weight.untyped_storage()._cdata == key
    assert (view.shape, view.stride(), view.storage_offset()) == ((7, 8), (8, 1), 8)
    assert isinstance(copy.fc.weight, torch.nn.Parameter) and copy.fc.weight.requires_grad
    assert a.untyped_storage().nbytes() == base.untyped_storage().nbytes()
    assert not base.is_meta and model.stash[0] is base


def test_shared_references_are_walked_once() -> None:
    """A list holding the same list 20 times, 10 levels deep: 20**10 paths, 10 objects."""
    leaf: Any = [torch.zeros(2)]
    for _ in range(10):
        leaf = [leaf] * 20
    model = Net()
    model.stash = leaf
    found = reachable_tensors(model)
    assert sum(1 for _, t in found if t.shape == (2,)) == 1
    copied = meta_copy(model)
    inner = copied.stash
    for _ in range(10):
        inner = inner[19]
    assert inner[0].is_meta


def test_cycles_are_fine() -> None:
    model = Net()
    loop: list[Any] = [torch.zeros(3)]
    loop.append(loop)
    model.stash = loop
    copied = meta_copy(model)
    assert copied.stash[1] is copied.stash and copied.stash[0].is_meta


def test_too_deep_state_is_refused_not_copied() -> None:
    model = Net()
    deep: Any = torch.zeros(1)
    for _ in range(600):
        deep = [deep]
    model.stash = deep
    with pytest.raises(SourceError, match="nests deeper than"):
        meta_copy(model)


# ---------------------------------------------------------------------------------------------
# 512 MiB of data in containers deepcopy copies without the search seeing it (issue 23.3),
# measured in a fresh process each: its resident memory, and its peak (VmHWM, reset just before
# the analysis through /proc/self/clear_refs), before and after mw.analyze

_HOLDERS = r"""
import array, collections, ctypes, gc, json, mmap, re, sys
import numpy as np, torch
import meta_widget as mw

N = 512 * 2**20
PAGE = {page}


def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def hwm():
    with open("/proc/self/status") as f:
        return int(re.search(r"VmHWM:\s+(\d+)", f.read()).group(1)) * 1024


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(x).relu()


MAKE = {{
    "deque": lambda: collections.deque([torch.empty(N // 4)]),
    "exception": lambda: ValueError("bad batch", torch.empty(N // 4)),
    "numpy": lambda: np.empty(N, dtype=np.uint8),
    "array.array": lambda: array.array("b", [0]) * N,
    "bytearray": lambda: bytearray(N),
    "memoryview": lambda: memoryview(bytearray(N)),
    "mmap": lambda: mmap.mmap(-1, N),
    "ctypes array": lambda: (ctypes.c_char * N)(),
    "torch storage": lambda: torch.UntypedStorage(N),
}}

mw.analyze(Net(), input_size=(2, 8))  # the first analysis imports and caches: not measured
model = Net()
model.stash = MAKE[sys.argv[1]]()
gc.collect()
try:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak (VmHWM) starts again from the resident memory now
    reset = True
except OSError:
    reset = False
before, peak = rss(), hwm()
a = mw.analyze(model, input_size=(2, 8))
grown, peak_grown = rss() - before, hwm() - peak
held = a.source_model.module.stash
inner = held[0] if isinstance(held, collections.deque) else held
inner = inner.args[1] if isinstance(inner, ValueError) else inner
print(json.dumps({{
    "error": None if a.error is None else a.error.message,
    "grown": grown,
    "peak_grown": peak_grown if reset else None,
    "shared": held is model.stash,
    "meta": isinstance(inner, torch.Tensor) and inner.is_meta,
    "meta storage": isinstance(inner, torch.UntypedStorage) and inner.device.type == "meta",
    "stand-in nbytes": inner.untyped_storage().nbytes() if isinstance(inner, torch.Tensor)
    else None,
}}))
"""

#: a container, and what the analysis' copy holds in its place: a meta stand-in, or the user's
#: own object, shared (never copied)
HOLDERS = {
    "deque": "meta",
    "exception": "meta",
    "numpy": "shared",
    "array.array": "shared",
    "bytearray": "shared",
    "memoryview": "shared",
    "mmap": "shared",
    "ctypes array": "shared",
    "torch storage": "meta storage",
}


@pytest.mark.parametrize("holder", list(HOLDERS))
def test_512_mib_in_any_container_is_not_copied(
    holder: str, request: pytest.FixtureRequest
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _HOLDERS.format(page=_PAGE), holder],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(request.config.rootpath),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["error"] is None
    assert out["grown"] < LIMIT, f"{holder}: RSS grew by {out['grown'] / 2**20:.0f} MiB"
    if out["peak_grown"] is not None:
        peak = out["peak_grown"]
        assert peak < LIMIT, f"{holder}: peak RSS grew by {peak / 2**20:.0f} MiB"
    kind = HOLDERS[holder]
    if kind == "shared":
        assert out["shared"], f"{holder}: the copy holds another object than the user's"
    else:
        assert out[kind], f"{holder}: the copy holds no meta stand-in"
    if kind == "meta":
        assert out["stand-in nbytes"] == 512 * 2**20
