"""The decode steps of a traced ``generate()``, each as one flat record, and the per-step rule.

What tracing equal decode steps once rests on (issue 26: "decode steps of equal shape may be
traced once and repeated, exactly, never estimated"; ``meta_widget.trace.decode_skip`` does
it). Within a stretch of decode steps that
crosses no sliding-window boundary, each step does what the step before it did, with every
size that depends on the cache's length one position longer: its allocations and frees, its
module calls, their FLOPs and costs. This module states that rule on recorded steps, exactly:

- :func:`decode_steps` cuts a trace's calls and events at the start of each decode step's
  forward pass (``Trace.phase_runs``): one :class:`StepRecord` per step, every number in it
  relative to the step's first call and event (a flat tuple of ints and strings, in the order
  they were recorded);
- :func:`per_step` is the rule between two steps: the difference of every int, when every
  string and every length is equal (None otherwise: no rule);
- :func:`follows` says whether three steps follow one rule (equal differences, int by int),
  and :func:`extrapolate` gives the step ``k`` steps on from one step by the rule;
- :func:`summed_steps` gives the calls of a stretch of steps by the rule, summed (the records
  standing for the steps that are not traced).

Nothing here is estimated: a step the rule gives is the step a trace records, or the check
that compares them fails (``tests/test_decode_steps.py`` checks it on full traces).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..data.flatten import TensorInfo
from ..data.records import CallRecord, Event

__all__ = [
    "StepRecord",
    "decode_steps",
    "extrapolate",
    "follows",
    "per_step",
    "step_record",
    "summed_steps",
]

Atom = int | str


@dataclass(frozen=True)
class StepRecord:
    """One decode step of a trace: its forward pass's number (``step``: 2 is the first decode
    step, the prefill is 1), where its calls and events begin, and ``atoms``: every event and
    call of the step flattened (see :func:`_call_atoms`), calls and events relative to the
    step's first."""

    step: int
    first_call: int
    first_event: int
    atoms: tuple[Atom, ...]


def decode_steps(
    calls: Sequence[CallRecord],
    events: Sequence[Event],
    runs: Sequence[tuple[int, str]],
) -> list[StepRecord]:
    """One :class:`StepRecord` per decode step of a traced ``generate()`` but the last (whose
    events run on to the end of ``generate()``, not to the next step's start).

    ``runs`` is the trace's ``phase_runs``: the prefill from event 0, then one run per decode
    step, begun at its forward pass."""
    roots = [c.index for c in calls if c.parent < 0]
    starts = [at for at, _ in runs]
    return [
        step_record(calls, events, k + 1, (roots[k], roots[k + 1]), (starts[k], starts[k + 1]))
        for k in range(1, min(len(roots), len(starts)) - 1)  # each decode step but the last
    ]


def step_record(
    calls: Sequence[CallRecord],
    events: Sequence[Event],
    step: int,
    call_range: tuple[int, int],
    event_range: tuple[int, int],
) -> StepRecord:
    """The :class:`StepRecord` of forward pass ``step``, whose calls are ``calls[c0:c1]`` and
    events ``events[e0:e1]`` (``call_range = (c0, c1)``, ``event_range = (e0, e1)``)."""
    (c0, c1), (e0, e1) = call_range, event_range
    atoms: list[Atom] = []
    for e in events[e0:e1]:
        atoms += [e.nbytes, e.live_bytes, _offset(e.call, c0), e.op, e.phase]
    for c in calls[c0:c1]:
        atoms += _call_atoms(c, c0, e0)
    return StepRecord(step, c0, e0, tuple(atoms))


def _offset(index: int, first: int) -> int:
    return index - first if index >= 0 else -1


def _call_atoms(c: CallRecord, c0: int, e0: int) -> list[Atom]:
    """Every number and name of one call, its indices relative to the step's first call and
    event; dicts (ops, costs) in the order their entries were first recorded, each entry's
    length given first so that two steps' atoms line up only if their structure is equal."""
    atoms: list[Atom] = [
        c.path,
        c.type,
        c.module,
        _offset(c.parent, c0),
        c.depth,
        c.flops,
        c.self_flops,
        c.alloc_bytes,
        c.activation_bytes,
        c.start_event - e0,
        c.end_event - e0,
        c.phase,
        len(c.ops),
        len(c.costs),
        len(c.inputs),
        len(c.outputs),
    ]
    for name, n in c.ops.items():
        atoms += [name, n]
    for (peak, flops, moved, shape), count in c.costs.items():
        atoms += [peak, flops, moved, len(shape), *shape, count]
    for name, info in (*c.inputs, *c.outputs):
        atoms += [name, info.dtype, len(info.shape), *info.shape, *info.stride]
    return atoms


def per_step(a: StepRecord, b: StepRecord) -> tuple[int, ...] | None:
    """The rule from step ``a`` to step ``b``: each int of ``b`` minus ``a``'s, per step
    between them (exact: None unless every difference divides evenly); None when their
    strings or lengths differ (no rule)."""
    if len(a.atoms) != len(b.atoms) or b.step <= a.step:
        return None
    span = b.step - a.step
    out = []
    for x, y in zip(a.atoms, b.atoms, strict=True):
        if isinstance(x, str) or isinstance(y, str):
            if x != y:
                return None
            out.append(0)
            continue
        d, r = divmod(y - x, span)
        if r:
            return None
        out.append(d)
    return tuple(out)


