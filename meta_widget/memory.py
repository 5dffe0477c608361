"""The memory model of one recorded pass.

Definitions (the README repeats them):

- **parameter bytes**: ``numel * element_size`` summed over the model's parameters, each tensor
  counted once (tied weights once).
- **buffer bytes**: the same over buffers.
- **input bytes**: the distinct storages of the input tensors.
- **activation bytes** (total): every byte of storage allocated during the pass, whether freed
  later or not; per call, the bytes of *new* storage its outputs hold (views allocate nothing).
- **live bytes** after an event: parameters + buffers + inputs + the storage allocated during the
  pass and not yet freed; **peak** is their maximum over the recorded timeline, with the module
  call and the aten op that allocated at that moment.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from .recorder import CallRecord, Event

#: bytes per element of the dtypes offered as what-ifs; int4 packs two weights in a byte
DTYPE_BYTES = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0, "int8": 1.0, "int4": 0.5}


@dataclass
class MemoryReport:
    """Bytes by category and the live-bytes timeline of one pass (see the module docstring)."""

    param_bytes: int
    buffer_bytes: int
    input_bytes: int
    activation_bytes: int
    params_by_dtype: dict[str, int]
    buffers_by_dtype: dict[str, int]
    float_params: int
    #: (live bytes, call index or -1, op) after each allocation or free, baseline included
    timeline: list[tuple[int, int, str]] = field(default_factory=list)
    peak_bytes: int = 0
    peak_call: int | None = None
    peak_module: str | None = None
    peak_op: str | None = None

    @property
    def baseline_bytes(self) -> int:
        """Bytes live before the first op: parameters, buffers and inputs."""
        return self.param_bytes + self.buffer_bytes + self.input_bytes

    def param_bytes_at(self, dtype: str) -> int:
        """Parameter bytes if every floating-point parameter were stored as ``dtype``.

        Non-floating parameters keep their recorded size. ``dtype`` is one of ``DTYPE_BYTES``.
        """
        if dtype not in DTYPE_BYTES:
            raise ValueError(f"dtype must be one of {sorted(DTYPE_BYTES)}, not {dtype!r}")
        float_bytes = sum(b for d, b in self.params_by_dtype.items() if _is_float(d))
        return int(self.param_bytes - float_bytes + self.float_params * DTYPE_BYTES[dtype])

    def by_category(self) -> dict[str, int]:
        """Bytes at the peak, by category: parameters, buffers, inputs, activations."""
        return {
            "parameters": self.param_bytes,
            "buffers": self.buffer_bytes,
            "inputs": self.input_bytes,
            "activations": self.peak_bytes - self.baseline_bytes,
        }


def _is_float(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat", "complex")) or dtype.startswith("float8")


def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def unique_bytes(tensors: Sequence[torch.Tensor]) -> dict[str, int]:
    """Bytes by dtype of ``tensors``, each tensor object counted once."""
    seen: set[int] = set()
    out: dict[str, int] = {}
    for t in tensors:
        if id(t) in seen:
            continue
        seen.add(id(t))
        name = _dtype_name(t)
        out[name] = out.get(name, 0) + t.numel() * t.element_size()
    return out


def storage_bytes(tensors: Sequence[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors``."""
    seen: dict[int, int] = {}
    for t in tensors:
        st = t.untyped_storage()
        seen[st._cdata] = st.nbytes()
    return sum(seen.values())


def memory_report(
    module: torch.nn.Module,
    inputs: Sequence[torch.Tensor],
    calls: Sequence[CallRecord] = (),
    events: Sequence[Event] = (),
) -> MemoryReport:
    """Build the :class:`MemoryReport` of ``module`` run on ``inputs`` (events may be empty)."""
    params = list(module.parameters())
    params_by_dtype = unique_bytes(params)
    buffers_by_dtype = unique_bytes(list(module.buffers()))
    report = MemoryReport(
        param_bytes=sum(params_by_dtype.values()),
        buffer_bytes=sum(buffers_by_dtype.values()),
        input_bytes=storage_bytes(inputs),
        activation_bytes=sum(e.nbytes for e in events if e.nbytes > 0),
        params_by_dtype=params_by_dtype,
        buffers_by_dtype=buffers_by_dtype,
        float_params=sum(p.numel() for p in params if p.is_floating_point()),
    )
    base = report.baseline_bytes
    report.timeline = [(base + e.live_bytes, e.call, e.op) for e in events]
    report.peak_bytes = base
    if events:
        i = max(range(len(events)), key=lambda k: events[k].live_bytes)
        report.peak_bytes = base + events[i].live_bytes
        report.peak_call = events[i].call if events[i].call >= 0 else None
        report.peak_op = events[i].op
        if report.peak_call is not None and report.peak_call < len(calls):
            report.peak_module = calls[report.peak_call].path
    return report


def to_dict(report: MemoryReport) -> dict[str, Any]:
    """The report as plain data (the timeline left out)."""
    return {
        "param_bytes": report.param_bytes,
        "buffer_bytes": report.buffer_bytes,
        "input_bytes": report.input_bytes,
        "activation_bytes": report.activation_bytes,
        "peak_bytes": report.peak_bytes,
        "peak_module": report.peak_module,
        "peak_op": report.peak_op,
        "params_by_dtype": report.params_by_dtype,
        "buffers_by_dtype": report.buffers_by_dtype,
    }
