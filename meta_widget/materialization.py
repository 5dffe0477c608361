"""Turn a meta model into a real one, the right way, after checking that it fits.

The two silent traps of the meta device are handled here:

- ``module.to(device)`` fails on meta, and ``module.to_empty(device)`` allocates *uninitialized*
  memory (and unties tied weights: each module gets its own copy). ``materialize`` allocates
  every tensor once (ties kept), then initializes each module that has tensors with its
  ``reset_parameters()`` (transformers models with their own ``_init_weights``), and reports the
  modules it could not initialize: their values are garbage until a checkpoint fills them.
- ``load_state_dict(real_state_dict)`` into a meta module reports success but leaves every
  parameter on meta. ``materialize(checkpoint=...)`` loads with ``assign=True``.

The user's module is never touched: a fresh meta build (a class, factory or config is built
again) or ``meta_widget.sources.models.meta_copy`` of the module is materialized.
"""

from __future__ import annotations

import json
import os
import pickle
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

import torch

from .checkpoints import (
    CheckpointDiff,
    CheckpointError,
    CheckpointInfo,
    TensorEntry,
    checkpoint_diff,
    inspect_checkpoint,
    sniff,
)
from .errors import MetaWidgetError
from .options import OptionError, OptionTypeError
from .sources.models import MetaModel, meta_copy, to_meta
from .undo import without_grad
from .units import format_bytes, is_floating

__all__ = [
    "InsufficientMemoryError",
    "MaterializeError",
    "MaterializeReport",
    "available_memory",
    "materialize",
]

#: refuse when the tensors would need more than this share of the available memory
MAX_FRACTION = 0.9


class MaterializeError(MetaWidgetError, RuntimeError):
    """The model cannot be materialized as asked (e.g. the checkpoint's shapes do not fit)."""


class InsufficientMemoryError(MaterializeError, MemoryError):
    """The real model would not fit in the device's free memory; nothing was allocated."""

    def __init__(self, message: str, *, needed: int, available: int, device: str) -> None:
        super().__init__(message)
        self.needed = needed
        self.available = available
        self.device = device


@dataclass
class MaterializeReport:
    """What ``materialize`` did. Plain data (``to_dict()``).

    - ``bytes``: bytes of the real parameters and buffers (each tensor once).
    - ``available_bytes``: free memory on the device when checked (``None``: not checked).
    - ``initialized``: modules initialized by ``reset_parameters()`` (or ``_init_weights``).
    - ``uninitialized``: ``(module path, type, tensor names)`` of modules with parameters or
      buffers that nothing filled: they hold arbitrary memory (``to_empty``'s garbage).
    - ``loaded``: checkpoint keys loaded; ``missing`` / ``unexpected``: as ``load_state_dict``
      reports them.
    """

    device: str
    bytes: int
    available_bytes: int | None
    method: str
    initialized: list[str] = field(default_factory=list)
    uninitialized: list[tuple[str, str, list[str]]] = field(default_factory=list)
    loaded: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """True when every tensor holds initialized or loaded values."""
        return not self.uninitialized

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["ok"] = self.ok
        return out

    def __str__(self) -> str:

        avail = (
            f" of {format_bytes(self.available_bytes)} available"
            if self.available_bytes is not None
            else ""
        )
        lines = [
            f"Materialized on {self.device}: {format_bytes(self.bytes)}{avail}, by {self.method}, "
            f"in {self.seconds:.2f} s."
        ]
        if self.loaded:
            lines.append(f"  {len(self.loaded)} tensors loaded from the checkpoint.")
        if self.initialized:
            lines.append(f"  {len(self.initialized)} module(s) initialized ({self.method}).")
        if self.missing:
            lines.append(f"  missing from the checkpoint: {', '.join(self.missing[:8])}")
        if self.unexpected:
            lines.append(f"  unexpected in the checkpoint: {', '.join(self.unexpected[:8])}")
        for path, kind, names in self.uninitialized:
            lines.append(
                f"  NOT initialized: {path or '<root>'} ({kind}: {', '.join(names)}) has no "
                "reset_parameters(): its values are arbitrary memory; load them from a checkpoint "
                "or set them yourself."
            )
        return "\n".join(lines)


