"""The layouts of ``plan``: :class:`Layout`, the degrees of ``mw.Parallel`` (replicate x fsdp
x tp x pp x cp, ep within fsdp x cp), the pipeline's schedule, stages per rank and
micro-batches, and sequence parallelism, frozen and plain (it pickles, and travels in a
candidate's key to the workers of a plan); the layouts ``plan(layouts=...)`` gives, checked; and
the default ones."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..options import OptionError, OptionTypeError, Parallel
from ..sources.config_limits import EXPERT_FIELDS
from ..sources.models import is_transformers_config
from ..timing.gpus import GPU

__all__ = [
    "MESH",
    "PIPELINE",
    "SEQUENCE",
    "Layout",
    "decoder_layers",
    "default_layouts",
    "layouts_given",
    "routed_experts",
]

#: the degrees a layout of ``plan(layouts=...)`` may give (``mw.Parallel``'s)
MESH = ("replicate", "fsdp", "tp", "pp", "cp", "ep")
#: the pipeline's settings a layout with ``pp > 1`` may give (``mw.Parallel``'s)
PIPELINE = ("schedule", "virtual_stages", "microbatches")
#: how a layout with ``tp > 1`` may shard its activations (``mw.Parallel``'s)
SEQUENCE = ("sequence_parallel",)


@dataclass(frozen=True)
class Layout:
    """One layout of a plan: the degrees of ``mw.Parallel`` and its pipeline's settings, checked
    by ``Parallel`` itself (the schedule named as ``Parallel`` names it, the pipeline's
    micro-batches filled in), frozen and hashable. ``replicate * fsdp * tp * pp * cp`` devices;
    ``schedule`` is None and ``microbatches`` 1 without a pipeline (``pp == 1``)."""

    replicate: int = 1
    fsdp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    schedule: str | None = None
    virtual_stages: int = 1
    microbatches: int = 1
    sequence_parallel: bool = False

    @classmethod
    def of(cls, given: Mapping[str, Any] | Parallel) -> Layout:
        """The layout of a dict of ``MESH`` and ``PIPELINE`` names or of a ``Parallel``,
        checked by ``Parallel`` (an ``OptionError`` for a degree or schedule it refuses)."""
        if isinstance(given, Parallel):
            extra = [
                name
                for name in ("stage_boundaries", "capacity_factor", "mp", "blocks", "tp_plan")
                if getattr(given, name) is not None
            ]
            if extra:
                raise OptionError(
                    f"plan: layout {given!r} sets {', '.join(extra)}, which plan does not vary: "
                    "give the degrees and the pipeline's schedule, virtual_stages and "
                    "microbatches only (FSDP2's mixed precision is plan's precisions= axis)."
                )
            fields_ = {name: getattr(given, name) for name in (*MESH, *PIPELINE, *SEQUENCE)}
        else:
            fields_ = dict(given)
        sizes = [fields_.get(k, 1) for k in MESH]
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in sizes):
            raise OptionError(
                f"plan: layout {given!r} must map {', '.join(MESH)} to whole numbers >= 1."
            )
        if math.prod(sizes[:5]) == 1:  # one device: no Parallel to check it
            if fields_.get("sequence_parallel"):
                raise OptionError(
                    f"plan: layout {given!r} is one device: it has no tensor-parallel ranks to "
                    "shard the sequence over."
                )
            if any(fields_.get(k) not in (None, 1) for k in ("ep", *PIPELINE)):
                raise OptionError(
                    f"plan: layout {given!r} is one device: it has no pipeline nor experts "
                    "to split."
                )
            return cls()
        checked = Parallel(**{k: v for k, v in fields_.items() if v is not None})
        return cls(
            **{k: getattr(checked, k) for k in MESH},
            schedule=checked.schedule,
            virtual_stages=checked.virtual_stages,
            microbatches=checked.microbatches or 1,
            sequence_parallel=checked.sequence_parallel,
        )

    @property
    def devices(self) -> int:
        """The devices the layout uses: ``replicate * fsdp * tp * pp * cp``."""
        return self.replicate * self.fsdp * self.tp * self.pp * self.cp

    @property
    def data_parallel(self) -> int:
        """The ranks that process other samples: ``replicate * fsdp`` (tensor, pipeline and
        context-parallel ranks share theirs)."""
        return self.replicate * self.fsdp

    def parallel(self) -> Parallel | None:
        """The ``parallel=`` of ``analyze`` that traces the layout (None: one device)."""
        if self.devices == 1:
            return None
        sizes: dict[str, Any] = {k: getattr(self, k) for k in MESH if getattr(self, k) > 1}
        if self.sequence_parallel:
            sizes["sequence_parallel"] = True
        if self.pp == 1:
            return Parallel(**sizes)
        return Parallel(
            **sizes,
            schedule=self.schedule,
            virtual_stages=self.virtual_stages,
            microbatches=self.microbatches,
        )

    def label(self) -> str:
        """The degrees above 1 and the pipeline's schedule: ``"pp=4 fsdp=2 1F1B"``;
        ``"tp=8 sp"`` with sequence parallelism."""
        sizes = " ".join(f"{k}={getattr(self, k)}" for k in MESH if getattr(self, k) > 1)
        if self.sequence_parallel:
            sizes += " sp"
        if self.pp > 1:
            v = f" x{self.virtual_stages}" if self.virtual_stages > 1 else ""
            sizes += f" {self.schedule}{v}"
        return sizes or "one device"


def default_layouts(
    devices: int, gpu: GPU, layers: int | None = None, experts: int | None = None
) -> list[Layout]:
    """Every ``(replicate, fsdp, tp)`` with product ``devices`` and ``tp <= gpus_per_node``: by
    tp, then fewest replicas (plain FSDP first). Beyond one node (``devices >
    gpus_per_node``) and given the model's decoder ``layers``, then pipelines too: every ``pp
    > 1`` dividing ``devices`` (at most ``layers``) times ``fsdp x tp`` (no replicas, ``tp <=
    gpus_per_node``), run by ``1F1B`` over ``pp`` micro-batches. Given a mixture of experts'
    routed ``experts``, then each of those without tensor parallelism again with expert
    parallelism: ``ep`` the most ranks, within a node, that divide both ``fsdp`` and the
    experts (the all-to-all inside a node, as torchtitan's recipes lay it out; those with
    tensor parallelism take ``ep`` in ``plan`` where the model takes it:
    ``plan_checks.experts_where_taken``)."""
    node = max(1, gpu.gpus_per_node)
    found = [Layout(r, f, t) for r, f, t in _meshes(devices, node)]
    if layers is not None and devices > node:
        for pp in _divisors(devices)[1:]:
            if pp <= layers:
                found.extend(
                    Layout.of({"fsdp": f, "tp": t, "pp": pp, "schedule": "1F1B"})
                    for r, f, t in _meshes(devices // pp, node)
                    if r == 1
                )
    if experts:
        for layout in list(found):
            ep = expert_degree(layout, experts, node)
            if layout.tp == 1 and ep > 1:
                found.append(dataclasses.replace(layout, ep=ep))
    return found


def expert_degree(layout: Layout, experts: int, node: int) -> int:
    """The ``ep`` a default layout takes for ``experts`` routed experts: the most ranks, within
    a ``node``, that divide the experts and that ``ep`` may borrow (some of ``fsdp``, and with
    tensor parallelism all of ``tp`` too: ``Parallel._check_expert_ranks``); 1 for none."""
    tp = layout.tp
    found = [tp * k for k in _divisors(layout.fsdp) if experts % (tp * k) == 0 and tp * k <= node]
    return max(found, default=1)


def decoder_layers(model: Any) -> int | None:
    """The decoder layers of a transformers config (or of a model's config), which bound the
    default pipelines; None for other models (no pipeline by default)."""
    return _config_count(model, ("num_hidden_layers",), least=0)


def routed_experts(model: Any) -> int | None:
    """The routed experts of a transformers mixture-of-experts config (or a model's config),
    which the default layouts shard by ``ep``; None for other models."""
    return _config_count(model, EXPERT_FIELDS, least=2)


def _config_count(model: Any, fields: Sequence[str], least: int) -> int | None:
    """The first of ``fields`` that a transformers config (``model``, or ``model.config``)
    holds as a whole number of at least ``least``; None for other models."""
    config = model if is_transformers_config(model) else getattr(model, "config", None)
    if not is_transformers_config(config):
        return None
    for field in fields:
        count = getattr(config, field, None)
        if isinstance(count, int) and not isinstance(count, bool) and count >= least:
            return count
    return None


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _meshes(devices: int, node: int) -> list[tuple[int, int, int]]:
    """Every ``(replicate, fsdp, tp)`` with product ``devices`` and ``tp <= node``: by tp, then
    fewest replicas."""
    divisors = _divisors(devices)
    return [
        (replicate, devices // tp // replicate, tp)
        for tp in divisors
        if tp <= node
        for replicate in divisors
        if (devices // tp) % replicate == 0
    ]


def layouts_given(
    given: Sequence[Mapping[str, Any] | Parallel] | None,
    devices: int,
    gpu: GPU,
    layers: int | None,
    experts: int | None = None,
) -> tuple[Layout, ...]:
    """The layouts of ``plan(layouts=...)`` checked (no repeats), or the default ones."""
    if given is None:
        return tuple(default_layouts(devices, gpu, layers, experts))
    if isinstance(given, (str, Mapping, Parallel)) or not isinstance(given, Sequence) or not given:
        raise OptionTypeError(
            f"plan: layouts must be a non-empty list of dicts or mw.Parallel, not {given!r}: "
            'e.g. [{"fsdp": 8}, {"replicate": 2, "fsdp": 4}, {"pp": 4, "fsdp": 2, "schedule": '
            '"1F1B"}, mw.Parallel(pp=2, tp=4)].'
        )
    found = tuple(_layout(layout, devices) for layout in given)
    return tuple(dict.fromkeys(found))


def _layout(given: Any, devices: int) -> Layout:
    """One layout of ``plan(layouts=...)`` checked: a dict of ``MESH`` and ``PIPELINE`` names
    or a ``Parallel``, on ``devices`` devices."""
    known = isinstance(given, Parallel) or (
        isinstance(given, Mapping) and set(given) <= {*MESH, *PIPELINE, *SEQUENCE}
    )
    if not known:
        raise OptionError(
            f"plan: layout {given!r} must be a mw.Parallel or a dict of "
            f"{', '.join((*MESH, *PIPELINE, *SEQUENCE))}."
        )
    layout = Layout.of(given)
    if layout.devices != devices:
        raise OptionError(
            f"plan: layout {given!r} uses {layout.devices} devices, not the devices={devices} "
            "every candidate uses (replicate x fsdp x tp x pp x cp)."
        )
    return layout
