"""A decoder's numbers at full depth from traces of 3 and 4 of its layers (``plan``).

A model whose decoder layers are all alike (same modules, parameters and settings; only their
index differs) runs the same ops in each middle layer: its trace at ``n + 1`` layers is its
trace at ``n`` layers with one middle layer's events, costs and collectives repeated, in each
phase (forward, backward, the optimizer's loops over parameters). So ``plan`` traces each
candidate at 3 and 4 layers, and

- **finds the rule**: the runs of the 3-layer trace's events that the 4-layer trace holds
  twice (:func:`doubled`: a diff of the two event sequences, each event its bytes, op and
  phase, a phase run at a time), and the costs, collectives, FLOPs and parameter bytes the
  fourth layer adds (none may fall);
- **checks it**: the 4-layer trace's events must be the 3-layer trace's with each run doubled,
  every byte and op (:func:`_regrouped`): the middle layer between the first and the last and
  the two middle layers beside them run the same events, as every middle layer at full depth
  must. Any difference and the candidate is traced at full depth
  (``Candidate.traced_layers`` says which). The 2-layer trace, once the rule's first sample,
  checked only the model with no middle layer, which no deeper model holds;
- **or stops early**: the parameters, buffers, gradients and optimizer state one rank holds
  (:func:`held_state_at`) grow by the same bytes with each alike layer (alike layers hold
  alike shards), so the 3- and 4-layer traces give them exactly at full depth, with no rule to
  check: where they and the CUDA context alone are over the budget the candidate cannot fit,
  and nor can any other with its layout and precision (``plan`` traces none of those);
- **applies it**: the full depth's events are the 3-layer trace's with each run repeated once
  per middle layer. The peak is the maximum of their running sum over the parameters, buffers
  and inputs (the traced peak of that event sequence, as ``MemoryReport`` takes it); the step
  time is ``step_time`` of the costs and collectives so extended. The collectives are counted,
  not ordered: only the two whose place the time model reads (``timing.model.schedule_edges``:
  the forward's first, the backward's last; the root unit's, alike at every depth) are kept
  with their place, checked like the rest. What the GPU holds is the caching allocator's
  reserve replayed over the full depth's allocator steps, built and checked the same way
  (``depth_reserve``; where a free outside the runs needs a third rank, ``plan`` traces the
  candidate at 2 layers too), and what does not grow with depth (the CUDA context, NCCL's
  buffers).

Where the layers are not all alike (a layer type list with two kinds, a first dense layer
before MoE layers, any module attribute other than the layer's index differing), or the model
is not a transformers config with ``num_hidden_layers``, the rule is not used.
"""

from __future__ import annotations

import copy
import difflib
import itertools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..analysis import Analysis
from ..data.records import CallRecord
from ..distributed.comms import CommRecord
from ..memory.allocator import read_table
from ..sources.models import is_transformers_config, to_meta
from ..timing.gpus import GPU
from ..timing.model import StepTime, schedule_edges, step_time
from .alike_layers import alike_layers
from .depth_reserve import Reserve, reserved_peak

__all__ = [
    "DEPTHS",
    "Extended",
    "Sample",
    "comm_records",
    "depth_of",
    "doubled",
    "extend",
    "held_state",
    "held_state_at",
    "overheads",
    "sample",
    "with_layers",
]

#: the depths traced: the rule is what the layer more adds, each run it doubles checked whole
DEPTHS = (3, 4)

Token = tuple[int, str, str]  # an event: (bytes, op, phase)
CommKey = tuple[str, int, str, int, str]  # collective, bytes, group, group size, phase


@dataclass(frozen=True)
class Sample:
    """What the rule reads of one depth's analysis."""

    layers: int
    events: tuple[Token, ...]
    baseline: int
    costs: dict[str, Counter[tuple[str, int, int, tuple[Any, ...]]]]
    comms: Counter[CommKey]
    flops: int
    tokens: int | None
    samples: int | None
    #: the part of ``flops`` that activation checkpointing recomputes
    recompute_flops: int = 0
    #: the event index where each training step begins (``MemoryReport.steps``)
    steps: tuple[int, ...] = (0,)
    #: the event index where each phase run begins (``MemoryReport.phase_runs``: one
    #: micro-batch's forward or backward on one stage, the optimizer's step)
    phase_runs: tuple[int, ...] = ()
    #: ``MemoryReport``'s peak, the caching allocator's reserved peak and the cuBLAS
    #: workspaces in it, and ``Analysis.footprint_bytes``
    peak_bytes: int = 0
    reserved_bytes: int = 0
    workspace_bytes: int = 0
    device_bytes: int = 0
    #: the collectives at the schedule's edges (``timing.model.schedule_edges``), first to last
    edges: tuple[CommKey, ...] = ()
    #: the parameters, buffers, gradients and optimizer state on the device (:func:`held_state`)
    state_bytes: int = 0
    #: the caching allocator's steps (``MemoryReport.allocator_steps``)
    allocator_steps: Any = field(default=None, compare=False, repr=False)


