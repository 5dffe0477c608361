"""The caching allocator's reserve at a decoder's full depth, from its traces at 3 and 4
layers, and 2 where a free outside the runs needs a third rank (``plan``'s per-layer rule,
``explore.depth``).

What the GPU holds is not the running sum of the events' bytes that the rule extends: the
caching allocator rounds, splits, caches and reuses blocks, so its reserve depends on which
block each free gives back. ``MemoryReport.allocator_steps`` keeps each trace's allocator
steps with that link (the row a free frees). The full depth's steps are built the way the rule
builds its events, and replayed through the same allocator:

- **the tensors alive before the trace** (parameters, buffers, inputs, in the order
  ``module.to("cuda")`` moves them): the runs of the 3-layer list that the 4-layer list holds
  twice, repeated once per middle layer;
- **the trace's steps**: those of each event run the fourth layer doubles (``depth.doubled``)
  repeated with the run (a cuBLAS workspace, placed once per thread, never), checked step by
  step against the 4-layer trace's;
- **which allocation each free frees**, a rule per free of the 3-layer trace, read off the
  4-layer trace (what each of the two copies of a layer's free gives back) and checked on the
  3-layer trace (the one copy). Copy ``c`` of ``k`` frees copy ``c`` of an allocation (a free in
  the same layer), copy ``k - 1 - c`` (the reverse order: the backward freeing what the forward
  saved), or one copy back or on, the copy at the end freeing an allocation of its own (FSDP2's
  prefetch: layer ``c``'s all-gathered parameters freed in layer ``c + 1``); a free outside the
  runs frees the first or the last copy of an allocation, or one outside the runs. Where none of
  those fits both traces, the ``r``-th newest (or oldest) live allocation of the free's size
  (an optimizer's list of per-parameter results, freed in the order made): the same ``r`` in
  both, or for a free repeated with a layer an ``r`` that moves by a step with the copy, from
  the last copy or with the depth (a layer's share of such a list, or a free whose allocation
  the diff of the events put outside the runs). The step is read off two of the three ranks
  seen and checked on the third (a free outside the runs is seen twice, at 3 and 4 layers:
  ``plan`` then traces 2 layers for its third rank, ``earlier``); where several rank rules
  fit, all must name the same allocation at the full depth. The 4-layer steps the rules build
  must free exactly what that trace frees. Where no rule fits, or the steps do not follow the
  runs, there is no reserve by the rule (``depth`` then tries the same events' runs placed
  otherwise: ``depth._spread``, and ``depth._slid`` on the run of the free
  :meth:`Reserve.build` names).

``tests/test_plan_depth.py`` checks the reserve so found against full-depth traces.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import islice, repeat

import numpy as np

from ..memory.allocator import EVENT, EXTRA, FREES, INITIAL, KIND, NBYTES, Step, run

__all__ = ["Built", "Reserve", "reserved_peak"]

Place = tuple[int, int]  # (row of the 3-layer trace's steps, copy)
Token = tuple[int, str, str]  # ``depth``'s token: an initial tensor's is its size


Doubled = Callable[[Sequence[Token], Sequence[Token]], list[tuple[int, int]] | None]
Repeat = Callable[[Sequence[Token], Sequence[tuple[int, int]], int], list[Token]]
#: :meth:`Reserve.build`'s answer: the steps at full depth and each traced step's place; the
#: 3-layer trace's event whose free names no live allocation there; or None
Built = tuple[list[Step], list[Place]] | int | None


@dataclass(frozen=True)
class Reserve:
    """The allocator steps of the traces at 3 and 4 layers (``tables``, each trace's
    ``MemoryReport.allocator_steps``) and ``depth``'s runs a layer more doubles (``doubled``)
    and repeat (``repeat``) of a token sequence: what builds the steps at any depth (module
    docstring). ``earlier``: the 2-layer trace's steps, where it was traced (a third rank to
    check the rank rules of frees outside the runs on)."""

    tables: Sequence[np.ndarray | None]
    doubled: Doubled
    repeat: Repeat
    earlier: np.ndarray | None = None

    def build(self, runs: Sequence[tuple[int, int]], layers: int) -> Built:
        """The allocator steps at ``layers`` layers with the third layer's event ``runs`` and
        the place of each traced step among the 3-layer trace's (after the initial tensors'
        steps); or the event of the 3-layer trace whose free, by rules found and checked at 3
        and 4 layers, names no live allocation at ``layers`` (``depth`` then places that free's
        run otherwise); or None where the steps do not follow the rule."""
        if len(self.tables) != 2 or any(t is None for t in self.tables):
            return None
        three, four = (t for t in self.tables if t is not None)
        lists = [_initial(t) for t in (three, four)]
        initial_runs = self.doubled(lists[0], lists[1])
        if initial_runs is None or self.repeat(lists[0], initial_runs, 2) != lists[1]:
            return None
        traced3, traced4 = three[len(lists[0]) :], four[len(lists[1]) :]
        copied = _copied(traced3, runs)
        order2 = _order(traced3, runs, copied, 2)
        if len(order2) != len(traced4) or not _same_steps(traced3, order2, traced4):
            return None
        before = None if self.earlier is None else _before(self.earlier, traced3, runs, copied)
        rules = _rules(traced3, len(lists[0]), traced4, len(lists[1]), order2, copied, before)
        if rules is None:
            return None
        again = _steps(traced3, len(lists[0]), order2, rules, [], 2)
        if isinstance(again, int) or not _follows(again, traced4, len(lists[1]), order2):
            return None
        times = layers - 2
        initial = [size for size, _, _ in self.repeat(lists[0], initial_runs, times)]
        order = _order(traced3, runs, copied, times)
        steps = _steps(traced3, len(lists[0]), order, rules, initial, times)
        return int(traced3[steps, EVENT]) if isinstance(steps, int) else (steps, order)


def reserved_peak(built: Built) -> int | None:
    """The caching allocator's reserved peak of the steps :meth:`Reserve.build` built; None
    for no steps."""
    return run(built[0]).peak_bytes if isinstance(built, tuple) else None


def _initial(table: np.ndarray) -> list[Token]:
    """The sizes of the tensors alive before the trace, as ``depth``'s tokens."""
    kinds = table[:, KIND]
    count = int(np.argmax(kinds != INITIAL)) if (kinds != INITIAL).any() else len(table)
    return [(int(n), "", "") for n in table[:count, NBYTES]]


