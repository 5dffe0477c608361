"""Selective (op-level) activation checkpointing against real CPU steps.

Truth: the same model run for real on the CPU with its blocks wrapped by hand in
``torch.utils.checkpoint.checkpoint(..., use_reentrant=False, context_fn=...)`` and PyTorch's
``create_selective_checkpoint_contexts`` under the same policy, written out here from
torchtitan's ``_op_sac_save_list`` and its every-other-``mm`` rule (not meta_widget's code); its
peak as the CPU allocator sees it (``torch.profiler``'s memory events, :func:`window_peak`:
MemTracker misses tensors under ``torch.utils.checkpoint``), its FLOPs by ``FlopCounterMode``.

The step is the one ``analyze(mode="training", optimizer=None)`` traces: forward, the sum of the
output, backward, the output kept to the end. ``steps`` runs it more than once in one process
(gradients freed between steps, as ``zero_grad()`` does by default) for a steady-state
comparison; the tests here compare one step.

Measured with PyTorch 2.13 (CPU): the analysis is below the real step by 5,056 bytes per
checkpointed block, the CPU generator's state that ``torch.utils.checkpoint`` saves
(``preserve_rng_state=True``) and a meta trace does not hold; well inside the 2 % bound.
"""

from __future__ import annotations

import copy
import gc
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)
from torch.utils.flop_counter import FlopCounterMode
from truth import window_peak

import meta_widget as mw

TOLERANCE = 0.02
aten = torch.ops.aten

#: torchtitan's save list (``torchtitan/models/llama3/infra/parallelize.py``), written out
TITAN_SAVE = {
    aten.mm.default,
    aten._scaled_dot_product_efficient_attention.default,
    aten._scaled_dot_product_flash_attention.default,
    aten._scaled_dot_product_cudnn_attention.default,
    aten._scaled_dot_product_attention_math.default,
    aten._scaled_dot_product_fused_attention_overrideable.default,
    torch.ops._c10d_functional.reduce_scatter_tensor.default,
    torch.ops._c10d_functional.all_to_all_single.default,
    aten.max.default,
}


def titan_context() -> Any:
    """torchtitan's ``selective_checkpointing_context_fn``: a fresh mm count per region."""
    meta: dict[str, int] = defaultdict(int)

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        if func == aten.mm.default:
            meta["mm"] += 1
        save = func in TITAN_SAVE and not (func == aten.mm.default and meta["mm"] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def ops_context(ops: list[Any]) -> Callable[[], Any]:
    """PyTorch's own list form: these ops saved, every other recomputed."""
    return lambda: create_selective_checkpoint_contexts(ops)


def wrap_blocks(model: nn.Module, context_fn: Callable[[], Any] | None) -> nn.Module:
    """Each child of the model's ModuleLists run under non-reentrant checkpointing (``None``:
    full checkpointing), as ``activation_checkpointing=True`` / ``"selective"`` pick them."""
    for m in list(model.modules()):
        if isinstance(m, nn.ModuleList):
            for block in m:
                forward = block.forward
                extra = {} if context_fn is None else {"context_fn": context_fn}

                def run(*args: Any, forward: Any = forward, extra: Any = extra, **kw: Any) -> Any:
                    return checkpoint(forward, *args, use_reentrant=False, **extra, **kw)

                block.forward = run  # type: ignore[method-assign]
    return model


def _loss(out: Any) -> torch.Tensor:
    return out.sum() if isinstance(out, torch.Tensor) else out.logits.sum()


def _profiled() -> profile:
    gc.collect()  # earlier garbage freed now, not inside the window
    return profile(activities=[ProfilerActivity.CPU], profile_memory=True)


def allocator_step_peak(
    model: nn.Module, x: torch.Tensor, context_fn: Callable[[], Any] | None, *, steps: int = 1
) -> int:
    """The CPU allocator's peak of ``steps`` real training steps (no optimizer) of a copy of
    ``model`` with its blocks checkpointed (``context_fn``: selective; None: full): the
    parameters, buffers and input held before, plus the highest running sum of every
    allocation and free ``torch.profiler`` records."""
    model = copy.deepcopy(model).train()
    held = [*model.parameters(), *model.buffers(), x]
    before = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in held}
    wrap_blocks(model, context_fn)
    with _profiled() as prof:
        for _ in range(steps):
            for p in model.parameters():
                p.grad = None  # zero_grad(set_to_none=True), PyTorch's default
            out = model(x)
            loss = _loss(out)
            loss.backward()
            del loss, out
    return sum(before.values()) + window_peak(prof)