def depth_of(model: Any) -> int | None:
    """The number of decoder layers of ``model`` when the rule applies to it: a transformers
    config with ``num_hidden_layers`` of at least 5, whose per-layer lists (``layer_types``...)
    hold one value and whose built layers are alike; else None."""
    layers = getattr(model, "num_hidden_layers", None)
    if not is_transformers_config(model) or not isinstance(layers, int) or layers <= max(DEPTHS):
        return None
    for value in vars(model).values():
        if (
            isinstance(value, (list, tuple))
            and len(value) == layers
            and len(set(map(repr, value))) > 1
        ):
            return None  # e.g. sliding and full attention layers, dense and MoE layers
    module = to_meta(with_layers(model, max(DEPTHS) + 1)).module
    return layers if alike_layers(module, max(DEPTHS) + 1) else None


def with_layers(config: Any, layers: int) -> Any:
    """A copy of the transformers ``config`` with ``layers`` decoder layers (per-layer lists cut
    to as many)."""
    out = copy.deepcopy(config)
    n = config.num_hidden_layers
    for name, value in vars(config).items():
        if isinstance(value, list) and len(value) == n:
            setattr(out, name, value[:layers])
    out.num_hidden_layers = layers
    return out


def sample(a: Analysis, layers: int) -> Sample:
    """The rule's view of ``a``, the analysis of the model at ``layers`` layers."""
    report = a.memory
    base = report.baseline_bytes
    runs = sorted(report.phase_runs)
    events: list[Token] = []
    live, run = base, 0
    for i, (now, _, op) in enumerate(report.timeline):
        while run + 1 < len(runs) and runs[run + 1][0] <= i:
            run += 1
        phase = str(runs[run][1]) if runs else ""
        events.append((now - live, op, phase))
        live = now
    costs: dict[str, Counter[tuple[str, int, int, tuple[Any, ...]]]] = {}
    for c in a.calls:
        costs.setdefault("forward", Counter()).update(c.costs)
        costs.setdefault("backward", Counter()).update(c.backward_costs)
    for phase, table in a.orphan_costs.items():
        costs.setdefault(f"outside {phase}", Counter()).update(table)
    time = a.time
    tokens = samples = None
    if time is not None:  # what one rank's step processes, times the data-parallel ranks
        if time.tokens_per_s is not None:
            tokens = round(time.tokens_per_s * time.step_s)
        if time.samples_per_s is not None:
            samples = round(time.samples_per_s * time.step_s)
    keys = [_key(c) for c in a.comm_records]
    edges = tuple(keys[i] for i in sorted(schedule_edges(a.comm_records)))
    recomputed = sum(c.recompute_self_flops for c in a.calls)
    return Sample(
        layers, tuple(events), base, costs, Counter(keys), int(a.total_flops), tokens, samples,
        recomputed, tuple(report.steps), tuple(i for i, _ in runs), report.peak_bytes,
        report.reserved_bytes, report.workspace_bytes, a.footprint_bytes, edges, held_state(a),
        read_table(report.allocator_steps),
    )  # fmt: skip


def held_state(a: Analysis) -> int:
    """What one rank of ``a`` holds on the device through a training step: its parameters
    (shards), buffers, gradients and optimizer state. In training all four are live when the
    optimizer step begins, so the traced peak is at least this, and what the GPU holds
    (``Analysis.footprint_bytes``: the caching allocator's reserve, never below the peak, and
    the CUDA context and NCCL's buffers) at least this and those."""
    m = a.memory
    return m.param_bytes + m.buffer_bytes + m.gradient_bytes + m.optimizer_state_bytes


