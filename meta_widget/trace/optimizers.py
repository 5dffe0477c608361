"""The optimizers a training step runs, built as a training script builds them.

``torch.optim.AdamW(params)`` picks its implementation from the parameters' device: on CUDA the
multi-tensor one (``foreach``), for plain tensors and FSDP2's DTensors alike; on the CPU one
parameter at a time. The two hold different memory during the step: the loop a temporary or two
of one parameter's size, the multi-tensor step whole lists at once (Adam's square roots of every
``exp_avg_sq`` of a dtype: one more copy of the second moment, 17 GB a rank for a 70B under
FSDP-8 with bf16 parameters). So the trace runs the implementation PyTorch picks on the device
analyzed (``FOREACH``), or the one ``analyze(foreach=...)`` names. ``fused=True`` holds no
temporaries (at most what the loop holds) and is not traced.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..choices import Optimizer

__all__ = ["FOREACH", "OPTIMIZERS", "foreach_for"]

#: the optimizers, built as a training script builds them; ``foreach``: True for PyTorch's
#: multi-tensor implementation, False for one parameter at a time, None for PyTorch's own choice
OPTIMIZERS: dict[str, Callable[[list[torch.nn.Parameter], bool | None], torch.optim.Optimizer]] = {
    Optimizer.ADAMW: lambda ps, foreach: torch.optim.AdamW(ps, foreach=foreach),
    Optimizer.ADAM: lambda ps, foreach: torch.optim.Adam(ps, foreach=foreach),
    Optimizer.SGD: lambda ps, foreach: torch.optim.SGD(ps, lr=0.01, foreach=foreach),
    Optimizer.SGD_MOMENTUM: lambda ps, foreach: torch.optim.SGD(
        ps, lr=0.01, momentum=0.9, foreach=foreach
    ),
}
#: the optimizer's implementation on each device an analysis is for: PyTorch's default there
#: (multi-tensor for parameters on CUDA, plain tensors and FSDP2's DTensors alike; one parameter
#: at a time on the CPU). ``"math"`` (a real run of ``measure``) leaves it to PyTorch, which
#: sees the real parameters' device
FOREACH: dict[str, bool | None] = {"cuda": True, "cpu": False}


def foreach_for(device: str, given: bool | None) -> bool | None:
    """The ``foreach=`` a trace for ``device`` builds its optimizer with: ``given``, else
    PyTorch's default there."""
    return FOREACH.get(device) if given is None else given
