"""The truth for pipeline traces: real ranks on gloo (one process each) running PyTorch's own
``torch.distributed.pipelining`` over a real tiny Llama, three AdamW steps, measured by the CPU
allocator (``truth.loop_peaks``), and the bytes each rank sends and receives.

The split is written here by hand, torchtitan's way (a copy of the model holding only the
stage's layers; the first stage embeds, the last normalizes and projects), independent of
``meta_widget.distributed.stages``. Each stage is given its input and output shapes (static
shapes, as meta_widget's trace gives them). The step: ``zero_grad``, ``schedule.step`` (the loss
the sum of the last stage's output, no outputs returned), ``AdamW(foreach=False).step()``.
"""

from __future__ import annotations

import copy
import json
import socket
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

SCHEDULE_CLASSES = {
    "1F1B": "Schedule1F1B",
    "gpipe": "ScheduleGPipe",
    "interleaved-1F1B": "ScheduleInterleaved1F1B",
}


class _Stage(nn.Module):
    """Layers ``keep`` of a real ``LlamaForCausalLM`` (a copy: the others dropped)."""

    def __init__(self, model: nn.Module, keep: range, first: bool, last: bool) -> None:
        super().__init__()
        model = copy.deepcopy(model)
        self.embed = model.model.embed_tokens if first else None
        self.blocks = nn.ModuleList(model.model.layers[i] for i in keep)
        self.rope = model.model.rotary_emb
        self.norm = model.model.norm if last else None
        self.head = model.lm_head if last else None

    #: the tensor-parallel mesh under sequence parallelism (set after the plan is applied):
    #: between stages each rank's shard of the sequence travels, inside a DTensor of the whole
    sequence_mesh: Any = None
    #: the forward under CPU autocast to bf16 (a training loop's ``with torch.autocast``)
    autocast: bool = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.autocast:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return self._forward(x)
        return self._forward(x)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x) if self.embed is not None else x
        if self.embed is None and self.sequence_mesh is not None:
            from torch.distributed.tensor import DTensor, Shard

            h = DTensor.from_local(h, self.sequence_mesh, [Shard(1)], run_check=False)
        pos = torch.arange(h.shape[1]).unsqueeze(0)
        cos_sin = self.rope(h, pos)
        for block in self.blocks:
            h = block(h, attention_mask=None, position_embeddings=cos_sin, position_ids=pos)
        if self.head is not None:
            h = self.head(self.norm(h))
        elif self.sequence_mesh is not None:
            h = h.to_local()
        return h


class _P2P(TorchDispatchMode):
    """Bytes of every ``c10d.send`` and ``c10d.recv_`` the rank runs."""

    def __init__(self) -> None:
        super().__init__()
        self.sent = self.received = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = str(func._overloadpacket)
        if name in ("c10d.send", "c10d.recv_"):
            n = sum(t.numel() * t.element_size() for t in args[0])
            if name == "c10d.send":
                self.sent += n
            else:
                self.received += n
        return func(*args, **(kwargs or {}))


def _parallelize(module: _Stage, mesh: Any, sp: bool) -> None:
    """The Llama plan written out in parallel_truth (its sequence-parallel form with ``sp``),
    on the stage's names."""
    from parallel_truth import llama_sp_plan, llama_tp_plan
    from torch.distributed.tensor.parallel import parallelize_module

    names = {"model.layers.*.": "blocks.*.", "model.embed_tokens": "embed", "model.norm": "norm"}
    styles = {}
    for path, style in (llama_sp_plan() if sp else llama_tp_plan()).items():
        for old, new in names.items():
            path = path.replace(old, new)
        path = "head" if path == "lm_head" else path
        if path.split(".")[0] in {n for n, _ in module.named_children()} and (
            getattr(module, path.split(".")[0]) is not None
        ):
            styles[path] = style
    parallelize_module(module, mesh, styles)
    if sp:
        module.sequence_mesh = mesh


