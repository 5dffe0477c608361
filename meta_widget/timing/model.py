"""The time of a traced step on one accelerator, from the trace's records (no re-trace).

Per op (``meta_widget.trace.costs`` records each op's peak class, executed FLOPs, bytes and
shape):

    time = max(FLOPs / (peak of its class * the fraction its shape reaches),
               bytes / (HBM bandwidth * EFFICIENCY.memory),
               EFFICIENCY.kernel_s with launch="eager", 0 with launch="graphs")

The fraction a GEMM or a fused attention kernel reaches comes from its shape, its kernel, its
precision and the GPU (``meta_widget.timing.efficiency``, every figure with its source).

An op is *compute*-bound when the first term is the larger of the first two, else *memory*-bound.
Views and metadata ops cost nothing. Fused attention with ``is_causal`` counts half its FLOPs in
time (the kernel skips the masked blocks); ``mfu`` and ``hfu`` keep ``FlopCounterMode``'s FLOPs.

Utilisation, over the step's time and the dense peak of the precision that ran the most FLOPs:
``mfu`` (model FLOPs utilisation, PaLM's definition: the FLOPs of the model's forward and
backward, activation checkpointing's recomputation left out, so it does not rise when a step
recomputes more) and ``hfu`` (hardware FLOPs utilisation: every FLOP the step executes, the
recomputation included). Without checkpointing the two are equal.

Per collective (``a.comm_records``), ring formulas over a group of ``p`` ranks moving ``N``
bytes (the whole tensor): all-gather, reduce-scatter and all-to-all ``(p-1)/p * N / bw``,
all-reduce ``2 (p-1)/p * N / bw``, broadcast ``N / bw``; plus ``EFFICIENCY.collective_s``. ``bw``
is one direction of NVLink (``nvlink_bytes_per_s / 2``) times ``EFFICIENCY.link`` when the
group's ranks share a node (``p * stride <= gpus_per_node``; the mesh is replicate x fsdp x tp,
tensor parallelism innermost, so an FSDP group's ranks are ``tp`` apart and an HSDP replica
group's ``fsdp * tp``; an all-reduce there on H100 / H200 runs NVLink SHARP, at
``efficiency.NVLS_FRACTION`` instead), else the network's ``network_bytes_per_s`` times
``EFFICIENCY.network``.

Overlap, as PyTorch's FSDP schedules it (a unit's all-gather prefetched during the previous
unit's compute; a unit's reduce-scatter run during the next unit's backward): FSDP's collectives
(every group but ``"tp"``) run beside the phase's compute and only what exceeds it is exposed,
but for the two the schedule has no compute to put beside: the first of the forward (the root
unit's all-gather, before any layer runs) and the last of the backward (the root unit's
reduce-scatter, or HSDP's last all-reduce, which the optimizer step waits for), exposed whole
(``edges``); tensor parallelism's sit between dependent matmuls and expert parallelism's
all-to-alls between the router and the experts, and are exposed whole:

    step_s = forward_s + backward_s + optimizer_s + edges
             + sum over phases (max(0, overlapped comm - compute) + tp comm)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import torch

from ..choices import Phase
from ..data.records import CallRecord
from ..units import format_seconds
from .efficiency import (
    EAGER_OP_S,
    FALLBACK_COMPUTE,
    HBM_FRACTION,
    NETWORK_FRACTION,
    NVLINK_FRACTION,
    NVLS_FRACTION,
    NVLS_PARTS,
    compute_fraction,
)
from .gpus import GPU

__all__ = [
    "EFFICIENCY",
    "Efficiency",
    "StepTime",
    "generation_time",
    "in_pipeline",
    "stage_step_s",
    "step_time",
    "tokens_of",
]

Cost = tuple[str, int, int, tuple[Any, ...]]
_FORWARD, _BACKWARD, _OPTIMIZER = Phase.FORWARD.value, Phase.BACKWARD.value, Phase.OPTIMIZER.value


@dataclass(frozen=True)
class Efficiency:
    """The fractions of the datasheet figures real kernels reach that do not depend on an op's
    shape, and the fixed costs (``meta_widget.timing.efficiency`` has their sources; the shape-
    dependent GEMM and attention fractions live there too).

    - ``compute`` 0.75: the fraction of a peak an op reaches where no figure was read for the
      GPU and precision (float32, TF32, a GPU of your own): an assumption.
    - ``memory`` 0.77: decode reaches 77 % of the datasheet HBM bandwidth (vLLM on an A100).
    - ``link`` 370/450: NCCL's bus bandwidth over NVLink (its maintainers' figure on H100).
    - ``network`` 47/50: NCCL's ring bus bandwidth over a 400 Gb/s NIC (46-48 GB/s).
    - ``kernel_s`` 5 us: eager PyTorch's host time per op (``launch="eager"``): no op takes less.
      Not applied to the optimizer step, which the trace runs one parameter at a time
      (``foreach=False``) where PyTorch's default ``foreach`` / ``fused`` implementations launch
      a few kernels for all parameters; nor with ``launch="graphs"`` (CUDA graphs replay).
    - ``collective_s`` 10 us: the fixed cost of one NCCL collective: nccl-tests' smallest
      messages on 8 H20 (the H100's NVLink 4 / NVSwitch fabric) take 10.3-12.5 us
      (deepseek-ai/DeepEP issue 303); across nodes it is more (46 us on two, NVIDIA/nccl issue
      1244), which is not modelled.
    """

    compute: float = FALLBACK_COMPUTE
    memory: float = HBM_FRACTION
    link: float = NVLINK_FRACTION
    kernel_s: float = EAGER_OP_S
    collective_s: float = 10e-6
    network: float = NETWORK_FRACTION


EFFICIENCY = Efficiency()


class CommLike(Protocol):
    """What the time model reads of a collective (``distributed.comms.CommRecord``)."""

    @property
    def collective(self) -> str: ...
    @property
    def bytes(self) -> int: ...
    @property
    def group(self) -> str: ...
    @property
    def group_size(self) -> int: ...
    @property
    def module(self) -> str: ...
    @property
    def phase(self) -> str: ...


#: bytes moved per byte of the whole tensor, by collective, on a ring of ``p`` ranks
_RING = {
    "all_gather": lambda p: (p - 1) / p,
    "reduce_scatter": lambda p: (p - 1) / p,
    "all_to_all": lambda p: (p - 1) / p,
    "all_reduce": lambda p: 2 * (p - 1) / p,
}
#: groups whose collectives sit on the critical path (no overlap with compute): tensor
#: parallelism's, between dependent matmuls; expert parallelism's all-to-alls, between the
#: router and the experts that need their tokens (torchtitan's ``ExpertParallel`` dispatch even
#: waits on the host for the split sizes: "this would incur a device-to-host sync",
#: torchtitan/distributed/expert_parallel.py); context parallelism's, whose ring attention
#: (PyTorch's default rotation, an all-gather of the keys and values) waits before it attends
_BLOCKING = frozenset({"tp", "ep", "cp"})


@dataclass(frozen=True)
class StepTime:
    """The time of the traced step on ``gpu`` (``meta_widget.timing.model`` has the model).

    ``forward_s``, ``backward_s``, ``optimizer_s``: the compute of each phase (every op, module
    calls and ops outside them: the loss, the optimizer step; recomputation under activation
    checkpointing is backward's); ``comm_s``: every collective, each as if alone;
    ``exposed_comm_s``: the part no compute hides; ``step_s``: the phases plus the exposed
    communication. ``flops``: the analysis' ``total_flops`` (``FlopCounterMode``'s, causal
    attention counted in full, the recomputation of activation checkpointing included, as
    ``FlopCounterMode`` over a real checkpointed step counts it); ``recompute_flops``: that
    recomputation's part; ``model_flops``: the rest. ``mfu`` (model FLOPs utilisation, PaLM's):
    ``model_flops / (step_s * peak_flops)``, with ``peak_flops`` the dense peak of the precision
    that ran the most FLOPs; ``hfu`` (hardware FLOPs utilisation): ``flops / (step_s *
    peak_flops)``, the recomputation counted; the two are equal without checkpointing.
    ``tokens_per_s``:
    the job's tokens per step (batch x sequence of the integer input, times micro-batches and
    the data-parallel ranks) over ``step_s``; None for inputs that are not tokens, whose rate
    is ``samples_per_s`` (the batch dimension, likewise). With ``parallel=``, times are
    rank 0's.

    In ``mode="generate"`` the step is the whole ``generate()``: ``prefill_s`` is the prefill's
    forward pass (the time to the first token), ``per_token_s`` the rest over the decode steps
    (``new_tokens - 1``; the ops outside the model's forward, e.g. each step's argmax, are
    counted there), and ``tokens_per_s`` the tokens made (batch x ``new_tokens``) over
    ``step_s``; ``decode_tokens_per_s`` the batch over ``per_token_s``.
    """

    gpu: GPU
    forward_s: float
    backward_s: float
    optimizer_s: float
    comm_s: float
    exposed_comm_s: float
    step_s: float
    flops: int
    recompute_flops: int
    peak_flops: float
    mfu: float
    hfu: float
    tokens_per_s: float | None
    samples_per_s: float | None
    #: the time of the ops outside any module call (part of the phases above)
    outside_s: float = 0.0
    #: per call (by index): its time, forward and backward, sub-calls included
    call_s: tuple[float, ...] = ()
    #: per call: the part of ``call_s`` that is compute-bound
    call_compute_s: tuple[float, ...] = ()
    #: collective time by the module it serves (``CommRecord.module``)
    comm_by_module: Mapping[str, float] = field(default_factory=dict)
    efficiency: Efficiency = EFFICIENCY
    #: ``mode="generate"``: the prefill (time to the first token) and each decode step
    prefill_s: float | None = None
    per_token_s: float | None = None
    #: how the kernels were launched: ``"eager"`` (each op at least ``efficiency.kernel_s``)
    #: or ``"graphs"`` (CUDA graphs: no launch cost)
    launch: str = "eager"
    #: a pipeline rank (``parallel=`` with ``pp > 1``): the time it waits in its schedule's
    #: idle slots for the pipeline's step (part of ``step_s``; :func:`in_pipeline`)
    bubble_s: float = 0.0

    @property
    def decode_tokens_per_s(self) -> float | None:
        """``mode="generate"``: tokens made per second while decoding (batch / ``per_token_s``)."""
        if not self.per_token_s or not self.samples_per_s:
            return None
        return self.samples_per_s * self.step_s / self.per_token_s

    def __repr__(self) -> str:
        if self.prefill_s is not None:
            per = _ms(self.per_token_s) if self.per_token_s is not None else "-"
            return (
                f"<StepTime on {self.gpu.name}: generate {_ms(self.step_s)} (prefill "
                f"{_ms(self.prefill_s)}, {per} per output token), "
                f"{self.tokens_per_s or 0:,.0f} tokens/s, launch {self.launch}>"
            )
        rate = (
            f"{self.tokens_per_s:,.0f} tokens/s"
            if self.tokens_per_s is not None
            else f"{self.samples_per_s or 0:,.1f} samples/s"
        )
        return (
            f"<StepTime on {self.gpu.name}: step {_ms(self.step_s)} (forward "
            f"{_ms(self.forward_s)}, backward {_ms(self.backward_s)}, optimizer "
            f"{_ms(self.optimizer_s)}, exposed comm {_ms(self.exposed_comm_s)}"
            f"{f', bubble {_ms(self.bubble_s)}' if self.bubble_s else ''}), "
            f"MFU {self.mfu:.1%}{_hfu(self)}, {rate}>"
        )

    @property
    def model_flops(self) -> int:
        """The step's FLOPs less activation checkpointing's recomputation: what ``mfu`` counts."""
        return self.flops - self.recompute_flops

    @property
    def compute_s(self) -> float:
        """``forward_s + backward_s + optimizer_s``."""
        return self.forward_s + self.backward_s + self.optimizer_s

    def module(self, path: str, calls: Iterable[CallRecord]) -> tuple[float, str]:
        """The time of a module's ``calls`` (forward and backward, sub-calls included) and what
        bounds it: ``"compute"``, ``"memory"`` or ``"comm"`` (its collectives, those of the
        modules under it included, take longer than its compute- or memory-bound part)."""
        total = compute = 0.0
        for c in calls:
            total += self.call_s[c.index]
            compute += self.call_compute_s[c.index]
        memory = total - compute
        prefix = f"{path}." if path else ""
        comm = sum(t for m, t in self.comm_by_module.items() if m == path or m.startswith(prefix))
        if comm > max(compute, memory):
            return total, "comm"
        if total == 0.0:  # no call ran an op (a container such as a ModuleList): nothing bounds it
            return total, ""
        return total, "compute" if compute >= memory else "memory"


def stage_step_s(t: StepTime, bubble: float) -> float:
    """One pipeline rank's step with the schedule's ``bubble`` (the fraction of its slots it
    waits, ``distributed.pipelining.bubble_fractions``): its forward and backward stretched
    over the slots it works in, then its optimizer step and its exposed collectives."""
    return (t.forward_s + t.backward_s) / (1 - bubble) + t.optimizer_s + t.exposed_comm_s


def in_pipeline(t: StepTime, step_s: float) -> StepTime:
    """``t``, one pipeline rank's step alone, in the pipeline's step ``step_s`` (its slowest
    rank's, the schedule's bubble included; at least ``t.step_s``): the difference is the time
    the rank waits (``bubble_s``), and its rates (MFU, HFU, tokens and samples per second) are
    over the longer step."""
    step_s = max(step_s, t.step_s)
    scale = t.step_s / step_s if step_s else 1.0

    def rate(r: float | None) -> float | None:
        return None if r is None else r * scale

    return replace(
        t,
        step_s=step_s,
        bubble_s=step_s - t.step_s,
        mfu=t.mfu * scale,
        hfu=t.hfu * scale,
        tokens_per_s=rate(t.tokens_per_s),
        samples_per_s=rate(t.samples_per_s),
    )


def _hfu(t: StepTime) -> str:
    """`` (HFU 40.0%)`` where recomputation makes hardware FLOPs utilisation differ."""
    return f" (HFU {t.hfu:.1%})" if t.recompute_flops else ""


def _ms(seconds: float) -> str:
    """A time in the unit that reads best (``15.1 s``, ``918 ms``): no exponents."""
    return format_seconds(seconds)


def op_seconds(
    cost: Cost, gpu: GPU, efficiency: Efficiency = EFFICIENCY, floor: float | None = None
) -> tuple[float, bool]:
    """The time of one op of ``cost`` on ``gpu``, and whether it is compute-bound; ``floor``:
    the least time of an op (default ``efficiency.kernel_s``)."""
    peak, flops, nbytes, shape = cost
    compute = 0.0
    if flops:
        fraction = compute_fraction(gpu, peak, shape, efficiency.compute)
        compute = flops / (gpu.peak(peak) * fraction)
    memory = nbytes / (gpu.hbm_bytes_per_s * efficiency.memory)
    least = efficiency.kernel_s if floor is None else floor
    return max(compute, memory, least), flops > 0 and compute >= memory


class _Timer:
    """Sums the time of cost tables, each distinct cost timed once."""

    def __init__(self, gpu: GPU, efficiency: Efficiency) -> None:
        self.gpu, self.efficiency = gpu, efficiency
        self.floor = efficiency.kernel_s
        self.known: dict[Cost, tuple[float, bool]] = {}
        self.flops_by_peak: dict[str, int] = {}

    def seconds(self, costs: Mapping[Cost, int]) -> tuple[float, float]:
        """(time, its compute-bound part) of ``costs`` (``{cost: count}``)."""
        total = compute = 0.0
        known, by_peak = self.known, self.flops_by_peak
        for cost, n in costs.items():
            timed = known.get(cost)
            if timed is None:
                timed = known[cost] = op_seconds(cost, self.gpu, self.efficiency, self.floor)
            t = timed[0] * n
            total += t
            if timed[1]:
                compute += t
            if cost[1]:
                by_peak[cost[0]] = by_peak.get(cost[0], 0) + cost[1] * n
        return total, compute


def collective_seconds(
    comm: CommLike,
    gpu: GPU,
    strides: Mapping[str, int] | None = None,
    efficiency: Efficiency = EFFICIENCY,
) -> float:
    """The time of one collective on ``gpu`` (ring formulas; see the module docstring).
    ``strides``: the distance between a group's ranks by mesh dimension (an FSDP group's ranks
    are ``tp`` apart, a replica group's ``fsdp * tp``; 1 when not given)."""
    p = comm.group_size
    if p <= 1 or comm.bytes <= 0:
        return 0.0
    stride = (strides or {}).get(comm.group, 1)
    if p * stride <= gpu.gpus_per_node:
        nvls = comm.collective == "all_reduce" and gpu.name in NVLS_PARTS
        bandwidth = gpu.nvlink_bytes_per_s / 2 * (NVLS_FRACTION if nvls else efficiency.link)
    else:
        bandwidth = gpu.network_bytes_per_s * efficiency.network
    share = _RING.get(comm.collective, lambda p: 1.0)(p)
    return share * comm.bytes / bandwidth + efficiency.collective_s