def available_memory(device: str = "cpu") -> int | None:
    """Free bytes on ``device``: ``MemAvailable`` of ``/proc/meminfo`` for the CPU (else
    ``os.sysconf`` free pages), ``torch.cuda.mem_get_info`` for CUDA; ``None`` when unknown."""
    kind = device.split(":")[0]
    if kind == "cpu":
        try:
            with open("/proc/meminfo", encoding="ascii") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError):
            pass
        try:
            return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
        except (ValueError, OSError, AttributeError):
            return None
    if kind == "cuda" and torch.cuda.is_available():
        free, _total = torch.cuda.mem_get_info(torch.device(device))
        return int(free)
    return None


def materialize(
    model: Any,
    device: str = "cpu",
    checkpoint: str | os.PathLike[str] | Mapping[str, Any] | None = None,
    *,
    available_bytes: int | None = None,
) -> tuple[torch.nn.Module, MaterializeReport]:
    """Build a real copy of ``model`` on ``device``: initialized, or loaded from a checkpoint.

    ``Analysis.materialize(device="cpu", checkpoint=None, *, available_bytes=None)`` calls this
    with the analysis' source (its rebuild function, or the module it analyzed).

    Parameters
    ----------
    model
        What ``mw.analyze`` accepts (an ``nn.Module`` on any device, a class or zero-argument
        function that builds one, a transformers config) or a
        ``meta_widget.sources.models.MetaModel``.
        A module is never changed: a meta copy of it is materialized, freshly initialized (its
        own weights are not copied: pass ``checkpoint=`` for weights).
    device
        Where the real tensors go (``"cpu"``, ``"cuda:0"``...).
    checkpoint
        A path ``inspect_checkpoint`` reads (``.safetensors``, ``torch.save`` file, sharded
        ``*.index.json``) or a state dict; loaded with ``load_state_dict(assign=True)``.
        Tensors it lacks are initialized as without a checkpoint and listed in ``missing``.
    available_bytes
        Free memory to check against (default: measured on ``device``).

    Returns
    -------
    (nn.Module, MaterializeReport)
        The real model (as built: call ``.eval()`` for inference) and what was done.

    Raises
    ------
    InsufficientMemoryError
        The tensors need more than 90% of the available memory; nothing was allocated.
    MaterializeError
        The checkpoint does not fit the model (a shape, a name given twice, or a dtype that
        loading cannot give the model: integers onto floating-point parameters), said as
        :func:`meta_widget.checkpoints.checkpoint_diff` says it; or ``device`` cannot be used
        in this process (e.g. ``"cuda"`` on a CPU-only PyTorch).
    OptionError
        ``device`` is not a device torch knows (``"tpu:0"``), or ``available_bytes`` is not a
        number of bytes (an :class:`~meta_widget.options.OptionTypeError` for a wrong type).
    """

    start = time.perf_counter()
    device = _check_device(device)
    _check_available_bytes(available_bytes)
    module = _fresh_meta(model)
    slots = _tensor_slots(module)
    ckpt_sizes, state = _checkpoint_sizes(checkpoint)
    needed = sum(
        ckpt_sizes.get(names[0][2], tensor.numel() * tensor.element_size())
        for tensor, names in slots
    )
    available = available_bytes if available_bytes is not None else available_memory(device)
    if available is not None and needed > MAX_FRACTION * available:
        raise InsufficientMemoryError(
            f"Refused to materialize {type(module).__name__} on {device}: its parameters and "
            f"buffers need {format_bytes(needed)} but only {format_bytes(available)} is "
            f"available (at most {MAX_FRACTION:.0%} of it is used). Nothing was allocated. Use a "
            "smaller dtype (build with torch_dtype=torch.bfloat16 or module.to(dtype) on meta "
            "first), another device, or inspect it on meta with mw.analyze instead.",
            needed=needed,
            available=available,
            device=device,
        )
    report = MaterializeReport(
        device=str(device), bytes=needed, available_bytes=available, method="reset_parameters"
    )
    filled: set[int] = set()  # ids of meta tensors whose slots now hold loaded tensors
    if checkpoint is not None:
        report.method = "load_state_dict(assign=True)"
        _load(module, slots, checkpoint, state, device, report, filled)
    fresh = _allocate(slots, device, filled, torch)
    _initialize(module, fresh, report)
    report.seconds = time.perf_counter() - start
    return module, report


