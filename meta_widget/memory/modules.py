"""Memory per module: the parameters, gradients and optimizer state each module owns.

**Owner rule.** A parameter belongs to the first module, in ``named_modules()`` order, that holds
it: the module under whose name ``named_parameters()`` lists it. GPT-2's tied ``lm_head.weight``
is ``transformer.wte.weight``, so it belongs to ``transformer.wte`` and ``lm_head`` owns nothing.
A parameter's gradient and optimizer state belong to its owner. Every byte is owned once, so
summed over all modules:

- parameter bytes (``numel × element_size``, as the tree counts them) give the model's parameter
  bytes;
- gradient bytes (the ``.grad`` storage of each trainable parameter after backward) give
  ``MemoryReport.gradient_bytes``;
- optimizer-state bytes (what ``step()`` keeps on the device: AdamW's two moments, SGD's
  momentum buffer) give ``MemoryReport.optimizer_state_bytes``; the step counters kept on the
  host are not per module (``MemoryReport.optimizer_host_bytes``).

A module's *subtree* sums (:meth:`ModuleMemory.subtree`) are what the memory chart draws: at any
depth the bars then add up to the totals, tied weights once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..data.walk import ModuleWalk
    from ..trace.passes import Trace

__all__ = ["ModuleMemory", "module_memory"]


@dataclass
class ModuleMemory:
    """Bytes each module owns (see the module docstring); row ``i`` is the ``i``-th entry of
    ``named_modules()``, as ``Analysis.modules``."""

    param_bytes: list[int]
    #: how many of its parameters' elements are floating point (the dtype what-ifs scale them)
    float_params: list[int]
    gradient_bytes: list[int]
    optimizer_state_bytes: list[int]

    def subtree(self, parents: Sequence[int]) -> ModuleMemory:
        """The same sums over each module's subtree; ``parents[i]`` is row ``i``'s parent (-1 at
        the root). Rows follow ``named_modules()``, so a parent comes before its children."""
        out = ModuleMemory(
            list(self.param_bytes),
            list(self.float_params),
            list(self.gradient_bytes),
            list(self.optimizer_state_bytes),
        )
        columns = (out.param_bytes, out.float_params, out.gradient_bytes, out.optimizer_state_bytes)
        for i in range(len(parents) - 1, 0, -1):
            p = parents[i]
            if p >= 0:
                for col in columns:
                    col[p] += col[i]
        return out


def module_memory(tree: ModuleWalk, trace: Trace | None = None) -> ModuleMemory:
    """What each module of ``tree`` owns (see the module docstring) after the training step
    recorded in ``trace`` (None, or an inference trace: no gradients, no optimizer state).

    The gradients and optimizer state are the storages alive when the step ends, as
    ``MemoryReport.gradient_bytes`` and ``optimizer_state_bytes`` count them.
    """
    rows = {path: i for i, path in enumerate(tree.names)}
    n = len(rows)
    out = ModuleMemory([0] * n, [0] * n, [0] * n, [0] * n)

    def owner(name: str) -> int:
        # a name no module path matches (a wrapper renamed it) goes to the root: nothing is lost
        return rows.get(name.rpartition(".")[0], 0)

    for name, p in tree.parameters:
        i = owner(name)
        out.param_bytes[i] += p.numel() * p.element_size()
        if p.is_floating_point():
            out.float_params[i] += p.numel()
    if trace is None or not (trace.grad_keys or trace.state_keys):
        return out
    for a in trace.allocations:
        if a.freed >= 0:
            continue
        if a.key in trace.grad_keys:
            out.gradient_bytes[owner(trace.grad_keys[a.key])] += a.nbytes
        if a.key in trace.state_keys:
            out.optimizer_state_bytes[owner(trace.state_keys[a.key])] += a.nbytes
    return out