def step_time(
    calls: Sequence[CallRecord],
    outside: Mapping[str, Mapping[Cost, int]],
    comms: Sequence[CommLike],
    gpu: GPU,
    flops: int,
    tokens: int | None = None,
    samples: int | None = None,
    data_parallel: int = 1,
    efficiency: Efficiency = EFFICIENCY,
    launch: str = "eager",
) -> StepTime:
    """The :class:`StepTime` of a trace's ``calls`` and ops ``outside`` calls (by phase), with
    its collectives ``comms``, on ``gpu``.

    ``flops``: the FLOPs ``hfu`` counts (the analysis' ``total_flops``, recomputation
    included; ``mfu`` counts them less the calls' ``recompute_self_flops``); ``tokens`` /
    ``samples``: what one rank's step processes; ``data_parallel``: the ranks processing other
    data (FSDP's degree); ``launch``: ``"eager"`` (no op takes less than
    ``efficiency.kernel_s``) or ``"graphs"`` (no launch cost).
    """
    timer = _Timer(gpu, efficiency)
    if launch != "eager":
        timer.floor = 0.0
    n = len(calls)
    call_s, call_compute = [0.0] * n, [0.0] * n
    phases = {_FORWARD: 0.0, _BACKWARD: 0.0, _OPTIMIZER: 0.0}
    for c in calls:
        f, fc = timer.seconds(c.costs)
        b, bc = timer.seconds(c.backward_costs)
        phases[_FORWARD] += f
        phases[_BACKWARD] += b
        call_s[c.index] += f + b
        call_compute[c.index] += fc + bc
    for c in reversed(calls):  # a sub-call starts after its parent: children come first
        if c.parent >= 0:
            call_s[c.parent] += call_s[c.index]
            call_compute[c.parent] += call_compute[c.index]
    outside_s = 0.0
    optimizer = _Timer(gpu, efficiency)
    optimizer.floor = 0.0  # the trace steps one parameter at a time; a GPU run, all at once
    for phase, costs in outside.items():
        t, _ = (optimizer if phase == _OPTIMIZER else timer).seconds(costs)
        phases[phase] = phases.get(phase, 0.0) + t
        outside_s += t
    comm_s, exposed, by_module = _communication(comms, gpu, efficiency, phases)
    compute_s = sum(phases.values())
    step_s = compute_s + exposed
    peak = _peak(timer.flops_by_peak, gpu)  # the optimizer's FLOPs (none counted) left out
    job = max(1, data_parallel)
    recomputed = sum(c.recompute_self_flops for c in calls)
    per_second = step_s * peak
    return StepTime(
        gpu=gpu,
        forward_s=phases[_FORWARD],
        backward_s=phases[_BACKWARD],
        optimizer_s=compute_s - phases[_FORWARD] - phases[_BACKWARD],
        comm_s=comm_s,
        exposed_comm_s=exposed,
        step_s=step_s,
        flops=flops,
        recompute_flops=recomputed,
        peak_flops=peak,
        mfu=(flops - recomputed) / per_second if step_s > 0 else 0.0,
        hfu=flops / per_second if step_s > 0 else 0.0,
        tokens_per_s=tokens * job / step_s if tokens and step_s > 0 else None,
        samples_per_s=samples * job / step_s if samples and step_s > 0 else None,
        outside_s=outside_s,
        call_s=tuple(call_s),
        call_compute_s=tuple(call_compute),
        comm_by_module=by_module,
        efficiency=efficiency,
        launch=launch,
    )


