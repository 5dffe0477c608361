"""``parallel=`` checked: the degrees of FSDP2 and tensor parallelism, bounded."""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass

from .errors import MAX_RANKS, OptionError, OptionTypeError, show

# -- parallel --------------------------------------------------------------------------------

_PARALLEL_EXAMPLE = (
    'e.g. parallel={"fsdp": 8}, {"tp": 2}, {"fsdp": 4, "tp": 2}, {"replicate": 2, "fsdp": 4} '
    '(HSDP), with optional "blocks" (module paths or class names fully_shard wraps) and '
    '"tp_plan" ({path: "colwise"})'
)


@dataclass(frozen=True)
class ParallelPlan:
    """``parallel=`` checked: FSDP2 over ``fsdp`` ranks and/or tensor parallelism over ``tp``,
    in ``replicate`` replicas (HSDP: ``fully_shard`` on a 2-D mesh, parameters sharded over
    ``fsdp`` ranks and replicated ``replicate`` times; ``replicate * fsdp * tp`` ranks in all,
    this trace is rank 0), the modules ``fully_shard`` wraps (``blocks``: None, each child of
    the outermost ``ModuleList``s) and the TP plan (``tp_plan``: None, the transformers
    config's)."""

    fsdp: int = 1
    tp: int = 1
    blocks: tuple[str, ...] | None = None
    tp_plan: tuple[tuple[str, str], ...] | None = None
    replicate: int = 1

    @property
    def world(self) -> int:
        return self.replicate * self.fsdp * self.tp

    @property
    def data_parallel(self) -> int:
        """The ranks that process other data: every replica's shard group."""
        return self.replicate * self.fsdp


def check_parallel(parallel: Any) -> ParallelPlan | None:
    """``parallel``: None, or a dict with ``fsdp`` and/or ``tp`` sizes (see ``ParallelPlan``)."""
    if parallel is None:
        return None
    if isinstance(parallel, ParallelPlan):
        return parallel
    if not isinstance(parallel, Mapping):
        raise OptionTypeError(
            f"parallel must be a dict, not {type(parallel).__name__}: {_PARALLEL_EXAMPLE}."
        )
    unknown = sorted(set(map(str, parallel)) - {"replicate", "fsdp", "tp", "blocks", "tp_plan"})
    if unknown:
        raise OptionError(f"parallel has unknown keys {unknown}: {_PARALLEL_EXAMPLE}.")
    sizes = _parallel_sizes(parallel)
    blocks = parallel.get("blocks")
    if blocks is not None:
        blocks = (blocks,) if isinstance(blocks, str) else blocks
        if not isinstance(blocks, Sequence) or not all(isinstance(b, str) for b in blocks):
            raise OptionTypeError(
                f"parallel['blocks'] must be module paths or class names, not {show(blocks)}."
            )
        blocks = tuple(blocks)
    plan = parallel.get("tp_plan")
    if plan is not None:
        if not isinstance(plan, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in plan.items()
        ):
            raise OptionTypeError(
                f"parallel['tp_plan'] must map module paths to style names, not {show(plan)}: "
                'e.g. {"layers.*.up": "colwise", "layers.*.down": "rowwise"}.'
            )
        plan = tuple(plan.items())
    return ParallelPlan(sizes["fsdp"], sizes["tp"], blocks, plan, sizes["replicate"])


def _parallel_sizes(parallel: Mapping[str, Any]) -> dict[str, int]:
    """``replicate``, ``fsdp`` and ``tp`` checked: whole numbers of devices, 2 to ``MAX_RANKS``
    in all."""
    sizes = {}
    for key in ("replicate", "fsdp", "tp"):
        value = parallel.get(key, 1)
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) < 1:
            raise OptionError(
                f"parallel[{key!r}] must be a whole number of devices >= 1, not {show(value)}: "
                f"{_PARALLEL_EXAMPLE}."
            )
        if int(value) > MAX_RANKS:
            raise OptionError(
                f"parallel[{key!r}]={show(value)} is more than {MAX_RANKS} devices, the most a "
                "parallel= trace stands for (the largest published training jobs): give the "
                f"degree of one job, {_PARALLEL_EXAMPLE}."
            )
        sizes[key] = int(value)
    world = sizes["replicate"] * sizes["fsdp"] * sizes["tp"]
    if world < 2:
        raise OptionError(
            f"parallel={show(dict(parallel))} is one device: give replicate, fsdp or tp > 1 "
            f"({_PARALLEL_EXAMPLE}), or leave parallel out."
        )
    if world > MAX_RANKS:
        raise OptionError(
            f"parallel={show(dict(parallel))} is {world} ranks (replicate x fsdp x tp), more than "
            f"{MAX_RANKS}, the most a parallel= trace stands for: lower fsdp or tp."
        )
    return sizes