def _rank(
    rank: int, pp: int, port: int, config: dict[str, Any], x: torch.Tensor, layout: dict[str, Any],
    out: str,
) -> None:  # fmt: skip
    import transformers
    from torch.distributed import pipelining

    torch.set_num_threads(1)
    from test_expert_parallel import slice_experts  # ep = fsdp: each rank its experts' slice
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    fsdp, tp, sp, ep = layout["fsdp"], layout["tp"], layout["sequence_parallel"], layout["ep"]
    if layout["backend"] == "fake":  # this rank alone: collectives and sends move no data
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group("fake", rank=rank, world_size=pp * fsdp * tp, store=FakeStore())
    else:
        address = f"tcp://127.0.0.1:{port}"
        dist.init_process_group("gloo", rank=rank, world_size=pp * fsdp * tp, init_method=address)
    try:
        mesh = init_device_mesh("cpu", (pp, fsdp, tp), mesh_dim_names=("pp", "fsdp", "tp"))
        stage_rank = rank // (fsdp * tp)  # pp is the outer dimension
        torch.manual_seed(0)
        made = getattr(transformers, layout["config_class"])(**config)
        model = getattr(transformers, (made.architectures or ["LlamaForCausalLM"])[0])(made)
        model.train()
        v, m = layout["virtual_stages"], layout["microbatches"]
        n_stages = pp * v
        layers = config["num_hidden_layers"]
        bounds = [0, *layout["bounds"], layers] if layout["bounds"] else [
            round(i * layers / n_stages) for i in range(n_stages + 1)
        ]  # fmt: skip
        mine = [stage_rank + k * pp for k in range(v)]
        mb = x.shape[0] // m
        hidden, vocab = config["hidden_size"], config["vocab_size"]
        stages, modules = [], []
        for s in mine:
            module = _Stage(model, range(bounds[s], bounds[s + 1]), s == 0, s == n_stages - 1)
            module.autocast = layout["autocast"]
            between = x.shape[1] // tp if sp else x.shape[1]  # the sequence a rank sends on
            given = (
                torch.empty(mb, x.shape[1], dtype=torch.long, device="meta")
                if s == 0
                else torch.empty(mb, between, hidden, device="meta", requires_grad=True),
            )
            made = (
                torch.empty(mb, x.shape[1], vocab, device="meta", requires_grad=True)
                if s == n_stages - 1
                else torch.empty(mb, between, hidden, device="meta", requires_grad=True),
            )
            if tp > 1:
                _parallelize(module, mesh["tp"], sp)
            ignored = slice_experts(module.blocks, mesh["fsdp"]) if ep > 1 else None
            if fsdp > 1:  # each block, then the stage (torchtitan's order)
                for block in module.blocks:
                    fully_shard(block, mesh=mesh["fsdp"], ignored_params=ignored)
                fully_shard(module, mesh=mesh["fsdp"], ignored_params=ignored)
            modules.append(module)
            stages.append(
                pipelining.PipelineStage(
                    module,
                    s,
                    n_stages,
                    torch.device("cpu"),
                    given,
                    made,
                    group=mesh["pp"].get_group(),
                )
            )
        del model
        cls = getattr(pipelining, SCHEDULE_CLASSES[layout["schedule"]])
        schedule = cls(
            stages if v > 1 or layout["schedule"] == "interleaved-1F1B" else stages[0],
            n_microbatches=m,
            loss_fn=lambda output, target: output.sum(),
        )
        if layout["backend"] == "fake":  # no number arrives: the stages' vote settled (static)
            from torch.distributed.pipelining.stage import InferenceMode

            def settled(stages: list[Any], has_backward: bool, p2p_done: bool) -> None:
                for stage in stages:
                    stage._inference_mode = InferenceMode.STATIC

            schedule._warmup_p2p = settled  # type: ignore[method-assign]
        params = [p for module in modules for p in module.parameters()]
        opt = torch.optim.AdamW(params, foreach=False)
        first, last = 0 in mine, n_stages - 1 in mine
        target = torch.empty(x.shape[0], 0)
        counted = _P2P()

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            schedule.step(
                *((x,) if first else ()), target=target if last else None, return_outputs=False
            )
            opt.step()

        step_no = [0]

        def counted_step() -> None:
            step_no[0] += 1
            if step_no[0] == 3:  # the vote of the first step left out
                with counted:
                    step()
            else:
                step()

        held = [_local(p) for p in params] + ([x] if first else [])
        peaks = _own_peaks(counted_step, 3, held)
        Path(out).write_text(
            json.dumps(
                {
                    "first_step": peaks[0],
                    "steady": max(peaks[1:]) - 4 * len(params),  # Adam's step counters left out
                    "sent": counted.sent,
                    "received": counted.received,
                    "stages": mine,
                }
            )
        )
    finally:
        dist.destroy_process_group()