# ---------------------------------------------------------------------------------------------


def _check_device(device: object) -> str:
    """``device`` as text, refused unless torch knows it and can allocate on it here."""
    if not isinstance(device, str | torch.device):
        raise OptionTypeError(
            f"materialize(device=...) takes a device name like 'cpu' or 'cuda:0' (or a "
            f"torch.device), not a {type(device).__name__}."
        )
    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError) as exc:
        raise OptionError(
            f"materialize(device={device!r}): torch knows no such device "
            f"({str(exc).splitlines()[0][:160]}). Use 'cpu', 'cuda', 'cuda:0', 'mps'..."
        ) from None
    if parsed.type == "meta":
        raise OptionError(
            "materialize(device='meta'): the model is on meta already; materialize puts it on "
            "a device with memory ('cpu', 'cuda:0'...)."
        )
    try:
        torch.empty(0, device=parsed)
    except (RuntimeError, AssertionError, ValueError) as exc:  # torch says "not compiled" so
        raise MaterializeError(
            f"materialize(device={device!r}): this process cannot allocate on {parsed} "
            f"({str(exc).splitlines()[0][:160]}). Nothing was allocated. Pick a device this "
            "PyTorch build and machine have (torch.cuda.is_available() tells for CUDA), or "
            "'cpu'."
        ) from None
    return str(device)


def _check_available_bytes(available: object) -> None:
    if available is None:
        return
    if not isinstance(available, int) or isinstance(available, bool):
        raise OptionTypeError(
            f"materialize(available_bytes=...) takes a number of bytes (an int) or None to "
            f"measure the device, not {available!r:.60}."
        )
    if available < 0:
        raise OptionError(f"materialize(available_bytes={available}) must be >= 0.")


def _fresh_meta(model: Any) -> torch.nn.Module:

    if isinstance(model, MetaModel):
        if model.wrapping is not None:
            raise MaterializeError(
                f"{type(model.module).__name__} was analyzed as you wrapped it (FSDP2 / tensor "
                "parallelism), and meta_widget does not materialize a wrapped model: do it on "
                "the model itself (model.to_empty(device=...), then its initialization), as "
                "FSDP2's docs do."
            )
        if model.owned and model.rebuild is not None:
            return model.rebuild()
        return meta_copy(model.module)
    if isinstance(model, torch.nn.Module):
        return meta_copy(model)
    meta = to_meta(model)  # a class, factory or config: built afresh on meta
    return meta.module if meta.owned else meta_copy(meta.module)


_Slot = tuple[Any, str, str]  # (owning module, attribute name, state-dict key)


def _tensor_slots(module: torch.nn.Module) -> list[tuple[torch.Tensor, list[_Slot]]]:
    """Every distinct parameter/buffer with every place it is held (tied weights: several)."""
    by_id: dict[int, tuple[torch.Tensor, list[_Slot]]] = {}
    for path, m in module.named_modules(remove_duplicate=False):
        for kind in ("_parameters", "_buffers"):
            for name, t in getattr(m, kind).items():
                if t is None:
                    continue
                key = f"{path}.{name}" if path else name
                entry = by_id.setdefault(id(t), (t, []))
                if all(s[2] != key for s in entry[1]):
                    entry[1].append((m, name, key))
    return list(by_id.values())


def _checkpoint_sizes(checkpoint: Any) -> tuple[dict[str, int], Any]:
    """Bytes per key of the checkpoint (read from headers for a path) and its info."""
    if checkpoint is None:
        return {}, None
    info = _mapping_info(checkpoint) if isinstance(checkpoint, Mapping) else None
    if info is None:
        if not isinstance(checkpoint, str | os.PathLike):
            raise OptionTypeError(
                "materialize(checkpoint=...) takes a path (a .safetensors, torch.save or "
                f"*.index.json file) or a state dict, not a {type(checkpoint).__name__}."
            )
        info = inspect_checkpoint(checkpoint)
    return {t.name: t.nbytes for t in info.tensors}, info


