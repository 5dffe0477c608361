"""What one rank holds besides activations at full depth, from one trace of 3 layers (``plan``).

:func:`meta_widget.explore.depth.held_state_at` gives a rank's parameters, buffers, gradients
and optimizer state at full depth from the traces at 3 and 4 layers: each alike layer adds
what the fourth added. The trace at 3 layers holds that already: its middle layer is a layer
like any other (the same parameters, sharded alike, with the same gradients and optimizer
state), and what it owns on the rank is its row of ``MemoryReport.by_module`` (its subtree's
shards, the gradients' views of its FSDP group's storage with the padding, the optimizer
state) with its buffers. So

    held at L layers = held at 3 layers + (L - 3) x what the middle layer holds,

which is the two traces' number wherever both are traced (``plan`` checks it on every
candidate it traces at 4 layers too, and stops using it for the rest of the plan at the first
difference). A candidate whose number is over the budget cannot fit, and neither can the
others of its layout and precision: they are pruned after one trace instead of two.
"""

from __future__ import annotations

from ..analysis import Analysis
from .depth import DEPTHS, held_state

__all__ = ["held_from_three", "middle_layer"]


def middle_layer(a: Analysis) -> int | None:
    """The row (``a.modules``) of the middle one of the decoder's 3 layers: the one
    ``ModuleList`` whose 3 children are of one class (``depth_of`` found the decoder's layers
    so); None when no module or several are."""
    found = [
        n.children[1].index
        for n in a.modules
        if n.type == "ModuleList"
        and len(n.children) == DEPTHS[0]
        and [c.name for c in n.children] == [str(i) for i in range(DEPTHS[0])]
        and len({c.type for c in n.children}) == 1
    ]
    return found[0] if len(found) == 1 else None


def held_from_three(a: Analysis, layers: int) -> int | None:
    """:func:`~meta_widget.explore.depth.held_state` at ``layers`` layers from ``a``, the
    analysis at 3 (see the module docstring); None where ``a`` has no per-module memory whose
    rows are its modules', or no single middle layer."""
    by = a.memory.by_module
    middle = middle_layer(a)
    if by is None or middle is None or len(by.param_bytes) != len(a.modules):
        return None
    sums = by.subtree([n.parent for n in a.modules])
    layer = (
        sums.param_bytes[middle]
        + sums.gradient_bytes[middle]
        + sums.optimizer_state_bytes[middle]
        + a.modules[middle].buffer_bytes
    )
    return held_state(a) + (layers - DEPTHS[0]) * layer
