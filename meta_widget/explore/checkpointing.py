"""``plan_checkpointing``: which modules to checkpoint so that a training step's traced peak fits a
memory budget, with the least recomputation.

Peaks are not additive: each moment of a training step holds its own set of tensors, and
checkpointing moves the peak from one moment to another (the end of the forward pass, the
backward of the first block not checkpointed, the recomputation of a checkpointed one, the
optimizer step). The search therefore trusts only traces, and uses a model to choose what to
trace next:

1. Trace the step with nothing checkpointed (``P0``; if it fits, the plan is empty) and with
   every candidate checkpointed (if even that does not fit, :class:`NothingFitsError` says the
   smallest peak reached).
2. Trace each candidate checkpointed alone: its *saving* ``P0 - peak`` and its *recompute*, the
   FLOPs the step gains (what backward recomputes: the recomputation of PyTorch's non-reentrant
   checkpoint stops once the last tensor backward needs is rebuilt, so it can be less than the
   module's forward FLOPs). Recompute is additive over modules that do not nest; savings are
   the model's guess. Of 5 or more alike blocks (a decoder's layers), the first two and the
   last two are traced alone, and the others only when the first, second and second-to-last
   disagree (:meth:`_Search._singles`): a Llama-3-8B's 32 layers each save and recompute the
   same alone.
3. Solve the 0-1 program ``min sum(recompute_i x_i)`` subject to ``P0 - sum(saving_i x_i) <=
   budget`` (``scipy.optimize.milp``, HiGHS, exact: relative gap 0), no module together with one
   it contains, recompute below the cheapest plan that fits so far, and one cut per traced plan
   that did not fit: "checkpoint at least one module more than this set" (checkpointing more
   never raised a traced peak in the models tested). Trace its answer, and solve again, until
   the program has no answer or ``max_iterations`` rounds. Among identical blocks the first
   ones in model order are taken.
4. Where a traced plan saved more than the sum of its modules' savings (the model over-stated
   its peak, and may so rule out plans that fit), every saving is raised by the most it fell
   short per module of such a plan, so the program tries those plans too.

The cheapest plan that fits among everything traced is returned. The model under-states the
peak when the peak moves (blocks of different sizes: the recomputation of a large block becomes
the peak); the cuts make the search exact then. The tests compare each plan with the exhaustive
optimum over every subset of the blocks of two 6-layer models, at every budget where one fits
exactly; and again with every saving halved (a model over-stating every peak).
"""

from __future__ import annotations

import json
import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from ..analysis import Analysis, analyze
from ..errors import MetaWidgetError
from ..options import OptionError, check_budget
from ..units import format_bytes, format_flops
from .fit import NothingFitsError
from .sweeps import ProgressFn, check_analyze_options, progress_function

__all__ = ["CheckpointPlan", "PlanError", "checkpoint_code", "plan_checkpointing"]

#: how much less recompute (a fraction of every candidate's) a plan must have to be tried
_CHEAPER = 1e-5
#: options ``plan_checkpointing`` sets itself
_OWN_OPTIONS = ("activation_checkpointing", "widget")


class PlanError(MetaWidgetError, RuntimeError):
    """A plan cannot be made: an analysis the search needed failed, the model has no
    candidates to checkpoint, or ``plan`` was called by a script's top level run again in a
    worker process as it starts."""


@dataclass(frozen=True)
class Traced:
    """One plan traced: its modules, traced peak, recomputed FLOPs and, with ``gpu=``, the
    seconds the recomputation adds to the backward pass."""

    modules: tuple[str, ...]
    peak_bytes: int
    recompute_flops: int
    recompute_s: float | None = None


