"""Your own FSDP2 / tensor-parallel wrapping, traced as it stands: accuracy and memory.

    python benchmarks/parallel_wrapped.py          # accuracy and memory (a few minutes)
    python benchmarks/parallel_wrapped.py --big    # + Llama 70B wrapped by you, FSDP 64

Accuracy: the model built on ``meta``, wrapped by the user's own code (``parallel_truth``:
``default_wrap``, blocks then root; ``with_settings``: ``reshard_after_forward=False``, bf16
all-gathers, dim-1 shards on the last block; ``hsdp``: a 2-D mesh, replicated then sharded)
under a fake process group, never materialized, and analyzed with
``mw.analyze(model, input_data=x, mode="training", device="cpu")`` as rank ``r``.
``measured``: the same wrapping of the same model built for real, one AdamW step of rank ``r``
measured by ``MemTracker`` (``parallel_truth.real_rank_peak``). ``parallel=``: the unwrapped
model analyzed with ``parallel={"fsdp": ..., "tp": ...}`` (rank 0; meta_widget's own wrapping,
the same as ``default_wrap``).

Memory: a 4-layer 8192-wide ``nn.Sequential`` wrapped by ``fully_shard`` on 2 ranks and
materialized (``to_empty``, this rank's 512 MiB of shards, filled), analyzed in a fresh process:
the growth of the process's peak RSS and the seconds the analysis took.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.testing._internal.distributed.fake_pg import FakeStore

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from parallel_truth import (  # noqa: E402
    DeepMLP,
    default_wrap,
    hsdp,
    llama_tp_plan,
    real_rank_peak,
    tiny_llama_config,
    with_settings,
    wrapped_on_meta,
)

import meta_widget as mw  # noqa: E402

MIB = 2**20
Wrap = Callable[[nn.Module, DeviceMesh], None]


def llama() -> nn.Module:
    import transformers

    return transformers.LlamaForCausalLM(tiny_llama_config())  # type: ignore[no-any-return]


def traced(
    make: Callable[[], nn.Module], x: torch.Tensor, fsdp: int, tp: int, rank: int, wrap: Wrap
) -> int:
    dist.init_process_group("fake", rank=rank, world_size=fsdp * tp, store=FakeStore())
    try:
        mesh = init_device_mesh("cpu", (fsdp, tp), mesh_dim_names=("dp", "tp"))
        a = mw.analyze(
            wrapped_on_meta(make, mesh, wrap), input_data=x, mode="training", device="cpu"
        )
        assert a.error is None, a.error
        return a.peak_bytes
    finally:
        dist.destroy_process_group()


def planned(make: Any, x: torch.Tensor, fsdp: int, tp: int) -> int:
    a = mw.analyze(
        make, input_data=x, mode="training", device="cpu", parallel={"fsdp": fsdp, "tp": tp}
    )
    return a.peak_bytes


def accuracy() -> None:
    mlp_x = torch.randn(64, 256)
    llama_x = torch.randint(0, 32000, (2, 128))
    tp = partial(default_wrap, tp_plan=llama_tp_plan())
    llama_config = tiny_llama_config()
    # (model, layout, build, the unwrapped model for parallel= (None: no such layout), input,
    #  mesh (dp, tp), rank, the user's wrapping)
    cases: list[tuple[str, str, Any, Any, torch.Tensor, tuple[int, int], int, Wrap]] = [
        ("MLP", "FSDP 4", DeepMLP, DeepMLP, mlp_x, (4, 1), 2, default_wrap),
        ("MLP, own settings", "FSDP 4", DeepMLP, None, mlp_x, (4, 1), 1, with_settings),
        ("MLP", "HSDP 2 × 2", DeepMLP, None, mlp_x, (2, 2), 3, hsdp),
        ("tiny Llama", "FSDP 4", llama, llama_config, llama_x, (4, 1), 3, default_wrap),
        ("tiny Llama", "TP 2", llama, llama_config, llama_x, (1, 2), 1, tp),
        ("tiny Llama", "FSDP 2 × TP 2", llama, llama_config, llama_x, (2, 2), 1, tp),
    ]
    print("| model | layout | rank | traced, MiB | measured, MiB | ratio | parallel=, MiB |")
    print("|---|---|---|---|---|---|---|")
    for name, layout, make, source, x, (fsdp, tp_size), rank, wrap in cases:
        mine = traced(make, x, fsdp, tp_size, rank, wrap)
        truth = real_rank_peak(make, x, fsdp=fsdp, tp=tp_size, rank=rank, wrap=wrap)["Total"]
        plan = f"{planned(source, x, fsdp, tp_size) / MIB:.2f}" if source is not None else "—"
        print(
            f"| {name} | {layout} | {rank} | {mine / MIB:.2f} | {truth / MIB:.2f} | "
            f"{mine / truth:.3f} | {plan} |"
        )


_REAL_SHARDS = textwrap.dedent(
    """
    import resource, time
    import torch, torch.distributed as dist
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore
    import meta_widget as mw

    def rss():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    def wrapped(width, mesh):
        with torch.device("meta"):
            model = nn.Sequential(*(nn.Linear(width, width) for _ in range(4)))
        for block in model:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        model.to_empty(device="cpu")
        with torch.no_grad():
            for p in model.parameters():
                p._local_tensor.fill_(1.0)
        return model

    dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
    mesh = init_device_mesh("cpu", (2,))
    mw.analyze(wrapped(64, mesh), input_size=(2, 64), mode="training")
    model = wrapped(8192, mesh)
    shards = sum(p.to_local().untyped_storage().nbytes() for p in model.parameters())
    before = rss()
    start = time.perf_counter()
    a = mw.analyze(model, input_size=(2, 8192), mode="training")
    print(shards, rss() - before, time.perf_counter() - start, a.peak_bytes)
    dist.destroy_process_group()
    """
)


def real_shards() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _REAL_SHARDS], capture_output=True, text=True, check=True
    )
    shards, grown, seconds, peak = out.stdout.split()
    print()
    print(
        "| local shards, MiB | peak RSS growth during analyze, MiB | seconds | traced peak, MiB |"
    )
    print("|---|---|---|---|")
    print(
        f"| {int(shards) / MIB:.0f} | {int(grown) / MIB:.1f} | {float(seconds):.1f} | "
        f"{int(peak) / MIB:.0f} |"
    )


_BIG = textwrap.dedent(
    """
    import json, resource, runpy, sys, time
    import torch, torch.distributed as dist, transformers
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore
    import meta_widget as mw

    n, wrapped = int(sys.argv[1]), sys.argv[2] == "wrapped"
    config = runpy.run_path(sys.argv[3])["config"]
    start = time.perf_counter()
    if wrapped:  # the planning flow: built on meta, wrapped under the user's own fake group
        dist.init_process_group("fake", rank=0, world_size=n, store=FakeStore())
        mesh = init_device_mesh("cpu", (n,))
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(config)
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        a = mw.analyze(model, input_size=(1, 4096), mode="training")
    else:
        a = mw.analyze(config, input_size=(1, 4096), mode="training", parallel={"fsdp": n})
    assert a.error is None, a.error
    print(json.dumps([
        time.perf_counter() - start,
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        a.peak_bytes,
        int(a.comms.bytes.sum()),
    ]))
    """
)


def big() -> None:
    """Llama-3-70B's shape (``examples/llama_70b.py``), 64 ranks: your wrapping vs parallel=."""
    print()
    print(
        "| Llama 70B, FSDP 64, rank 0 | seconds | peak RSS, MiB | peak per GPU, GiB | comms, GiB |"
    )
    print("|---|---|---|---|---|")
    config = str(ROOT / "examples" / "llama_70b.py")
    for how in ("wrapped", "parallel="):
        out = subprocess.run(
            [sys.executable, "-c", _BIG, "64", how.rstrip("="), config],
            capture_output=True,
            text=True,
            check=True,
        )
        seconds, rss, peak, comms = json.loads(out.stdout.strip().splitlines()[-1])
        print(
            f"| {how} | {seconds:.0f} | {rss / MIB:.0f} | {peak / 2**30:.2f} | "
            f"{comms / 2**30:.1f} |"
        )


if __name__ == "__main__":
    accuracy()
    real_shards()
    if "--big" in sys.argv:
        big()
