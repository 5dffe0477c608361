"""Attention is traced the same whatever else the step does: under activation checkpointing and
autocast, and in one rank of a parallel layout.

Truths: the aten attention ops a real CPU step runs (their names, the dtypes of their arguments
and the bytes they read and write, logged by a ``TorchDispatchMode`` under
``torch.autocast("cpu")`` with the decoder layers run by ``torch.utils.checkpoint``), and a
single-device trace of the same model and shapes for a parallel one.
"""

from __future__ import annotations

import functools
from collections import Counter
from typing import Any

import pytest
import torch
from models import llama_config, real
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import checkpoint

import meta_widget as mw
from meta_widget.trace.costs import PEAK_OF_DTYPE

#: the query head count of ``llama_config`` and the key/value head counts tried: multi-head
#: attention (as many key/value heads as query heads) and grouped-query attention
HEADS = 4
KV_HEADS = (4, 2)


def _tiny_llama(kv_heads: int) -> Any:
    config = llama_config()
    config.num_key_value_heads = kv_heads
    config._attn_implementation = "sdpa"
    return config


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _nbytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class _AttentionOps(TorchDispatchMode):
    """Logs each attention op a real run dispatches: ``(name, peak of its first argument's
    dtype, bytes of its tensor arguments and outputs)``, the three things a cost records."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, str, int]] = []

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        name = str(func.overloadpacket)
        if "scaled_dot_product" in name:
            inputs = _tensors(list(args) + list((kwargs or {}).values()))
            peak = PEAK_OF_DTYPE[inputs[0].dtype]
            self.seen.append((name, peak, _nbytes(inputs) + _nbytes(_tensors(out))))
        return out


@functools.cache
def _real_step(kv_heads: int) -> tuple[tuple[str, str, int], ...]:
    """The attention ops of a real CPU training step under ``torch.autocast("cpu", bfloat16)``
    with every decoder layer checkpointed (non-reentrant, as ``activation_checkpointing=True``
    runs them): forward, recomputation and backward."""
    model = real(_tiny_llama(kv_heads)).train()
    for layer in model.model.layers:
        forward = layer.forward

        def checkpointed(*args: Any, forward: Any = forward, **kwargs: Any) -> Any:
            return checkpoint(forward, *args, use_reentrant=False, **kwargs)

        layer.forward = checkpointed
    log = _AttentionOps()
    with log:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(_ids()).logits.sum()
        loss.backward()
    return tuple(log.seen)


def _ids() -> torch.Tensor:
    return torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(0))


def _attention_costs(a: Any) -> Counter[tuple[str, int]]:
    """``(peak, bytes)`` of every op with FLOPs in the attention modules' own bodies, forward
    and backward (the recomputation included): their projections are sub-modules, so these are
    the attention kernels."""
    found: Counter[tuple[str, int]] = Counter()
    for c in a.calls:
        if c.path.endswith("self_attn"):
            for costs in (c.costs, c.backward_costs):
                for (peak, flops, nbytes, _), n in costs.items():
                    if flops:
                        found[peak, nbytes] += n
    return found


def _attention_ops(a: Any) -> set[str]:
    """The attention ops the attention modules ran, forward and backward."""
    return {
        op
        for c in a.calls
        if c.path.endswith("self_attn")
        for ops in (c.ops, c.backward_ops)
        for op in ops
        if "scaled_dot_product" in op
    }


@pytest.mark.parametrize("kv_heads", KV_HEADS)
def test_checkpointed_attention_under_autocast_runs_in_the_real_steps_dtype(
    kv_heads: int,
) -> None:
    """Activation checkpointing and autocast together: every attention op (forward,
    recomputation, backward) has the dtype and the bytes of the real CPU step's. Before, the
    checkpointed forward routed attention above the autocast mode, so the kernel was picked on
    (and ran in) float32: multi-head attention was priced at the fp32 peak, twice its bytes."""
    real_ops = _real_step(kv_heads)
    a = mw.analyze(
        _tiny_llama(kv_heads), input_data=_ids(), mode="training", device="cpu",
        autocast=torch.bfloat16, activation_checkpointing=True,
    )  # fmt: skip
    assert a.error is None, a.error
    assert {peak for _, peak, _ in real_ops} == {"bf16"}
    assert _attention_costs(a) == Counter((peak, n) for _, peak, n in real_ops)
    assert _attention_ops(a) == {name for name, _, _ in real_ops}


@pytest.mark.parametrize("kv_heads", KV_HEADS)
@pytest.mark.parametrize("parallel", [None, {"fsdp": 2}])
def test_checkpointed_attention_under_autocast_on_cuda_runs_in_the_autocast_dtype(
    kv_heads: int, parallel: dict[str, int] | None
) -> None:
    """The same on CUDA's kernels, on one device and in one rank of FSDP2: autocast casts
    attention's arguments (it is in both devices' lower-precision lists), so every attention
    kernel runs in the dtype the real CPU step gives it."""
    (peak,) = {peak for _, peak, _ in _real_step(kv_heads)}
    a = mw.analyze(
        _tiny_llama(kv_heads), input_data=_ids(), mode="training", device="cuda",
        autocast=torch.bfloat16, activation_checkpointing=True,
        **({"parallel": parallel} if parallel else {}),
    )  # fmt: skip
    assert a.error is None, a.error
    costs = _attention_costs(a)
    assert sum(costs.values()) == 2 * 3  # forward, recomputation, backward; two layers
    assert {p for p, _ in costs} == {peak}
    assert all("flash" in op for op in _attention_ops(a)), _attention_ops(a)


def _attention_by_layer(a: Any) -> list[tuple[dict[str, int], list[int], list[int]]]:
    """Per attention module: its attention ops with their FLOPs (``FlopCounterMode``'s count),
    and the FLOPs its kernels execute forward and backward (a causal fused kernel skips half)."""
    return [
        (
            {op: n for op, n in {**c.ops, **c.backward_ops}.items() if "scaled_dot_product" in op},
            sorted(flops for _, flops, _, _ in c.costs if flops),
            sorted(flops for _, flops, _, _ in c.backward_costs if flops),
        )
        for c in a.calls
        if c.path.endswith("self_attn")
    ]


@pytest.mark.parametrize("autocast", [None, torch.bfloat16])
def test_a_parallel_rank_runs_the_attention_kernel_of_one_device(
    autocast: torch.dtype | None,
) -> None:
    """A rank of FSDP2 computes each layer's attention on the whole batch, as one device does
    (FSDP shards parameters, not activations): the same kernels, the same FLOPs per layer.
    Inputs as a tokenizer gives them, with an attention mask of ones. Before, transformers saw
    the rank's fake tensors as a compiler's (``is_tracing``), kept the mask, and the rank ran
    memory-efficient attention over every block where one device runs flash attention (bf16) or
    causal memory-efficient attention (fp32) over half of them."""
    config = _tiny_llama(HEADS)
    inputs = {"input_ids": _ids(), "attention_mask": torch.ones(2, 16, dtype=torch.long)}

    def analyze(**parallel: Any) -> Any:
        return mw.analyze(
            config, input_data=inputs, mode="training", device="cuda", gpu="H100",
            autocast=autocast, **parallel,
        )  # fmt: skip

    one, rank = analyze(), analyze(parallel={"fsdp": 2})
    assert one.error is None and rank.error is None, (one.error, rank.error)
    layers = _attention_by_layer(one)
    assert len(layers) == 2
    assert _attention_by_layer(rank) == layers
    # the kernel one device picks skips the causal half (its executed FLOPs, against the count)
    for ops, forward, _ in layers:
        assert forward == [sum(n for op, n in ops.items() if "backward" not in op) // 2]


def test_only_the_ranks_fake_tensors_look_real_and_only_while_it_runs() -> None:
    """transformers' ``is_tracing`` answers for the rank's fake tensors as for real ones while
    its trace runs; fake tensors of another mode (a compiler's) stay fake to it, and afterwards
    the library is as it was."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from transformers.utils import import_utils

    from meta_widget.distributed.stand_ins import SeenAsReal

    before = import_utils.is_fake_tensor
    rank, other = FakeTensorMode(), FakeTensorMode()
    with rank:
        mine = torch.empty(2)
    with other:
        theirs = torch.empty(2)
    with SeenAsReal(rank):
        assert not import_utils.is_tracing(mine)
        assert import_utils.is_tracing(theirs)
    assert import_utils.is_fake_tensor is before
    assert import_utils.is_tracing(mine)
