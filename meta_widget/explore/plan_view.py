"""The plan view of ``mw.plan``: every candidate as step time against its per-rank peak.

``plan_payload(plan)`` is what the front end (``js/plan.ts``) draws: the candidates traced as
points (fitting ones filled, the others hollow), the budget as a vertical dashed line, the best
one marked, a table of them all, and the candidates not traced listed with their reason.
Clicking a candidate sends ``{"type": "open", "index": i}``; the kernel answers by putting
that candidate's analysis payload in the view's ``detail`` trait (``plan_widget``), which the
front end shows below the chart as the analysis widget does: a trait, so it is saved with the
notebook and shown again when the notebook is opened without a kernel.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..choices import ExploreKind
from .fit import NothingFitsError
from .plan_front import front, gpu_hours
from .view import ExploreView, explore_view

if TYPE_CHECKING:  # plan.py imports this module when a plan is shown
    from .plan import Candidate, Plan

__all__ = ["plan_payload", "plan_widget"]


def plan_payload(plan: Plan) -> dict[str, Any]:
    """What the plan view shows: the plan's GPU, devices, mode and budget, the index of its
    best candidate (None when nothing fits), and one entry per candidate (camelCase keys of
    the columns of ``Plan.to_dataframe()``, and ``index``, its place in ``plan.candidates``).

    Parameters
    ----------
    plan
        The answer of ``mw.plan``.

    Returns
    -------
    dict
        ``{"title", "gpu", "devices", "mode", "budget", "best", "tokens", "notes",
        "candidates": [...]}`` (``notes``: ``Plan.notes``, shown under the verdict);
        each candidate's ``pareto`` (on the Pareto front of the fitting ones: ``Plan.pareto``)
        and ``gpuHours`` (``to_dataframe()``'s ``gpu_hours``: None unless the plan is priced,
        ``Plan.for_tokens``).
    """
    try:
        best: int | None = plan.candidates.index(plan.best)
    except NothingFitsError:
        best = None
    return {
        "title": plan.title,
        "gpu": plan.gpu.name,
        "devices": plan.devices,
        "mode": plan.mode,
        "budget": plan.budget,
        "best": best,
        "tokens": plan.tokens,
        "notes": list(plan.notes),
        "candidates": [
            {**_candidate(i, c), "pareto": on, "gpuHours": gpu_hours(c, plan.devices, plan.tokens)}
            for i, (c, on) in enumerate(zip(plan.candidates, front(plan.candidates), strict=True))
        ],
    }


def _candidate(index: int, c: Candidate) -> dict[str, Any]:
    """One candidate of the payload (``pareto`` and ``gpuHours`` added by the plan's)."""
    return {
        "index": index,
        "replicate": c.replicate,
        "fsdp": c.fsdp,
        "tp": c.tp,
        "pp": c.pp,
        "cp": c.cp,
        "ep": c.ep,
        "sequenceParallel": c.sequence_parallel,
        "schedule": c.schedule,
        "virtualStages": c.virtual_stages,
        "checkpointing": c.activation_checkpointing,
        "precision": c.precision,
        "microBatches": c.micro_batches,
        "peakBytes": c.peak_bytes,
        "deviceBytes": c.device_bytes,
        "fits": c.fits,
        "stepS": c.step_s,
        "mfu": c.mfu,
        "tokensPerS": c.tokens_per_s,
        "samplesPerS": c.samples_per_s,
        "error": c.error,
        "openable": c.openable,
        "tracedLayers": list(c.traced_layers),
    }


def plan_widget(plan: Plan) -> ExploreView:
    """The plan view of ``plan`` (``ExploreView``, kind ``"plan"``): clicking a candidate
    shows its analysis below the chart (the view's ``detail`` trait)."""

    def open_candidate(index: int) -> dict[str, Any] | None:
        if not 0 <= index < len(plan.candidates):
            return None
        analysis = plan.candidates[index].analysis
        return None if analysis is None else analysis.to_payload()

    view = explore_view(ExploreKind.PLAN, plan_payload(plan), repr(plan))
    view.opener = open_candidate
    return view