@dataclass
class CheckpointPlan:
    """The answer of :func:`plan_checkpointing`: what to checkpoint, and what it costs.

    Attributes
    ----------
    modules
        The module paths to checkpoint (paths of ``model.named_modules()``), in model order.
    peak_bytes
        The traced peak of a training step with these modules checkpointed (``analysis``'s).
    recompute_flops
        The FLOPs recomputed in backward: the plan's traced training-step FLOPs minus those with
        nothing checkpointed (FlopCounterMode's count; PyTorch's non-reentrant checkpoint stops
        recomputing once the last saved tensor backward needs is rebuilt).
    recompute_s
        With ``gpu=`` (an option of ``analyze``): the seconds the recomputation adds to the
        backward pass (``analysis.time.backward_s`` less that with nothing checkpointed), and
        the search then minimizes this instead of FLOPs; None without ``gpu=``.
    analysis
        The plan traced: ``analyze(..., mode="training", activation_checkpointing=modules)``.
    code
        A Python snippet applying exactly this plan to ``model`` with PyTorch's
        ``apply_activation_checkpointing`` (see :func:`checkpoint_code`).
    budget
        The budget in bytes, as given.
    held_back_bytes
        With ``gpu=``: the bytes of the budget held back for what the GPU holds beside the
        tensors (``Analysis.footprint_bytes - peak_bytes`` with nothing checkpointed: the
        caching allocator's reserve around the peak, the CUDA context); the traced peaks are
        held against the rest. 0 without ``gpu=``.
    baseline_peak_bytes
        The traced peak with nothing checkpointed.
    candidates
        The module paths the search chose from.
    history
        Every plan traced, in order: ``(modules, peak_bytes, recompute_flops, recompute_s)``.
    """

    modules: list[str]
    peak_bytes: int
    recompute_flops: int
    recompute_s: float | None
    analysis: Analysis
    code: str
    budget: int
    baseline_peak_bytes: int
    candidates: list[str] = field(default_factory=list)
    history: list[Traced] = field(default_factory=list)
    held_back_bytes: int = 0

    @property
    def traces(self) -> int:
        """How many training steps the search traced."""
        return len(self.history)

    def __repr__(self) -> str:
        seconds = f" ({self.recompute_s * 1e3:.3g} ms)" if self.recompute_s is not None else ""
        held = f" + {format_bytes(self.held_back_bytes)} held back" if self.held_back_bytes else ""
        return (
            f"<CheckpointPlan {len(self.modules)} of {len(self.candidates)} modules: "
            f"{format_bytes(self.peak_bytes)}{held} of {format_bytes(self.budget)} (was "
            f"{format_bytes(self.baseline_peak_bytes)}), recomputes "
            f"{format_flops(self.recompute_flops)}{seconds}; {self.traces} traces>"
        )


def plan_checkpointing(
    model: Any,
    input_size: Any = None,
    *,
    budget: int | str,
    input_data: Any = None,
    candidates: Sequence[str] | None = None,
    max_iterations: int = 50,
    progress: bool | ProgressFn = False,
    **analyze_options: Any,
) -> CheckpointPlan:
    """The modules to checkpoint so that a training step's traced peak fits ``budget``, with the
    least recompute.

    Every peak the search compares is traced; a linear model of per-module savings, solved
    exactly (``scipy.optimize.milp``), only picks what to trace next (the method: the
    docstring of ``meta_widget.explore.checkpointing``).

    Parameters
    ----------
    model, input_size, input_data
        As for ``analyze``.
    budget
        Bytes (an int) or a size with a unit: ``"24GiB"`` (binary), ``"24GB"`` (decimal).
    candidates
        Module paths to choose from; default the blocks (each child of an ``nn.ModuleList``, what
        ``activation_checkpointing=True`` checkpoints). A path and one inside it are never both
        chosen.
    max_iterations
        At most this many solve-and-trace rounds after the first traces (nothing and every
        candidate checkpointed, and the candidates alone); the cheapest plan that fits so far
        is returned then (the one checkpointing every candidate fits).
    progress
        ``True``: a text line per trace on standard error; or a function ``(done, total, text)``.
    **analyze_options
        ``analyze``'s options (``optimizer``, ``param_dtype``, ``micro_batches``,
        ``parallel``...); ``mode`` is ``"training"``. With ``gpu=`` the search minimizes the
        recomputation's seconds on that accelerator (``CheckpointPlan.recompute_s``), else its
        FLOPs, and the bytes the GPU holds beside the tensors (the caching allocator's reserve
        around the peak, the CUDA context, with nothing checkpointed) are held back from the
        budget (``CheckpointPlan.held_back_bytes``).

    Returns
    -------
    CheckpointPlan
        Its ``code`` applies the plan with PyTorch's API; its ``analysis`` is the plan traced.

    Raises
    ------
    NothingFitsError
        When even every candidate checkpointed does not fit; the message gives the smallest
        traced peak.
    PlanError
        When an analysis the search needs fails, or there is nothing to choose from.
    OptionError
        For a budget, candidates or options that cannot be used.
    """
    limit = check_budget(budget)
    _check_options(analyze_options, max_iterations)
    base = analyze(model, input_size, input_data=input_data, **analyze_options)
    # with gpu=: the caching allocator's reserve around the peak and the CUDA context, as with
    # nothing checkpointed, are held back; the search compares traced peaks, whose savings add
    held_back = base.footprint_bytes - base.peak_bytes if base.error is None else 0
    search = _Search(
        base, limit - held_back, progress_function(progress, "plan_checkpointing"), held_back
    )
    if search.base.peak_bytes <= search.budget:
        return search.plan(())
    search.start(_candidates(search.base, candidates))
    search.solve(max_iterations)
    return search.plan(search.best())


