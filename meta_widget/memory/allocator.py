"""What the GPU holds: PyTorch's CUDA caching allocator (``caching.py``) replayed over a trace.

:func:`replay` runs a trace's allocations and frees, in the order :func:`steps_of` gives,
through :class:`~meta_widget.memory.caching.CachingAllocator` and returns :class:`Reserved`: the
peak of the bytes the allocator reserves from CUDA (``torch.cuda.max_memory_reserved()`` on a
device), beside the peak of the bytes its blocks hand out (``max_memory_allocated()``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .caching import DEFAULT_CONFIG, AllocatorConfig, Block, CachingAllocator

if TYPE_CHECKING:
    from ..data.records import Allocation

__all__ = ["AllocatorConfig", "Reserved", "read_table", "replay", "run", "step_table", "steps_of"]


@dataclass(frozen=True)
class Reserved:
    """The caching allocator over one allocation sequence (see :func:`replay`).

    Attributes
    ----------
    peak_bytes
        The most bytes reserved at once: segments (or mapped pages) held from CUDA, what
        ``torch.cuda.max_memory_reserved()`` reports.
    end_bytes
        Reserved after the last step (no ``empty_cache``: nothing is given back).
    peak_allocated_bytes
        The most bytes of blocks handed out at once: each request's rounded size, or the whole
        block when it was not split (``torch.cuda.max_memory_allocated()``).
    segments
        Segments held at the reserved peak (an expandable segment counts once).
    peak_index
        The step of the sequence where the reserved peak was first reached (-1: no step).
    peak_event
        The trace event of that step (-1: an initial tensor, or not from a trace).
    retries
        Times a segment did not fit under ``capacity`` and cached memory was released.
    failed_index
        The step whose request did not fit even after releasing (out of memory), -1: none; the
        replay stops there.
    """

    peak_bytes: int
    end_bytes: int
    peak_allocated_bytes: int
    segments: int
    peak_index: int
    peak_event: int = -1
    retries: int = 0
    failed_index: int = -1


#: one step of a sequence: (key, bytes) allocates bytes under key, (key, None) frees key's block
Step = tuple[object, int | None]


def run(
    steps: Sequence[Step],
    config: AllocatorConfig = DEFAULT_CONFIG,
    capacity: int | None = None,
    stream: Callable[[object], int] | None = None,
    events: Sequence[int] | None = None,
) -> Reserved:
    """Replay ``steps`` in order through a :class:`CachingAllocator` (``events``: the trace
    event of each step, for :attr:`Reserved.peak_event`; ``stream``: each key's stream)."""
    alloc = CachingAllocator(config, capacity)
    live: dict[object, Block] = {}
    peak = (0, -1, 0)  # reserved, step, segments
    failed = -1
    malloc, free, taken = alloc.malloc, alloc.free, live.pop  # a replay is 100,000 steps
    for i, (key, nbytes) in enumerate(steps):
        if nbytes is None:
            free(taken(key))
            continue
        block = malloc(nbytes, stream(key) if stream is not None else 0)
        if block is None:
            failed = i
            break
        live[key] = block
        if alloc.reserved > peak[0]:
            peak = (alloc.reserved, i, alloc.segments)
    alloc.unlink(live.values())
    return Reserved(
        peak_bytes=alloc.peak_reserved,
        end_bytes=alloc.reserved,
        peak_allocated_bytes=alloc.peak_allocated,
        segments=peak[2],
        peak_index=peak[1],
        peak_event=events[peak[1]] if events is not None and peak[1] >= 0 else -1,
        retries=alloc.retries,
        failed_index=failed,
    )


def steps_of(
    allocations: Sequence[Allocation],
    initial: Sequence[int] = (),
    extra: Sequence[tuple[int, int]] = (),
) -> tuple[list[Step], list[int]]:
    """The steps a trace's allocations make, and the event of each (-1 for ``initial``).

    Order: first ``initial`` (parameters, buffers, inputs: each its own tensor, never freed),
    then event by event. At one event index: first the frees of earlier allocations freed there,
    then ``extra`` allocations placed there (``(event, bytes)``, never freed: e.g. a cuBLAS
    workspace made just before the event's GEMM), then the allocations made there in their
    order, then the frees of those among them freed at the same event. Frees go first because
    the trace's live bytes after an event are net of both (a resumed stretch of decode steps
    frees and allocates under one event), so no step of the replay holds more than the trace
    says was live. ``Allocation.event`` and ``freed`` index the same event list.
    """
    steps: list[Step] = [(("initial", k), n) for k, n in enumerate(initial)]
    where = [-1] * len(steps)
    made: dict[int, list[int]] = {}
    gone: dict[int, list[int]] = {}
    for j, a in enumerate(allocations):
        if a.nbytes > 0:  # PyTorch never asks the allocator for 0 bytes
            made.setdefault(a.event, []).append(j)
            if a.freed >= 0:
                gone.setdefault(a.freed, []).append(j)
    placed: dict[int, list[int]] = {}
    for k, (event, _) in enumerate(extra):
        placed.setdefault(event, []).append(k)
    for event in sorted(made.keys() | gone.keys() | placed.keys()):
        freed = gone.get(event, [])
        here: list[Step] = [(j, None) for j in freed if allocations[j].event != event]
        here += [(("extra", k), extra[k][1]) for k in placed.get(event, [])]
        here += [(j, allocations[j].nbytes) for j in made.get(event, [])]
        here += [(j, None) for j in freed if allocations[j].event == event]
        steps += here
        where += [event] * len(here)
    return steps, where


#: the columns of :func:`step_table`
EVENT, NBYTES, FREES, KIND = range(4)
#: a step's kind in :func:`step_table`: a tensor alive before the trace, an allocation placed
#: beside the trace's (a cuBLAS workspace), an allocation of the trace
INITIAL, EXTRA, TRACED = range(3)


def step_table(steps: Sequence[Step], where: Sequence[int]) -> np.ndarray:
    """``steps`` (and the event of each, :func:`steps_of`) as plain numbers, one row a step:
    ``(event, bytes, freed step, kind)``. An allocation has its bytes and ``freed step`` -1;
    a free has bytes -1 and the row of the allocation it frees. ``plan``'s per-layer rule
    extends it to a model's full depth and replays it (``explore.depth_reserve``)."""
    rows: list[tuple[int, int, int, int]] = []
    row_of: dict[object, int] = {}
    kinds = {"initial": INITIAL, "extra": EXTRA}
    for i, ((key, nbytes), event) in enumerate(zip(steps, where, strict=True)):
        if nbytes is None:
            rows.append((event, -1, row_of.pop(key), TRACED))
            continue
        row_of[key] = i
        kind = kinds.get(key[0], TRACED) if isinstance(key, tuple) else TRACED
        rows.append((event, nbytes, -1, kind))
    return np.array(rows, dtype=np.int64).reshape(len(rows), 4)


def read_table(raw: bytes) -> np.ndarray:
    """A :func:`step_table` from its bytes (``MemoryReport.allocator_steps``)."""
    return np.frombuffer(raw, dtype=np.int64).reshape(-1, 4)


def replay(
    allocations: Sequence[Allocation],
    initial: Sequence[int] = (),
    config: AllocatorConfig = DEFAULT_CONFIG,
    capacity: int | None = None,
    extra: Sequence[tuple[int, int]] = (),
) -> Reserved:
    """The caching allocator over a trace's allocations (see :func:`steps_of` for the order).

    Parameters
    ----------
    allocations
        ``Trace.allocations``: each allocated at event ``event`` and freed at ``freed`` (-1:
        never).
    initial
        Bytes of the tensors alive before the trace (parameters, buffers, inputs), each
        allocated on its own, in order, never freed.
    config
        The allocator's settings (``PYTORCH_CUDA_ALLOC_CONF``).
    capacity
        The bytes the allocator may reserve (None: unlimited); past it, cached memory is
        released and the request retried, and a request that still does not fit fails.
    extra
        Allocations the trace does not hold, ``(event, bytes)``, never freed.
    """
    steps, where = steps_of(allocations, initial, extra)
    return run(steps, config, capacity, events=where)
