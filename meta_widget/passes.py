"""What one analysis runs on meta: a forward pass, or a whole training step, under a Recorder.

Inference: ``eval()``, ``torch.no_grad()``, one forward pass. Training: ``train()``, a forward pass,
the loss (``loss(output)``, or the sum of every floating output), ``backward()``, and one
optimizer step, each recorded as a phase of the live-bytes timeline (``forward``, ``backward``,
``optimizer``). Everything is undone afterwards: hooks, modes and ``training`` flags.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .assume import Assumption, Policy
from .flatten import named_tensors
from .kernels import AttentionKernels
from .recorder import Allocation, CallRecord, Event, Listener, Recorder

OPTIMIZERS: dict[str, Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer]] = {
    "adamw": lambda ps: torch.optim.AdamW(ps, foreach=False),
    "adam": lambda ps: torch.optim.Adam(ps, foreach=False),
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.01, foreach=False),
    "sgd-momentum": lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9, foreach=False),
}

PHASES = ("forward", "backward", "optimizer")


@dataclass
class Trace:
    """What one recorded pass produced (records, events and allocations; no tensors)."""

    calls: list[CallRecord]
    events: list[Event]
    allocations: list[Allocation]
    orphan_flops: int
    orphan_ops: dict[str, int]
    exception: BaseException | None
    failed_op: str | None
    error_call: int | None
    seconds: float
    assumptions: list[Assumption] = field(default_factory=list)
    #: event index where each phase begins
    phase_starts: dict[str, int] = field(default_factory=dict)
    #: storage keys of the gradients and optimizer state alive at the end of a training step
    grad_keys: set[int] = field(default_factory=set)
    state_keys: set[int] = field(default_factory=set)
    #: optimizer state kept off the meta device (e.g. AdamW's step counters, on the CPU)
    state_other_bytes: int = 0


def default_loss(output: Any) -> torch.Tensor:
    """The sum of every floating-point output that requires grad (KV caches left out)."""
    terms = [
        t.sum()
        for _, t in named_tensors(output, caches=False)
        if t.is_floating_point() and t.requires_grad
    ]
    if not terms:
        raise ValueError(
            "mode='training' needs an output that requires grad to back-propagate from; the "
            "model returned none. Pass loss=lambda output: ... to say what to differentiate."
        )
    total = terms[0]
    for t in terms[1:]:
        total = total + t
    return total


def trace(
    module: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    training: bool = False,
    optimizer: str | None = "adamw",
    loss: Callable[[Any], torch.Tensor] | None = None,
    listeners: Sequence[Listener] = (),
    policy: Policy | None = None,
    device: str = "cuda",
    checkpointed: Sequence[torch.nn.Module] = (),
    on_phase: Callable[[str], None] | None = None,
) -> Trace:
    """Run the pass once under a :class:`Recorder` and return what it saw.

    An exception raised by the model is caught and returned in ``Trace.exception`` with the
    records made before it. ``device`` picks the attention kernel (``meta_widget.kernels``);
    the forward of each module in ``checkpointed`` runs under activation checkpointing
    (``torch.utils.checkpoint``, non-reentrant): its activations are recomputed in backward.
    ``on_phase(name)`` is told when a training step enters ``backward`` and ``optimizer``.
    """
    # PyTorch imports torch._dynamo the first time some of its functions run. Were that first
    # time mid-trace, the import would keep the frames then running alive (an exception stored
    # during it holds their traceback), and with them the tensors of the model's calls: the
    # first analysis of a process would show activations that are never freed.
    import torch._dynamo

    if training and optimizer is not None and optimizer not in OPTIMIZERS:
        raise ValueError(
            f"optimizer must be one of {sorted(OPTIMIZERS)} or None, not {optimizer!r}"
        )
    flags = [(m, m.training) for m in module.modules()]
    recorder = Recorder(
        module,
        listeners,
        [t for _, t in named_tensors((args, kwargs))],
        policy=policy,
        tag_grad_nodes=training,
    )
    phase_starts = {"forward": 0}
    grad_keys: set[int] = set()
    state_keys: set[int] = set()
    state_other = 0
    exception: BaseException | None = None
    output = opt = None  # both outlive the recorder: the timeline ends as a training loop would
    start = time.perf_counter()
    params = [p for p in module.parameters() if p.requires_grad]
    grads = [p.grad for p in params]  # restored afterwards: a user's meta module is left as it was
    patched = [_checkpoint_forward(m, device) for m in checkpointed] if training else []
    # The cyclic garbage collector is paused while tracing: it would scan the growing records
    # again and again (a third of the time on a 20,000-module model). Reference counting still
    # frees storages the moment they die, so the memory timeline is unchanged.
    collecting = gc.isenabled()
    gc.disable()
    try:
        module.train(training)
        kernels = AttentionKernels(device) if device != "math" else contextlib.nullcontext()
        with torch.set_grad_enabled(training), recorder, kernels:
            if not training:
                output = module(*args, **kwargs)  # kept alive: the timeline ends with outputs
            else:
                with torch.autograd.graph.saved_tensors_hooks(_pack(recorder), _unpack):
                    output = module(*args, **kwargs)
                    value = (loss or default_loss)(output)
                recorder.phase = "backward"
                phase_starts["backward"] = len(recorder.events)
                if on_phase is not None:
                    on_phase("backward")
                value.backward()
                del value
                recorder.sum_backward()
                grad_keys = {p.grad.untyped_storage()._cdata for p in params if p.grad is not None}
                if optimizer is not None:
                    recorder.phase = "optimizer"
                    phase_starts["optimizer"] = len(recorder.events)
                    if on_phase is not None:
                        on_phase("optimizer")
                    opt = OPTIMIZERS[optimizer](params)
                    opt.step()
                    for state in opt.state.values():
                        for v in state.values():
                            if isinstance(v, torch.Tensor):
                                if v.is_meta:
                                    state_keys.add(v.untyped_storage()._cdata)
                                else:
                                    state_other += v.numel() * v.element_size()
    except Exception as exc:
        exception = exc
    finally:
        for m, flag in flags:
            m.training = flag
        if collecting:
            gc.enable()
        for m in patched:
            del m.forward  # back to the class's forward
        for p, g in zip(params, grads, strict=True):
            p.grad = g
    del output, opt
    if exception is not None and recorder.error_call is None and recorder.calls:
        recorder.error_call = _deepest_unfinished(recorder.calls)
    return Trace(
        calls=recorder.calls,
        events=recorder.events,
        allocations=recorder.allocations,
        orphan_flops=recorder.orphan_flops,
        orphan_ops=recorder.orphan_ops,
        exception=exception,
        failed_op=recorder.failed_op,
        error_call=recorder.error_call,
        seconds=time.perf_counter() - start,
        assumptions=list(recorder.assumptions.values()),
        phase_starts=phase_starts,
        grad_keys=grad_keys,
        state_keys=state_keys,
        state_other_bytes=state_other,
    )


def _checkpoint_forward(m: torch.nn.Module, device: str) -> torch.nn.Module:
    """Make ``m``'s forward run under activation checkpointing (an instance attribute).

    The recomputation runs inside the autograd engine, where the attention mode of the trace is
    not active: it is entered again around the forward, so both runs use the same kernels.
    """
    from torch.utils.checkpoint import checkpoint

    forward = m.forward

    def run(*args: Any, **kwargs: Any) -> Any:
        with AttentionKernels(device):
            return forward(*args, **kwargs)

    def checkpointed(*args: Any, **kwargs: Any) -> Any:
        return checkpoint(run, *args, use_reentrant=False, **kwargs)

    m.forward = checkpointed  # type: ignore[method-assign]
    return m


def _pack(recorder: Recorder) -> Callable[[torch.Tensor], torch.Tensor]:
    def pack(t: torch.Tensor) -> torch.Tensor:
        recorder.mark_saved(t)
        return t

    return pack


def _unpack(t: torch.Tensor) -> torch.Tensor:
    return t


def _deepest_unfinished(calls: list[CallRecord]) -> int | None:
    failed = [c for c in calls if c.error]
    return max(failed, key=lambda c: c.depth).index if failed else None
