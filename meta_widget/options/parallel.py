"""``parallel=`` checked: the degrees of FSDP2 and tensor parallelism, bounded, and FSDP2's
mixed precision (``"mp"``: the arguments of ``torch.distributed.fsdp.MixedPrecisionPolicy``)."""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import heavy

if TYPE_CHECKING:
    import torch

from .errors import MAX_RANKS, OptionError, OptionTypeError, show
from .shapes import parse_dtype

# -- parallel --------------------------------------------------------------------------------

_PARALLEL_EXAMPLE = (
    'e.g. parallel={"fsdp": 8}, {"tp": 2}, {"fsdp": 4, "tp": 2}, {"replicate": 2, "fsdp": 4} '
    '(HSDP), with optional "blocks" (module paths or class names fully_shard wraps) and '
    '"tp_plan" ({path: "colwise"}) and "mp" (FSDP2\'s mixed precision: {"param_dtype": '
    '"bfloat16", "reduce_dtype": "float32"})'
)
#: ``MixedPrecisionPolicy``'s arguments: the dtypes, and whether forward inputs are cast
MP_DTYPES = ("param_dtype", "reduce_dtype", "output_dtype")
MP_KEYS = (*MP_DTYPES, "cast_forward_inputs")


@dataclass(frozen=True)
class MixedPrecision:
    """``parallel["mp"]`` checked: the arguments of FSDP2's
    ``torch.distributed.fsdp.MixedPrecisionPolicy``, which ``fully_shard`` takes as
    ``mp_policy`` (``param_dtype``: the dtype parameters are all-gathered and computed in, the
    sharded parameters keeping theirs; ``reduce_dtype``: the dtype gradients are
    reduce-scattered in; ``output_dtype``: the dtype of the module's floating outputs;
    ``cast_forward_inputs``: floating inputs cast to ``param_dtype``)."""

    param_dtype: torch.dtype | None = None
    reduce_dtype: torch.dtype | None = None
    output_dtype: torch.dtype | None = None
    cast_forward_inputs: bool = True

    def label(self) -> str:
        """``"mp bfloat16 params, float32 reduce"``: the dtypes given, for the badge."""
        given = [
            f"{str(dtype).removeprefix('torch.')} {key.removesuffix('_dtype')}"
            for key in MP_DTYPES
            if (dtype := getattr(self, key)) is not None
        ]
        return "mp " + (", ".join(given) or "default")

    def arguments(self) -> str:
        """``param_dtype=torch.bfloat16, ...``: the policy's arguments that are not defaults."""
        given = [f"{key}={getattr(self, key)}" for key in MP_DTYPES if getattr(self, key)]
        return ", ".join(
            given + ([] if self.cast_forward_inputs else ["cast_forward_inputs=False"])
        )


@dataclass(frozen=True)
class ParallelPlan:
    """``parallel=`` checked: FSDP2 over ``fsdp`` ranks and/or tensor parallelism over ``tp``,
    in ``replicate`` replicas (HSDP: ``fully_shard`` on a 2-D mesh, parameters sharded over
    ``fsdp`` ranks and replicated ``replicate`` times; ``replicate * fsdp * tp`` ranks in all,
    this trace is rank 0), the modules ``fully_shard`` wraps (``blocks``: None, each child of
    the outermost ``ModuleList``s) and the TP plan (``tp_plan``: None, the transformers
    config's) and FSDP2's mixed precision (``mp``)."""

    fsdp: int = 1
    tp: int = 1
    blocks: tuple[str, ...] | None = None
    tp_plan: tuple[tuple[str, str], ...] | None = None
    replicate: int = 1
    #: FSDP2's mixed precision (``fully_shard(..., mp_policy=...)``), or None: none
    mp: MixedPrecision | None = None

    @property
    def world(self) -> int:
        return self.replicate * self.fsdp * self.tp

    def label(self) -> str:
        """The layout in a few words: ``"fsdp 4 × tp 2 · mp bfloat16 param"``."""
        sizes = [
            f"{k} {getattr(self, k)}" for k in ("replicate", "fsdp", "tp") if getattr(self, k) > 1
        ]
        mp = f" · {self.mp.label()}" if self.mp is not None else ""
        return (" × ".join(sizes) or "parallel") + mp

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
    known = {"replicate", "fsdp", "tp", "blocks", "tp_plan", "mp"}
    unknown = sorted(set(map(str, parallel)) - known)
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
    mp = _mixed_precision(parallel.get("mp"))
    if mp is not None and sizes["fsdp"] == sizes["replicate"] == 1:
        raise OptionError(
            f"parallel['mp'] is FSDP2's mixed precision, and parallel={show(dict(parallel))} "
            'shards nothing with FSDP2: give "fsdp" (e.g. {"fsdp": 8, "mp": {...}}), or leave '
            '"mp" out (for compute in bfloat16 on one device, analyze(..., autocast=...))."'
        )
    return ParallelPlan(sizes["fsdp"], sizes["tp"], blocks, plan, sizes["replicate"], mp)


def _mixed_precision(mp: Any) -> MixedPrecision | None:
    """``parallel["mp"]``: None, a dict of ``MixedPrecisionPolicy``'s arguments (dtypes as
    ``torch.dtype`` or by name) or a ``MixedPrecisionPolicy`` itself."""
    if mp is None or isinstance(mp, MixedPrecision):
        return mp
    if type(mp).__name__ == "MixedPrecisionPolicy":  # FSDP2's own: its fields, read
        mp = {key: getattr(mp, key) for key in MP_KEYS}
    if not isinstance(mp, Mapping):
        raise OptionTypeError(
            f"parallel['mp'] must be a dict of MixedPrecisionPolicy's arguments or a "
            f'MixedPrecisionPolicy, not {show(mp)}: e.g. {{"param_dtype": "bfloat16", '
            '"reduce_dtype": "float32"}.'
        )
    unknown = sorted(set(map(str, mp)) - set(MP_KEYS))
    if unknown:
        raise OptionError(
            f"parallel['mp'] has unknown keys {unknown}: MixedPrecisionPolicy takes "
            f"{', '.join(MP_KEYS)}."
        )
    dtypes = {key: _floating(mp[key], key) for key in MP_DTYPES if mp.get(key) is not None}
    cast = mp.get("cast_forward_inputs", True)
    if not isinstance(cast, bool):
        raise OptionTypeError(
            f"parallel['mp']['cast_forward_inputs'] must be True or False, not {show(cast)}."
        )
    return MixedPrecision(**dtypes, cast_forward_inputs=cast)


def _floating(value: Any, key: str) -> torch.dtype:
    """A floating dtype, given as a ``torch.dtype`` or its name."""
    torch = heavy.torch()
    dtype = value
    if isinstance(value, str):
        try:
            dtype = parse_dtype(value)
        except OptionError:
            dtype = None
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise OptionError(
            f"parallel['mp'][{key!r}] must be a floating dtype (torch.bfloat16, 'float32'...), "
            f"not {show(value)}."
        )
    return dtype


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
