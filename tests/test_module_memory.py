"""Per-module parameters, gradients and optimizer state (``meta_widget.memory.modules``) against a
real CPU training step, and the memory chart's bars built from them (``a.figure("memory")``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from models import gpt2_config, llama_config, real
from torch import nn

import meta_widget as mw
from meta_widget.units import format_bytes
from meta_widget.views.memory_bars import memory_bars

#: what a user writes, as the analysis' optimizers do
OPTIMIZERS: dict[str, Callable[[list[nn.Parameter]], torch.optim.Optimizer]] = {
    "adamw": lambda ps: torch.optim.AdamW(ps, foreach=False),
    "sgd-momentum": lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9, foreach=False),
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.01, foreach=False),
}
CONFIGS = {"gpt2": gpt2_config, "llama": llama_config}
IDS = torch.randint(0, 100, (2, 8))


def real_step_by_module(config: Any, optimizer: str) -> dict[str, tuple[int, int, int]]:
    """Module path -> (parameter, gradient, optimizer-state bytes) it owns after a real CPU step.

    Owner: the first module in ``named_modules()`` whose own ``_parameters`` hold the tensor
    (walked here by hand). State: every tensor the optimizer keeps per parameter except the
    step counter (a host tensor, reported apart by the analysis)."""
    model = real(config).train()
    out = model(IDS)
    out.logits.sum().backward()
    opt = OPTIMIZERS[optimizer]([p for p in model.parameters() if p.requires_grad])
    opt.step()
    seen: set[int] = set()
    owned: dict[str, tuple[int, int, int]] = {}
    for path, m in model.named_modules():
        pb = gb = sb = 0
        for p in m._parameters.values():
            if p is None or id(p) in seen:
                continue
            seen.add(id(p))
            pb += p.numel() * p.element_size()
            gb += p.grad.untyped_storage().nbytes() if p.grad is not None else 0
            state = opt.state.get(p, {})
            sb += sum(v.untyped_storage().nbytes() for k, v in state.items() if k != "step")
        owned[path] = (pb, gb, sb)
    return owned


def owned_by_module(a: mw.Analysis) -> dict[str, tuple[int, int, int]]:
    """Module path -> (parameter, gradient, optimizer-state bytes) it owns, as analyzed."""
    by = a.memory.by_module
    assert by is not None
    return {
        n.path: (
            by.param_bytes[n.index],
            by.gradient_bytes[n.index],
            by.optimizer_state_bytes[n.index],
        )
        for n in a.modules
    }


@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
@pytest.mark.parametrize("model", list(CONFIGS))
def test_each_module_owns_what_a_real_step_gives_it(model: str, optimizer: str) -> None:
    config = CONFIGS[model]()
    a = mw.analyze(config, input_data=IDS, mode="training", optimizer=optimizer)
    assert a.error is None
    by = a.memory.by_module
    assert by is not None
    assert owned_by_module(a) == real_step_by_module(config, optimizer)
    # over all modules each byte once: the totals of the step, as they stand when it ends
    mem = a.memory
    assert sum(by.param_bytes) == mem.param_bytes
    assert sum(by.gradient_bytes) == mem.gradient_bytes == mem.timeline_categories["gradients"][-1]
    assert sum(by.optimizer_state_bytes) == mem.optimizer_state_bytes
    assert mem.optimizer_state_bytes == mem.timeline_categories["optimizer state"][-1]
    assert mem.gradient_bytes == mem.param_bytes  # every parameter trains (fp32 gradients)
    per_param = {"adamw": 2, "sgd-momentum": 1, "sgd": 0}[optimizer]
    assert mem.optimizer_state_bytes == per_param * mem.param_bytes


def test_tied_weights_are_counted_once_at_their_first_owner() -> None:
    a = mw.analyze(gpt2_config(), input_data=IDS, mode="training", optimizer="adamw")
    by = a.memory.by_module
    assert by is not None
    row = {n.path: n.index for n in a.modules}
    wte, head = row["transformer.wte"], row["lm_head"]
    weight = a.modules[wte].param_bytes
    assert a.modules[head].param_bytes == weight  # the tree: lm_head's subtree holds it
    assert (by.param_bytes[head], by.gradient_bytes[head], by.optimizer_state_bytes[head]) == (
        0,
        0,
        0,
    )
    assert (by.param_bytes[wte], by.gradient_bytes[wte]) == (weight, weight)
    assert by.optimizer_state_bytes[wte] == 2 * weight
    # the bars at depth 1 add up to the totals; the tree's subtree counts would count it twice
    bars = memory_bars(a, depth=1)
    assert [b.path for b in bars] == ["transformer", "lm_head"]
    assert sum(b.param_bytes for b in bars) == a.memory.param_bytes
    assert sum(a.modules[b.modules[0]].param_bytes for b in bars) == a.memory.param_bytes + weight
    assert sum(b.gradient_bytes for b in bars) == a.memory.gradient_bytes
    assert sum(b.optimizer_state_bytes for b in bars) == a.memory.optimizer_state_bytes
    assert bars[1].tied_bytes == weight


def test_the_payload_carries_subtree_sums_and_the_tied_bytes() -> None:
    a = mw.analyze(gpt2_config(), input_data=IDS, mode="training", optimizer="adamw")
    mods = a.to_payload()["memory"]["modules"]
    row = {n.path: n.index for n in a.modules}
    weight = a.modules[row["transformer.wte"]].param_bytes
    assert mods["tied"] == [[row["lm_head"], weight, weight // 4]]
    assert mods["gradient_bytes"][0] == a.memory.gradient_bytes  # the root: everything
    assert mods["optimizer_state_bytes"][row["transformer"]] == a.memory.optimizer_state_bytes
    assert mods["gradient_bytes"][row["lm_head"]] == 0
    layer = row["transformer.h.0"]
    assert mods["gradient_bytes"][layer] == a.modules[layer].param_bytes
    # inference: no gradients, no state, nothing sent for them
    b = mw.analyze(gpt2_config(), input_data=IDS)
    assert set(b.to_payload()["memory"]["modules"]) == {"tied"}


def test_the_memory_figure_folds_layers_and_stacks_the_step() -> None:
    a = mw.analyze(llama_config(), input_data=IDS, mode="training", optimizer="adamw")
    bars = memory_bars(a, depth=3)
    layers = next(b for b in bars if b.count > 1)
    assert layers.label == "model.layers.0–1 · 2 × LlamaDecoderLayer"
    members = [n for n in a.modules if n.path in ("model.layers.0", "model.layers.1")]
    assert layers.modules == [n.index for n in members]
    assert layers.param_bytes == sum(n.param_bytes for n in members)
    assert layers.output_bytes == sum(n.activation_bytes for n in members)
    assert layers.optimizer_state_bytes == 2 * layers.gradient_bytes == 2 * layers.param_bytes
    fig = a.figure("memory", depth=3)
    parts = {t.name: t for t in fig.data if t.type == "bar"}
    assert list(parts) == ["parameters", "gradients", "optimizer state", "output mem"]
    i = list(parts["parameters"].y).index(layers.label)
    assert parts["gradients"].text[i] == format_bytes(layers.gradient_bytes)
    beside = next(t for t in fig.data if t.type == "scatter")
    assert beside.text[i].strip() == format_bytes(layers.total)
    # inference: parameters and output mem only
    b = mw.analyze(llama_config(), input_data=IDS)
    assert [t.name for t in b.figure("memory").data if t.type == "bar"] == [
        "parameters",
        "output mem",
    ]


def _shard_bytes(p: Any, ranks: int) -> int:
    """Bytes of rank 0's FSDP2 shard of a parameter of ``p``'s shape: dim 0 cut in ``ranks``
    chunks, each padded to the largest (``ceil``)."""
    rows = -(-p.shape[0] // ranks)
    return rows * (p.numel() // p.shape[0]) * p.element_size()


def test_one_rank_owns_its_shards_beside_its_gradients_and_state() -> None:
    """Under FSDP each column is the rank's: the parameters as their shards (the tree counts the
    model), beside the rank's gradients and optimizer state; the bars add up to the rank's
    totals."""
    config = llama_config()
    a = mw.analyze(config, input_data=IDS, mode="training", parallel=mw.Parallel(fsdp=4))
    assert a.error is None
    by, mem = a.memory.by_module, a.memory
    assert by is not None
    model = real(config)
    own = {
        path: [p for p in m._parameters.values() if p is not None]
        for path, m in model.named_modules()
    }
    for n in a.modules:
        assert by.param_bytes[n.index] == sum(_shard_bytes(p, 4) for p in own[n.path]), n.path
    assert sum(by.param_bytes) == mem.param_bytes < a.root.param_bytes // 3
    assert sum(by.gradient_bytes) == mem.gradient_bytes == mem.param_bytes  # fp32, padded
    assert sum(by.optimizer_state_bytes) == mem.optimizer_state_bytes
    # a decoder layer is one FSDP group: one reduce-scatter output holds its gradients
    sums = by.subtree([n.parent for n in a.modules])
    layer = next(n.index for n in a.modules if n.path == "model.layers.0")
    assert sums.gradient_bytes[layer] == sums.param_bytes[layer]
    q = next(n.index for n in a.modules if n.path == "model.layers.0.self_attn.q_proj")
    assert by.gradient_bytes[q] == by.param_bytes[q]  # its view, not the group's storage
    bars = memory_bars(a, depth=1)
    assert sum(b.param_bytes for b in bars) == mem.param_bytes
    assert sum(b.gradient_bytes for b in bars) == mem.gradient_bytes
    assert all(b.tied_bytes == 0 for b in bars)
    payload = a.to_payload()["memory"]["modules"]
    assert payload["param_bytes"][0] == mem.param_bytes
    assert payload["float_params"][0] == mem.float_params
    assert payload["tied"] == []


def test_a_tied_weight_under_fsdp_is_the_ranks_shard_at_its_first_owner() -> None:
    a = mw.analyze(gpt2_config(), input_data=IDS, mode="training", parallel=mw.Parallel(fsdp=2))
    assert a.error is None
    by = a.memory.by_module
    assert by is not None
    row = {n.path: n.index for n in a.modules}
    wte, head = row["transformer.wte"], row["lm_head"]
    shard = by.param_bytes[wte]
    assert shard == _shard_bytes(real(gpt2_config()).transformer.wte.weight, 2)
    assert by.param_bytes[head] == 0
    bars = memory_bars(a, depth=1)
    assert [b.path for b in bars] == ["transformer", "lm_head"]
    assert (bars[1].param_bytes, bars[1].tied_bytes) == (0, shard)
    assert sum(b.param_bytes for b in bars) == a.memory.param_bytes
    tied = a.to_payload()["memory"]["modules"]["tied"]
    assert tied == [[head, shard, shard // 4]]


def real_fsdp_rank_by_module(config: Any, ranks: int) -> dict[str, tuple[int, int, int]]:
    """Module path -> (parameter, gradient, optimizer-state bytes) it owns on rank 0 of
    ``ranks`` after one real CPU step under PyTorch's fake process group, wrapped by hand
    (``fully_shard`` on each decoder layer, then the root: ``parallel_truth.default_wrap``).

    The storages are the real rank's: each parameter's local shard, the optimizer's state. A
    storage holding several gradients (FSDP2 reduce-scatters a group's into one, a view each)
    is split by the views' bytes in ``named_parameters()`` order, its rest with the last.
    AdamW's step counters are left out: a CUDA run keeps them on the host (``foreach``, not
    ``capturable``), and so does the analysis (``optimizer_host_bytes``)."""
    import torch.distributed as dist
    from parallel_truth import default_wrap
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from meta_widget.distributed.decisions import forget_meshes

    dist.init_process_group("fake", rank=0, world_size=ranks, store=FakeStore())
    try:
        model = real(config).train()
        default_wrap(model, init_device_mesh("cpu", (ranks, 1), mesh_dim_names=("dp", "tp")))
        opt = torch.optim.AdamW(model.parameters(), foreach=False)
        model(IDS).logits.sum().backward()
        opt.step()
        owner = {name: name.rpartition(".")[0] for name, _ in model.named_parameters()}
        owned = {path: [0, 0, 0] for path, _ in model.named_modules()}
        views: dict[int, list[tuple[str, int, int]]] = {}
        for name, p in model.named_parameters():
            local = p.to_local()
            owned[owner[name]][0] += local.untyped_storage().nbytes()
            state = opt.state[p]
            held = [v.to_local() for k, v in state.items() if k != "step"]
            owned[owner[name]][2] += sum(v.untyped_storage().nbytes() for v in held)
            grad = p.grad.to_local()  # type: ignore[union-attr]
            storage = grad.untyped_storage()
            views.setdefault(storage.data_ptr(), []).append(
                (name, grad.numel() * grad.element_size(), storage.nbytes())
            )
        for parts in views.values():
            rest = parts[0][2]
            for name, nbytes, _ in parts:
                owned[owner[name]][1] += min(nbytes, rest)
                rest -= min(nbytes, rest)
            owned[owner[parts[-1][0]]][1] += rest
        return {path: (p, g, s) for path, (p, g, s) in owned.items()}
    finally:
        dist.destroy_process_group()
        forget_meshes()


def test_each_module_owns_what_a_real_fsdp_rank_gives_it() -> None:
    config = llama_config()
    a = mw.analyze(config, input_data=IDS, mode="training", parallel=mw.Parallel(fsdp=4))
    assert a.error is None
    assert owned_by_module(a) == real_fsdp_rank_by_module(config, 4)
    mem = a.memory
    assert mem.optimizer_state_bytes == 2 * mem.param_bytes  # AdamW's two moments, no counter
    assert mem.optimizer_host_bytes == 4 * len(list(real(config).parameters()))  # the counters