def _mapping_info(state: Mapping[Any, Any]) -> CheckpointInfo:
    """A state dict described as a checkpoint file would be (names, shapes, dtypes)."""
    entries = []
    for name, value in state.items():
        if not isinstance(name, str) or not isinstance(value, torch.Tensor):
            raise OptionTypeError(
                "materialize(checkpoint=...) takes a state dict of name -> tensor, but it maps "
                f"{name!r:.80} to a {type(value).__name__}."
            )
        dtype = str(value.dtype).removeprefix("torch.")
        entries.append(
            TensorEntry(name, tuple(value.shape), dtype, value.numel() * value.element_size(), "")
        )
    return CheckpointInfo(path="<state dict>", format="state dict", tensors=entries, files=[])


def _load(
    module: torch.nn.Module,
    slots: list[tuple[torch.Tensor, list[_Slot]]],
    checkpoint: Any,
    info: Any,
    device: str,
    report: MaterializeReport,
    filled: set[int],
) -> None:

    _refuse_misfits(module, checkpoint_diff(module, info), info)
    if isinstance(checkpoint, Mapping):
        state = {k: v.to(device) for k, v in checkpoint.items()}
    else:
        state = load_state_dict_file(info, device)
    expected = module.state_dict(keep_vars=True)
    if state and not any(k in expected for k in state):
        raise MaterializeError(
            f"none of the checkpoint's {len(state)} keys (e.g. {next(iter(state))!r}) is a key "
            f"of {type(module).__name__} (e.g. {next(iter(expected), '')!r}): it belongs to "
            "another model, or its keys carry a prefix; compare them with "
            "meta_widget.checkpoints.checkpoint_diff."
        )
    result = module.load_state_dict(state, strict=False, assign=True)
    report.missing = list(result.missing_keys)
    report.unexpected = list(result.unexpected_keys)
    loaded_keys = set(state) - set(report.unexpected)
    report.loaded = [k for k in state if k in loaded_keys]
    # assign=True replaced the tensor in the slot named by the key only: re-tie the others
    for tensor, names in slots:
        source = next((s for s in names if s[2] in loaded_keys), None)
        if source is None:
            continue
        owner0, attr0, _ = source
        value = owner0._parameters.get(attr0)
        if value is None:
            value = owner0._buffers[attr0]
        for owner, attr, _key in names:
            kind = "_parameters" if attr in owner._parameters else "_buffers"
            getattr(owner, kind)[attr] = value
        report.missing = [m for m in report.missing if m not in {s[2] for s in names}]
        filled.add(id(tensor))


def _refuse_misfits(module: torch.nn.Module, diff: CheckpointDiff, info: CheckpointInfo) -> None:
    """Refuse, in the diff's own words, what ``load_state_dict(assign=True)`` cannot load right:
    shape mismatches, names given twice, dtypes of another kind (integers onto floats)."""
    kinds = [
        (n, m, c)
        for n, m, c in diff.dtype_mismatches
        if is_floating(m) != is_floating(c) or m.startswith("complex") != c.startswith("complex")
    ]
    lines = diff.duplicate_lines() + diff.shape_lines()
    if kinds:
        lines.append(diff.dtype_line(kinds))
    if not lines:
        return
    what = "; ".join(lines)
    raise MaterializeError(
        f"{info.path!r} does not fit {type(module).__name__}, and loading it would fail or give "
        f"wrong values: {what}. Nothing was allocated. Build the model with the checkpoint's "
        "configuration and dtypes (meta_widget.checkpoints.checkpoint_diff lists every "
        "difference), or fix the checkpoint."
    )


def _torch_dtype(name: str, tensor: str, file: str) -> torch.dtype:
    """The torch dtype of a checkpoint dtype name; sub-byte packed ones (F4, F6) have none."""
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise MaterializeError(
            f"{tensor!r} in {file!r} is stored as {name}, which has no torch dtype of one element "
            "per value (sub-byte formats are packed); load it with the library that wrote it."
        )
    return dtype