def follows(a: StepRecord, b: StepRecord, c: StepRecord) -> bool:
    """Whether ``a``, ``b`` and ``c`` (in order, any distance apart) follow one per-step
    rule, every int of every record (``extrapolate(a, rule, c.step - a.step) == c``)."""
    rule = per_step(a, b)
    return rule is not None and extrapolate(a, rule, c.step - a.step).atoms == c.atoms


def extrapolate(a: StepRecord, rule: Sequence[int], k: int) -> StepRecord:
    """The step ``k`` steps after ``a`` by ``rule`` (:func:`per_step`): each int of ``a`` plus
    ``k`` times its difference; strings as they are (``first_call`` and ``first_event``: ``a``'s,
    the atoms being relative to them)."""
    atoms: tuple[Any, ...] = tuple(
        x if isinstance(x, str) else x + k * d for x, d in zip(a.atoms, rule, strict=True)
    )
    return StepRecord(a.step + k, a.first_call, a.first_event, atoms)


def summed_steps(
    a: Sequence[CallRecord],
    b: Sequence[CallRecord],
    steps: tuple[int, int],
    index: int,
    event: int,
) -> list[CallRecord]:
    """The calls of decode steps ``a.step + t`` for ``t`` from ``steps[0]`` to ``steps[1]``,
    by the rule from step ``a`` to the step after it, ``b`` (their calls, in order), summed:
    one record per call of a step, standing for that call in every one of those steps.

    Each number is the sum, over the steps, of ``a``'s plus ``t`` times its difference to
    ``b``'s: FLOPs, ``ops``, ``alloc_bytes``, ``activation_bytes``; ``costs`` holds each step's
    costs (an op whose cost changes from step to step has an entry per step). ``inputs`` and
    ``outputs`` are those of the last step summed. The records take indices from ``index``
    (parents among them), their events are the one event ``event`` that stands for the steps
    (``StorageTracker.resume``); ``duration_s`` is 0 (none was timed), and no data-flow ids."""
    first, last = steps
    n = last - first + 1
    span = (first + last) * n // 2  # the sum of t over the steps

    def total(x: int, y: int) -> int:
        return n * x + (y - x) * span

    c0 = a[0].index
    out = []
    for x, y in zip(a, b, strict=True):
        out.append(
            CallRecord(
                index=index + x.index - c0,
                path=x.path,
                type=x.type,
                module=x.module,
                parent=index + x.parent - c0 if x.parent >= c0 else -1,
                depth=x.depth,
                inputs=_at(x.inputs, y.inputs, last),
                outputs=_at(x.outputs, y.outputs, last),
                flops=total(x.flops, y.flops),
                self_flops=total(x.self_flops, y.self_flops),
                ops={
                    k: total(v, w) for (k, v), w in zip(x.ops.items(), y.ops.values(), strict=True)
                },
                alloc_bytes=total(x.alloc_bytes, y.alloc_bytes),
                activation_bytes=total(x.activation_bytes, y.activation_bytes),
                start_event=event,
                end_event=event + 1,
                phase=x.phase,
                assumed=x.assumed or y.assumed,
                costs=_summed_costs(x.costs, y.costs, first, last),
                repeats=n * x.repeats,
            )
        )
    return out


def _at(
    xs: Sequence[tuple[str, TensorInfo]], ys: Sequence[tuple[str, TensorInfo]], t: int
) -> list[tuple[str, TensorInfo]]:
    """The tensors ``t`` steps after ``xs`` by the rule ``ys - xs``: shapes and strides."""
    return [
        (name, x._replace(shape=_on(x.shape, y.shape, t), stride=_on(x.stride, y.stride, t)))
        for (name, x), (_, y) in zip(xs, ys, strict=True)
    ]


def _on(x: tuple[int, ...], y: tuple[int, ...], t: int) -> tuple[int, ...]:
    return tuple(p + t * (q - p) for p, q in zip(x, y, strict=True))


def _shape_at(x: tuple[Any, ...], y: tuple[Any, ...], t: int) -> tuple[Any, ...]:
    """A cost's shape ``t`` steps after ``x`` by the rule ``y - x`` (its integers move; its
    names are the same in both)."""
    return tuple(p if isinstance(p, str) else p + t * (q - p) for p, q in zip(x, y, strict=True))


def _summed_costs(
    x: dict[tuple[str, int, int, tuple[Any, ...]], int],
    y: dict[tuple[str, int, int, tuple[Any, ...]], int],
    first: int,
    last: int,
) -> dict[tuple[str, int, int, tuple[Any, ...]], int]:
    """The costs of the steps ``first`` to ``last`` after ``x`` by the rule ``y - x``, added up:
    a cost that does not change is one entry, one that does an entry per step."""
    out: dict[tuple[str, int, int, tuple[Any, ...]], int] = {}
    n = last - first + 1
    span = (first + last) * n // 2
    for ((peak, f, m, sx), c), ((_, f2, m2, sy), c2) in zip(x.items(), y.items(), strict=True):
        df, dm, dc = f2 - f, m2 - m, c2 - c
        if not df and not dm and sx == sy:
            out[peak, f, m, sx] = out.get((peak, f, m, sx), 0) + n * c + dc * span
            continue
        for t in range(first, last + 1):
            key = (peak, f + t * df, m + t * dm, _shape_at(sx, sy, t))
            out[key] = out.get(key, 0) + c + t * dc
    return out