def plain_step_peak(model: nn.Module, x: torch.Tensor) -> int:
    """The same step without checkpointing (the allocator's peak)."""
    model = copy.deepcopy(model).train()
    held = [*model.parameters(), *model.buffers(), x]
    before = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in held}
    with _profiled() as prof:
        out = model(x)
        _loss(out).backward()
        del out
    return sum(before.values()) + window_peak(prof)


# ---------------------------------------------------------------------------------------------
# models


class Block(nn.Module):
    """A pre-norm block without biases (its projections are ``aten.mm``, as a Llama's):
    fused qkv, causal ``scaled_dot_product_attention``, a GELU MLP."""

    def __init__(self, d: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d, bias=False), nn.Linear(4 * d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        qkv = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Blocks(nn.Module):
    """Three blocks in a ModuleList, then a head."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList(Block() for _ in range(3))
        self.head = nn.Linear(64, 16, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)  # type: ignore[no-any-return]


def tiny_llama() -> nn.Module:
    import transformers

    config = transformers.LlamaConfig(
        hidden_size=128,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        vocab_size=256,
        max_position_embeddings=256,
        use_cache=False,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


CASES: dict[str, Callable[[], tuple[nn.Module, torch.Tensor]]] = {
    "blocks": lambda: (Blocks(), torch.randn(4, 128, 64)),
    "llama": lambda: (tiny_llama(), torch.randint(0, 256, (2, 128))),
}


def analyzed(model: nn.Module, x: torch.Tensor, device: str = "cpu", **options: Any) -> Any:
    a = mw.analyze(model, input_data=x, mode="training", optimizer=None, device=device, **options)
    assert a.error is None, a.error
    return a


# ---------------------------------------------------------------------------------------------
# peaks


@pytest.mark.parametrize("name", sorted(CASES))
def test_selective_peak_is_a_real_selective_steps_peak(name: str) -> None:
    model, x = CASES[name]()
    sac = analyzed(model, x, activation_checkpointing="selective")
    truth = allocator_step_peak(model, x, titan_context)
    assert sac.peak_bytes == pytest.approx(truth, rel=TOLERANCE)
    # between no checkpointing and full checkpointing, as the real steps are
    full = analyzed(model, x, activation_checkpointing=True)
    plain = analyzed(model, x)
    assert full.peak_bytes == pytest.approx(allocator_step_peak(model, x, None), rel=TOLERANCE)
    assert plain.peak_bytes == pytest.approx(plain_step_peak(model, x), rel=TOLERANCE)
    assert full.peak_bytes < sac.peak_bytes < plain.peak_bytes
    # recomputation: some, less than full checkpointing's
    assert plain.total_flops < sac.total_flops < full.total_flops
    assert any("torchtitan's op list" in n and "aten.mm.default" in n for n in sac.notes)


def test_an_op_list_policy_is_pytorchs_list_form() -> None:
    """``checkpoint_policy`` as op names: those saved, every other op recomputed, equal to
    ``create_selective_checkpoint_contexts([ops])`` on a real step. Saving every matmul keeps
    more than torchtitan's every-other-mm rule."""
    model, x = CASES["blocks"]()
    every_mm = analyzed(model, x, activation_checkpointing=True, checkpoint_policy={"aten.mm"})
    truth = allocator_step_peak(model, x, ops_context([aten.mm.default]))
    assert every_mm.peak_bytes == pytest.approx(truth, rel=TOLERANCE)
    titan = analyzed(model, x, activation_checkpointing="selective")
    assert every_mm.peak_bytes > titan.peak_bytes
    assert every_mm.total_flops < titan.total_flops

    # a function, as PyTorch takes it, deciding the same: the same trace
    def policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        return (
            CheckpointPolicy.MUST_SAVE
            if op == aten.mm.default
            else CheckpointPolicy.PREFER_RECOMPUTE
        )

    function = analyzed(model, x, activation_checkpointing=True, checkpoint_policy=policy)
    assert function.peak_bytes == every_mm.peak_bytes
    assert function.total_flops == every_mm.total_flops


def test_selective_recompute_flops_are_a_real_steps() -> None:
    """FLOPs of the step, recomputation included: FlopCounterMode below the real step's
    selective modes counts only the ops run again. It has no formula for the CPU flash
    attention kernel (torchtitan's list does not save it: it is recomputed), which is added by
    hand as in ``test_truth_training``: per block 2 matmuls forward, 2 again in the
    recomputation and 5 backward (FlashAttention, Algorithm 4)."""
    model, x = CASES["blocks"]()
    sac = analyzed(model, x, activation_checkpointing="selective")
    real = wrap_blocks(copy.deepcopy(model).train(), titan_context)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION), FlopCounterMode(display=False) as counter:
        real(x).sum().backward()
    b, t, d = x.shape
    heads = 4
    attention = 3 * (2 + 2 + 5) * 2 * b * heads * t * t * (d // heads)  # 3 blocks
    assert sac.total_flops == counter.get_total_flops() + attention
    # each block's backward holds its recomputation: less than under full checkpointing
    full = analyzed(model, x, activation_checkpointing=True)
    plain = analyzed(model, x)
    for i in range(3):
        path = f"layers.{i}"
        assert plain[path].backward_flops < sac[path].backward_flops < full[path].backward_flops


# ---------------------------------------------------------------------------------------------
# the option, checked up front


@pytest.mark.parametrize(
    ("policy", "error", "match"),
    [
        ({"aten.mmm"}, mw.OptionError, "no op of this PyTorch"),
        ([3], mw.OptionTypeError, "neither an op name nor an op"),
        (set(), mw.OptionError, "is empty"),
        (lambda ctx: None, mw.OptionTypeError, r"must take \(ctx, op"),
        (3.5, mw.OptionTypeError, "must be op names"),
    ],
)
def test_a_bad_policy_is_refused_before_anything_runs(policy: Any, error: Any, match: str) -> None:
    with pytest.raises(error, match=match):
        mw.analyze(
            Blocks, input_size=(1, 8, 64), mode="training", activation_checkpointing=True,
            checkpoint_policy=policy,
        )  # fmt: skip


def test_a_policy_without_checkpointing_is_noted_and_a_bad_answer_explained() -> None:
    a = mw.analyze(Blocks, input_size=(1, 8, 64), mode="training", checkpoint_policy={"mm"})
    assert any("checkpoint_policy was not used" in n for n in a.notes)
    bad = mw.analyze(
        Blocks, input_size=(1, 8, 64), mode="training", activation_checkpointing=True,
        checkpoint_policy=lambda ctx, op, *a, **k: "save",
    )  # fmt: skip
    assert bad.error is not None and "CheckpointPolicy" in bad.error.message


def test_the_badge_says_selective_and_a_rerun_goes_back_to_full() -> None:
    from meta_widget.views.protocol import encode_settings

    a = mw.analyze(Blocks, input_size=(1, 8, 64), mode="training",
                   activation_checkpointing="selective")  # fmt: skip
    badges = dict(encode_settings(a.options))
    assert "selective checkpointing" in badges
    b = a.rerun(activation_checkpointing=True)
    assert "checkpointing" in dict(encode_settings(b.options))
    assert b.options.save_policy is None and b.total_flops > a.total_flops


def test_a_layer_writing_a_kv_cache_is_explained() -> None:
    """A transformers Llama with ``use_cache=True`` writes its cache in the forward and again
    in the recomputation: PyTorch's selective mode refuses (a real run does too); the error
    says to turn the cache off, and with it off the step is traced."""
    model, x = CASES["llama"]()
    model.config.use_cache = True
    a = mw.analyze(model, input_data=x, mode="training", activation_checkpointing="selective")
    assert a.error is not None and "use_cache = False" in str(a.error)
    real = wrap_blocks(copy.deepcopy(model).train(), titan_context)
    with pytest.raises(RuntimeError, match="not found in storage"):
        real(x).logits.sum().backward()
    model.config.use_cache = False
    assert (
        mw.analyze(model, input_data=x, mode="training", activation_checkpointing="selective").error
        is None
    )


def test_a_kv_cache_under_checkpointing_is_traced_as_a_real_run_holds_it() -> None:
    """With ``use_cache=True`` and every block checkpointed, a transformers Llama writes each
    layer's keys and values into its cache in the forward and again in the recomputation, and
    the cache holds them to the end: what a layer more adds with the cache on, less what it adds
    with it off, is the same bytes in the trace as in a real run (MemTracker, the blocks under
    torch's checkpoint). The analysis says so in a note, which names the layer; with the cache
    off there is no note."""
    import transformers
    from torch.distributed._tools.mem_tracker import MemTracker

    def config(layers: int, cache: bool) -> Any:
        return transformers.LlamaConfig(
            vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=layers,
            num_attention_heads=4, num_key_value_heads=2, use_cache=cache,
            architectures=["LlamaForCausalLM"],
        )  # fmt: skip

    def real(layers: int, cache: bool) -> int:
        torch.manual_seed(0)
        model = wrap_blocks(transformers.LlamaForCausalLM(config(layers, cache)).train(), None)
        x = torch.randint(0, 512, (2, 256))
        tracker = MemTracker()
        tracker.track_external(model, x)
        with tracker:
            model(x).logits.sum().backward()
            return int(tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"])

    def traced(layers: int, cache: bool) -> mw.Analysis:
        return mw.analyze(
            config(layers, cache), (2, 256), mode="training", device="cpu",
            activation_checkpointing=True,
        )  # fmt: skip

    per_layer = {}
    for cache in (True, False):
        two, four = traced(2, cache), traced(4, cache)
        notes = [n for n in four.notes if "KV cache" in n]
        assert notes == ([] if not cache else [notes[0]])
        per_layer[cache] = (
            (four.peak_bytes - two.peak_bytes) // 2,
            (real(4, cache) - real(2, cache)) // 2,
        )
    assert per_layer[True][0] > per_layer[False][0]  # the cache holds more a layer
    assert per_layer[True][0] - per_layer[False][0] == per_layer[True][1] - per_layer[False][1]
    note = next(n for n in traced(2, True).notes if "KV cache" in n)
    assert note.startswith("LlamaDecoderLayer ") and "config.use_cache = False" in note


def test_the_note_counts_what_a_real_step_saves() -> None:
    """The note's count and bytes of saved outputs, per step, against the decisions of
    torchtitan's policy on a real step (a recording copy of it)."""
    model, x = CASES["blocks"]()
    saved: list[int] = []

    def recording() -> Any:
        meta: dict[str, int] = defaultdict(int)

        def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
            if func == aten.mm.default:
                meta["mm"] += 1
            save = func in TITAN_SAVE and not (func == aten.mm.default and meta["mm"] % 2 == 0)
            if save:
                saved.append(ctx.op_output.numel() * ctx.op_output.element_size())
            return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE

        return create_selective_checkpoint_contexts(policy)

    real = wrap_blocks(copy.deepcopy(model).train(), recording)
    real(x).sum().backward()
    a = analyzed(model, x, activation_checkpointing="selective")
    note = next(n for n in a.notes if "Selective" in n)
    assert (
        f"saved {len(saved)} op output(s) (aten.mm.default {len(saved)}× ({sum(saved):,} B))"
        in note
    )
