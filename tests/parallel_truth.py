"""The truth for parallel traces: one real CPU step of rank 0 under PyTorch's fake process group.

The model is built for real (random weights), wrapped here, by hand, with PyTorch's own
``fully_shard`` (each decoder layer / block, then the root) and ``parallelize_module`` (the
column/row-wise plan written out below, the one transformers' Llama config names), and runs one
training step the way ``analyze(mode="training")`` models it (the output kept to the end, the
loss freed after backward, AdamW made after backward, ``foreach=False``) while
``torch.distributed._tools.mem_tracker.MemTracker`` measures it. The collectives move no data
(backend ``"fake"``) but every buffer FSDP2 and DTensor allocate is allocated.

Where MemTracker cannot run (it hooks every parameter's gradient, and a frozen parameter has
none), :func:`allocator_rank_peak` measures the same step as the CPU allocator sees it
(``torch.profiler``'s memory events); :func:`real_output_bytes` gives the bytes of the tensors
modules return on a real rank (DTensor's real output sizes).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch._C._profiler import _EventType
from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.profiler import ProfilerActivity, profile
from torch.testing._internal.distributed.fake_pg import FakeStore
from truth import loop_peaks

from meta_widget.distributed.decisions import forget_meshes

CPU = torch.device("cpu")


def tiny_llama_config(vocab: int = 32000) -> Any:
    """The tiny Llama of the issue: 4 layers, hidden 256 (8 heads, 4 key/value heads)."""
    import transformers

    return transformers.LlamaConfig(
        hidden_size=256,
        intermediate_size=1024,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        vocab_size=vocab,
        architectures=["LlamaForCausalLM"],
    )


def llama_tp_plan() -> dict[str, Any]:
    """transformers' Llama plan (``base_model_tp_plan`` and ``_tp_plan``), written by hand."""
    plan: dict[str, Any] = {
        f"model.layers.*.{path}": ColwiseParallel()
        for path in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")
    }
    plan["model.layers.*.self_attn.o_proj"] = RowwiseParallel()
    plan["model.layers.*.mlp.gate_proj"] = ColwiseParallel()
    plan["model.layers.*.mlp.up_proj"] = ColwiseParallel()
    plan["model.layers.*.mlp.down_proj"] = RowwiseParallel()
    plan["model.embed_tokens"] = RowwiseParallel(input_layouts=Replicate())
    plan["lm_head"] = ColwiseParallel(output_layouts=Replicate())
    return plan


class GatheredNorm(SequenceParallel):
    """A norm on the rank's sequence shard, its output all-gathered (a replicated DTensor) for
    the column-wise projections after it: Megatron's sequence parallelism, written by hand."""

    @staticmethod
    def _prepare_output_fn(use_local_output, mod, outputs, device_mesh):  # type: ignore[no-untyped-def,override]
        return outputs.redistribute(placements=[Replicate()])


def llama_sp_plan() -> dict[str, Any]:
    """:func:`llama_tp_plan` with sequence parallelism, as torchtitan writes it for its Llama:
    the embedding's output and the row-wise projections' sharded along the sequence (a
    reduce-scatter), each decoder layer's norms on the shard then all-gathered, the final norm
    on the shard and the head gathering it."""
    plan = llama_tp_plan()
    for path in ("self_attn.o_proj", "mlp.down_proj"):
        plan[f"model.layers.*.{path}"] = RowwiseParallel(
            output_layouts=Shard(1), use_local_output=False
        )
    for path in ("input_layernorm", "post_attention_layernorm"):
        plan[f"model.layers.*.{path}"] = GatheredNorm()
    plan["model.embed_tokens"] = RowwiseParallel(
        input_layouts=Replicate(), output_layouts=Shard(1), use_local_output=False
    )
    plan["model.norm"] = SequenceParallel()
    plan["lm_head"] = ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())
    return plan


