"""``checkpoint_policy=`` checked: which ops selective activation checkpointing saves.

Selective (op-level) activation checkpointing runs a module's forward under
``torch.utils.checkpoint.checkpoint(..., use_reentrant=False, context_fn=...)`` with PyTorch's
``create_selective_checkpoint_contexts(policy)``: the output of each op the policy saves is kept
from the forward pass, every other op is run again in backward. A policy is given as

- ``None`` with ``activation_checkpointing="selective"``: torchtitan's op-level default
  (``torchtitan/models/llama3/infra/parallelize.py``, ``_op_sac_save_list``): matrix products
  (``aten.mm``), the attention kernels, ``reduce_scatter_tensor``, ``all_to_all_single``,
  ``aten.max`` and ``flex_attention`` are saved, except every second ``aten.mm`` of a
  checkpointed forward, which is recomputed;
- a collection of op names (``{"aten.mm", "aten._scaled_dot_product_flash_attention"}``; a
  name without its namespace is an ``aten`` op, one without an overload means every overload)
  or op objects (``torch.ops.aten.mm.default``): these are saved, every other op recomputed, as
  ``create_selective_checkpoint_contexts`` does with a list of ops;
- a function ``policy(ctx, op, *args, **kwargs)`` returning a
  ``torch.utils.checkpoint.CheckpointPolicy`` (or a ``bool``: save), as PyTorch takes it; it is
  called for each op of every checkpointed forward, in order.

Each is checked before anything is built: unknown op names, a function that cannot take
``(ctx, op, *args)``, or anything else raise an :class:`OptionError`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .errors import OptionError, OptionTypeError, show

__all__ = [
    "SELECTIVE",
    "TORCHTITAN_SAVE_LIST",
    "SavePolicy",
    "check_checkpoint_policy",
    "op_name",
    "save_policy",
]

#: ``activation_checkpointing="selective"``: the modules ``True`` picks, op-level checkpointed
SELECTIVE = "selective"
#: torchtitan's op-level save list (``_op_sac_save_list``), by name; those a PyTorch lacks are
#: left out
TORCHTITAN_SAVE_LIST = (
    "aten.mm.default",
    "aten._scaled_dot_product_efficient_attention.default",
    "aten._scaled_dot_product_flash_attention.default",
    "aten._scaled_dot_product_cudnn_attention.default",
    "aten._scaled_dot_product_attention_math.default",
    "aten._scaled_dot_product_fused_attention_overrideable.default",
    "_c10d_functional.reduce_scatter_tensor.default",
    "_c10d_functional.all_to_all_single.default",
    "aten.max.default",
    "flex_attention",
)
_EXAMPLE = (
    'e.g. checkpoint_policy={"aten.mm", "aten._scaled_dot_product_flash_attention"} (ops to '
    "save), or a function (ctx, op, *args, **kwargs) -> torch.utils.checkpoint.CheckpointPolicy"
)


@dataclass(frozen=True)
class SavePolicy:
    """What selective activation checkpointing saves (``checkpoint_policy=`` checked).

    ``ops``: the ops whose outputs are saved (``OpOverload`` objects, and higher-order ops);
    ``packets``: ops saved in every overload (``OpOverloadPacket``); ``every_other_mm``:
    torchtitan's rule, every second ``aten.mm.default`` of a checkpointed forward recomputed;
    ``function``: a policy of the user's (then ``ops`` and ``packets`` are empty).
    """

    ops: frozenset[Any] = frozenset()
    packets: frozenset[Any] = frozenset()
    every_other_mm: bool = False
    function: Callable[..., Any] | None = None
    #: how the badge and the notes name it
    label: str = "selective"

    def saves(self, op: Any) -> bool:
        """Whether ``op`` is one of the ops saved (without the every-other-``mm`` rule)."""
        return op in self.ops or getattr(op, "overloadpacket", None) in self.packets

    @classmethod
    def torchtitan(cls) -> SavePolicy:
        """torchtitan's op-level default (:data:`TORCHTITAN_SAVE_LIST`, every other mm)."""
        ops = frozenset(op for op in map(_lookup, TORCHTITAN_SAVE_LIST) if op is not None)
        return cls(ops, every_other_mm=True, label="torchtitan's op list")


def check_checkpoint_policy(
    policy: Any, selection: bool | str | Sequence[str], notes: list[str]
) -> SavePolicy | None:
    """``checkpoint_policy``: None, or the :class:`SavePolicy` it gives (``selection``: the
    ``activation_checkpointing`` checked). A policy given where nothing is checkpointed is
    noted as not used."""
    if policy is None:
        return None
    checked = policy if isinstance(policy, SavePolicy) else _checked(policy)
    if not selection:
        notes.append(
            "checkpoint_policy was not used: no module is checkpointed (give "
            "activation_checkpointing='selective', True or module names)."
        )
    return checked


