"""``Plan``: what :func:`~meta_widget.explore.plan.plan` answers, every candidate and the fastest
that fits; it sorts and filters like a DataFrame, keeps its Pareto front, says why nothing fits
and shows itself as the plan view (``plan_view``)."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, overload

import pandas as pd

from ..options import OptionError, OptionTypeError
from ..timing.gpus import GPU
from ..units import format_bytes
from .candidates import CHECKPOINTING, COLUMNS, Candidate, checkpointing_label
from .fit import NothingFitsError
from .layouts import MESH
from .plan_front import check_tokens, front, gpu_hours, speed

__all__ = ["Plan", "label"]


@dataclass
class Plan:
    """The answer of :func:`plan`: every candidate traced, and the fastest that fits.

    Attributes
    ----------
    candidates
        Every :class:`Candidate`, in the order tried.
    budget
        The memory budget per device, in bytes.
    gpu
        The accelerator the times are for.
    devices
        The number of devices.
    mode
        ``"training"`` or ``"inference"``.
    traces
        How many times ``analyze`` ran (each depth of the per-layer rule counted).
    title
        The model's class name (``Analysis.title``).
    tokens
        The tokens the ``gpu_hours`` column prices (``for_tokens``, ``pareto(tokens=)``);
        None: not priced.
    notes
        What the traces said of the model as given that holds for its rows (each also a
        ``UserWarning`` when the plan ends): its checkpointed layers writing transformers' KV
        cache (``use_cache=True``), which holds their keys and values through backward.

    A plan sorts and filters like a DataFrame, each answer a ``Plan`` of the same GPU, budget
    and devices: ``p.sort("step_s")``, ``p.query("fits and tp == 1")`` (pandas' ``query``
    over ``to_dataframe()``'s columns), ``p[p.fits]`` (a mask per candidate), ``p[:5]``;
    ``p[0]`` is a ``Candidate``. ``p.pareto()`` keeps the Pareto front of the fitting rows.
    """

    candidates: list[Candidate]
    budget: int
    gpu: GPU
    devices: int
    mode: str
    traces: int = 0
    title: str = "model"
    tokens: float | None = None
    notes: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.candidates)

    @overload
    def __getitem__(self, rows: int) -> Candidate: ...
    @overload
    def __getitem__(self, rows: slice | Sequence[bool] | pd.Series) -> Plan: ...
    def __getitem__(self, rows: Any) -> Candidate | Plan:
        """``p[i]``: a candidate; ``p[a:b]``, or ``p[mask]`` with a bool per candidate (a list,
        or a Series such as ``p.to_dataframe()["fits"]``): a ``Plan`` of those rows."""
        if isinstance(rows, int) and not isinstance(rows, bool):
            return self.candidates[rows]
        if isinstance(rows, slice):
            return self._with(self.candidates[rows])
        mask = list(rows)
        if len(mask) != len(self.candidates) or not all(isinstance(m, bool) for m in mask):
            raise OptionTypeError(
                f"plan[...]: give an index, a slice or one bool per candidate "
                f"({len(self.candidates)}), e.g. p[p.fits]; not {type(rows).__name__} of "
                f"{len(mask)}."
            )
        return self._with([c for c, keep in zip(self.candidates, mask, strict=True) if keep])

    @property
    def fits(self) -> list[bool]:
        """Per candidate, whether it fits the budget (a mask: ``p[p.fits]``)."""
        return [c.fits for c in self.candidates]

    def sort(self, by: str | list[str], *, descending: bool = False) -> Plan:
        """The candidates ordered by a column (or columns) of ``to_dataframe()``, stable, rows
        with no value last: ``p.sort("step_s")``, ``p.sort("tokens_per_s", descending=True)``
        (``activation_checkpointing``: False, modules named, "selective", True)."""
        table = self.to_dataframe()
        names = [by] if isinstance(by, str) else list(by)
        _columns(names, table)
        order = table.sort_values(
            names, ascending=not descending, na_position="last", kind="stable", key=_recomputed
        ).index
        return self._with([self.candidates[i] for i in order])

    def query(self, expression: str) -> Plan:
        """The candidates whose row of ``to_dataframe()`` meets ``expression``
        (``pandas.DataFrame.query``): ``p.query("fits and mfu > 0.4")``."""
        kept = self.to_dataframe().query(expression).index
        return self._with([self.candidates[i] for i in kept])

    def for_tokens(self, tokens: float) -> Plan:
        """The same rows, ``gpu_hours`` priced for ``tokens`` tokens."""
        return replace(self, candidates=list(self.candidates), tokens=check_tokens(tokens))

    def pareto(self, tokens: float | None = None) -> Plan:
        """The Pareto front of the fitting candidates, fastest first: those no other fitting
        candidate beats on both speed (``best``'s: tokens per second) and per-GPU memory
        (``device_bytes``); priced for ``tokens`` when given (``gpu_hours``)."""
        on = front(self.candidates)
        rows = sorted((c for c, keep in zip(self.candidates, on, strict=True) if keep), key=speed)
        p = self._with(rows[::-1])
        return p if tokens is None else p.for_tokens(tokens)

    def _with(self, candidates: list[Candidate]) -> Plan:
        return replace(self, candidates=candidates)

    @property
    def best(self) -> Candidate:
        """The fastest candidate that fits: the most ``tokens_per_s`` (``samples_per_s`` for
        inputs that are not tokens; else the least ``step_s``), the first of equals. A
        ``Candidate`` (``meta_widget.explore.plan``): the columns of ``to_dataframe()`` as
        attributes, and ``analysis``, the candidate traced.

        Raises
        ------
        NothingFitsError
            When no candidate fits the budget.
        """
        fitting = [c for c in self.candidates if c.fits]
        if not fitting:
            raise _nothing_fits(self)
        return max(fitting, key=speed)

    def to_dataframe(self) -> pd.DataFrame:
        """One row per candidate: ``replicate``, ``fsdp``, ``tp``, ``pp``, ``cp``, ``ep``,
        ``sequence_parallel``, ``schedule`` (None without a pipeline), ``virtual_stages``,
        ``activation_checkpointing``, ``precision``, ``micro_batches`` (a pipeline's: its
        schedule's), ``peak_bytes``, ``device_bytes`` (what the GPU
        holds, held against the budget), ``fits``, ``step_s``, ``mfu``,
        ``tokens_per_s``, ``samples_per_s``, ``error``, ``traced_layers``; ``pareto`` (on
        the Pareto front of this plan's fitting rows: ``pareto()``) and ``gpu_hours`` (the
        GPU-hours of ``tokens`` tokens, None unpriced: ``for_tokens``)."""
        on = front(self.candidates)
        rows = [
            {**c.row(), "pareto": keep, "gpu_hours": gpu_hours(c, self.devices, self.tokens)}
            for c, keep in zip(self.candidates, on, strict=True)
        ]
        return pd.DataFrame(rows, columns=[*COLUMNS, "pareto", "gpu_hours"])

    def widget(self) -> Any:
        """The plan view (``meta_widget.explore.plan_view``): step time against peak per
        candidate, the budget line, the best marked; clicking a candidate opens its analysis."""
        from .plan_view import plan_widget  # anywidget: ~0.5 s, loaded on first use

        return plan_widget(self)

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget()._repr_mimebundle_(**kwargs)

    def __repr__(self) -> str:
        fits = sum(c.fits for c in self.candidates)
        head = (
            f"<Plan {len(self.candidates)} candidates on {self.devices} x {self.gpu.name}, "
            f"{fits} fit {format_bytes(self.budget)}"
        )
        if not fits:
            return head + ">"
        b = self.best
        return (
            f"{head}; best {label(b)}: {format_bytes(b.device_bytes or 0)} on the GPU (peak "
            f"{format_bytes(b.peak_bytes or 0)}), step {b.step_s:.4g} s>"
        )


def _recomputed(column: pd.Series) -> pd.Series:
    """A column as ``Plan.sort`` orders it: checkpointing settings (``False``, ``True``,
    ``"selective"``, modules named: which do not compare) as False, modules named,
    ``"selective"``, True (modules named are 0.5: between none and every block)."""
    if column.name != "activation_checkpointing":
        return column
    rank = {k: float(i) for i, k in enumerate(CHECKPOINTING)}
    return column.map(lambda v: 0.5 if isinstance(v, tuple) else rank[v])


def _columns(names: list[str], table: pd.DataFrame) -> None:
    unknown = [n for n in names if n not in table.columns]
    if unknown:
        close = [m for u in unknown for m in difflib.get_close_matches(u, table.columns, n=1)]
        hint = f"did you mean {', '.join(map(repr, close))}? " if close else ""
        raise OptionError(
            f"Plan.sort: {', '.join(map(repr, unknown))} is no column of to_dataframe(); "
            f"{hint}columns: {', '.join(table.columns)}."
        )


def label(c: Candidate) -> str:
    return (
        f"{c.layout.label()} checkpointing={checkpointing_label(c.activation_checkpointing)} "
        f"{c.precision} "
        f"micro_batches={c.micro_batches}"
    )


def _nothing_fits(p: Plan) -> NothingFitsError:
    held = [c for c in p.candidates if c.device_bytes is not None]
    least = min(held, key=lambda c: c.device_bytes or 0) if held else None
    if least is None:
        smallest = "no candidate could be traced (see Plan.to_dataframe()['error'])"
    else:
        n = least.device_bytes or 0
        what = (
            f"a peak of {format_bytes(least.peak_bytes)}, the caching allocator's reserve "
            "around it, the CUDA context"
            if least.peak_bytes is not None
            else "its parameters, gradients and optimizer state alone, and the CUDA context"
        )
        smallest = f"the least any holds on the GPU is {format_bytes(n)} ({n:,} bytes: {what})"
    return NothingFitsError(
        f"plan: none of the {len(p.candidates)} candidates on {p.devices} x {p.gpu.name} fits "
        f"the budget of {format_bytes(p.budget)} ({p.budget:,} bytes) per device; {smallest}. "
        f"Try {_sequence_parallel_hint(p)}more devices, a smaller batch or sequence, or a "
        "larger budget."
    )


def _sequence_parallel_hint(p: Plan) -> str:
    """Where tensor-parallel layouts were tried without sequence parallelism and none with
    it: the first such layout with it, as ``layouts=`` takes it (it shards the activations
    the TP ranks otherwise each hold whole: the 405B fits no layout without it)."""
    layouts = [c.layout for c in p.candidates if c.layout is not None]
    plain = [x for x in layouts if x.tp > 1 and not x.sequence_parallel]
    if not plain or any(x.sequence_parallel for x in layouts):
        return ""
    given: dict[str, Any] = {k: getattr(plain[0], k) for k in MESH if getattr(plain[0], k) != 1}
    given["sequence_parallel"] = True
    return f"sequence parallelism (layouts=[{given}]), "
