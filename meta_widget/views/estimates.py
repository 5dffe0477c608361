"""What-if and multi-device **estimates** computed from a recorded :class:`MemoryReport`.

Plain numbers in, plain numbers out: nothing here traces a model. Every function re-scales the
bytes live at the recorded peak, by category (``meta_widget.memory.report.CATEGORIES``), with the
formula
its docstring states; ``docs/estimates.md`` gathers the formulas, the assumptions and a measured
check of the ZeRO-3 estimate against FSDP2. These are estimates, not measurements: the recorded
pass ran at one dtype on one device, and a re-scaled activation or a sharded optimizer state is a
model of what another run would hold.

Notation used in the docstrings: ``r`` the recorded bytes per floating-point parameter (4 for a
float32 model), ``c`` the bytes per element of the compute dtype, ``E`` the number of floating
parameters, ``k`` the optimizer's state slots per parameter (AdamW/Adam 2, SGD with momentum 1,
SGD 0) and ``N`` the number of devices.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from .. import heavy
from ..choices import Optimizer, Phase
from ..errors import MetaWidgetError
from ..memory.report import CATEGORIES, MemoryReport
from ..units import DTYPE_BYTES

if TYPE_CHECKING:
    import pandas as pd

    from ..data.tree import ModuleNode
    from .analyzed import Analyzed

__all__ = [
    "OPTIMIZER_SLOTS",
    "STRATEGIES",
    "EstimateError",
    "distributed",
    "distributed_table",
    "infer_optimizer",
    "largest_block_bytes",
    "recorded_element_size",
    "recorded_optimizer_state_bytes",
    "root_unit_bytes",
    "tp_activation_fraction",
    "tp_fraction",
    "what_if",
    "what_if_table",
]

#: state tensors the optimizer keeps per parameter (each the size of the parameter)
OPTIMIZER_SLOTS: dict[str | None, int] = {
    Optimizer.ADAMW: 2,
    Optimizer.ADAM: 2,
    Optimizer.SGD_MOMENTUM: 1,
    Optimizer.SGD: 0,
    None: 0,
}
#: per-device strategies of :func:`distributed`; ``"fsdp"`` is ``"zero3"``
STRATEGIES = ("ddp", "zero1", "zero2", "zero3", "fsdp", "tp")
COMPUTE_DTYPES = ("float32", "bfloat16", "float16")
WEIGHT_DTYPES = ("int8", "int4")
#: module paths or class names taken as the attention / MLP blocks tensor parallelism splits
TP_PATTERN = re.compile(r"attn|attention|mlp|feed_?forward|ffn", re.IGNORECASE)
CONTAINERS = ("ModuleList", "ModuleDict")
MASTER_BYTES = 4  # fp32 master weights of mixed precision, bytes per parameter


class EstimateError(MetaWidgetError, ValueError):
    """An estimate was asked with arguments that do not describe a possible run."""


# ---------------------------------------------------------------------------------------------
# what the report recorded


def _float_param_bytes(report: MemoryReport) -> int:
    return sum(b for d, b in report.params_by_dtype.items() if _is_float(d))


def _is_float(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat", "complex"))


def recorded_element_size(report: MemoryReport) -> float:
    """Bytes per floating-point parameter as recorded (``r``): float parameter bytes / ``E``.

    4.0 for a float32 model, 2.0 for bfloat16; 4.0 when the model has no floating parameters.
    """
    if report.float_params == 0:
        return 4.0
    return _float_param_bytes(report) / report.float_params


def recorded_optimizer_state_bytes(report: MemoryReport) -> int:
    """Optimizer state on the device after the recorded step, live at the peak or not.

    ``report.optimizer_state_bytes`` where the report has it; otherwise the live bytes at the
    end of the timeline minus those just before the ``optimizer`` phase began (the step's
    temporaries are freed by then, its state is not). 0 in inference or without an optimizer.
    """
    recorded = int(getattr(report, "optimizer_state_bytes", 0) or 0)
    if recorded or report.mode != "training":
        return recorded
    start = report.phases.get(Phase.OPTIMIZER)
    if start is None or start < 1 or not report.timeline:
        return int(report.categories.get("optimizer state", 0))
    return max(0, report.timeline[-1][0] - report.timeline[start - 1][0])


def infer_optimizer(report: MemoryReport) -> str | None:
    """The optimizer the recorded state implies: ``k = round(state bytes / (E · r))``.

    ``k = 2`` gives ``"adamw"`` (Adam keeps the same state), ``1`` ``"sgd-momentum"``, ``0``
    ``"sgd"`` when an optimizer phase was recorded and ``None`` otherwise (and in inference).
    """
    if report.mode != "training":
        return None
    trained = int(getattr(report, "gradient_bytes", 0) or 0) or _float_param_bytes(report)
    state = recorded_optimizer_state_bytes(report)
    if trained == 0 or state == 0:
        return "sgd" if Phase.OPTIMIZER in report.phases else None
    slots = round(state / trained)
    for name, k in OPTIMIZER_SLOTS.items():
        if k == slots and name is not None:
            return str(name)
    raise EstimateError(
        f"the recorded optimizer state ({state} bytes) is {state / trained:.2f}x the trained "
        "parameter bytes, which matches no optimizer in OPTIMIZER_SLOTS; pass optimizer= to "
        "say which one to model."
    )


# ---------------------------------------------------------------------------------------------
# one device: dtypes, mixed precision, weight-only quantization


def what_if(
    report: MemoryReport,
    *,
    dtype: str = "float32",
    weights: str | None = None,
    mixed_precision: bool = False,
    optimizer: str | None = "auto",
) -> dict[str, int]:
    """Bytes by category at the recorded peak had the model run at another precision (estimate).

    Parameters
    ----------
    report
        The recorded memory report (``Analysis.memory``).
    dtype
        Compute dtype: ``"float32"``, ``"bfloat16"`` or ``"float16"`` (``c`` = 4, 2, 2 bytes).
    weights
        ``"int8"`` or ``"int4"``: weight-only quantization (inference only); compute stays at
        ``dtype``.
    mixed_precision
        Compute at ``dtype`` (a 16-bit one) with fp32 master weights and fp32 optimizer state.
    optimizer
        ``"adamw"``, ``"adam"``, ``"sgd-momentum"``, ``"sgd"`` or ``None``; ``"auto"`` (default)
        infers it from the recorded state with :func:`infer_optimizer`.

    Returns
    -------
    dict[str, int]
        Every category of ``CATEGORIES`` and ``"total"`` (their sum). With ``s = c``, or ``s = 4``
        under mixed precision, the bytes of the optimizer's state dtype, and ``m = 4`` bytes of
        fp32 master weights under mixed precision (else 0):

        - parameters = ``report.param_bytes_at(weights or dtype)``: every floating parameter at
          ``c`` bytes (int8: 1, int4: 0.5), others as recorded;
        - buffers: floating buffers re-scaled by ``c / r``, kept as recorded under mixed
          precision; inputs: as recorded (their dtype is the caller's);
        - gradients = recorded × ``c / r`` (gradients at the compute dtype), 0 in inference;
        - optimizer state = ``E · (k · s + m)`` in training (torch keeps Adam's moments at the
          parameter dtype; mixed precision keeps them and the master weights in fp32, the ZeRO
          paper's ``K = 12`` bytes for Adam). It counts even when the recorded peak came before
          the first step created it: from the second step on the state is live throughout;
        - activations = recorded × ``c / r``; temporaries = recorded × ``c / r``, or × ``s / r``
          when the peak is in the optimizer phase (the step's temporaries have the state's
          dtype). Scaling activations linearly assumes every floating activation changes dtype
          with the compute dtype, which ignores ops autocast keeps in fp32 (softmax, norms).

    Raises
    ------
    EstimateError
        For an unknown dtype, weight format or optimizer, int weights in a training report, or
        mixed precision at float32.
    """
    if dtype not in COMPUTE_DTYPES:
        raise EstimateError(f"what_if: dtype must be one of {COMPUTE_DTYPES}, not {dtype!r}.")
    if weights is not None and weights not in WEIGHT_DTYPES:
        raise EstimateError(
            f"what_if: weights must be None or one of {WEIGHT_DTYPES}, not {weights!r}."
        )
    training = report.mode == "training"
    if weights is not None and (training or mixed_precision):
        raise EstimateError(
            f"what_if: weights={weights!r} models weight-only quantization for inference; this "
            f"report is a {report.mode} report{' with mixed precision' if mixed_precision else ''}"
            ". Analyze with mode='inference' and leave mixed_precision=False."
        )
    if mixed_precision and dtype == "float32":
        raise EstimateError(
            "what_if: mixed precision computes in a 16-bit dtype; pass dtype='bfloat16' or "
            "dtype='float16' with mixed_precision=True."
        )
    name = infer_optimizer(report) if optimizer == "auto" else optimizer
    if name not in OPTIMIZER_SLOTS:
        raise EstimateError(
            f"what_if: optimizer must be 'auto', None or one of "
            f"{[o.value for o in Optimizer]}, not {optimizer!r}."
        )
    r = recorded_element_size(report)
    c = DTYPE_BYTES[dtype]
    s = float(MASTER_BYTES) if mixed_precision else c
    master = MASTER_BYTES if mixed_precision else 0
    cats = {k: report.categories.get(k, 0) for k in CATEGORIES}
    float_buffers = sum(b for d, b in report.buffers_by_dtype.items() if _is_float(d))
    buffers = report.buffer_bytes
    if not mixed_precision:
        buffers = report.buffer_bytes - float_buffers + round(float_buffers * c / r)
    temp_size = s if report.peak_phase == Phase.OPTIMIZER else c
    out = {
        "parameters": report.param_bytes_at(weights or dtype),
        "buffers": buffers,
        "inputs": cats["inputs"],
        "gradients": round(cats["gradients"] * c / r) if training else 0,
        "optimizer state": (
            round(report.float_params * (OPTIMIZER_SLOTS[name] * s + master)) if training else 0
        ),
        "activations": round(cats["activations"] * c / r),
        "temporaries": round(cats["temporaries"] * temp_size / r),
    }
    for name, n in report.categories.items():  # mode="generate": the KV cache, as activations
        if name.startswith("KV cache"):
            out[name] = round(n * c / r)
    out["total"] = sum(out.values())
    return out


# ---------------------------------------------------------------------------------------------
# several devices


def distributed(
    report: MemoryReport,
    n_devices: int,
    strategy: str,
    *,
    optimizer: str | None = "auto",
    dtype: str = "float32",
    mixed_precision: bool = False,
    largest_unit_bytes: int | None = None,
    root_unit_bytes: int = 0,
    tp_fraction: float | None = None,
    tp_activation_fraction: float | None = None,
) -> dict[str, int]:
    """Bytes by category on each of ``n_devices`` devices under a parallel strategy (estimate).

    The single-device bytes ``B`` are :func:`what_if` at ``dtype`` / ``mixed_precision``; the
    recorded batch is taken as the per-device batch (data parallelism replicates activations).

    Parameters
    ----------
    report
        The recorded memory report (``Analysis.memory``).
    n_devices
        ``N`` >= 1.
    strategy
        - ``"ddp"``: a full replica, ``B`` unchanged (gradients taken as views into DDP's
          buckets, ``gradient_as_bucket_view=True``; PyTorch's default keeps one more copy of
          the gradients in its buckets).
        - ``"zero1"``: optimizer state / ``N``.
        - ``"zero2"``: also gradients / ``N``.
        - ``"zero3"`` / ``"fsdp"``: also parameters / ``N``, plus the unsharded working set of
          FSDP: the root unit's parameters (``root_unit_bytes``: parameters outside every
          wrapped block, kept gathered for the whole step) and the largest wrapped unit gathered
          (``largest_unit_bytes``); in training also that unit's unsharded gradients and the
          reduce-scatter input they are copied into (2 × the unit), put under gradients. Unit
          bytes are recorded bytes, re-scaled by ``c / r``.
        - ``"tp"``: tensor parallelism of the attention / MLP blocks: with ``f = tp_fraction``
          (their share of parameters), parameters, gradients and optimizer state × ``(1 - f +
          f / N)``; with ``a = tp_activation_fraction`` (default ``f``), activations and
          temporaries × ``(1 - a + a / N)``; buffers and inputs replicated.
    optimizer, dtype, mixed_precision
        As in :func:`what_if`.
    largest_unit_bytes, root_unit_bytes
        For ``"zero3"``: see :func:`largest_block_bytes` and :func:`root_unit_bytes`.
    tp_fraction, tp_activation_fraction
        For ``"tp"``: see :func:`tp_fraction` and :func:`tp_activation_fraction`.

    Returns
    -------
    dict[str, int]
        Every category of ``CATEGORIES`` and ``"total"``, per device.

    Raises
    ------
    EstimateError
        For an unknown strategy, ``N`` < 1, or ``"zero3"`` / ``"tp"`` without the size they need.
    """
    if strategy not in STRATEGIES:
        raise EstimateError(f"distributed: strategy must be one of {STRATEGIES}, not {strategy!r}.")
    if isinstance(n_devices, bool) or not isinstance(n_devices, int) or n_devices < 1:
        raise EstimateError(f"distributed: n_devices must be an int >= 1, not {n_devices!r}.")
    base = what_if(report, dtype=dtype, mixed_precision=mixed_precision, optimizer=optimizer)
    out = {k: base[k] for k in CATEGORIES}
    n = n_devices
    scale = DTYPE_BYTES[dtype] / recorded_element_size(report)
    if strategy in ("zero1", "zero2", "zero3", "fsdp"):
        out["optimizer state"] = _ceil_div(out["optimizer state"], n)
    if strategy in ("zero2", "zero3", "fsdp"):
        out["gradients"] = _ceil_div(out["gradients"], n)
    if strategy in ("zero3", "fsdp"):
        if largest_unit_bytes is None:
            raise EstimateError(
                f"distributed: strategy {strategy!r} needs largest_unit_bytes, the parameter "
                "bytes of the biggest wrapped block; pass largest_block_bytes(analysis) (and "
                "root_unit_bytes=root_unit_bytes(analysis)) or use distributed_table(analysis)."
            )
        unit = round(largest_unit_bytes * scale)
        out["parameters"] = _ceil_div(out["parameters"], n) + round(root_unit_bytes * scale) + unit
        if report.mode == "training":
            out["gradients"] += 2 * unit
    if strategy == "tp":
        if tp_fraction is None:
            raise EstimateError(
                "distributed: strategy 'tp' needs tp_fraction, the share of parameters in the "
                "attention/MLP blocks; pass tp_fraction(analysis) or use distributed_table."
            )
        f = _fraction(tp_fraction, "tp_fraction")
        a = (
            f
            if tp_activation_fraction is None
            else _fraction(tp_activation_fraction, "tp_activation_fraction")
        )
        for k in ("parameters", "gradients", "optimizer state"):
            out[k] = round(out[k] * (1 - f + f / n))
        for k in ("activations", "temporaries"):
            out[k] = round(out[k] * (1 - a + a / n))
    out["total"] = sum(out.values())
    return out


def _ceil_div(x: int, n: int) -> int:
    return -(-x // n)


def _fraction(x: float, name: str) -> float:
    if not 0.0 <= x <= 1.0:
        raise EstimateError(f"distributed: {name} must be in [0, 1], not {x!r}.")
    return float(x)


# ---------------------------------------------------------------------------------------------
# sizes read from an analysis


def _blocks(analysis: Analyzed) -> list[ModuleNode]:
    """Children of the outermost ``ModuleList`` / ``ModuleDict`` containers."""
    blocks: list[ModuleNode] = []

    def visit(node: ModuleNode) -> None:
        if node.type in CONTAINERS and node.children:
            blocks.extend(node.children)
            return
        for child in node.children:
            visit(child)

    visit(analysis.root)
    return blocks


def largest_block_bytes(analysis: Analyzed) -> int:
    """Parameter bytes of the biggest FSDP unit: the largest child of a ``ModuleList``.

    The children of the outermost ``ModuleList`` / ``ModuleDict`` containers are taken as the
    wrapped blocks (``fully_shard(block)`` for each transformer layer); without any, the largest
    leaf module (a module with no children), as if every such module were wrapped.
    """
    blocks = _blocks(analysis) or [n for n in analysis.modules if not n.children]
    return max((n.param_bytes for n in blocks), default=0)


def root_unit_bytes(analysis: Analyzed) -> int:
    """Parameter bytes left to the root FSDP unit: all parameters minus the blocks' ones.

    The blocks are those of :func:`largest_block_bytes`; with no ``ModuleList`` every leaf
    module is taken as wrapped and the root keeps the parameters held outside the leaves.
    """
    blocks = _blocks(analysis) or [n for n in analysis.modules if n.path and not n.children]
    return max(0, analysis.root.param_bytes - sum(n.param_bytes for n in blocks))


def _tp_nodes(analysis: Analyzed) -> list[ModuleNode]:
    """The outermost modules whose name or class names attention or an MLP."""
    found: list[ModuleNode] = []

    def visit(node: ModuleNode) -> None:
        if node.path and (TP_PATTERN.search(node.name) or TP_PATTERN.search(node.type)):
            found.append(node)
            return
        for child in node.children:
            visit(child)

    visit(analysis.root)
    return found


def tp_fraction(analysis: Analyzed) -> float:
    """Share of parameters in attention / MLP blocks: their ``params`` / all ``params``.

    A block is the outermost module whose attribute name or class name matches
    ``attn|attention|mlp|feed_forward|feedforward|ffn`` (case-insensitive).
    """
    total = analysis.root.params
    if total == 0:
        return 0.0
    return min(1.0, sum(n.params for n in _tp_nodes(analysis)) / total)


def tp_activation_fraction(analysis: Analyzed) -> float:
    """Share of the forward pass's allocated bytes made inside attention / MLP blocks.

    ``sum(alloc_bytes)`` of the forward calls of those blocks and their sub-modules, over the
    same sum for every forward call; 0.0 for a structural analysis.
    """
    inside: set[int] = set()
    for node in _tp_nodes(analysis):
        inside.update(n.index for n in node.walk())
    forward = analysis.calls  # recomputations under checkpointing are not calls of their own
    total = sum(c.alloc_bytes for c in forward)
    if total == 0:
        return 0.0
    return sum(c.alloc_bytes for c in forward if c.module in inside) / total


# ---------------------------------------------------------------------------------------------
# tables


def what_if_table(analysis: Analyzed) -> pd.DataFrame:
    """One row per precision, one column per category plus ``total`` (bytes, estimates).

    Training: float32, bfloat16, float16, mixed bfloat16 and mixed float16. Inference: float32,
    bfloat16, float16, int8 and int4 weights (bfloat16 compute). Each row is :func:`what_if`.
    """
    pd = heavy.pandas()

    report = analysis.memory
    rows: dict[str, dict[str, int]] = {d: what_if(report, dtype=d) for d in COMPUTE_DTYPES}
    if report.mode == "training":
        for d in ("bfloat16", "float16"):
            rows[f"mixed {d}"] = what_if(report, dtype=d, mixed_precision=True)
    else:
        for w in WEIGHT_DTYPES:
            rows[f"{w} weights"] = what_if(report, dtype="bfloat16", weights=w)
    frame = pd.DataFrame.from_dict(rows, orient="index", columns=[*CATEGORIES, "total"])
    frame.index.name = "precision"
    return frame


def distributed_table(
    analysis: Analyzed,
    sizes: tuple[int, ...] = (1, 2, 8),
    *,
    dtype: str = "float32",
    mixed_precision: bool = False,
) -> pd.DataFrame:
    """Per-device bytes for ddp, zero1, zero2, zero3 and tp at each size (estimates).

    Columns: ``strategy``, ``devices``, every category and ``total``. Unit sizes and tensor-
    parallel shares come from :func:`largest_block_bytes`, :func:`root_unit_bytes`,
    :func:`tp_fraction` and :func:`tp_activation_fraction`.
    """
    pd = heavy.pandas()

    report = analysis.memory
    rows = []
    for strategy in ("ddp", "zero1", "zero2", "zero3", "tp"):
        for n in sizes:
            est = distributed(
                report,
                n,
                strategy,
                dtype=dtype,
                mixed_precision=mixed_precision,
                largest_unit_bytes=largest_block_bytes(analysis),
                root_unit_bytes=root_unit_bytes(analysis),
                tp_fraction=tp_fraction(analysis),
                tp_activation_fraction=tp_activation_fraction(analysis),
            )
            rows.append({"strategy": strategy, "devices": n, **est})
    return pd.DataFrame(rows, columns=["strategy", "devices", *CATEGORIES, "total"])