def held_state_at(three: Sample, four: Sample, layers: int) -> int:
    """:func:`held_state` at ``layers`` layers from the samples at 3 and 4: exact, with no rule
    to check, where the layers are alike (:func:`depth_of`): each holds the same parameters,
    sharded alike (FSDP2 and tensor parallelism split each parameter by its shape), and with
    them the same gradients and optimizer state; the rest (embeddings, head, norm) is the same
    at every depth."""
    return state_at(three.state_bytes, four.state_bytes, layers)


def state_at(three: int, four: int, layers: int) -> int:
    """What held ``three`` bytes at 3 layers and ``four`` at 4 holds at ``layers``: each layer
    alike adds the same (:func:`held_state_at`)."""
    return four + (four - three) * (layers - 4)


def overheads(s: Sample | Analysis) -> int:
    """What the GPU holds besides the caching allocator's reserve in ``s``: the CUDA context
    and NCCL's buffers, alike at every depth (0 without ``gpu=``)."""
    device, reserved = (
        (s.device_bytes, s.reserved_bytes)
        if isinstance(s, Sample)
        else (s.footprint_bytes, s.memory.reserved_bytes)
    )
    return max(0, device - reserved) if reserved > 0 else 0


def _key(c: CommRecord) -> CommKey:
    return (c.collective, c.bytes, c.group, c.group_size, str(c.phase))


def comm_records(comms: Counter[CommKey], edges: Sequence[CommKey]) -> list[CommRecord]:
    """One record per collective counted in ``comms``, in an order that keeps the schedule's
    ``edges`` where they ran (the forward's first first, the backward's last last)."""
    keys = sorted(comms.elements())
    first = [k for k in edges if k[4] == "forward"][:1]
    last = [k for k in edges if k[4] == "backward"][-1:]
    for key in first:
        keys.insert(0, keys.pop(keys.index(key)))
    for key in last:
        keys.append(keys.pop(len(keys) - 1 - keys[::-1].index(key)))
    return [
        CommRecord(i, coll, nbytes, group, size, "", phase, -1, -1, "")
        for i, (coll, nbytes, group, size, phase) in enumerate(keys)
    ]


@dataclass(frozen=True)
class Extended:
    """The numbers of the full depth, by the rule."""

    peak_bytes: int
    time: StepTime
    #: the least the GPU holds at the peak: the peak and what does not grow with depth
    #: (``least_device_bytes``)
    least_device_bytes: int
    #: what the GPU holds (``Analysis.footprint_bytes``): the caching allocator's reserve
    #: replayed over the full depth's steps (``depth_reserve``) and what does not grow with
    #: depth; None where the steps do not follow the rule
    device_bytes: int | None = None


def extend(
    samples: Sequence[Sample],
    layers: int,
    gpu: GPU,
    data_parallel: int,
    runs: Sequence[tuple[int, int]] | None = None,
    two: Sample | None = None,
) -> Extended | None:
    """The full depth's peak and step time from the samples at 3 and 4 layers; None when
    they do not follow the rule (``runs``: :func:`doubled`'s, when found already). ``two``:
    the sample at 2 layers, where it was traced for the caching allocator's reserve
    (``depth_reserve.Reserve``'s ``earlier``)."""
    three, four = samples
    runs = doubled(three, four) if runs is None else list(runs)
    runs = None if runs is None else _regrouped(three.events, runs, four.events)
    if runs is None:
        return None
    if three.edges != four.edges:
        return None
    extra = layers - three.layers
    linear = [
        _linear(
            [
                Counter({k: getattr(s, k) for k in ("baseline", "flops", "recompute_flops")})
                for s in samples
            ],
            extra,
        ),
        _linear([s.comms for s in samples], extra),
        *(_linear([s.costs.get(p, Counter()) for s in samples], extra) for p in _phases(samples)),
    ]
    checked = [c for c in linear if c is not None]
    if len(checked) < len(linear):
        return None
    totals, comms, *phases = checked
    costs = dict(zip(_phases(samples), phases, strict=True))
    deltas = np.array([t[0] for t in _repeat(three.events, runs, extra + 1)], dtype=np.int64)
    peak = totals["baseline"] + (int(np.cumsum(deltas).max()) if deltas.size else 0)
    call = CallRecord(0, "", "", -1, -1, 0, [], costs=dict(costs.get("forward", {})))
    call.backward_costs = dict(costs.get("backward", {}))
    call.recompute_self_flops = totals["recompute_flops"]
    outside = {
        p.removeprefix("outside "): dict(c) for p, c in costs.items() if p.startswith("outside ")
    }
    records = comm_records(comms, three.edges)
    dp = max(1, data_parallel)
    tokens = None if three.tokens is None else three.tokens // dp
    batch = None if three.samples is None else three.samples // dp
    flops = totals["flops"]
    time = step_time([call], outside, records, gpu, flops, tokens, batch, data_parallel=dp)
    least = least_device_bytes(peak, four)
    return Extended(peak, time, least, _device_bytes(samples, runs, layers, peak, two))