def _signature(node: Any) -> Hashable:
    """What makes two blocks alike for :meth:`_Search._singles`: their modules' types,
    settings, parameters, FLOPs and activation bytes, by relative path."""
    return (
        node.type,
        node.extra_repr,
        tuple(node.own_params),
        node.flops,
        node.backward_flops,
        node.activation_bytes,
        tuple((c.name, _signature(c)) for c in node.children),
    )


def _agree(a: Traced, b: Traced) -> bool:
    """The same peak and recompute (its seconds to rounding)."""
    seconds = (
        a.recompute_s == b.recompute_s
        if a.recompute_s is None or b.recompute_s is None
        else math.isclose(a.recompute_s, b.recompute_s, rel_tol=1e-9)
    )
    return a.peak_bytes == b.peak_bytes and a.recompute_flops == b.recompute_flops and seconds


def _check_options(options: dict[str, Any], max_iterations: Any) -> None:
    """``mode`` is training; the options are ``analyze``'s, and those the search sets are not
    given."""
    check_analyze_options(options, "plan_checkpointing")
    mode = options.setdefault("mode", "training")
    if mode != "training":
        raise OptionError(
            f"plan_checkpointing plans a training step; mode={mode!r} cannot be used (leave "
            "mode out)."
        )
    given = sorted(set(options) & set(_OWN_OPTIONS))
    if given:
        raise OptionError(
            f"plan_checkpointing chooses {given} itself; leave them out (candidates= names the "
            "modules it may checkpoint)."
        )
    if (
        isinstance(max_iterations, bool)
        or not isinstance(max_iterations, int)
        or max_iterations < 1
    ):
        raise OptionError(f"max_iterations must be an int of 1 or more, not {max_iterations!r}")


def _candidates(base: Analysis, given: Sequence[str] | None) -> list[str]:
    """The module paths to choose from, in model order: the blocks, or those given (each a
    module of the model that the forward pass calls)."""
    nodes = list(base.root.walk())
    if given is None:
        lists = {n.index for n in nodes if n.type == "ModuleList"}
        paths = [n.path for n in nodes if n.parent in lists and n.calls]
        if not paths:
            raise PlanError(
                f"plan_checkpointing: {base.title} has no blocks (children of an nn.ModuleList) "
                "called in its forward pass; pass candidates=[module paths] (see "
                "a.to_dataframe()['module'])."
            )
        return paths
    if isinstance(given, str) or not all(isinstance(p, str) for p in given):
        raise OptionError(f"candidates must be a list of module paths, not {given!r}")
    called = {n.path for n in nodes if n.calls and n.path}
    unknown = sorted(set(given) - called)
    if unknown or not given:
        raise OptionError(
            f"candidates {unknown or '[]'} are not modules of {base.title} that its forward "
            "pass calls; use paths from a.to_dataframe()['module'] with calls > 0."
        )
    return [n.path for n in nodes if n.path in set(given)]


