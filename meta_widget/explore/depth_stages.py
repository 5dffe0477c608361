"""The per-layer rule (``explore.depth``) for a pipeline: every rank extended on its own.

A pipeline layout splits the decoder's layers evenly over its stages
(``distributed.stages.layer_ranges``), and each rank is traced with its own stages only. Traced
with ``stages * d`` layers for ``d`` in ``DEPTHS``, every stage holds ``d`` layers, and each
rank's analysis (``Analysis.stages[r].analysis``) is one sample of the rule at ``d`` layers a
stage: the first rank's embedding and the last's norm and head are in every sample alike, and
a layer more a stage inserts the same runs of events into each of the schedule's micro-batches.
Each rank is extended by ``depth.extend`` to the layers a stage it holds at the full depth
(which differ by one where the stages do not divide the layers), its 4-layer trace checking
the rule, as for one stage.

The pipeline's numbers are then assembled as ``distributed.pipelining.run_stages`` assembles
a full-depth trace's: each rank's step with the schedule's bubble (``stage_step_s``; the
bubbles come from the schedule's actions, which must be the same at every depth), the
pipeline's step the slowest rank's, and the peak, what the GPU holds and the rates those of
the rank with the highest peak (``in_pipeline``).

Each trace runs every rank, so the rule costs the layers of its two traces, 3 + 4 a stage,
where the full depth costs the stage's layers once: it is used only where a stage holds more
than 7 (the Llama 3 405B's 126 layers over 2, 4 or 8 stages: 63, 32 and 16 layers a stage;
over 16 stages, 7 or 8 layers a stage are traced whole). Where a rank's stages differ in size
(virtual stages over layers they do not divide), the schedule's bubbles change with depth or
any rank's traces break the rule, there is no result either: the pipeline is traced at full
depth. After its traces at 3 and 4 layers a stage, what each rank holds besides its
activations at the full depth is exact (:func:`held_by_ranks`), and prunes as for one stage.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..analysis import Analysis
from ..distributed.stages import stage_indices
from ..options import Parallel
from ..timing.gpus import GPU
from ..timing.model import in_pipeline, stage_step_s
from .depth import DEPTHS, Extended, extend, held_state, overheads, sample, state_at

__all__ = ["extend_stages", "held_by_ranks", "stage_layers"]


def stage_layers(plan: Parallel, layers: int) -> list[int] | None:
    """The layers a stage of each pipeline rank of ``plan`` holds at ``layers`` layers (split
    as ``layer_ranges`` splits them without ``stage_boundaries``); None where one rank's stages
    differ in size, or a stage holds no more layers than the rule's two traces together (7:
    tracing the pipeline whole once costs less)."""
    if plan.stage_boundaries is not None:
        return None
    size, extra = divmod(layers, plan.stages)
    sizes = [size + (1 if i < extra else 0) for i in range(plan.stages)]
    out = []
    for rank in range(plan.pp):
        mine = {sizes[s] for s in stage_indices(plan, rank)}
        if len(mine) != 1:
            return None
        out.append(mine.pop())
    return out if min(out) > sum(DEPTHS) else None


def held_by_ranks(three: Analysis, four: Analysis, sizes: Sequence[int]) -> int | None:
    """The most one rank of the pipeline holds on its GPU through a step at the full depth
    (``sizes``: :func:`stage_layers`) besides what its activations take: its parameters,
    buffers, gradients and optimizer state (``depth.held_state_at``, exact as for one stage:
    each rank's layers are alike) and the CUDA context and NCCL's buffers; from the analyses
    at 3 and 4 layers a stage. None where they lack a rank."""
    ranks = (three.stages, four.stages)
    if any(r is None or len(r) != len(sizes) for r in ranks):
        return None
    at_three, at_four = ranks
    assert at_three is not None and at_four is not None
    return max(
        state_at(held_state(a.analysis), held_state(b.analysis), layers) + overheads(b.analysis)
        for a, b, layers in zip(at_three, at_four, sizes, strict=True)
    )


def extend_stages(
    analyses: Sequence[Analysis],
    sizes: Sequence[int],
    gpu: GPU,
    data_parallel: int,
    two: Analysis | None = None,
) -> Extended | None:
    """The pipeline's numbers at the full depth (``sizes``: :func:`stage_layers`) from its
    analyses with ``DEPTHS`` layers a stage; None where the rule does not hold (module
    docstring). ``two``: its analysis with 2 layers a stage, where traced for the caching
    allocator's reserve (``depth.extend``)."""
    reports = [a.stages for a in analyses]
    if any(r is None or len(r) != len(sizes) for r in reports):
        return None
    bubbles = {tuple(s.bubble for s in r) for r in reports if r is not None}
    if len(bubbles) != 1:
        return None
    (bubble,) = bubbles
    ranks: list[Extended] = []
    for rank, layers in enumerate(sizes):
        samples = [sample(r[rank].analysis, d) for r, d in zip(reports, DEPTHS, strict=True) if r]
        earlier = None if two is None or two.stages is None else two.stages[rank].analysis
        full = extend(
            samples, layers, gpu, data_parallel, two=None if earlier is None else sample(earlier, 2)
        )
        if full is None:
            return None
        ranks.append(full)
    step_s = max(stage_step_s(e.time, b) for e, b in zip(ranks, bubble, strict=True))
    worst = max(ranks, key=lambda e: e.peak_bytes)  # the first of the highest, as run_stages
    return Extended(
        worst.peak_bytes,
        in_pipeline(worst.time, step_s),
        worst.least_device_bytes,
        worst.device_bytes,
    )