def _own_peaks(step: Any, steps: int, held: list[torch.Tensor]) -> list[int]:
    """``truth.loop_peaks`` counting the rank's own allocations only: those of the thread that
    runs the steps (and their frees, on any thread). Gloo runs collectives on threads of its
    own, with temporaries of its own (its reduce-scatter is an all-reduce of a full copy): a
    GPU's NCCL keeps its buffers outside the caching allocator, and the trace models neither."""
    import gc

    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    base = sum(
        {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in held}.values()
    )
    gc.collect()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        for k in range(steps):
            with torch.profiler.record_function(f"own step {k}"):
                step()
    ranges: dict[int, tuple[int, int]] = {}
    events: list[tuple[int, int, int, int]] = []
    main = -1
    pending = list(prof.profiler.kineto_results.experimental_event_tree())  # type: ignore[union-attr]
    while pending:
        node = pending.pop()
        if node.name.startswith("own step "):
            ranges[int(node.name.rsplit(" ", 1)[1])] = (node.start_time_ns, node.end_time_ns)
            main = node.start_tid
        if node.tag == _EventType.Allocation:
            fields = node.extra_fields
            events.append((node.start_time_ns, fields.alloc_size, fields.ptr, node.start_tid))
        pending.extend(node.children)
    peaks, live, mine = [0] * steps, 0, set()
    for at, size, ptr, tid in sorted(events):
        if size > 0 and tid == main:
            mine.add(ptr)
        elif size < 0 and ptr in mine:
            mine.discard(ptr)
        else:
            continue
        live += size
        for k, (start, end) in ranges.items():
            if start <= at <= end:
                peaks[k] = max(peaks[k], live)
    return [base + p for p in peaks]


def _local(t: torch.Tensor) -> torch.Tensor:
    to_local = getattr(t, "to_local", None)
    return to_local() if to_local is not None else t


def real_pipeline_ranks(
    config: Any,
    x: torch.Tensor,
    pp: int,
    tmp: Path,
    schedule: str = "1F1B",
    virtual_stages: int = 1,
    microbatches: int | None = None,
    bounds: tuple[int, ...] = (),
    fsdp: int = 1,
    backend: str = "gloo",
    tp: int = 1,
    sequence_parallel: bool = False,
    ep: int = 1,
    autocast: bool = False,
) -> list[dict[str, Any]]:
    """Each of ``pp * fsdp`` real ranks' steady and first-step peaks (bytes, CPU allocator) and
    the bytes it sent and received in a step, one process a rank (rank ``r`` is pipeline rank
    ``r // (fsdp * tp)``; with ``tp`` > 1 each stage is ``parallelize_module``-d with the Llama
    plan, its sequence-parallel form with ``sequence_parallel``; with ``ep`` (equal to
    ``fsdp``, a Mixtral) each rank holds its slice of the stage's experts, reached by
    all-to-all; with ``fsdp`` > 1 its blocks, then the stage, are ``fully_shard``-ed; with
    ``autocast`` each stage's forward runs under CPU autocast to bf16).
    ``backend="gloo"``: the ranks run together; ``"fake"``: each runs alone under PyTorch's
    fake process group (real tensors, nothing moved, no threads of gloo's), one after another,
    the schedule's first-step vote settled as static (no number arrives; as in the trace)."""
    layout = {
        "schedule": schedule,
        "virtual_stages": virtual_stages,
        "microbatches": microbatches or pp * virtual_stages,
        "bounds": list(bounds),
        "fsdp": fsdp,
        "backend": backend,
        "tp": tp,
        "sequence_parallel": sequence_parallel,
        "ep": ep,
        "config_class": type(config).__name__,
        "autocast": autocast,
    }
    assert ep in (1, fsdp), "the truth's experts are sharded over the fsdp ranks (ep = fsdp)"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    world = pp * fsdp * tp
    outs = [str(tmp / f"rank{r}.json") for r in range(world)]
    ctx = mp.get_context("spawn")
    procs = [
        ctx.Process(target=_rank, args=(r, pp, port, config.to_dict(), x, layout, outs[r]))
        for r in range(world)
    ]
    together = backend == "gloo"
    for p in procs:
        p.start()
        if not together:
            p.join(timeout=600)
    for p in procs:
        p.join(timeout=600)
    codes = [p.exitcode for p in procs]
    assert codes == [0] * world, f"a real pipeline rank failed: exit codes {codes}"
    return [json.loads(Path(o).read_text()) for o in outs]
