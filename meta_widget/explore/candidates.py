"""The candidates of ``plan``: their axes (layouts, checkpointing, precisions, micro-batches)
checked, and one :class:`Candidate` per combination, with the numbers its traces give.

A layout is a :class:`~meta_widget.explore.layouts.Layout` (its own module)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..analysis import Analysis
from ..options import OptionError, OptionTypeError, Parallel, check_micro_batches
from ..options.selective import SELECTIVE
from ..timing.gpus import GPU, resolve_gpu
from .layouts import MESH, PIPELINE, Layout, default_layouts, layouts_given

__all__ = [
    "CHECKPOINTING",
    "COLUMNS",
    "HELD_AS",
    "MESH",
    "PIPELINE",
    "PRECISIONS",
    "Candidate",
    "Layout",
    "Space",
    "candidates",
    "default_layouts",
]

#: the precisions tried: name -> the options of ``analyze`` that give it
PRECISIONS: dict[str, dict[str, Any]] = {
    "as given": {},
    "autocast bf16": {"autocast": "bfloat16"},
    "param_dtype bf16": {"param_dtype": "bfloat16"},
}
#: what each precision keeps its parameters, gradients and optimizer state in, named by the
#: precision that keeps them so: autocast runs ops in bf16 on parameters it leaves as given
#: (their gradients and the optimizer's state follow the parameters' dtype)
HELD_AS: dict[str, str] = {
    "as given": "as given",
    "autocast bf16": "as given",
    "param_dtype bf16": "param_dtype bf16",
}
#: the checkpointing settings a plan may try besides modules named, in the order ``Plan.sort``
#: gives them: none, every block saving the ops of ``checkpoint_policy=`` (torchtitan's op
#: list by default), every block whole (``analyze``'s ``activation_checkpointing`` values)
CHECKPOINTING: tuple[bool | str, ...] = (False, SELECTIVE, True)
#: one checkpointing setting of a plan: one of ``CHECKPOINTING``, or module paths and class names
Checkpointing = bool | str | tuple[str, ...]
#: the columns of ``Plan.to_dataframe()``
COLUMNS = (
    "replicate",
    "fsdp",
    "tp",
    "pp",
    "cp",
    "ep",
    "sequence_parallel",
    "schedule",
    "virtual_stages",
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
    layout
        The :class:`Layout`; its degrees are attributes too: ``replicate`` HSDP replicas of
        ``fsdp`` FSDP shards, ``tp`` tensor-parallel ranks, ``pp`` pipeline ranks (run by
        ``schedule``, ``virtual_stages`` stages each), ``cp`` context-parallel and ``ep``
        expert-parallel ranks (``schedule`` None without a pipeline).
    activation_checkpointing
        ``False``: nothing checkpointed; ``True``: every block, its forward run again whole in
        backward; ``"selective"``: every block, saving the outputs of the ops of the plan's
        ``checkpoint_policy=`` (torchtitan's op list by default: its matmuls but every second,
        attention, reduce-scatters) and running the rest again; a tuple of module paths or
        class names: those modules, each run again whole (``("LlamaMLP",)``: the MLP of every
        block). ``analyze``'s values.
    precision
        ``"as given"``, ``"autocast bf16"`` or ``"param_dtype bf16"``.
    micro_batches
        Forward and backward passes per optimizer step: gradient accumulation, or with a
        pipeline (``pp > 1``) the pipeline schedule's micro-batches (``Layout.microbatches``).
    input_size
        The input of one rank that ``analyze`` is given: one micro-batch, or with a pipeline
        the whole step's (which the schedule splits into its micro-batches); None for the
        plan's own ``input_size`` or ``input_data``.
    peak_bytes
        Rank 0's traced peak (the steady step's in training): what its tensors hold; with a
        pipeline, the peak of its worst stage's rank (``Analysis.peak_bytes``); None when
        the candidate could not be traced.
    device_bytes
        What rank 0's GPU holds at that peak, as ``nvidia-smi`` shows it
        (``Analysis.footprint_bytes``: the caching allocator's reserve, the CUDA context,
        NCCL's buffers); by the per-layer rule the same, the reserve replayed over the full
        depth's allocator steps (``meta_widget.explore.depth_reserve``). Where those steps do
        not follow the rule and the candidate cannot fit, the least it holds: the peak,
        cuBLAS's workspaces, the context and NCCL's buffers (the allocator's cached blocks
        come on top; ``meta_widget.explore.depth.least_device_bytes``).
    fits
        ``device_bytes <= budget`` (False when not traced). A candidate that may fit whose
        allocator steps do not follow the rule is traced at full depth, so that the caching
        allocator's reserve is replayed exactly.
    step_s, mfu, tokens_per_s, samples_per_s
        ``analysis.time``'s (with a pipeline, the pipeline's step, its bubble included);
        ``tokens_per_s`` and ``samples_per_s`` are the whole job's (every data-parallel
        rank's); None when not traced (``tokens_per_s`` also for inputs that are not tokens).
    error
        Why the candidate was not traced or its trace failed; None otherwise. A layout or
        batch the model cannot take is found before any trace (``LayoutError``'s message); a
        candidate whose layout and precision hold more than the budget in parameters,
        gradients and optimizer state alone (traced for another candidate of them, which
        checkpointing and micro-batches do not change) is not traced: "Cannot fit: ...", with
        ``device_bytes`` that least.
    traced_layers
        The depths traced when the numbers follow from the per-layer rule (``(3, 4)``, and
        ``(2, 3, 4)`` where the caching allocator's steps needed the 2-layer trace too;
        ``meta_widget.explore.depth``); ``(3,)`` when that trace put its parameters,
        gradients and optimizer state alone at full depth over the budget
        (``explore.depth_held``; ``error`` says so), ``(3, 4)`` when those two did; the one depth
        whose trace failed (its ``error``, which the full depth gives too: it is not traced for
        nothing); ``()`` when the model was traced at full depth, or not at all (its ``error``
        says why). With a pipeline the depths are layers a stage (``explore.depth_stages``).
    analysis
        The traced :class:`~meta_widget.Analysis` at full depth (traced when first asked for
        after the per-layer rule); None when ``analyze`` refused the layout.
    """

    layout: Layout
    activation_checkpointing: Checkpointing
    precision: str
    micro_batches: int
    input_size: Any = None
    peak_bytes: int | None = None
    device_bytes: int | None = None
    fits: bool = False
    step_s: float | None = None
    mfu: float | None = None
    tokens_per_s: float | None = None
    samples_per_s: float | None = None
    error: str | None = None
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

    replicate = property(lambda self: self.layout.replicate, doc="HSDP replicas.")
    fsdp = property(lambda self: self.layout.fsdp, doc="FSDP shards.")
    tp = property(lambda self: self.layout.tp, doc="Tensor-parallel ranks.")
    pp = property(lambda self: self.layout.pp, doc="Pipeline ranks.")
    cp = property(lambda self: self.layout.cp, doc="Context-parallel ranks.")
    ep = property(lambda self: self.layout.ep, doc="Expert-parallel ranks.")
    schedule = property(lambda self: self.layout.schedule, doc="The pipeline's schedule.")
    virtual_stages = property(lambda self: self.layout.virtual_stages, doc="Stages a rank.")
    sequence_parallel = property(
        lambda self: self.layout.sequence_parallel, doc="Sequence parallelism over tp."
    )

    @property
    def key(self) -> tuple[Any, ...]:
        """What identifies the candidate, and what travels to a worker: layout, checkpointing,
        precision, micro-batches and the input size of one rank."""
        return (
            self.layout,
            self.activation_checkpointing,
            self.precision,
            self.micro_batches,
            self.input_size,
        )

    def options(self) -> dict[str, Any]:
        """The options of ``analyze`` that give this candidate (besides the plan's own and the
        input): with a pipeline, its schedule's micro-batches are ``parallel``'s. Only a
        ``"selective"`` candidate takes the plan's ``checkpoint_policy``."""
        return {
            "parallel": self.layout.parallel(),
            "activation_checkpointing": self.activation_checkpointing,
            "micro_batches": 1 if self.layout.pp > 1 else self.micro_batches,
            **PRECISIONS[self.precision],
            **({} if self.activation_checkpointing == SELECTIVE else {"checkpoint_policy": None}),
        }

    def row(self) -> dict[str, Any]:
        """The candidate as a row of ``Plan.to_dataframe()`` (``traced_layers`` as text:
        ``"3, 4"``, ``"all"`` for the full depth, ``"none"`` for a candidate not traced)."""
        row = {c: getattr(self, c) for c in COLUMNS}
        row["traced_layers"] = ", ".join(map(str, self.traced_layers)) or (
            "all" if self.openable else "none"
        )
        return row