def save_policy(
    policy: SavePolicy | None, selection: bool | str | Sequence[str]
) -> SavePolicy | None:
    """What the checkpointed modules save: the policy given (it makes them selective),
    torchtitan's for ``"selective"`` without one, or None (full checkpointing)."""
    if not selection:
        return None
    if policy is None and selection == SELECTIVE:
        return SavePolicy.torchtitan()
    return policy


def _checked(policy: Any) -> SavePolicy:
    if isinstance(policy, (str, torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        policy = [policy]
    elif callable(policy) and not isinstance(policy, torch._ops.HigherOrderOperator):
        _check_signature(policy)
        name = getattr(policy, "__name__", type(policy).__name__)
        return SavePolicy(function=policy, label=f"policy {name}")
    if not isinstance(policy, Collection) or isinstance(policy, (bytes, dict)):
        raise OptionTypeError(
            f"checkpoint_policy={show(policy)} must be op names or ops to save, or a policy "
            f"function: {_EXAMPLE}."
        )
    ops: set[Any] = set()
    packets: set[Any] = set()
    for item in policy:
        op = _lookup(item) if isinstance(item, str) else item
        if isinstance(op, torch._ops.OpOverloadPacket):
            packets.add(op)
        elif isinstance(op, (torch._ops.OpOverload, torch._ops.HigherOrderOperator)):
            ops.add(op)
        elif isinstance(item, str):
            raise OptionError(
                f"checkpoint_policy names {item!r}, which is no op of this PyTorch: give ops "
                f"as 'namespace.op' or 'namespace.op.overload' ('aten.mm', 'aten.mm.default'), "
                f"{_EXAMPLE}."
            )
        else:
            raise OptionTypeError(
                f"checkpoint_policy holds {show(item)}, which is neither an op name nor an op: "
                f"{_EXAMPLE}."
            )
    if not ops and not packets:
        raise OptionError(
            "checkpoint_policy is empty: nothing would be saved, which is full checkpointing "
            "(activation_checkpointing=True says so); name the ops to save, " + _EXAMPLE + "."
        )
    label = ", ".join(sorted(op_name(o) for o in (*ops, *packets)))
    return SavePolicy(frozenset(ops), frozenset(packets), label=f"saving {label}")


def _check_signature(policy: Callable[..., Any]) -> None:
    """A policy is called as ``policy(ctx, op, *args, **kwargs)``: refuse one that cannot be."""
    try:
        signature = inspect.signature(policy)
    except (TypeError, ValueError):  # a builtin without a signature: taken as it is
        return
    try:
        signature.bind(None, None, None, None)
    except TypeError:
        raise OptionTypeError(
            f"checkpoint_policy={show(policy)} must take (ctx, op, *args, **kwargs), as "
            "torch.utils.checkpoint.create_selective_checkpoint_contexts calls it, and return "
            "a CheckpointPolicy; its signature is "
            f"{signature}."
        ) from None


def _lookup(name: str) -> Any:
    """The op ``name`` names (``"aten.mm"``, ``"aten.mm.default"``, ``"mm"``, or a
    higher-order op like ``"flex_attention"``), or None."""
    parts = name.strip().split(".")
    if len(parts) == 1:
        hop = getattr(torch._higher_order_ops, parts[0], None)
        if isinstance(hop, torch._ops.HigherOrderOperator):
            return hop
        parts = ["aten", *parts]
    if len(parts) not in (2, 3) or not all(p.isidentifier() for p in parts):
        return None
    try:
        namespace = getattr(torch.ops, parts[0])
        packet = getattr(namespace, parts[1])
        return getattr(packet, parts[2]) if len(parts) == 3 else packet
    except (AttributeError, RuntimeError):
        return None


def op_name(op: Any) -> str:
    """``aten.mm.default``, ``aten.mm`` (every overload), or a higher-order op's name."""
    if isinstance(op, torch._ops.OpOverload):
        namespace, rest = op.name().split("::", 1)
        name, _, overload = rest.partition(".")
        return f"{namespace}.{name}.{overload or 'default'}"
    if isinstance(op, torch._ops.OpOverloadPacket):
        return str(op._qualified_op_name).replace("::", ".")
    return str(getattr(op, "name", lambda: op)())