def generation_time(
    step: StepTime, calls: Sequence[CallRecord], batch: int, new_tokens: int
) -> StepTime:
    """``step`` (a whole traced ``generate()``) with its prefill, time per output token and
    tokens made per second (see :class:`StepTime`): the prefill is the first call of the root
    module, each later one a decode step."""
    roots = [c for c in calls if c.parent < 0]
    prefill = step.call_s[roots[0].index] if roots else 0.0
    decode = max(0.0, step.step_s - prefill)
    per_token = decode / (new_tokens - 1) if new_tokens > 1 else None
    made = batch * new_tokens
    return replace(
        step,
        prefill_s=prefill,
        per_token_s=per_token,
        tokens_per_s=made / step.step_s if step.step_s > 0 else None,
        samples_per_s=batch / step.step_s if step.step_s > 0 else None,
    )


def mesh_strides(comms: Sequence[CommLike]) -> dict[str, int]:
    """How far apart a group's ranks are, by mesh dimension (replicate, fsdp, cp, tp: tensor
    parallelism innermost, context parallelism's ranks ``tp`` apart, an FSDP group with ``cp``
    the flattened ``fsdp x cp`` ranks, ``distributed.context``; expert parallelism's ``ep``
    the innermost ranks: the tensor-parallel ones and the innermost of ``fsdp``, and
    ``efsdp`` the rest of the ``fsdp`` ranks), from the group sizes the collectives ran on."""
    size = {c.group: c.group_size for c in comms}
    tp, fsdp, ep = size.get("tp", 1), size.get("fsdp", 1), size.get("ep", 1)
    return {"tp": 1, "cp": tp, "fsdp": tp, "ep": 1, "efsdp": max(ep, tp), "replicate": fsdp * tp}