@dataclass(frozen=True)
class Space:
    """The axes :func:`plan` combines, checked: layouts, checkpointing settings, precision
    names and micro-batch counts (gradient accumulation; a pipeline's layout brings its own)."""

    layouts: tuple[Layout, ...]
    checkpointing: tuple[Checkpointing, ...]
    precisions: tuple[str, ...]
    micro_batches: tuple[int, ...]

    @classmethod
    def checked(
        cls,
        devices: int,
        mode: str,
        gpu: GPU,
        layouts: Sequence[Mapping[str, Any] | Parallel] | None,
        checkpointing: Sequence[bool | str | Sequence[str]] | None,
        precisions: Sequence[str] | None,
        micro_batches: Sequence[int] | None,
        layers: int | None = None,
        experts: int | None = None,
    ) -> Space:
        """The axes given (or their defaults) checked against ``devices`` and ``mode``;
        ``layers``: the model's decoder layers, which bound the default pipelines (None: no
        pipeline by default); ``experts``: a mixture of experts' routed experts (None: no
        expert parallelism by default)."""
        training = mode == "training"
        if not training and (checkpointing is not None or micro_batches is not None):
            raise OptionError(
                "plan: activation_checkpointing= and micro_batches= are axes of training; "
                f"leave them out with mode={mode!r}."
            )
        found = layouts_given(layouts, devices, gpu, layers if training else None, experts)
        piped = next((layout for layout in found if layout.pp > 1), None)
        if piped is not None and not training:
            raise OptionError(
                f"plan: layout {piped.label()} is a pipeline, which traces a training step "
                f"only: give mode='training' or layouts without pp (mode={mode!r})."
            )
        return cls(
            found,
            _checkpointing_axis(checkpointing, training),
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
        precision and micro-batches (a pipeline's layout: its own micro-batches, once)."""
        return [
            Candidate(layout, checkpointing, precision, micro)
            for layout in self.layouts
            for checkpointing in self.checkpointing
            for precision in self.precisions
            for micro in ((layout.microbatches,) if layout.pp > 1 else self.micro_batches)
        ]


def candidates(devices: int, mode: str = "training", gpu: str | GPU = "H100") -> list[Candidate]:
    """The candidates :func:`plan` tries by default on ``devices`` GPUs in ``mode``, not yet
    traced."""
    return Space.checked(devices, mode, resolve_gpu(gpu), None, None, None, None).candidates()


def _checkpointing_axis(
    given: Sequence[bool | str | Sequence[str]] | None, training: bool
) -> tuple[Checkpointing, ...]:
    """The checkpointing settings to try: each one of :data:`CHECKPOINTING` or a non-empty list
    of module paths or class names (made a tuple), no repeats."""
    if given is None or isinstance(given, (str, bytes)) or not isinstance(given, Sequence):
        return _axis(
            "activation_checkpointing", given, (False, True) if training else (False,), bool
        )
    found: list[Checkpointing] = []
    for value in given:
        if isinstance(value, bool) or value == SELECTIVE:
            found.append(value)
        elif (
            isinstance(value, Sequence)
            and not isinstance(value, (str, bytes))
            and value
            and all(isinstance(n, str) and n for n in value)
        ):
            found.append(tuple(value))
        else:
            raise OptionError(
                f"plan: activation_checkpointing holds {value!r}; each setting must be False, "
                f"True, {SELECTIVE!r} or a list of module paths or class names: e.g. "
                "activation_checkpointing=[False, ['LlamaMLP'], 'selective', True]."
            )
    if not found:
        return _axis("activation_checkpointing", given, (False, True), bool)  # says it is empty
    return tuple(dict.fromkeys(found))


def checkpointing_label(setting: Checkpointing) -> str:
    """A checkpointing setting as a plan's labels say it: ``True``, ``selective``,
    ``[LlamaMLP]``."""
    return f"[{', '.join(setting)}]" if isinstance(setting, tuple) else str(setting)


def _axis(
    name: str,
    given: Sequence[Any] | None,
    default: tuple[Any, ...],
    kind: type,
    known: Any = None,
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