def _before(
    two: np.ndarray, traced3: np.ndarray, runs: Sequence[tuple[int, int]], copied: np.ndarray
) -> tuple[np.ndarray, int, dict[int, Place]] | None:
    """The 2-layer trace's steps, initial rows and each step's place among the 3-layer steps,
    where they are those less the runs' (but for where a workspace lands); else None."""
    offset = len(_initial(two))
    traced2 = two[offset:]
    order0 = [p for p in _order(traced3, runs, copied, 0) if traced3[p[0], KIND] != EXTRA]
    plain2 = np.flatnonzero(traced2[:, KIND] != EXTRA)
    if len(order0) != len(plain2) or not _same_steps(traced3, order0, traced2[plain2]):
        return None
    return traced2, offset, dict(zip(plain2.tolist(), order0, strict=True))


def _copied(traced: np.ndarray, runs: Sequence[tuple[int, int]]) -> np.ndarray:
    """Whether each step is repeated with its event's run (a workspace never is)."""
    events = traced[:, EVENT]
    inside = np.zeros(len(traced), dtype=bool)
    for start, end in runs:
        inside |= (events >= start) & (events < end)
    return inside & (traced[:, KIND] != EXTRA)


def _order(
    traced: np.ndarray, runs: Sequence[tuple[int, int]], copied: np.ndarray, times: int
) -> list[Place]:
    """The steps at ``times`` copies of each run: each run's steps, then its copies (none:
    the 2-layer trace's, a workspace placed in a run kept)."""
    events = traced[:, EVENT]
    inside = copied.tolist()
    out: list[Place] = []
    at = 0
    for start, end in runs:
        first, stop = np.searchsorted(events, [start, end], side="left").tolist()
        out.extend(zip(range(at, first), repeat(0)))
        inner = [row for row in range(first, stop) if inside[row]]
        if times > 0:
            out.extend(zip(range(first, stop), repeat(0)))
        else:
            out.extend((row, 0) for row in range(first, stop) if not inside[row])
        for copy in range(1, times):  # 100,000 places at a 405B's depth: tuples made in C
            out.extend(zip(inner, repeat(copy)))
        at = stop
    out.extend(zip(range(at, len(traced)), repeat(0)))
    return out


def _same_steps(traced3: np.ndarray, order: list[Place], traced4: np.ndarray) -> bool:
    """Whether the 3-layer steps in ``order`` are the 4-layer trace's, bytes and kinds."""
    rows = np.fromiter((row for row, _ in order), dtype=np.int64, count=len(order))
    cols = [NBYTES, KIND]
    return bool(np.array_equal(traced3[rows][:, cols], traced4[:, cols]))


