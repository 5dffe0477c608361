"""``payload["stages"]``: a pipeline-parallel analysis's ranks, for the widget's Stages tab.

``analyze(..., parallel=mw.Parallel(pp=P, ...))`` traces every pipeline rank and keeps them in
``a.stages`` (``meta_widget.distributed.pipelining.StageReport``); the analysis itself is the
rank with the highest peak. The widget draws, from what this sends: each rank's peak by memory
category side by side, the schedule each rank ran (its forward, backward and weight-gradient
actions in their time slots, the idle slots its bubble) and each rank's collectives per mesh
dimension. Nothing is computed here that the trace did not give: the numbers are the
``StageReport``'s, the categories its analysis's, the collectives its records summed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["encode_stages", "shown_rank"]


def shown_rank(stages: Sequence[Any]) -> int:
    """The pipeline rank whose analysis a pipeline analysis is: the first with the highest
    peak (``meta_widget.distributed.pipelining.run_stages``'s choice)."""
    return max(range(len(stages)), key=lambda r: stages[r].peak_bytes)


def comms_by_dimension(records: Sequence[Any]) -> list[list[Any]]:
    """A rank's collectives of one step summed by mesh dimension and collective:
    ``[group, collective, calls, bytes]`` each (``bytes`` as ``a.comms`` counts them: a send's
    tensor, an all-gather's output, a reduce-scatter's input), a dimension's rows together, in
    order of first appearance."""
    rows: dict[tuple[str, str], list[Any]] = {}
    for r in records:
        row = rows.setdefault((r.group, r.collective), [r.group, r.collective, 0, 0])
        row[2] += 1
        row[3] += r.bytes
    groups = list(dict.fromkeys(group for group, _ in rows))
    return sorted(rows.values(), key=lambda row: groups.index(row[0]))


def encode_stages(a: Any) -> dict[str, Any]:
    """``payload["stages"]`` of a pipeline analysis (``a.stages`` not empty)::

    {"pp": P, "schedule": "1F1B", "virtual_stages": v, "microbatches": m,
     "shown": int,                     # the pipeline rank this analysis is (highest peak)
     "slots": int,                     # the schedule's time slots (every action one)
     "ranks": [{"rank", "stages": [int], "modules": [str], "peak_bytes",
                "categories": {name: bytes},   # that rank's peak by memory category
                "bubble": float, "step_s": float | null, "send_bytes", "recv_bytes",
                "actions": [["F" | "B" | "W", stage, micro-batch]],   # as it ran them
                "slots": [int],                 # each action's time slot
                "comms": [[group, collective, calls, bytes]]}]}   # per mesh dimension
    """
    plan = a.options.parallel
    stages = a.stages
    return {
        "pp": plan.pp,
        "schedule": str(plan.schedule),
        "virtual_stages": plan.virtual_stages,
        "microbatches": plan.microbatches,
        "shown": shown_rank(stages),
        "slots": max((max(s.slots) + 1 for s in stages if s.slots), default=0),
        "ranks": [
            {
                "rank": s.rank,
                "stages": list(s.stages),
                "modules": list(s.modules),
                "peak_bytes": s.peak_bytes,
                "categories": dict(s.analysis.memory.categories),
                "bubble": s.bubble,
                "step_s": s.step_s,
                "send_bytes": s.send_bytes,
                "recv_bytes": s.recv_bytes,
                "actions": [list(action) for action in s.actions],
                "slots": list(s.slots),
                "comms": comms_by_dimension(s.analysis.comm_records),
            }
            for s in stages
        ],
    }