class DeepMLP(nn.Module):
    """Four blocks of 256 -> 1024 -> 256 in a ModuleList (what fully_shard wraps)."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 256)) for _ in range(4)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def real_rank_peak(
    make: Callable[[], nn.Module],
    x: torch.Tensor,
    fsdp: int,
    tp: int = 1,
    tp_plan: dict[str, Any] | None = None,
    blocks: Callable[[nn.Module], list[nn.Module]] | None = None,
    rank: int = 0,
    wrap: Callable[[nn.Module, DeviceMesh], None] | None = None,
    steps: int = 1,
) -> dict[str, int]:
    """``steps`` real AdamW steps (``zero_grad``, forward, the sum of the floating outputs,
    backward, step) of ``rank`` of ``fsdp * tp`` CPU ranks: MemTracker's peak snapshot (bytes
    by its categories), ``"Total"`` the first step's peak and ``"Steady"`` the highest of the
    later steps' as the CPU allocator sees them (kernels' own copies too; Adam's step counters,
    host memory on a GPU, left out). The process group is destroyed afterwards.
    ``wrap(model, mesh)`` wraps the model instead of the default wrapping above (the mesh's
    dimensions are named ``"dp"`` and ``"tp"``)."""
    dist.init_process_group("fake", rank=rank, world_size=fsdp * tp, store=FakeStore())
    try:
        torch.manual_seed(0)
        model = make().train()
        mesh = init_device_mesh("cpu", (fsdp, tp), mesh_dim_names=("dp", "tp"))
        if wrap is not None:
            wrap(model, mesh)
        else:
            default_wrap(model, mesh, tp_plan, blocks)
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, foreach=False)  # making one allocates nothing
        tracker = MemTracker()
        tracker.track_external(model, opt, x)

        def step() -> None:
            tracker.reset_mod_stats()  # per-module stats only (MemTracker's rule); peak kept
            opt.zero_grad()
            out = model(x)
            loss = _floating_sum(out)
            loss.backward()
            del loss
            opt.step()

        held = [_local(t) for t in (*model.parameters(), *model.buffers(), x)]
        with tracker:
            peaks = loop_peaks(step, steps, held)
            peak = tracker.get_tracker_snapshot("peak")[CPU]
        out = {str(k).rsplit(".", 1)[-1]: int(v) for k, v in peak.items()}
        counters = 4 * len(params)  # live from the first optimizer step on
        out["MemTracker"] = out.pop("Total")  # the tensors ops return, over every step
        out["Total"] = peaks[0]
        if steps > 1:
            out["Steady"] = max(peaks[1:]) - counters
        return out
    finally:
        dist.destroy_process_group()
        forget_meshes()  # DTensor's cache would hand this world's meshes to the next one


def _local(t: torch.Tensor) -> torch.Tensor:
    to_local = getattr(t, "to_local", None)
    return to_local() if to_local is not None else t


def allocator_rank_peak(make: Callable[[], nn.Module], x: torch.Tensor, fsdp: int) -> int:
    """The peak (bytes) of one real AdamW step of rank 0 of ``fsdp`` CPU ranks (each block, then
    the root, ``fully_shard``-ed) as the CPU allocator sees it: rank 0's parameter shards and the
    input, plus the highest sum of every allocation and free ``torch.profiler`` records during
    the step (``profile_memory=True``). For models MemTracker cannot follow (frozen parameters);
    the step is the one :func:`real_rank_peak` runs."""
    dist.init_process_group("fake", rank=0, world_size=fsdp, store=FakeStore())
    try:
        torch.manual_seed(0)
        model = make().train()
        default_wrap(model, init_device_mesh("cpu", (fsdp, 1), mesh_dim_names=("dp", "tp")))
        params = [p for p in model.parameters() if p.requires_grad]
        held = [p.to_local() for p in model.parameters()] + [x]  # type: ignore[operator]
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in held}
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            out = model(x)
            loss = _floating_sum(out)
            loss.backward()
            del loss
            torch.optim.AdamW(params, foreach=False).step()
            del out
        return sum(storages.values()) + _highest(prof)
    finally:
        dist.destroy_process_group()
        forget_meshes()


def _highest(prof: profile) -> int:
    """The highest running sum of the allocations (+) and frees (-) ``prof`` recorded."""
    events: list[tuple[int, int]] = []
    pending = list(prof.profiler.kineto_results.experimental_event_tree())  # type: ignore[union-attr]
    while pending:
        node = pending.pop()
        if node.tag == _EventType.Allocation:
            events.append((node.start_time_ns, node.extra_fields.alloc_size))
        pending.extend(node.children)
    live = peak = 0
    for _, size in sorted(events):
        live += size
        peak = max(peak, live)
    return peak


def real_output_bytes(
    make: Callable[[], nn.Module], x: torch.Tensor, tp: int, plan: dict[str, ParallelStyle]
) -> dict[str, int]:
    """Bytes of the tensor each module named in ``plan`` returns, on rank 0 of ``tp`` real CPU
    ranks after ``parallelize_module(model, mesh, plan)``, in one forward pass (module path ->
    bytes; the module's first call)."""
    dist.init_process_group("fake", rank=0, world_size=tp, store=FakeStore())
    try:
        torch.manual_seed(0)
        model = make().train()
        parallelize_module(model, init_device_mesh("cpu", (tp,)), plan)
        sizes: dict[str, int] = {}

        def record(path: str) -> Callable[[nn.Module, Any, Any], None]:
            def hook(module: nn.Module, args: Any, out: Any) -> None:
                local = out.to_local() if hasattr(out, "to_local") else out
                sizes.setdefault(path, local.numel() * local.element_size())

            return hook

        for path in plan:
            model.get_submodule(path).register_forward_hook(record(path))
        model(x)
        return sizes
    finally:
        dist.destroy_process_group()
        forget_meshes()


def default_wrap(
    model: nn.Module,
    mesh: DeviceMesh,
    tp_plan: dict[str, Any] | None = None,
    blocks: Callable[[nn.Module], list[nn.Module]] | None = None,
    **fsdp: Any,
) -> None:
    """Tensor parallelism over the mesh's ``"tp"`` dimension (if > 1) with ``tp_plan``, then
    ``fully_shard(**fsdp)`` over ``"dp"`` (if > 1) on each block, then on the root."""
    if mesh["tp"].size() > 1:
        parallelize_module(model, mesh["tp"], tp_plan)
    if mesh["dp"].size() > 1:
        for block in (blocks or _layers)(model):
            fully_shard(block, mesh=mesh["dp"], **fsdp)
        fully_shard(model, mesh=mesh["dp"], **fsdp)


def wrapped_on_meta(
    make: Callable[[], nn.Module], mesh: DeviceMesh, wrap: Callable[[nn.Module, DeviceMesh], None]
) -> nn.Module:
    """The planning flow of FSDP2's docs: built on meta, wrapped, never materialized."""
    with torch.device("meta"):
        model = make()
    wrap(model, mesh)
    return model


def with_settings(model: nn.Module, mesh: DeviceMesh) -> None:
    """FSDP2's options away from the defaults: blocks kept unsharded after forward, bf16
    all-gathers, and the last block's parameters sharded on dim 1."""
    bf16 = MixedPrecisionPolicy(param_dtype=torch.bfloat16)
    dp = mesh["dp"]
    for block in model.layers[:3]:  # type: ignore[index]
        fully_shard(block, mesh=dp, reshard_after_forward=False, mp_policy=bf16)
    fully_shard(model.layers[3], mesh=dp, mp_policy=bf16, shard_placement_fn=_dim1)  # type: ignore[index]
    fully_shard(model, mesh=dp, mp_policy=bf16)


def hsdp(model: nn.Module, mesh: DeviceMesh) -> None:
    """HSDP: replicated over the mesh's first dimension, sharded over its second."""
    for block in model.layers:  # type: ignore[union-attr]
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)


def _dim1(p: nn.Parameter) -> Shard:
    return Shard(p.ndim - 1)


def _layers(model: nn.Module) -> list[nn.Module]:
    inner = getattr(model, "model", model)
    return list(inner.layers)  # type: ignore[union-attr, arg-type]


def _floating_sum(out: Any) -> torch.Tensor:
    """The loss ``analyze`` uses by default: the sum of the output (a model's logits)."""
    if isinstance(out, torch.Tensor):
        return out.sum()
    return out.logits.sum()  # type: ignore[no-any-return]


@pytest.fixture(autouse=True)
def no_process_group_left() -> Any:
    """A test module that imports this runs each test with no default process group before
    or after it: an analysis leaves none behind, and a test that made one destroyed it."""
    assert not dist.is_initialized()
    yield
    assert not dist.is_initialized()


def no_decision_kept() -> bool:
    """DTensor's cache of sharding decisions is empty: no world's mesh is kept past it
    (``meta_widget.distributed.decisions``)."""
    from torch.distributed.tensor import DTensor

    cached = DTensor._op_dispatcher.sharding_propagator.propagate_op_sharding
    return cached.cache_info().currsize == 0  # type: ignore[no-any-return]