def load_state_dict_file(info: Any, device: str = "cpu") -> dict[str, torch.Tensor]:
    """The real tensors of the checkpoint ``info`` (a :class:`CheckpointInfo`) on ``device``.

    safetensors files are read with the standard library and ``torch.frombuffer`` (no
    ``safetensors`` package needed); ``torch.save`` files with ``torch.load(weights_only=True,
    mmap=True)``.
    """

    state: dict[str, torch.Tensor] = {}
    for file in info.files:
        try:
            _load_file(info, file, device, state)
        except OSError as exc:
            raise CheckpointError(
                f"{file!r} cannot be read ({exc.strerror or type(exc).__name__}); it was read "
                "when inspected, so it changed since or its disk failed: check it and retry."
            ) from exc
        except (RuntimeError, pickle.UnpicklingError, EOFError, ValueError) as exc:
            if isinstance(exc, MetaWidgetError):
                raise
            raise MaterializeError(
                f"torch.load could not load {file!r} ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0][:200] if str(exc) else 'no detail'}); its names "
                "and shapes were read, but its data cannot be: the file changed since it was "
                "inspected, or it is damaged. Save or download it again."
            ) from None
    return state


def _load_file(info: Any, file: str, device: str, state: dict[str, torch.Tensor]) -> None:
    """Add the real tensors of one checkpoint file to ``state``."""
    kind = sniff(file)
    if kind != "safetensors":
        obj = torch.load(file, map_location=device, weights_only=True, mmap=kind == "torch-zip")
        _collect(obj, "", state, torch)
        return
    wanted = [t for t in info.tensors if t.file == file]
    with open(file, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        base = 8 + n
        header = json.loads(f.read(n))
        for t in wanted:
            start, end = header[t.name]["data_offsets"]
            f.seek(base + start)
            raw = bytearray(f.read(end - start))
            dtype = _torch_dtype(t.dtype, t.name, file)
            flat = torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)
            state[t.name] = flat.reshape(t.shape).to(device)


def _collect(obj: Any, prefix: str, out: dict[str, Any], torch: Any) -> None:
    if isinstance(obj, torch.Tensor):
        out[prefix] = obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _collect(v, f"{prefix}.{k}" if prefix else str(k), out, torch)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _collect(v, f"{prefix}.{i}" if prefix else str(i), out, torch)


def _allocate(
    slots: list[tuple[torch.Tensor, list[_Slot]]], device: str, filled: set[int], torch: Any
) -> set[tuple[int, str]]:
    """Give every tensor still on meta real, uninitialized memory, once per tensor (ties kept).

    Returns the ``(id(module), attribute)`` slots that got fresh memory.
    """
    fresh: set[tuple[int, str]] = set()
    for tensor, names in slots:
        if id(tensor) in filled or not tensor.is_meta:
            continue
        value = torch.empty_like(tensor, device=device)
        if isinstance(tensor, torch.nn.Parameter):
            value = torch.nn.Parameter(value, requires_grad=tensor.requires_grad)
        for owner, attr, _key in names:
            kind = "_parameters" if attr in owner._parameters else "_buffers"
            getattr(owner, kind)[attr] = value
            fresh.add((id(owner), attr))
    return fresh


def _initialize(
    module: torch.nn.Module, fresh: set[tuple[int, str]], report: MaterializeReport
) -> None:
    """Fill the freshly allocated tensors: per module whose own tensors are all fresh."""

    hf_init: Any = getattr(module, "_init_weights", None)
    is_hf = callable(hf_init) and any(c.__name__ == "PreTrainedModel" for c in type(module).__mro__)
    for path, m in module.named_modules():
        own = [*m._parameters.items(), *m._buffers.items()]
        own = [(n, t) for n, t in own if t is not None]
        new = [n for n, _ in own if (id(m), n) in fresh]
        if not new:
            continue
        reset = getattr(m, "reset_parameters", None) or getattr(m, "_reset_parameters", None)
        if len(new) == len(own) and is_hf:
            without_grad(partial(hf_init, m))
            report.initialized.append(path)
        elif len(new) == len(own) and callable(reset):
            without_grad(reset)
            report.initialized.append(path)
        else:
            report.uninitialized.append((path, type(m).__name__, new))
    if is_hf and report.initialized:
        how = "transformers _init_weights"
        report.method = f"{report.method} + {how}" if report.loaded else how
