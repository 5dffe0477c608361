"""The peak of a real CPU run, as ``torch.distributed._tools.mem_tracker.MemTracker`` measures it
(:func:`real_peak`), or as the CPU allocator sees it (:func:`allocator_peak`).

What ``mw.analyze(..., device="cpu")`` models: inference is ``eval()`` under ``no_grad``, one
forward; training is ``train()``, forward, the sum of the output, backward (no optimizer step),
the output kept to the end.
"""

from __future__ import annotations

import copy
import gc
from typing import Any

import torch
from torch import nn
from torch._C._profiler import _EventType
from torch.distributed._tools.mem_tracker import MemTracker
from torch.profiler import ProfilerActivity, profile


def real_peak(
    model: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any] | None = None,
    *,
    training: bool = False,
) -> int:
    """MemTracker's peak (bytes) of one real CPU pass of a copy of ``model``."""
    model = copy.deepcopy(model).train(training)
    kwargs = kwargs or {}
    tracker = MemTracker()
    tracker.track_external(
        model, *[a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
    )
    with tracker, torch.set_grad_enabled(training):
        out = model(*args, **kwargs)
        if training:
            loss = out.sum()
            loss.backward()
            del loss
        peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]
    del out
    return int(peak["Total"])


def allocator_peak(
    model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None
) -> int:
    """The peak (bytes) of one real CPU inference pass of ``model`` as the CPU allocator sees
    it: every allocation and free ``torch.profiler`` records (``profile_memory=True``), inside
    fused kernels too, on top of the parameters, buffers and inputs already there.

    ``MemTracker`` only sees the tensors each dispatched op returns, so a fused kernel's own
    buffers (``_transformer_encoder_layer_fwd``'s heads and scores) are invisible to it; this
    measure is the truth for those paths.
    """
    kwargs = kwargs or {}
    model = model.eval()
    held = [*model.parameters(), *model.buffers()]
    held += [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in held}
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        with torch.no_grad():
            out = model(*args, **kwargs)
        del out
    events: list[tuple[int, int]] = []
    pending = list(prof.profiler.kineto_results.experimental_event_tree())
    while pending:
        node = pending.pop()
        if node.tag == _EventType.Allocation:
            events.append((node.start_time_ns, node.extra_fields.alloc_size))
        pending.extend(node.children)
    live = peak = 0
    for _, size in sorted(events):
        live += size
        peak = max(peak, live)
    return sum(storages.values()) + peak


def loop_peaks(step: Any, steps: int, held: list[torch.Tensor]) -> list[int]:
    """The peak (bytes) of each of ``steps`` real calls of ``step()`` (one training step of a
    loop: what it allocates stays or goes as the loop leaves it), as the CPU allocator sees it:
    every allocation and free ``torch.profiler`` records, on top of ``held`` (the parameters,
    buffers and inputs, there before), each step's peak taken within its own
    ``record_function`` range."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in held}
    gc.collect()  # earlier garbage freed now, not inside the window
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        for k in range(steps):
            with torch.profiler.record_function(f"meta_widget step {k}"):
                step()
    ranges: dict[int, tuple[int, int]] = {}
    pending = list(prof.profiler.kineto_results.experimental_event_tree())
    while pending:
        node = pending.pop()
        if node.name.startswith("meta_widget step "):
            ranges[int(node.name.rsplit(" ", 1)[1])] = (node.start_time_ns, node.end_time_ns)
        pending.extend(node.children)
    peaks = [0] * steps
    live = 0
    for at, size in owned_allocations(prof):
        live += size
        for k, (start, end) in ranges.items():
            if start <= at <= end:
                peaks[k] = max(peaks[k], live)
    base = sum(storages.values())
    return [base + p for p in peaks]


def owned_allocations(prof: profile) -> list[tuple[int, int]]:
    """The allocations (+ bytes) ``prof`` recorded and the frees (-) of those blocks, in time
    order. A free of a block allocated before the profiler started is left out: the cyclic
    garbage of earlier code, collected inside the window, would otherwise lower the sum (the
    profiler knows such a block's size when an earlier profiler in the process saw it made)."""
    events: list[tuple[int, int, int]] = []
    pending = list(prof.profiler.kineto_results.experimental_event_tree())  # type: ignore[union-attr]
    while pending:
        node = pending.pop()
        if node.tag == _EventType.Allocation:
            fields = node.extra_fields
            events.append((node.start_time_ns, fields.alloc_size, fields.ptr))
        pending.extend(node.children)
    out: list[tuple[int, int]] = []
    mine: set[int] = set()
    for at, size, ptr in sorted(events):
        if size > 0:
            mine.add(ptr)
        elif ptr in mine:
            mine.discard(ptr)
        else:
            continue
        out.append((at, size))
    return out


def window_peak(prof: profile) -> int:
    """The highest running sum of :func:`owned_allocations`."""
    live = peak = 0
    for _, size in owned_allocations(prof):
        live += size
        peak = max(peak, live)
    return peak