def _device_bytes(
    samples: Sequence[Sample],
    runs: Sequence[tuple[int, int]],
    layers: int,
    peak: int,
    two: Sample | None = None,
) -> int | None:
    """What the GPU holds at ``layers`` layers (``Analysis.footprint_bytes``): the caching
    allocator's reserve by the rule (``depth_reserve.Reserve``) and the CUDA context and
    NCCL's buffers, alike at 3 and 4 layers; the peak without a caching allocator (no
    ``gpu=``); None where the allocator's steps do not follow the rule. Where they do not with
    ``runs`` as the diff placed them, the same events' runs placed otherwise are tried: spread
    over their block (:func:`_spread`), then the run of each free that fails moved on
    (:func:`_slid`)."""
    three, four = samples
    if four.reserved_bytes <= 0 or four.device_bytes <= four.peak_bytes:
        return peak
    if overheads(three) != overheads(four):
        return None
    earlier = None if two is None else two.allocator_steps
    rule = Reserve([s.allocator_steps for s in samples], _doubled, _repeat, earlier)
    placed = list(runs)
    built = rule.build(placed, layers)
    spread = None if isinstance(built, tuple) else _spread(three.events, runs)
    if spread is not None and _regrouped(three.events, spread, four.events) == spread:
        placed = spread
        built = rule.build(placed, layers)
    for _ in placed:  # each try moves the run of the free that failed on: once a run at most
        moved = _slid(three.events, placed, built) if isinstance(built, int) else None
        if moved is None or _regrouped(three.events, moved, four.events) != moved:
            break
        placed = moved
        built = rule.build(placed, layers)
    reserved = reserved_peak(built)
    return None if reserved is None else reserved + overheads(four)


def _slid(
    events: Sequence[Token], runs: Sequence[tuple[int, int]], event: int
) -> list[tuple[int, int]] | None:
    """``runs`` with the run holding ``event`` moved on as far as the events let it: one event
    at a time while the event it leaves is the one it takes in (the same events inserted), short
    of the next run; None where no run holds ``event`` or it cannot move. A layer's free of a
    buffer in a row of alike frees (an interleaved rank's forward giving back the next stage's
    all-gather buffers one by one) may be any of the row's to the events, but to the allocator
    the one whose copies free the buffers the layer adds."""
    out = list(runs)
    for i, (start, end) in enumerate(runs):
        if not start <= event < end:
            continue
        limit = runs[i + 1][0] if i + 1 < len(runs) else len(events)
        step = 0
        while end + step < limit and events[start + step] == events[end + step]:
            step += 1
        out[i] = (start + step, end + step)
        return out if step else None
    return None


def _spread(
    events: Sequence[Token], runs: Sequence[tuple[int, int]]
) -> list[tuple[int, int]] | None:
    """``runs`` with each run of ``k`` alike events inside a block of those events cut into
    ``k`` single events, one at the end of each of ``k`` equal parts of the block; None where
    no run is so. The events are the same either way (any ``k`` of a block's alike events are
    an insertion), but not the allocations: an interleaved rank allocates its stages' FSDP2
    all-gather buffers together, a group a stage, and the layer more each stage has adds one
    to each group, where the diff sees one run of ``k`` at the block's start. The caching
    allocator's steps follow the rule only with each in its group."""
    out: list[tuple[int, int]] = []
    for start, end in runs:
        k, token = end - start, events[start]
        first, last = start, end
        while first > 0 and events[first - 1] == token:
            first -= 1
        while last < len(events) and events[last] == token:
            last += 1
        size, left = divmod(last - first, k)
        if k > 1 and left == 0 and all(e == token for e in events[start:end]):
            out += [(first + size * (i + 1) - 1, first + size * (i + 1)) for i in range(k)]
        else:
            out.append((start, end))
    out.sort()
    apart = all(end <= start for (_, end), (start, _) in itertools.pairwise(out))
    return out if apart and out != list(runs) else None


