"""What the warm-up does (``meta_widget.warm`` runs it): PyTorch's first meta forward and
backward, on a two-by-two layer, and the package modules an analysis and its widget load.

Not transformers' model modules: importing them imports what transformers integrates (torchao,
when installed), which logs warnings on stderr ("Failed to load …_C_mxfp8…so"); from a
background thread those land under whatever cell the user runs at that moment, one that may
have nothing to do with transformers. They are paid where the user's own code asks for them.

It touches nothing global: no module hooks, no dispatch mode, nothing the user's own code in
the main thread could see. Started by ``%load_ext meta_widget`` and by ``import meta_widget``
in a Jupyter kernel; ``META_WIDGET_WARMUP=0`` turns it off.
"""

from __future__ import annotations

import importlib
import os

from . import heavy, warm

__all__ = ["start", "start_in_kernel", "warm_up"]

#: the package modules the first analysis (and its widget, in a kernel) would load
MODULES = (".pipeline", ".analysis")
WIDGET_MODULES = (".views.widget",)


def warm_up() -> None:
    """The warm-up itself: a meta forward and backward, then the analysis's modules."""
    torch = heavy.torch()
    layer = torch.nn.Linear(2, 2, device="meta")
    x = torch.ones(1, 2, device="meta", requires_grad=True)
    layer(x).sum().backward()
    for name in (*MODULES, *(WIDGET_MODULES if warm.in_kernel() else ())):
        importlib.import_module(name, "meta_widget")


def enabled() -> bool:
    return os.environ.get("META_WIDGET_WARMUP", "1") not in ("0", "", "false", "no")


def start() -> bool:
    """Start the warm-up (once per process); False when off or already started."""
    return enabled() and warm.start(warm_up)


def start_in_kernel() -> bool:
    """``import meta_widget``: start the warm-up when this is a Jupyter kernel."""
    return warm.in_kernel() and start()