class _Search:
    """The traces of one search: the step with nothing checkpointed, then plans by their
    modules (each traced once)."""

    def __init__(
        self, base: Analysis, budget: int, report: ProgressFn | None, held_back: int = 0
    ) -> None:
        _check_traced(base, ())
        self.base = base
        self.budget = budget  # for the traced peaks: the user's budget less ``held_back``
        self.held_back = held_back
        self.report = report
        self.candidates: list[str] = []
        self.traced: dict[tuple[str, ...], tuple[Traced, Analysis]] = {}
        self.timed = _backward_s(base) is not None  # gpu=: minimize seconds, not FLOPs
        self.history: list[Traced] = [Traced((), base.peak_bytes, 0, 0.0 if self.timed else None)]
        self.cuts: list[np.ndarray] = []
        self.saving = np.zeros(0)  # per candidate: the peak it saves alone (bytes)
        self.cost = np.zeros(0)  # per candidate: the FLOPs it recomputes alone

    def trace(self, modules: Sequence[str]) -> Traced:
        """The plan checkpointing ``modules``, traced (once)."""
        wanted = set(modules)
        key = tuple(p for p in self.candidates if p in wanted)
        if not key:
            return self.history[0]
        if key not in self.traced:
            if self.report is not None:
                self.report(len(self.history), 0, f"{len(key)} checkpointed")
            a = self.base.rerun(activation_checkpointing=list(key))
            _check_traced(a, key)
            done = Traced(
                key, a.peak_bytes, a.total_flops - self.base.total_flops, self._seconds(a)
            )
            if done.peak_bytes > self.budget:  # then at least one module more than these
                self.cuts.append(np.array([float(p not in key) for p in self.candidates]))
            self.traced[key] = (done, a)
            self.history.append(done)
        return self.traced[key][0]

    def start(self, candidates: list[str]) -> None:
        """Every candidate checkpointed (it must fit), then each alone: the model's numbers."""
        self.candidates = candidates
        every = self.trace(self._outermost(candidates))
        if every.peak_bytes > self.budget:
            raise _nothing_fits(self.base, every, self.budget, len(candidates), self.held_back)
        singles = self._singles(candidates)
        self.saving = np.array([self.base.peak_bytes - t.peak_bytes for t in singles], float)
        self.cost = np.array([max(self._cost(t), 0) for t in singles], float)

    def _singles(self, candidates: list[str]) -> list[Traced]:
        """Each candidate checkpointed alone, traced; but of 5 or more alike blocks (the same
        modules, settings, parameters, FLOPs and activations: a decoder's layers) only the
        first two and the last two when the first, second and second-to-last agree, the
        blocks between then taken to agree with them (they are the model's numbers only: every
        plan held against the budget is traced). The last is traced apart: checkpointed, its
        recomputation comes first in the backward, where the peak may be."""
        nodes = {n.path: n for n in self.base.root.walk()}
        alike: dict[Hashable, list[str]] = {}
        for path in candidates:
            alike.setdefault(_signature(nodes[path]), []).append(path)
        single: dict[str, Traced] = {}
        for paths in alike.values():
            many = len(paths) >= 5
            probes = [paths[0], paths[1], paths[-2], paths[-1]] if many else paths
            first, *others = [self.trace([p]) for p in probes[:3]]
            agree = many and all(_agree(first, t) for t in others)
            for path in paths:
                single[path] = (
                    replace(first, modules=(path,))
                    if agree and path not in probes
                    else self.trace([path])
                )
        return [single[p] for p in candidates]

    def solve(self, rounds: int) -> None:
        """Solve and trace, each round asking for a plan cheaper than the best that fits so
        far, until the program has none, its answer was traced already, or ``rounds``."""
        for _ in range(rounds):
            chosen = self._solution()
            if chosen is None or chosen in self.traced:
                break
            self.trace(chosen)

    def best(self) -> tuple[str, ...]:
        """The cheapest traced plan that fits (fewer modules, then the lower peak, on ties)."""
        fits = [t for t, _ in self.traced.values() if t.peak_bytes <= self.budget]
        return min(fits, key=lambda t: (self._cost(t), len(t.modules), t.peak_bytes)).modules

    def plan(self, modules: tuple[str, ...]) -> CheckpointPlan:
        traced, analysis = self.traced.get(modules, (self.history[0], self.base))
        if self.report is not None:
            n = len(self.history)
            self.report(n, n, f"{len(modules)} checkpointed ({n} traces)")
        return CheckpointPlan(
            modules=list(modules),
            peak_bytes=traced.peak_bytes,
            recompute_flops=traced.recompute_flops,
            recompute_s=traced.recompute_s,
            analysis=analysis,
            code=checkpoint_code(modules, traced.peak_bytes, self.budget),
            budget=self.budget + self.held_back,
            held_back_bytes=self.held_back,
            baseline_peak_bytes=self.base.peak_bytes,
            candidates=list(self.candidates),
            history=list(self.history),
        )

    def _solution(self) -> tuple[str, ...] | None:
        """The 0-1 program's answer, or None when it has none: the least recompute (then the
        fewest modules), less than the best plan that fits so far, whose modelled peak fits
        (each saving raised by :meth:`_overstatement`); no module with one inside it; the
        cuts."""
        n = len(self.candidates)
        scale = self.cost.sum() or 1.0
        need = self.base.peak_bytes - self.budget
        best = self._cost(self.traced[self.best()][0])
        rows = [(self.saving + self._overstatement()) / need, self.cost / scale, *self.cuts]
        lower = [1.0, -np.inf, *[1.0] * len(self.cuts)]
        upper = [np.inf, best / scale - _CHEAPER, *[np.inf] * len(self.cuts)]
        for i, j in self._nested():
            row = np.zeros(n)
            row[[i, j]] = 1.0
            rows.append(row)
            lower.append(-np.inf)
            upper.append(1.0)
        result = milp(
            self.cost / scale + 1e-6,
            constraints=LinearConstraint(np.array(rows), lower, upper),
            integrality=np.ones(n),
            bounds=Bounds(0, 1),
            options={"mip_rel_gap": 0.0},
        )
        if result.x is None:
            return None
        return self._canonical(np.asarray(result.x) > 0.5, np.array(rows), lower, upper)

    def _canonical(
        self, x: np.ndarray, rows: np.ndarray, lower: list[float], upper: list[float]
    ) -> tuple[str, ...]:
        """Among candidates alike to the model (the same saving and recompute: identical
        blocks), the first ones in model order, when that keeps every constraint (the
        solver's choice among equals is arbitrary)."""
        first = x.copy()
        for key in {(a, b) for a, b in zip(self.saving, self.cost, strict=True)}:
            alike = np.flatnonzero((self.saving == key[0]) & (self.cost == key[1]))
            first[alike] = False
            first[alike[: int(x[alike].sum())]] = True
        value = rows @ first
        if np.all(value >= np.array(lower) - 1e-9) and np.all(value <= np.array(upper) + 1e-9):
            x = first
        return tuple(p for p, chosen in zip(self.candidates, x, strict=True) if chosen)

    def _cost(self, traced: Traced) -> float:
        """What the search minimizes: recomputed seconds with ``gpu=``, else FLOPs."""
        if self.timed and traced.recompute_s is not None:
            return traced.recompute_s
        return float(traced.recompute_flops)

    def _seconds(self, a: Analysis) -> float | None:
        """The seconds ``a``'s backward pass takes more than with nothing checkpointed."""
        after, before = _backward_s(a), _backward_s(self.base)
        return after - before if after is not None and before is not None else None

    def _overstatement(self) -> float:
        """The most the model under-stated the saving of a traced plan, per module of it
        (bytes, >= 0): savings of modules checkpointed together are not additive, and the
        program allows each module that much more."""
        worst = 0.0
        for traced, _ in self.traced.values():
            chosen = [p in traced.modules for p in self.candidates]
            model = self.base.peak_bytes - float(self.saving[chosen].sum())
            worst = max(worst, (model - traced.peak_bytes) / len(traced.modules))
        return worst

    def _nested(self) -> list[tuple[int, int]]:
        """Index pairs (i, j) of candidates where j lies inside i."""
        c = self.candidates
        return [
            (i, j)
            for i, a in enumerate(c)
            for j, b in enumerate(c)
            if i != j and b.startswith(a + ".")
        ]

    def _outermost(self, paths: list[str]) -> list[str]:
        """``paths`` without those inside another one."""
        inner = {self.candidates[j] for _, j in self._nested()}
        return [p for p in paths if p not in inner]


