"""The header's badges: the settings of an analysis that change its numbers (autocast, the
parameters' dtype, the parallel layout, micro-batches, ``foreach``, checkpointing), each a
label and a tooltip saying which option of ``analyze`` gave it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..options import MESH_DIMS, SCHEDULES
from .stages import shown_rank

__all__ = ["encode_settings"]


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def encode_settings(options: Any, stages: Sequence[Any] = ()) -> list[list[str]]:
    """The settings that change the numbers, as the header's badges: ``[label, tooltip]`` each.

    The mode and the source are the header's chips already; these are the rest: autocast, the
    parameters' dtype, the parallel layout, micro-batches, the optimizer's implementation when
    given (``foreach``), activation checkpointing. ``stages``: a pipeline's ranks
    (``a.stages``), for the badges to say which rank the numbers are. Defaults
    (none of them given) send an empty list.
    """
    out: list[list[str]] = []
    if options.autocast is not None:
        name = _dtype_name(options.autocast)
        out.append(
            [
                f"autocast {name}",
                f"analyze(..., autocast={name}): ops ran under "
                "torch.autocast, activations in that dtype where autocast casts",
            ]
        )
    if options.param_dtype is not None:
        name = _dtype_name(options.param_dtype)
        out.append(
            [
                f"params {name}",
                f"analyze(..., param_dtype={name}): floating parameters and buffers in that dtype",
            ]
        )
    if options.parallel is not None:
        out.extend(_layout_badges(options.parallel, stages))
    if getattr(options, "micro_batches", 1) > 1:
        n = options.micro_batches
        out.append(
            [
                f"{n} micro-batches",
                f"analyze(..., micro_batches={n}): gradient "
                "accumulation over that many forward/backward passes per step",
            ]
        )
    foreach = getattr(options, "foreach", None)
    if foreach is not None and getattr(options, "training", False):
        out.append(
            [
                f"foreach {'on' if foreach else 'off'}",
                f"analyze(..., foreach={foreach}): the optimizer step "
                + ("as one multi-tensor op per list" if foreach else "one parameter at a time"),
            ]
        )
    if getattr(options, "activation_checkpointing", False):
        saves = getattr(options, "save_policy", None)  # selective: what its policy saves
        kept = f"outputs of {saves.label} kept, other " if saves is not None else ""
        out.append(
            [
                "selective checkpointing" if saves is not None else "checkpointing",
                f"analyze(..., activation_checkpointing=...): {kept}activations "
                "recomputed in the backward pass",
            ]
        )
    return out


def _layout_badges(plan: Any, stages: Sequence[Any]) -> list[list[str]]:
    """The parallel layout's badges: the degrees (``pp 4 × fsdp 2``, with FSDP2's mixed precision
    policy with them) and, for a pipeline, its schedule (``1F1B · 8 micro-batches``), each
    tooltip saying which rank the numbers are."""
    mp = plan.mp  # FSDP2's MixedPrecisionPolicy
    policy = f"; MixedPrecisionPolicy({mp.arguments()})" if mp is not None else ""
    experts = (
        f"; ep {plan.ep}: each rank holds 1/{plan.ep} of every MoE layer's experts, the tokens "
        "sent to them by all-to-all under balanced routing (see the notes)"
        if plan.ep > 1
        else ""
    )
    if plan.pp == 1 or not stages:
        tip = f"rank 0 of {plan.world}; its numbers are one GPU's{policy}{experts}"
        return [[plan.label(), f"analyze(..., parallel=...): this trace is {tip}"]]
    # the mesh's order, the pipeline outermost (expert parallelism within fsdp x cp)
    dims = (*MESH_DIMS, "ep")
    degrees = " × ".join(f"{k} {getattr(plan, k)}" for k in dims if getattr(plan, k) > 1)
    shown = shown_rank(stages)
    rank = shown * (plan.world // plan.pp)  # pipelining.rank_of: pp is the mesh's outermost
    where = (
        f"pipeline rank {shown} (rank {rank} of {plan.world}), the one of the {plan.pp} "
        "with the highest peak; the Stages tab has every rank's"
    )
    layout = [
        degrees + (f" · {mp.label()}" if mp is not None else ""),
        f"analyze(..., parallel=...): this trace is {where}; its numbers are one GPU's"
        f"{policy}{experts}",
    ]
    v = plan.virtual_stages
    per_rank = f" · {v} stages a rank" if v > 1 else ""
    schedule = [
        f"{plan.schedule} · {plan.microbatches} micro-batches{per_rank}",
        f"the pipeline's schedule: torch.distributed.pipelining.{SCHEDULES[plan.schedule][0]}, "
        f"{plan.microbatches} micro-batches a step over {plan.stages} stages; pipeline rank "
        f"{shown} waits {stages[shown].bubble:.0%} of the step (its bubble)",
    ]
    return [layout, schedule]