def least_device_bytes(peak: int, deepest: Sample) -> int:
    """The least the GPU holds at the full depth's ``peak``: the peak and the deepest trace's
    bytes that do not grow with depth (cuBLAS's workspaces, the CUDA context, NCCL's buffers).
    The caching allocator's rounding and cached blocks come on top. They do not grow with depth
    in any regular way (8.5, 6.9, 6.3 and 2.5 GB at 2, 3, 4 and 8 layers of a 70B FSDP 8 rank,
    7.6 GB at 80), so the bytes of the events cannot give them: the allocator replayed over the
    full depth's steps does (:func:`_device_bytes`), and this bound stands where those steps
    follow no rule. Without ``gpu=``: the peak."""
    if deepest.reserved_bytes <= 0 or deepest.device_bytes <= deepest.peak_bytes:
        return peak
    return peak + deepest.device_bytes - deepest.reserved_bytes + deepest.workspace_bytes


def _phases(samples: Sequence[Sample]) -> list[str]:
    return sorted({p for s in samples for p in s.costs})


def _linear(counters: Sequence[Counter[Any]], extra: int) -> Counter[Any] | None:
    """The 3-layer counter plus ``extra`` times the per-layer step (what the 4-layer counter
    adds); None where the layer takes anything away (a count that is not the layers' own)."""
    three, four = counters
    step = _step(three, four)
    if any(n < 0 for n in step.values()):
        return None
    out = Counter(three)
    for key, n in step.items():
        out[key] += n * extra
    return out


def _step(before: Counter[Any], after: Counter[Any]) -> dict[Any, int]:
    """What ``after`` adds to ``before``, zeros left out."""
    keys = set(before) | set(after)
    return {k: after[k] - before[k] for k in keys if after[k] != before[k]}


def doubled(three: Sample, four: Sample) -> list[tuple[int, int]] | None:
    """The runs of ``three``'s events that ``four`` (a layer more) holds twice (:func:`_doubled`),
    chunk by chunk (:func:`_chunks`; those alike in both skipped), in ``three``'s places. None
    when the chunks differ in number, or the layer adds nothing or changes anything."""
    cuts = _chunks(three), _chunks(four)
    if len(cuts[0]) != len(cuts[1]):
        return None
    runs: list[tuple[int, int]] = []
    seen: dict[Any, list[tuple[int, int]] | None] = {}  # alike chunks (each step's) diffed once
    for (a, end_a), (b, end_b) in zip(*cuts, strict=True):
        pair = three.events[a:end_a], four.events[b:end_b]
        if pair[0] == pair[1]:
            continue  # a chunk no layer runs in: a stage without the layer, an embedding's
        found = seen[pair] if pair in seen else seen.setdefault(pair, _doubled(*pair))
        if found is None:
            return None
        runs.extend((start + a, end + a) for start, end in found)
    return runs or None


def _chunks(s: Sample) -> list[tuple[int, int]]:
    """``s``'s events cut where each training step and each phase run begins: one diff of the
    whole could match a layer's events in one against another's (a training trace holds two
    alike steps; a rank of an interleaved pipeline runs the forwards and backwards of two stages
    by turns, and the layer more each stage has is not one block of the deeper trace: diffed
    whole, a stage's closing frees are taken into the layer's run)."""
    starts = sorted({0, *s.steps, *s.phase_runs} - {len(s.events)})
    return list(zip(starts, [*starts[1:], len(s.events)], strict=True))