def _backward_s(a: Analysis) -> float | None:
    """The backward pass's seconds on ``gpu=``'s accelerator; None without ``gpu=``."""
    time = getattr(a, "time", None)
    return float(time.backward_s) if time is not None else None


def _check_traced(a: Analysis, modules: Sequence[str]) -> None:
    if a.error is not None:
        where = f" (in module {a.error.module!r})" if a.error.module else ""
        which = f"with {list(modules)} checkpointed" if modules else "with nothing checkpointed"
        raise PlanError(
            f"plan_checkpointing: the training step of {a.title} {which} failed{where}: "
            f"{a.error.type}: {a.error.message} Run mw.analyze(..., mode='training') to see the "
            "explanation."
        )


def _nothing_fits(
    base: Analysis, every: Traced, budget: int, count: int, held_back: int
) -> NothingFitsError:
    smallest = min(every.peak_bytes, base.peak_bytes)
    held = (
        f" once {format_bytes(held_back)} are held back for the caching allocator's reserve "
        "and the CUDA context (gpu=)"
        if held_back
        else ""
    )
    return NothingFitsError(
        f"plan_checkpointing: even with all {count} candidate modules checkpointed, the training "
        f"step of {base.title} needs {format_bytes(smallest)} ({smallest:,} bytes, the smallest "
        f"traced peak), more than the budget of {format_bytes(budget)} ({budget:,} bytes)"
        f"{held}; with "
        f"nothing checkpointed it needs {format_bytes(base.peak_bytes)}. Try a larger budget, "
        "a smaller batch or sequence, autocast / param_dtype, micro_batches, or "
        "parallel={'fsdp': N}."
    )


