"""The decode steps of a traced ``generate()``, each as one flat record, and the per-step rule.

Groundwork for tracing equal decode steps once (issue 26: "decode steps of equal shape may be
traced once and repeated, exactly, never estimated"). Within a stretch of decode steps that
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
  and :func:`extrapolate` gives the step ``k`` steps on from one step by the rule.

Nothing here is estimated: a step the rule gives is the step a trace records, or the check
that compares them fails (``tests/test_decode_steps.py`` checks it on full traces).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..data.records import CallRecord, Event

__all__ = ["StepRecord", "decode_steps", "extrapolate", "follows", "per_step"]

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
    out = []
    for k in range(1, min(len(roots), len(starts)) - 1):  # each decode step but the last
        c0, c1 = roots[k], roots[k + 1]
        e0, e1 = starts[k], starts[k + 1]
        atoms: list[Atom] = []
        for e in events[e0:e1]:
            atoms += [e.nbytes, e.live_bytes, _offset(e.call, c0), e.op, e.phase]
        for c in calls[c0:c1]:
            atoms += _call_atoms(c, c0, e0)
        out.append(StepRecord(k + 1, c0, e0, tuple(atoms)))
    return out


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
    for (peak, flops, moved), count in c.costs.items():
        atoms += [peak, flops, moved, count]
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