def _doubled(short: Sequence[Token], long: Sequence[Token]) -> list[tuple[int, int]] | None:
    """The runs of ``short`` that ``long`` repeats: (start, end) in ``short``, each a block the
    diff sees ``long`` insert read as a run of ``short`` next to it, or around it, doubled
    (:func:`_run_doubled`); None when ``long`` changes or drops anything, inserts nothing, or
    inserts a block that doubles no run.

    The diff may split one layer's events around an event that also ends the run before it
    (GPT-2's optimizer loop: ``[free, sqrt, div, free]`` matched at its first ``free``): a block
    that doubles no run is read with the next one and the events between them as one block.
    """
    matcher = difflib.SequenceMatcher(None, short, long, autojunk=False)
    inserts: list[tuple[int, int, int]] = []
    for tag, i1, _, j1, j2 in matcher.get_opcodes():
        if tag == "insert":
            inserts.append((i1, j1, j2))
        elif tag != "equal":
            return None
    runs: list[tuple[int, int]] = []
    k = 0
    while k < len(inserts):
        at, j1, j2 = inserts[k]
        found = _run_doubled(short, at, long[j1:j2])
        if found is None and k + 1 < len(inserts):
            then, m1, m2 = inserts[k + 1]
            n = (j2 - j1) + (m2 - m1)
            if list(long[j1 + n : m2]) == list(short[at:then]):
                found = _run_doubled(short, at, long[j1 : j1 + n])
                k += 1
        if found is None:
            return None
        runs.extend(found)
        k += 1
    apart = all(end <= start for (_, end), (start, _) in itertools.pairwise(runs))
    return _split(short, runs) if runs and apart else None


def _run_doubled(
    short: Sequence[Token], at: int, block: Sequence[Token]
) -> list[tuple[int, int]] | None:
    """The run of ``short`` that inserting ``block`` at ``at`` doubles: the run ending at
    ``at``, the one starting there, or one around ``at`` (``block`` its events from ``at``
    on, then those before); else two runs meeting at ``at``, each doubled (the ends of two
    groups a layer extends each on its own, ``AB`` to ``AABB``); None where there is none."""
    n, block = len(block), list(block)
    for start in (at - n, at, *range(at - n + 1, at)):
        inside = start >= 0 and start + n <= len(short)
        if inside and list(short[at : start + n]) + list(short[start:at]) == block:
            return [(start, start + n)]
    for k in range(1, n):
        if list(short[at - k : at]) == block[:k] and list(short[at : at + n - k]) == block[k:]:
            return [(at - k, at), (at, at + n - k)]
    return None


def _split(events: Sequence[Token], runs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``runs`` cut where the phase changes inside one: the layer's events at the end of a
    phase and at the start of the next repeat each in its own phase (``XXYY``, not ``XYXY``):
    a training step's optimizer loop, then the next step's ``zero_grad`` freeing the layer's
    gradients, are two runs the diff may see as one."""
    out: list[tuple[int, int]] = []
    for start, end in runs:
        cut = start
        for j in range(start + 1, end):
            if events[j][2] != events[j - 1][2]:
                out.append((cut, j))
                cut = j
        out.append((cut, end))
    return out


def _regrouped(
    events: Sequence[Token], runs: Sequence[tuple[int, int]], four: Sequence[Token]
) -> list[tuple[int, int]] | None:
    """``runs`` such that ``four`` (the next depth's events) is ``events`` with each run
    doubled (:func:`_repeat`); None where no such runs are found.

    A run may hold the ends of two groups that the next layer extends each on its own: an
    optimizer's loop over one group of parameters, then over the next (FSDP2 with
    checkpointing), where the diff sees the third layer's last entry of one group and first of
    the next as one run ``AB``, and the fourth layer's trace holds ``AABB``, not ``ABAB``.
    Such a run is cut in two where exactly one cut gives ``four`` there (either half alone is
    an insertion too: cutting a run leaves what is left of ``events`` as it was).
    """
    out: list[tuple[int, int]] = []
    at = pos = 0
    for start, end in runs:
        run = list(events[start:end])
        size = (start - at) + 2 * len(run)
        if list(four[pos : pos + start - at]) != list(events[at:start]):
            return None
        doubled = list(four[pos + start - at : pos + size])
        if doubled == run * 2:
            out.append((start, end))
        else:
            cuts = [k for k in range(1, len(run)) if doubled == run[:k] * 2 + run[k:] * 2]
            if len(cuts) != 1:
                return None
            out += [(start, start + cuts[0]), (start + cuts[0], end)]
        at, pos = end, pos + size
    return out if list(four[pos:]) == list(events[at:]) else None


def _repeat(events: Sequence[Token], runs: Sequence[tuple[int, int]], times: int) -> list[Token]:
    """``events`` with each run appearing ``times`` times where it appears once."""
    out: list[Token] = []
    at = 0
    for start, end in runs:
        out.extend(events[at:end])
        out.extend(list(events[start:end]) * (times - 1))
        at = end
    out.extend(events[at:])
    return out
