"""Memory per module: the parameters, gradients and optimizer state each module owns.

**Owner rule.** A parameter belongs to the first module, in ``named_modules()`` order, that holds
it: the module under whose name ``named_parameters()`` lists it. GPT-2's tied ``lm_head.weight``
is ``transformer.wte.weight``, so it belongs to ``transformer.wte`` and ``lm_head`` owns nothing.
A parameter's gradient and optimizer state belong to its owner. Every byte is owned once, so
summed over all modules:

- parameter bytes give ``MemoryReport.param_bytes``;
- gradient bytes (the ``.grad`` storage of each trainable parameter after backward) give
  ``MemoryReport.gradient_bytes``;
- optimizer-state bytes (what ``step()`` keeps on the device: AdamW's two moments, SGD's
  momentum buffer) give ``MemoryReport.optimizer_state_bytes``; the step counters kept on the
  host are not per module (``MemoryReport.optimizer_host_bytes``).

**One rank's bytes.** Every column counts what one device holds, as the report's totals do: a
parameter's bytes are :func:`tensor_sizes`' (a DTensor's local shard, FSDP's padding included;
a quantized weight's inner tensors), its elements its local tensor's. On one device that is
what the module tree counts (``ModuleNode.param_bytes``); under FSDP or tensor parallelism the
tree counts the model (each parameter whole) and these columns the rank, beside the rank's
gradients and optimizer state.

A module's *subtree* sums (:meth:`ModuleMemory.subtree`) are what the memory chart draws: at any
depth the bars then add up to the totals, tied weights once. A subtree may reach parameters it
does not own (``lm_head``'s weight): ``reached_bytes`` counts them too, so the chart can say
beside a bar how much of it is counted at another owner (:meth:`ModuleMemory.tied`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..data.tree import held_bytes, reached_params
from ..trace.storage import local

if TYPE_CHECKING:
    from ..data.walk import ModuleWalk
    from ..trace.passes import Trace

__all__ = ["ModuleMemory", "module_memory", "tensor_sizes"]


@dataclass
class ModuleMemory:
    """Bytes each module owns on one device (see the module docstring); row ``i`` is the
    ``i``-th entry of ``named_modules()``, as ``Analysis.modules``."""

    param_bytes: list[int]
    #: how many of its parameters' elements are floating point (the dtype what-ifs scale them)
    float_params: list[int]
    gradient_bytes: list[int]
    optimizer_state_bytes: list[int]
    #: the bytes and floating-point elements of every parameter the row's *subtree* reaches,
    #: each once, owned there or not (as ``ModuleNode.param_bytes``, on one device); subtree
    #: sums already, so :meth:`subtree` keeps them as they are
    reached_bytes: list[int]
    reached_floats: list[int]

    def subtree(self, parents: Sequence[int]) -> ModuleMemory:
        """The same sums over each module's subtree; ``parents[i]`` is row ``i``'s parent (-1 at
        the root). Rows follow ``named_modules()``, so a parent comes before its children."""
        out = ModuleMemory(
            list(self.param_bytes),
            list(self.float_params),
            list(self.gradient_bytes),
            list(self.optimizer_state_bytes),
            self.reached_bytes,
            self.reached_floats,
        )
        columns = (out.param_bytes, out.float_params, out.gradient_bytes, out.optimizer_state_bytes)
        for i in range(len(parents) - 1, 0, -1):
            p = parents[i]
            if p >= 0:
                for col in columns:
                    col[p] += col[i]
        return out

    def tied(self) -> list[tuple[int, int, int]]:
        """Of subtree sums (:meth:`subtree`): each row whose subtree reaches parameters another
        module owns, with their bytes and floating-point elements: ``(row, bytes, elements)``."""
        return [
            (i, reached - owned, floats - owned_floats)
            for i, (reached, owned, floats, owned_floats) in enumerate(
                zip(
                    self.reached_bytes,
                    self.param_bytes,
                    self.reached_floats,
                    self.float_params,
                    strict=True,
                )
            )
            if reached != owned or floats != owned_floats
        ]


def tensor_sizes(tensors: Sequence[torch.Tensor]) -> list[tuple[torch.Tensor, int]]:
    """Each tensor object of ``tensors`` once, with the bytes one device holds of it: a
    DTensor's local shard's storage, a quantized weight's inner tensors, else ``numel *
    element_size``; in order."""
    seen: set[int] = set()
    out: list[tuple[torch.Tensor, int]] = []
    for t in tensors:
        if id(t) in seen:
            continue
        seen.add(id(t))
        held = local(t)
        if type(t).__name__ != "DTensor":
            n = held_bytes(t)  # a quantized weight: its inner tensors
        else:
            n = held.untyped_storage().nbytes() if held is not t else t.numel() * t.element_size()
        out.append((t, n))
    return out


def module_memory(tree: ModuleWalk, trace: Trace | None = None) -> ModuleMemory:
    """What each module of ``tree`` owns on one device (see the module docstring) after the
    training step recorded in ``trace`` (None, or an inference trace: no gradients, no
    optimizer state).

    The gradients and optimizer state are the storages alive when the step ends, as
    ``MemoryReport.gradient_bytes`` and ``optimizer_state_bytes`` count them. A storage holding
    several parameters' gradients (FSDP2's reduce-scatter output, a view each) is split by
    their views' bytes, its padding credited with the last.
    """
    rows = {path: i for i, path in enumerate(tree.names)}
    n = len(rows)
    sizes = {id(t): b for t, b in tensor_sizes([p for _, p in tree.parameters])}

    def size(p: torch.Tensor) -> tuple[int, int]:  # elements and bytes, on this device
        return local(p).numel(), sizes[id(p)]

    reached, reached_floats = reached_params(tree, size)
    out = ModuleMemory([0] * n, [0] * n, [0] * n, [0] * n, reached, reached_floats)

    def owner(name: str) -> int:
        # a name no module path matches (a wrapper renamed it) goes to the root: nothing is lost
        return rows.get(name.rpartition(".")[0], 0)

    for name, p in tree.parameters:
        i = owner(name)
        elements, nbytes = size(p)
        out.param_bytes[i] += nbytes
        if p.is_floating_point():
            out.float_params[i] += elements
    if trace is None or not (trace.grad_keys or trace.state_keys):
        return out
    for a in trace.allocations:
        if a.freed >= 0:
            continue
        if a.key in trace.grad_keys:  # each parameter its view; the rest (padding) the last
            rest = a.nbytes
            for name, nbytes in trace.grad_keys[a.key]:
                share = min(nbytes, rest)
                out.gradient_bytes[owner(name)] += share
                rest -= share
            out.gradient_bytes[owner(name)] += rest
        if a.key in trace.state_keys:
            out.optimizer_state_bytes[owner(trace.state_keys[a.key])] += a.nbytes
    return out
