"""The candidates of ``plan``: their axes (layouts, checkpointing, precisions, micro-batches)
checked, and one :class:`Candidate` per combination, with the numbers its traces give."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..analysis import Analysis
from ..options import OptionError, OptionTypeError, check_micro_batches
from ..timing.gpus import GPU, resolve_gpu

__all__ = ["COLUMNS", "MESH", "PRECISIONS", "Candidate", "Space", "candidates", "default_layouts"]

#: the precisions tried: name -> the options of ``analyze`` that give it
PRECISIONS: dict[str, dict[str, Any]] = {
    "as given": {},
    "autocast bf16": {"autocast": "bfloat16"},
    "param_dtype bf16": {"param_dtype": "bfloat16"},
}
#: the names a layout of ``plan(layouts=...)`` may give
MESH = ("replicate", "fsdp", "tp")
#: the columns of ``Plan.to_dataframe()``
COLUMNS = (
    "replicate",
    "fsdp",
    "tp",
    "activation_checkpointing",
    "precision",
    "micro_batches",
    "peak_bytes",
    "device_bytes",
    "fits",
    "step_s",
    "mfu",
    "tokens_per_s",
    "samples_per_s",
    "error",
    "traced_layers",
)
#: what a child of ``plan(workers=N)`` sends back of a candidate: the columns after its axes
_NUMBERS = COLUMNS[COLUMNS.index("peak_bytes") :]


@dataclass
class Candidate:
    """One configuration :func:`plan` traced (or could not).

    Attributes
    ----------
    fsdp, tp, replicate
        The layout: FSDP and tensor-parallel degrees, in ``replicate`` HSDP replicas
        (``replicate * fsdp * tp`` devices).
    activation_checkpointing
        Whether every block is checkpointed.
    precision
        ``"as given"``, ``"autocast bf16"`` or ``"param_dtype bf16"``.
    micro_batches
        Forward and backward passes per optimizer step.
    peak_bytes
        Rank 0's traced peak (the steady step's in training): what its tensors hold; None when
        the candidate could not be traced.
    device_bytes
        What rank 0's GPU holds at that peak, as ``nvidia-smi`` shows it
        (``Analysis.footprint_bytes``: the caching allocator's reserve, the CUDA context,
        NCCL's buffers). By the per-layer rule, which only decides that a candidate cannot fit,
        the least it holds: the peak, cuBLAS's workspaces, the context and NCCL's buffers (the
        allocator's cached blocks come on top; ``meta_widget.explore.depth.least_device_bytes``).
    fits
        ``device_bytes <= budget`` (False when not traced). A candidate that may fit is traced
        at full depth, so that the caching allocator's reserve is replayed exactly.
    step_s, mfu, tokens_per_s, samples_per_s
        ``analysis.time``'s; None when not traced (``tokens_per_s`` also for inputs that are
        not tokens).
    error
        Why the candidate was not traced or its trace failed; None otherwise.
    traced_layers
        The depths traced when the numbers follow from the per-layer rule (``(2, 3, 4)``;
        ``meta_widget.explore.depth``); the one depth whose trace failed (its ``error``, which
        the full depth gives too: it is not traced for nothing); ``()`` when the model was
        traced at full depth.
    analysis
        The traced :class:`~meta_widget.Analysis` at full depth (traced when first asked for
        after the per-layer rule); None when ``analyze`` refused the layout.
    """

    fsdp: int
    tp: int
    activation_checkpointing: bool
    precision: str
    micro_batches: int
    peak_bytes: int | None = None
    device_bytes: int | None = None
    fits: bool = False
    step_s: float | None = None
    mfu: float | None = None
    tokens_per_s: float | None = None
    samples_per_s: float | None = None
    error: str | None = None
    replicate: int = 1
    traced_layers: tuple[int, ...] = ()
    _analysis: Analysis | None = field(default=None, repr=False)
    #: traces the full depth, for a candidate whose numbers came from the per-layer rule
    _trace_full: Callable[[], Analysis] | None = field(default=None, repr=False, compare=False)

    @property
    def analysis(self) -> Analysis | None:
        """The candidate traced at full depth (traced now if its numbers came from the
        per-layer rule); None when ``analyze`` refused its layout."""
        if self._analysis is None and self._trace_full is not None:
            self._analysis = self._trace_full()
            self._trace_full = None
        return self._analysis

    @property
    def openable(self) -> bool:
        """Whether :attr:`analysis` is there or can be traced."""
        return self._analysis is not None or self._trace_full is not None

    @property
    def layout(self) -> tuple[int, int, int]:
        """(replicate, fsdp, tp)."""
        return (self.replicate, self.fsdp, self.tp)

    @property
    def key(self) -> tuple[Any, ...]:
        """What identifies the candidate: layout, checkpointing, precision, micro-batches."""
        return (
            *self.layout,
            self.activation_checkpointing,
            self.precision,
            self.micro_batches,
        )

    def options(self) -> dict[str, Any]:
        """The options of ``analyze`` that give this candidate (besides the plan's own)."""
        sizes = (("replicate", self.replicate), ("fsdp", self.fsdp), ("tp", self.tp))
        parallel = {name: n for name, n in sizes if n > 1}
        return {
            "parallel": parallel or None,
            "activation_checkpointing": self.activation_checkpointing,
            "micro_batches": self.micro_batches,
            **PRECISIONS[self.precision],
        }

    def row(self) -> dict[str, Any]:
        """The candidate as a row of ``Plan.to_dataframe()`` (``traced_layers`` as text:
        ``"2, 3, 4"``, or ``"all"`` for the full depth)."""
        row = {c: getattr(self, c) for c in COLUMNS}
        row["traced_layers"] = ", ".join(map(str, self.traced_layers)) or "all"
        return row


@dataclass(frozen=True)
class Space:
    """The axes :func:`plan` combines, checked: layouts ``(replicate, fsdp, tp)``,
    checkpointing settings, precision names and micro-batch counts."""

    layouts: tuple[tuple[int, int, int], ...]
    checkpointing: tuple[bool, ...]
    precisions: tuple[str, ...]
    micro_batches: tuple[int, ...]

    @classmethod
    def checked(
        cls,
        devices: int,
        mode: str,
        gpu: GPU,
        layouts: Sequence[Mapping[str, int]] | None,
        checkpointing: Sequence[bool] | None,
        precisions: Sequence[str] | None,
        micro_batches: Sequence[int] | None,
    ) -> Space:
        """The axes given (or their defaults) checked against ``devices`` and ``mode``."""
        training = mode == "training"
        if not training and (checkpointing is not None or micro_batches is not None):
            raise OptionError(
                "plan: activation_checkpointing= and micro_batches= are axes of training; "
                f"leave them out with mode={mode!r}."
            )
        return cls(
            _layouts(layouts, devices, gpu),
            _axis(
                "activation_checkpointing",
                checkpointing,
                (False, True) if training else (False,),
                bool,
            ),
            _axis("precisions", precisions, tuple(PRECISIONS), str, PRECISIONS),
            tuple(
                check_micro_batches(count, mode)  # before any trace: 5000 is refused here
                for count in _axis(
                    "micro_batches", micro_batches, (1, 2) if training else (1,), int
                )
            ),
        )

    def candidates(self) -> list[Candidate]:
        """Every combination, not yet traced: layouts (FSDP-first), then checkpointing,
        precision and micro-batches."""
        return [
            Candidate(fsdp, tp, checkpointing, precision, micro, replicate=replicate)
            for replicate, fsdp, tp in self.layouts
            for checkpointing in self.checkpointing
            for precision in self.precisions
            for micro in self.micro_batches
        ]


def candidates(devices: int, mode: str = "training", gpu: str | GPU = "H100") -> list[Candidate]:
    """The candidates :func:`plan` tries by default on ``devices`` GPUs in ``mode``, not yet
    traced."""
    return Space.checked(devices, mode, resolve_gpu(gpu), None, None, None, None).candidates()


def default_layouts(devices: int, gpu: GPU) -> list[tuple[int, int, int]]:
    """Every ``(replicate, fsdp, tp)`` with product ``devices`` and ``tp <= gpus_per_node``:
    by tp, then fewest replicas (plain FSDP first)."""
    divisors = [d for d in range(1, devices + 1) if devices % d == 0]
    return [
        (replicate, devices // tp // replicate, tp)
        for tp in divisors
        if tp <= max(1, gpu.gpus_per_node)
        for replicate in divisors
        if (devices // tp) % replicate == 0
    ]


def _layouts(
    given: Sequence[Mapping[str, int]] | None, devices: int, gpu: GPU
) -> tuple[tuple[int, int, int], ...]:
    if given is None:
        return tuple(default_layouts(devices, gpu))
    if isinstance(given, (str, Mapping)) or not isinstance(given, Sequence) or not given:
        raise OptionTypeError(
            f"plan: layouts must be a non-empty list of dicts, not {given!r}: e.g. "
            '[{"fsdp": 8}, {"replicate": 2, "fsdp": 4}, {"fsdp": 4, "tp": 2}].'
        )
    found = tuple(_layout(layout, devices) for layout in given)
    return tuple(dict.fromkeys(found))


def _layout(layout: Any, devices: int) -> tuple[int, int, int]:
    """One layout of ``plan(layouts=...)`` checked: (replicate, fsdp, tp), product ``devices``."""
    known = isinstance(layout, Mapping) and set(layout) <= set(MESH)
    sizes = tuple(layout.get(k, 1) for k in MESH) if known else ()
    if not sizes or not all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in sizes
    ):
        raise OptionError(
            f"plan: layout {layout!r} must map replicate, fsdp and tp to whole numbers >= 1."
        )
    replicate, fsdp, tp = sizes
    if replicate * fsdp * tp != devices:
        raise OptionError(
            f"plan: layout {layout!r} uses {replicate * fsdp * tp} devices, not the "
            f"devices={devices} every candidate uses (replicate x fsdp x tp)."
        )
    return replicate, fsdp, tp


def _axis(
    name: str, given: Sequence[Any] | None, default: tuple[Any, ...], kind: type, known: Any = None
) -> tuple[Any, ...]:
    """One axis given (or its default), each value of ``kind`` (and in ``known``), no repeats."""
    if given is None:
        return default
    if isinstance(given, (str, bytes)) or not isinstance(given, Sequence) or not given:
        raise OptionTypeError(
            f"plan: {name} must be a non-empty list or tuple (e.g. {list(default)}), not {given!r}."
        )
    for value in given:
        bad = not isinstance(value, kind) or (kind is int and isinstance(value, bool))
        if bad or (known is not None and value not in known) or (kind is int and value < 1):
            allowed = f"one of {list(known)}" if known is not None else f"a {kind.__name__}"
            raise OptionError(f"plan: {name} holds {value!r}; each must be {allowed}.")
    return tuple(dict.fromkeys(given))