def _communication(
    comms: Sequence[CommLike], gpu: GPU, efficiency: Efficiency, compute: Mapping[str, float]
) -> tuple[float, float, dict[str, float]]:
    """(all collectives' time, the exposed part, time by module served) under the overlap rule
    of the module docstring."""
    strides = mesh_strides(comms)
    overlapped: dict[str, float] = {}
    blocking = 0.0
    total = 0.0
    by_module: dict[str, float] = {}
    edges = schedule_edges(comms)
    for i, c in enumerate(comms):
        t = collective_seconds(c, gpu, strides, efficiency)
        total += t
        by_module[c.module] = by_module.get(c.module, 0.0) + t
        if c.group in _BLOCKING or c.phase not in compute or i in edges:
            blocking += t
        else:
            overlapped[c.phase] = overlapped.get(c.phase, 0.0) + t
    exposed = blocking + sum(max(0.0, t - compute[p]) for p, t in overlapped.items())
    return total, exposed, by_module


def schedule_edges(comms: Sequence[CommLike]) -> frozenset[int]:
    """The positions in ``comms`` (in the order they ran) of the collectives FSDP's schedule
    cannot overlap with compute: the first overlappable one of the forward and the last one of
    the backward (module docstring)."""
    fsdp = [i for i, c in enumerate(comms) if c.group not in _BLOCKING]
    first = next((i for i in fsdp if comms[i].phase == _FORWARD), None)
    last = next((i for i in reversed(fsdp) if comms[i].phase == _BACKWARD), None)
    return frozenset(i for i in (first, last) if i is not None)


def _peak(flops_by_peak: Mapping[str, int], gpu: GPU) -> float:
    """The dense peak of the precision that ran the most FLOPs (BF16's when none ran)."""
    if not flops_by_peak:
        return gpu.peak("bf16")
    kind = max(flops_by_peak.items(), key=lambda item: item[1])[0]
    return gpu.peak(kind)


def tokens_of(inputs: Iterable[Any], micro_batches: int = 1) -> tuple[int | None, int | None]:
    """(tokens, samples) one rank's step processes: the first integer input of two or more
    dimensions holds tokens (batch x sequence; None without one), the first input's first
    dimension is the batch; each times ``micro_batches``."""
    tokens = samples = None
    for t in inputs:
        if not isinstance(t, torch.Tensor):
            continue
        if samples is None and t.dim() >= 1:
            samples = int(t.shape[0]) * micro_batches
        if (
            tokens is None
            and t.dim() >= 2
            and not t.is_floating_point()
            and not t.is_complex()
            and t.dtype is not torch.bool
        ):
            tokens = t.numel() * micro_batches
    return tokens, samples