def _ranks(traced: np.ndarray, offset: int) -> dict[int, tuple[int, int]] | None:
    """For each free, the place of the allocation it frees among the allocations of its size
    then live: (from the newest, from the oldest); None where a free frees none of them.
    ``offset``: the initial rows before the traced steps of the table (a free's link counts
    them)."""
    live: dict[int, list[int]] = {}
    out: dict[int, tuple[int, int]] = {}
    nbytes, links = traced[:, NBYTES].tolist(), traced[:, FREES].tolist()
    for row, n in enumerate(nbytes):
        if n >= 0:
            live.setdefault(n, []).append(row)
            continue
        alloc = links[row] - offset
        same = live.get(nbytes[alloc], [])
        if alloc not in same:
            return None
        at = same.index(alloc)
        out[row] = (len(same) - 1 - at, at)
        del same[at]
    return out


Rule = Callable[[int, int], Place]  # (copy, copies) -> the allocation's place

#: how a rank rule's count moves (:class:`Rank`): with the copy of the layer, from the last
#: copy, or with the depth (a list of per-layer results, one longer a layer deeper)
_COUNTS: dict[str, Callable[[int, int], int]] = {
    "copy": lambda copy, times: copy,
    "from the last copy": lambda copy, times: times - 1 - copy,
    "depth": lambda copy, times: times - 1,
}


@dataclass(frozen=True)
class Rank:
    """A free that frees the ``base + step * n``-th newest (``side`` 0) or oldest (1) live
    allocation of its size, ``n`` counted by ``_COUNTS[count]`` (``step`` 0: always the same
    rank): an optimizer's lists of per-parameter results, freed in the order made or reversed,
    and a layer's share of them."""

    side: int
    base: int
    step: int = 0
    count: str = "copy"

    def at(self, copy: int, times: int) -> int:
        return self.base + self.step * _COUNTS[self.count](copy, times)


Seen = tuple[int, int, tuple[int, int]]  # (copies, copy, (from the newest, from the oldest))


def _rank_rules(seen: Sequence[Seen], before: Sequence[Seen] = ()) -> list[Rank]:
    """The rank rules that give every rank ``seen`` (at 3 and 4 layers), each checked on one
    rank at least that it was not read from: the same rank on either side, else one moving by
    a step with the copy, from the last copy or with the depth, where three ranks are seen (a
    free repeated with a layer: its copy at 3 layers and its two at 4; one outside the runs
    with its rank at 2 layers, ``before``)."""
    rules = []
    for side in (0, 1):
        ranks = [r[side] for _, _, r in seen]
        if len(set(ranks)) == 1:
            rules.append(Rank(side, ranks[0]))
    seen = [*before, *seen]
    if rules or len(seen) < 3:
        return rules
    for count, n in _COUNTS.items():
        ns = [n(copy, times) for times, copy, _ in seen]
        if len(set(ns)) < 2:
            continue
        n0, n1 = sorted(set(ns))[:2]
        i0, i1 = ns.index(n0), ns.index(n1)
        for side in (0, 1):
            r0, r1 = seen[i0][2][side], seen[i1][2][side]
            step, left = divmod(r1 - r0, n1 - n0)
            rule = Rank(side, r0 - step * n0, step, count)
            if (
                left == 0
                and step != 0
                and all(rule.at(copy, times) == r[side] for times, copy, r in seen)
            ):
                rules.append(rule)
    return rules


def _rules(
    traced3: np.ndarray,
    offset3: int,
    traced4: np.ndarray,
    offset4: int,
    order2: list[Place],
    copied: np.ndarray,
    before: tuple[np.ndarray, int, dict[int, Place]] | None = None,
) -> dict[int, Rule | list[Rank]] | None:
    """For each free of the 3-layer trace, which allocation each of its copies frees: a rule
    naming the allocation's place (:func:`_by_place`), else the rank rules (:class:`Rank`)
    that give what the 3- and the 4-layer traces free (all of them: at the full depth they
    must name one allocation), a free outside the runs checked on the 2-layer trace too where
    it was traced (``before``: :func:`_before`). None where none does."""
    frees3: dict[int, Place] = {}
    nbytes3, links3 = traced3[:, NBYTES].tolist(), traced3[:, FREES].tolist()
    for row, n in enumerate(nbytes3):
        if n < 0:
            frees3[row] = (links3[row] - offset3, 0)
    frees4: dict[int, dict[int, Place]] = {}
    for p in np.flatnonzero(traced4[:, NBYTES] < 0).tolist():
        row, copy = order2[p]
        frees4.setdefault(row, {})[copy] = order2[int(traced4[p, FREES]) - offset4]
    ranks3, ranks4 = _ranks(traced3, offset3), _ranks(traced4, offset4)
    if ranks3 is None or ranks4 is None:
        return None
    seen: dict[int, list[Seen]] = {}
    for row, r in ranks3.items():
        seen.setdefault(row, []).append((1, 0, r))
    for p, r in ranks4.items():
        row, copy = order2[p]
        seen[row].append((2, copy, r))
    earlier: dict[int, list[Seen]] = {}
    if before is not None:
        traced2, offset2, order0 = before
        for p, r in (_ranks(traced2, offset2) or {}).items():
            earlier[order0[p][0]] = [(0, 0, r)]
    rules: dict[int, Rule | list[Rank]] = {}
    for row, first in frees3.items():
        places = frees4.get(row, {})
        named = [
            rule
            for rule in _by_place(places, bool(copied[row]), copied)
            if rule(0, 1) == first and all(rule(c, 2) == place for c, place in places.items())
        ]
        if len(named) == 1:
            rules[row] = named[0]
            continue
        ranked = _rank_rules(seen[row], earlier.get(row, ()))
        if not ranked:
            return None
        rules[row] = ranked
    return rules


