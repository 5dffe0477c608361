"""The header's badges: the settings of an analysis that change its numbers (autocast, the
parameters' dtype, the parallel layout, micro-batches, ``foreach``, checkpointing), each a
label and a tooltip saying which option of ``analyze`` gave it."""

from __future__ import annotations

from typing import Any

__all__ = ["encode_settings"]


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def encode_settings(options: Any) -> list[list[str]]:
    """The settings that change the numbers, as the header's badges: ``[label, tooltip]`` each.

    The mode and the source are the header's chips already; these are the rest: autocast, the
    parameters' dtype, the parallel layout, micro-batches, the optimizer's implementation when
    given (``foreach``), activation checkpointing. Defaults
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
    plan = options.parallel
    if plan is not None:
        mp = plan.mp  # FSDP2's MixedPrecisionPolicy
        policy = f"; MixedPrecisionPolicy({mp.arguments()})" if mp is not None else ""
        out.append(
            [
                plan.label(),
                f"analyze(..., parallel=...): this trace is "
                f"rank 0 of {plan.world}; its numbers are one GPU's{policy}",
            ]
        )
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
