"""``mw.measure``: the recorder of ``mw.analyze`` on a real run, for the prediction to be checked.

The model runs for real (on the CPU, or on CUDA where it is available) under the same
:class:`~meta_widget.trace.recorder.Recorder` and the same pass (``meta_widget.trace.passes``:
a forward pass, or a training step) as a meta analysis, with its storage tracker following real
storages instead of meta ones. So every number has the definition it has in ``mw.analyze``:
output bytes per module call, FLOPs, the live-bytes timeline (every storage an op returns,
freed when it dies). Then:

- **the peak** is the allocator's: on the CPU, the parameters, buffers and inputs plus the
  largest sum of the allocations and frees ``torch.profiler`` records (``profile_memory=True``)
  while the pass runs, buffers allocated inside fused kernels included (which the timeline,
  made of the tensors ops return, does not see); on CUDA, ``torch.cuda.max_memory_allocated``.
  The timeline's own maximum is kept as ``recorded_peak_bytes``.
- **wall time** per module call (``wall_s`` in ``to_dataframe()``, and ``duration_s`` per call)
  is measured in a second, plain forward pass with timing hooks only (the recorder's dispatch
  mode would inflate it). It is the forward pass only, in training too.

The model is first analyzed on meta, and the run is refused when that predicted peak passes
``max_bytes`` (4 GiB unless raised). The user's module is left as it was: in training a copy of it
runs (the optimizer step changes weights), in inference the module itself, with its hooks and
flags put back.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile
from torch.utils._pytree import tree_map_only

from ..analysis import Analysis, analyze
from ..data.flatten import named_tensors
from ..data.records import CallRecord
from ..data.tree import build_tree
from ..data.walk import walk
from ..errors import MetaWidgetError
from ..materialization import materialize
from ..options import OptionError
from ..pipeline import _assemble
from ..sources.models import MetaModel
from ..trace.passes import Trace, set_training, trace
from ..trace.recorder import Recorder
from ..trace.storage import inner_tensors
from ..trace.trace_changes import remove_module_hooks
from ..undo import Undo, set_grad_enabled, undoing
from ..units import format_bytes

__all__ = ["MeasureError", "Measured", "measure"]

#: the predicted peak above which ``measure`` refuses to run a model for real
DEFAULT_MAX_BYTES = 4 * 2**30
_DEVICES = ("cpu", "cuda")


class MeasureError(MetaWidgetError, RuntimeError):
    """``mw.measure`` cannot run the model for real as asked (too large, or no such device)."""


@dataclass(eq=False, frozen=True, repr=False)  # Analysis's short repr
class Measured(Analysis):
    """An :class:`~meta_widget.analysis.Analysis` of a real run (see :func:`measure`).

    ``peak_bytes`` is the allocator's peak (the CPU allocator's as ``torch.profiler`` records
    it, or CUDA's ``max_memory_allocated``); ``recorded_peak_bytes`` the maximum of the timeline
    (the storages ops returned); ``to_dataframe()`` has a ``wall_s`` column: the wall time of
    each module's forward calls in a plain run, sub-modules included.
    """

    allocator_peak_bytes: int = 0
    device: str = "cpu"

    @property
    def peak_bytes(self) -> int:
        return self.allocator_peak_bytes

    @property
    def recorded_peak_bytes(self) -> int:
        """The peak of the recorded timeline (tensors the ops returned; no kernel's scratch)."""
        return self.memory.peak_bytes

    def _time_columns(self, path: str, calls: list[CallRecord]) -> dict[str, Any]:
        return {**super()._time_columns(path, calls), "wall_s": sum(c.duration_s for c in calls)}


def measure(
    model: Any,
    input_size: Any = None,
    *,
    input_data: Any = None,
    dtypes: Any = None,
    mode: str = "inference",
    device: str = "cpu",
    max_bytes: int = DEFAULT_MAX_BYTES,
    **options: Any,
) -> Measured:
    """Run ``model`` for real under the recorder of ``mw.analyze``: an analysis of measured
    numbers, to set beside the prediction with ``mw.compare(predicted, measured)``.

    Parameters
    ----------
    model
        A real ``nn.Module`` (run as it is in inference, a copy of it in training), or what
        ``mw.analyze`` accepts (a class, factory, config...: built for real with
        ``mw.materialize``, freshly initialized).
    input_size, input_data, dtypes
        As for ``mw.analyze``; ``input_data``'s real tensors are used as they are (moved to
        ``device``), ``input_size`` makes random floats and zero integers (valid token ids).
    mode
        ``"inference"`` or ``"training"`` (forward, loss, backward, optimizer step).
    device
        ``"cpu"``, or ``"cuda"`` when this PyTorch sees a CUDA device.
    max_bytes
        Refuse when the meta analysis predicts a larger peak (default 4 GiB).
    **options
        Other options of ``mw.analyze`` (``optimizer``, ``loss``, ``autocast``...).

    Returns
    -------
    Measured
        An ``Analysis`` whose numbers were measured (see the module docstring of
        ``meta_widget.explore.measure``): ``peak_bytes`` the allocator's, ``wall_s`` per module.

    Raises
    ------
    MeasureError
        ``device`` is not available, or the predicted peak passes ``max_bytes``, or the real
        run raised.

    Notes
    -----
    The global random number generators (the CPU's, and CUDA's when ``device="cuda"``) are
    left as they were, whether the run succeeds or raises: random inputs, a fresh build's
    initialization and dropout draw from a fork of them.
    """
    _check_device(device, max_bytes)
    cuda = list(range(torch.cuda.device_count())) if device == "cuda" else []
    with torch.random.fork_rng(devices=cuda):  # the user's random streams are left as they were
        return _measure(model, input_size, input_data, dtypes, mode, device, max_bytes, options)


def _measure(
    model: Any,
    input_size: Any,
    input_data: Any,
    dtypes: Any,
    mode: str,
    device: str,
    max_bytes: int,
    options: dict[str, Any],
) -> Measured:
    """``measure`` past its checks, inside a fork of the random number generators."""
    predicted = analyze(
        model, input_size, input_data=input_data, dtypes=dtypes, mode=mode, device=device,
        **options,
    )  # fmt: skip
    if predicted.peak_bytes > max_bytes:
        raise MeasureError(
            f"measure: {predicted.title} is predicted to peak at "
            f"{format_bytes(predicted.peak_bytes)}, over max_bytes={format_bytes(max_bytes)}: "
            "nothing was run. Pass a larger max_bytes= to run it anyway, or smaller inputs."
        )
    if not predicted.traced:
        raise MeasureError("measure needs inputs: pass input_size= or input_data=.")
    module = _real_module(model, predicted, device)
    args, kwargs = _real_inputs(input_data, predicted, device)
    walls = _wall_times(module, args, kwargs, predicted.options.training)
    return _measured_run(module, args, kwargs, predicted, device, walls)


def _check_device(device: object, max_bytes: object) -> None:
    if device not in _DEVICES:
        raise OptionError(f"measure: device must be one of {_DEVICES}, not {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise MeasureError(
            "measure: device='cuda' but this PyTorch sees no CUDA device; use device='cpu'."
        )
    if not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes <= 0:
        raise OptionError(f"measure: max_bytes must be a positive int of bytes, not {max_bytes!r}")


def _is_real(model: Any) -> bool:
    if not isinstance(model, torch.nn.Module):
        return False
    return not any(t.is_meta for t in (*model.parameters(), *model.buffers()))


def _real_module(model: Any, predicted: Analysis, device: str) -> torch.nn.Module:
    """The module to run: the user's (a copy of it in training, or off its device), or a
    fresh real build of what ``analyze`` built on meta."""
    if _is_real(model):
        on_device = all(t.device.type == device for t in (*model.parameters(), *model.buffers()))
        if predicted.options.training or not on_device:
            return copy.deepcopy(model).to(device)
        return model
    source = predicted.source_model
    assert isinstance(source, MetaModel)
    module, _ = materialize(source, device)
    return module


def _real_value(t: torch.Tensor, device: str) -> torch.Tensor:
    """A real tensor for a meta one: random floats, zeros (valid ids and indices), ones for
    booleans (masks that keep everything)."""
    if not t.is_meta:
        return t.to(device)
    if t.is_floating_point():
        return torch.randn(t.shape, dtype=t.dtype, device=device)
    if t.dtype == torch.bool:
        return torch.ones(t.shape, dtype=t.dtype, device=device)
    return torch.zeros(t.shape, dtype=t.dtype, device=device)


def _real_inputs(
    input_data: Any, predicted: Analysis, device: str
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The positional and keyword arguments of the real run."""
    data = input_data if input_data is not None else predicted.options.input_data
    data = tree_map_only(torch.Tensor, lambda t: _real_value(t, device), data)
    if isinstance(data, dict):
        return (), data
    if isinstance(data, (tuple, list)):
        return tuple(data), {}
    return (data,), {}


def _wall_times(
    module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], training: bool
) -> list[tuple[int, float]]:
    """(id of the module, seconds) of each forward call, in start order, in a plain run (which
    also warms the kernels up: one-off allocations stay out of the measured run)."""
    starts: list[float] = []
    calls: list[tuple[int, float]] = []
    flags = [(m, m.training) for m in module.modules()]

    def pre(m: torch.nn.Module, _args: Any) -> None:
        starts.append(time.perf_counter())
        calls.append((id(m), 0.0))

    def post(m: torch.nn.Module, _args: Any, _out: Any) -> None:
        for i in range(len(calls) - 1, -1, -1):  # the latest unfinished call of ``m``
            if calls[i][0] == id(m) and calls[i][1] == 0.0:
                calls[i] = (id(m), time.perf_counter() - starts[i])
                break

    def run(undo: Undo) -> None:
        modules = list(module.modules())
        undo.add(lambda: remove_module_hooks(modules, lambda h: h is pre or h is post))
        for m in modules:
            m.register_forward_pre_hook(pre)
            m.register_forward_hook(post, always_call=True)
        undo.add(lambda: _restore_flags(flags))
        set_training(module, training)
        set_grad_enabled(False, undo)
        module(*args, **kwargs)

    try:
        undoing(run)
    except Exception as exc:  # the model's own error, said as measure's, with its cause kept
        raise MeasureError(
            f"measure: the real run of {type(module).__name__} failed: {exc}"
        ) from exc
    return calls


def _restore_flags(flags: list[tuple[torch.nn.Module, bool]]) -> None:
    for m, flag in flags:
        m.training = flag


def _measured_run(
    module: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    predicted: Analysis,
    device: str,
    walls: list[tuple[int, float]],
) -> Measured:
    """Trace the real run under the profiler and assemble its analysis."""
    start = time.perf_counter()
    options = replace(predicted.options, input_data=None, fast=False)
    spec = replace(options.trace_spec(), device="math")  # the real kernels run as they are
    tree = walk(module)
    inputs = [t for _, t in named_tensors((args, kwargs))]
    held = [*(p for _, p in tree.parameters), *(b for _, b in tree.buffers), *inputs]

    def attach(recorder: Recorder, _undo: Undo) -> None:
        recorder.storage.track_real(held)

    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)

    def profiled(undo: Undo) -> Trace:
        undo.add(_ProfilerState().restore)
        with prof:
            return trace(
                module, args, kwargs, spec, attach=attach, default_device=device, tree=tree
            )

    result = undoing(profiled)
    if result.exception is not None:
        raise MeasureError(
            f"measure: the real run of {type(module).__name__} failed: {result.exception}"
        ) from result.exception
    peak = (
        torch.cuda.max_memory_allocated()
        if device == "cuda"
        else _storage_bytes(held) + _profiled_peak(prof)
    )
    _set_wall_times(result.calls, tree.paths, walls)
    nodes = build_tree(module, tree)
    meta = MetaModel(module, f"measured on {device}", owned=False)
    fields = _assemble(meta, nodes, inputs, options, [], None, result)
    fields["notes"] = [*fields["notes"], _note(fields["memory"].peak_bytes, peak)]
    return Measured(
        **fields,
        source_model=predicted.source_model,
        seconds=time.perf_counter() - start,
        allocator_peak_bytes=peak,
        device=device,
    )


class _ProfilerState:
    """Whether the profiler is on (in C, and torch's Python flag for it), saved before
    ``measure`` starts one: an interrupt landing inside ``profile``'s ``__enter__`` leaves it on
    with no ``__exit__`` to come."""

    def __init__(self) -> None:
        self.on = self._on()
        self.flag = torch.autograd.profiler._is_profiler_enabled

    @staticmethod
    def _on() -> bool:
        return bool(torch._C._autograd._profiler_enabled())

    def restore(self) -> None:
        """Turn off a profiler started since. Idempotent."""
        if not self.on and self._on():
            torch._C._autograd._disable_profiler()
        torch.autograd.profiler._set_is_profiler_enabled(self.flag)


def _storage_bytes(tensors: Sequence[torch.Tensor]) -> int:
    """Bytes of the distinct storages of ``tensors`` (there before the run); a tensor subclass
    (a quantized weight) by the storages of its inner tensors."""
    held = [x for t in tensors for x in inner_tensors(t)]
    return sum(
        {x.untyped_storage().data_ptr(): x.untyped_storage().nbytes() for x in held}.values()
    )


def _profiled_peak(prof: profile) -> int:
    """The largest sum of the allocations and frees (in time order) the profiler recorded."""
    events: list[tuple[int, int]] = []
    pending = list(prof.profiler.kineto_results.experimental_event_tree())  # type: ignore[union-attr]
    while pending:
        node = pending.pop()
        if node.tag == _EventType.Allocation and node.extra_fields.device.type == "cpu":
            events.append((node.start_time_ns, node.extra_fields.alloc_size))
        pending.extend(node.children)
    live = peak = 0
    for _, size in sorted(events):
        live += size
        peak = max(peak, live)
    return peak


def _set_wall_times(
    calls: list[CallRecord], paths: dict[int, list[str]], walls: list[tuple[int, float]]
) -> None:
    """Each forward call's ``duration_s`` from the plain run, where its calls match the
    recorded ones one for one (same modules in the same order); else the recorder's stay."""
    forward = [c for c in calls if c.phase == "forward" and c.index >= 0]
    if len(forward) != len(walls):
        return
    for call, (module_id, _) in zip(forward, walls, strict=True):
        if call.path not in paths.get(module_id, [call.path]):
            return
    for call, (_, seconds) in zip(forward, walls, strict=True):
        call.duration_s = seconds


def _note(recorded: int, allocator: int) -> str:
    return (
        f"Measured: a real run. The peak is the allocator's ({format_bytes(allocator)}); the "
        f"timeline, made of the storages ops returned, peaks at {format_bytes(recorded)}."
    )