def _by_place(seen: dict[int, Place], in_run: bool, copied: np.ndarray) -> list[Rule]:
    """The rules naming a place that the 4-layer trace's frees (copy -> what it freed) allow:
    copy ``c`` of ``k`` frees copy ``c`` of an allocation (a free in the same layer), copy
    ``k - 1 - c`` (the reverse order: the backward freeing a forward's activation), or one copy
    back or on, the copy at the end freeing an allocation of its own (FSDP2's prefetch: layer
    ``c``'s all-gathered parameters freed in layer ``c + 1``); a free outside the runs frees
    the first or the last copy of an allocation, or one outside the runs."""

    def end(place: Place) -> Callable[[int], Place]:
        row, copy = place
        if not copied[row] or copy == 0:
            return lambda times: (row, 0)
        return lambda times: (row, times - 1)

    if not in_run:
        if 0 not in seen:
            return []
        at = end(seen[0])
        return [lambda c, times: at(times)]
    if 0 not in seen or 1 not in seen:
        return []
    (a0, j0), (a1, j1) = seen[0], seen[1]
    rules: list[Rule] = []
    if a0 == a1 and copied[a0] and j0 != j1:
        rules.append(lambda c, times: (a0, c if j0 == 0 else times - 1 - c))
    if a0 != a1 and copied[a1]:  # copy c >= 1 frees copy c - 1 (j1 0) or k - c (j1 1)
        first = end(seen[0])
        rules.append(
            lambda c, times: first(times) if c == 0 else (a1, c - 1 if j1 == 0 else times - c)
        )
    if a0 != a1 and copied[a0]:  # copy c <= k - 2 frees copy c + 1 (j0 1) or k - 2 - c (j0 0)
        last = end(seen[1])
        rules.append(
            lambda c, times: (
                last(times) if c == times - 1 else (a0, c + 1 if j0 == 1 else times - 2 - c)
            )
        )
    return rules


def _steps(
    traced3: np.ndarray,
    offset3: int,
    order: list[Place],
    rules: dict[int, Rule | list[Rank]],
    initial: list[int],
    times: int,
) -> list[Step] | int:
    """The allocator's steps in ``order``, after the ``initial`` tensors, each free freeing the
    allocation its rule names; the row of the first free whose allocation is not live or not of
    its size."""
    steps: list[Step] = [(("initial", k), n) for k, n in enumerate(initial)]
    # each size's live allocations, oldest first: a dict, so that a free finds and removes
    # its allocation at once (a list took time in the allocations live: quadratic in the depth)
    live: dict[int, dict[Place, None]] = {}
    nbytes, links = traced3[:, NBYTES].tolist(), traced3[:, FREES].tolist()
    of_size, step = live.get, steps.append  # 100,000 steps at a 405B's depth
    for place in order:
        row, copy = place
        n = nbytes[row]
        if n >= 0:
            same = of_size(n)
            if same is None:
                same = live[n] = {}
            same[place] = None
            step((place, n))
            continue
        same = of_size(nbytes[links[row] - offset3], {})
        rule = rules[row]
        if isinstance(rule, list):
            found = {_nth(same, r.side, r.at(copy, times)) for r in rule}
            alloc = found.pop() if len(found) == 1 else None
            if alloc is None:
                return row
        else:
            alloc = rule(copy, times)
            if alloc not in same:
                return row
        del same[alloc]
        step((alloc, None))
    return steps


def _nth(live: dict[Place, None], side: int, rank: int) -> Place | None:
    """The ``rank``-th newest (``side`` 0) or oldest (1) of the ``live`` allocations (oldest
    first); None where there is none."""
    if not 0 <= rank < len(live):
        return None
    return next(islice(reversed(live) if side == 0 else iter(live), rank, None))


def _follows(steps: list[Step], traced4: np.ndarray, offset4: int, order2: list[Place]) -> bool:
    """Whether ``steps`` (the rule's at 4 layers) free what the 4-layer trace frees."""
    links = traced4[:, FREES].tolist()
    return all(
        nbytes is not None or key == order2[links[p] - offset4]
        for p, (key, nbytes) in enumerate(steps)
    )