def checkpoint_code(
    modules: Sequence[str], peak_bytes: int | None = None, budget: int | None = None
) -> str:
    """A Python snippet that checkpoints exactly ``modules`` of ``model`` with PyTorch's API.

    ``torch.distributed.algorithms._checkpoint.checkpoint_wrapper.apply_activation_checkpointing``
    wraps each module whose path is listed in a non-reentrant ``checkpoint_wrapper`` (what the
    trace runs: ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``), on a plain
    module as under FSDP; a path the model does not have is a ``KeyError``. Run it on the
    model before making its optimizer (and before ``torch.compile``). With no modules, a comment.
    """
    if not modules:
        return "# meta_widget.plan_checkpointing: nothing to checkpoint, the step fits as it is.\n"
    fits = ""
    if peak_bytes is not None and budget is not None:
        fits = f": traced peak {format_bytes(peak_bytes)} of a {format_bytes(budget)} budget"
    listed = "".join(f"    {json.dumps(p)},\n" for p in modules)  # a Python str literal
    return (
        f"# meta_widget.plan_checkpointing{fits}.\n"
        "# `model` is your nn.Module: run this before making its optimizer.\n"
        "from functools import partial\n\n"
        "from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (\n"
        "    CheckpointImpl,\n"
        "    apply_activation_checkpointing,\n"
        "    checkpoint_wrapper,\n"
        ")\n\n"
        f"CHECKPOINTED = [\n{listed}]\n"
        "named = dict(model.named_modules())\n"
        "chosen = {id(named[path]) for path in CHECKPOINTED}\n"
        "apply_activation_checkpointing(\n"
        "    model,\n"
        "    checkpoint_wrapper_fn=partial(checkpoint_wrapper, "
        "checkpoint_impl=CheckpointImpl.NO_REENTRANT),\n"
        "    check_fn=lambda module: id(module) in chosen,\n"
        ")\n"
    )
