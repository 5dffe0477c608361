"""Context parallelism: a rank of ``cp`` traced as PyTorch's own ``context_parallel`` runs it.

``torch.distributed.tensor.experimental.context_parallel`` (torch 2.13) shards the inputs along
the sequence and runs SDPA as ring attention over the CUDA kernels (flash, efficient, cudnn).
On real CPU tensors it cannot run (the first test: SDPA is the CPU's flash kernel there, which
DTensor cannot shard, and the ring's kernels have no CPU implementation), so there is no real
CPU rank to hold a trace against. A trace routes attention to the kernel a CUDA GPU picks, whose
meta kernels run on the fake CPU mesh (``meta_widget.distributed.context``): the tests below
hold its numbers against what PyTorch's ring does by construction (its blocks, its all-gather
of the keys and values, half the tokens a rank), against the same model without ``cp``, and
the per-layer rule against the full depth.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
import transformers
from parallel_truth import (
    no_process_group_left,  # noqa: F401  (an autouse fixture)
    tiny_llama_config,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._sharding_prop import ShardingPropagator
from torch.distributed.tensor.experimental import context_parallel
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.utils.flop_counter import sdpa_flop_count

import meta_widget as mw
from meta_widget.distributed.context import check_context, check_inputs
from meta_widget.distributed.decisions import forget_meshes
from meta_widget.trace.kernels import AttentionKernels

#: 2 layers, 8 heads of 32, as many key/value heads (so the ring gathers what attention gets)
HEADS, DIM, BATCH, SEQ = 8, 32, 2, 512


def config(**kw: Any) -> Any:
    return transformers.LlamaConfig(
        hidden_size=HEADS * DIM, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=HEADS, num_key_value_heads=HEADS, vocab_size=1000,
        use_cache=False, **kw,
    )  # fmt: skip


def training(layout: dict[str, Any], model: Any = None, **kw: Any) -> mw.Analysis:
    x = torch.randint(0, 1000, (BATCH, SEQ))
    return mw.analyze(
        model if model is not None else config(), input_data=x, mode="training",
        parallel=layout, gpu="H100", autocast=torch.bfloat16, **kw,
    )  # fmt: skip


def _pristine() -> tuple[Any, ...]:
    return (
        F.scaled_dot_product_attention,
        ShardingPropagator._propagate_tensor_meta_non_cached,
        ShardingPropagator.propagate_op_sharding_non_cached,
        dict(DTensor._op_dispatcher._custom_op_handlers),
        AttentionKernels.ring_calls,
    )


def test_pytorchs_context_parallel_cannot_shard_real_cpu_attention() -> None:
    dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
    try:
        mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("cp",))
        q, k, v = (torch.randn(1, 4, 128, 32, requires_grad=True) for _ in range(3))
        buffers = [t.detach() for t in (q, k, v)]
        with (
            pytest.raises(NotImplementedError, match="flash_attention_for_cpu"),
            context_parallel(mesh, buffers=buffers, buffer_seq_dims=[2, 2, 2]),
        ):
            F.scaled_dot_product_attention(q, k, v, is_causal=True)
        # the ring's own kernels have no CPU implementation either
        with pytest.raises(NotImplementedError, match="CPU"):
            torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True)
    finally:
        dist.destroy_process_group()
        forget_meshes()
    # context_parallel put SDPA back
    assert F.scaled_dot_product_attention.__module__ == "torch._C._nn"


def _attention_flops(a: mw.Analysis) -> list[int]:
    return [
        r.ops.get("aten._scaled_dot_product_flash_attention", 0)
        for m in a.modules
        for r in m.calls
        if r.path.endswith("self_attn")
    ]


def test_a_cp_rank_runs_pytorchs_ring_on_its_half_of_each_sequence() -> None:
    before = _pristine()
    ring = training({"fsdp": 2, "cp": 2})
    plain = training({"fsdp": 4})
    assert ring.error is None and plain.error is None
    # PyTorch's ring with head-tail load balancing, 2 ranks: the rank's 256 queries against
    # its own 256 keys (causal), then its back half of queries against the other rank's keys
    half, quarter = SEQ // 2, SEQ // 4
    q, kv = (BATCH, HEADS, half, DIM), (BATCH, HEADS, half, DIM)
    block = sdpa_flop_count(q, kv, kv) + sdpa_flop_count((BATCH, HEADS, quarter, DIM), kv, kv)
    assert _attention_flops(ring) == [block] * 2  # a call a layer
    # each layer's forward gathers the whole sequence's keys and values over the 2 ranks
    gathered = ring.comms[(ring.comms.group == "cp") & (ring.comms.phase == "forward")]
    assert list(gathered.collective) == ["all_gather"] * 2
    assert set(gathered.bytes) == {2 * BATCH * HEADS * SEQ * DIM * 2}  # k and v, bf16
    assert set(ring.comms.group) == {"fsdp", "cp"}
    # the rank holds what FSDP over fsdp x cp = 4 ranks holds, and its matmuls see half the
    # tokens of a rank without cp
    assert ring.memory.param_bytes == plain.memory.param_bytes
    mm = [sum(r.ops.get("aten.mm", 0) for m in a.modules for r in m.calls) for a in (ring, plain)]
    assert mm[0] * 2 == mm[1] > 0
    assert ring.memory.peak_bytes < plain.memory.peak_bytes
    assert ring.time is not None and ring.time.step_s > 0
    assert _pristine() == before


def test_the_rings_sharding_decisions_are_made_once_a_schema_in_a_trace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # DTensor asks for the ring kernel's sharding at every attention call (2 layers, 2 steps,
    # forward and backward); the trace keeps each op schema's answer, as PyTorch keeps it
    # outside a fake mode (the numbers of the tests above come through it)
    made: list[Any] = []
    original = ShardingPropagator.propagate_op_sharding_non_cached

    def counted(self: ShardingPropagator, op_schema: Any) -> Any:
        made.append(op_schema)
        return original(self, op_schema)

    monkeypatch.setattr(ShardingPropagator, "propagate_op_sharding_non_cached", counted)
    a = training({"fsdp": 2, "cp": 2})
    assert a.error is None
    ring = [s for s in made if "flash_attention" in str(s.op)]
    assert ring, "the ring's sharding was never decided"
    assert len(ring) == len(set(ring)), "a schema's sharding decided twice in one trace"
    assert len(ring) < 2 * 2 * 2  # fewer than the ring's calls: 2 layers x 2 steps x 2 passes


def test_cp_without_fsdp_labels_its_ring_and_fsdp2_apart() -> None:
    a = training({"cp": 2})
    assert a.error is None
    by_op = {op: set(a.comms[a.comms.op == op].group) for op in set(a.comms.op)}
    assert by_op["c10d._allgather_base_"] == {"fsdp"}  # FSDP2 over the 2 cp ranks
    assert by_op["_c10d_functional.all_gather_into_tensor"] == {"cp"}  # the ring's


def test_the_per_layer_rule_gives_the_full_depths_numbers_under_cp() -> None:
    deep = config()
    deep.num_hidden_layers = 6
    p = mw.plan(
        deep, (BATCH, SEQ), gpu="H100", devices=8, layouts=[{"fsdp": 4, "cp": 2}],
        precisions=["param_dtype bf16"], activation_checkpointing=[True], micro_batches=[1],
    )  # fmt: skip
    (c,) = p.candidates
    assert c.error is None and c.row()["traced_layers"] == "3, 4"
    full = mw.analyze(
        deep, input_data=torch.randint(0, 1000, (BATCH, SEQ)), mode="training",
        parallel={"fsdp": 4, "cp": 2}, gpu="H100", param_dtype=torch.bfloat16,
        activation_checkpointing=True,
    )  # fmt: skip
    assert full.error is None and full.time is not None
    assert c.peak_bytes == full.memory.peak_bytes
    assert c.step_s == pytest.approx(full.time.step_s, rel=1e-9)


def test_attention_on_the_math_path_is_an_error_naming_it() -> None:
    before = _pristine()
    gqa = config()
    gqa.num_key_value_heads = 4
    x = torch.randint(0, 1000, (BATCH, SEQ))
    a = mw.analyze(gqa, input_data=x, mode="training", parallel={"cp": 2}, gpu="H100")
    assert a.error is not None
    assert "math path" in str(a.error) and "bf16" in str(a.error), str(a.error)
    assert _pristine() == before


def test_a_plan_traces_one_candidate_of_a_layout_and_precision_on_the_math_path() -> None:
    gqa = config()
    gqa.num_key_value_heads = 4
    p = mw.plan(
        gqa, (BATCH, SEQ), gpu="H100", devices=4, layouts=[{"fsdp": 2, "cp": 2}],
        precisions=["as given", "autocast bf16"], activation_checkpointing=[False, True],
        micro_batches=[1], workers=1,
    )  # fmt: skip
    fp32 = [c for c in p.candidates if c.precision == "as given"]
    bf16 = [c for c in p.candidates if c.precision == "autocast bf16"]
    assert all("math path" in str(c.error) for c in fp32)
    assert "Not traced" not in str(fp32[0].error) and "Not traced" in str(fp32[1].error)
    assert all(c.error is None and c.step_s is not None for c in bf16)  # its attention is bf16
    assert p.traces == 1 + 2  # the first fp32 candidate's failing trace, each bf16 one whole


def test_attention_that_never_calls_sdpa_is_refused() -> None:
    before = _pristine()
    with pytest.raises(mw.LayoutError, match="never called scaled_dot_product_attention"):
        training({"cp": 2}, model=config(attn_implementation="eager"))
    assert _pristine() == before


def test_a_model_that_fails_before_its_attention_says_its_own_error() -> None:
    class Attends(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(HEADS * DIM, 3 * HEADS * DIM)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.sum().item() > 0:  # data-dependent: no value on meta
                x = x * 2
            b, t, _ = x.shape
            q, k, v = self.proj(x).view(b, t, 3, HEADS, DIM).permute(2, 0, 3, 1, 4)
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    before = _pristine()
    a = mw.analyze(
        Attends(), input_size=(BATCH, SEQ, HEADS * DIM), mode="training",
        parallel={"fsdp": 2, "cp": 2}, gpu="H100", autocast=torch.bfloat16,
    )  # fmt: skip
    assert a.error is not None and "never called" not in str(a.error)
    assert "item" in str(a.error)
    assert _pristine() == before


@pytest.mark.parametrize(
    ("layout", "kw", "match"),
    [
        ({"pp": 2, "cp": 2}, {}, "pipeline's stages"),
        ({"cp": 2}, {"device": "cpu"}, "CUDA attention kernels only"),
    ],
)
def test_what_cp_cannot_trace_is_a_layout_error(
    layout: dict[str, Any], kw: dict[str, Any], match: str
) -> None:
    x = torch.randint(0, 32000, (2, 128))
    with pytest.raises(mw.LayoutError, match=match) as raised:
        mw.analyze(tiny_llama_config(), input_data=x, mode="training", parallel=layout, **kw)
    assert "\n" not in str(raised.value)


def test_experts_with_cp_are_refused() -> None:
    with pytest.raises(mw.LayoutError, match="experts sharded over context-parallel"):
        check_context(mw.Parallel(fsdp=2, cp=2, ep=2))


def test_a_sequence_that_does_not_split_into_2cp_chunks_is_refused() -> None:
    x = torch.randint(0, 1000, (BATCH, 100))
    with pytest.raises(mw.LayoutError, match=r"100 tokens does not split into 8 equal chunks"):
        mw.analyze(config(), input_data=x, mode="training", parallel={"cp": 4}, gpu="H100")
    plan = mw.Parallel(cp=2)
    with pytest.raises(mw.LayoutError, match="disagree"):
        check_inputs(plan, (torch.zeros(2, 8), torch.zeros(2, 12)), {})
    with pytest.raises(mw.LayoutError, match="no input has a sequence"):
        check_inputs(plan, (torch.zeros(8),), {})


@pytest.mark.parametrize("where", ["forward", "backward"])
def test_ctrl_c_inside_the_ring_leaves_nothing_behind(
    where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An interrupt inside PyTorch's ring attention (its forward block or its backward): SDPA,
    DTensor's handlers and propagation, the routing's count and the process group are all as
    they were, and the next trace gives the same numbers as before."""
    from torch.distributed.tensor.experimental._context_parallel import _attention as ring

    before = _pristine()
    first = training({"fsdp": 2, "cp": 2})
    name = "_templated_ring_attention" + ("_backward" if where == "backward" else "")
    original = getattr(ring, name)
    calls = [0]

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        raise KeyboardInterrupt

    monkeypatch.setattr(ring, name, interrupted)
    with pytest.raises(KeyboardInterrupt):
        training({"fsdp": 2, "cp": 2})
    assert calls[0] == 1
    monkeypatch.setattr(ring, name, original)
    assert _pristine() == before
    again = training({"fsdp": 2, "cp": 2})
    assert again.peak_bytes == first.peak_bytes and again.comm_records == first.comm_records
