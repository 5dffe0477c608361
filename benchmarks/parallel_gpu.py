"""A parallel trace against FSDP2 on a real CUDA device (rank 0 under the fake process group).

    python benchmarks/parallel_gpu.py          # needs one CUDA GPU

For the tiny Llama of ``tests/parallel_truth.py`` (4 layers, hidden 256, vocab 32000, batch
2 x 128) and FSDP2 over 2, 4 and 8 ranks: ``torch.cuda.max_memory_allocated`` over one AdamW step
of rank 0 (``fully_shard`` on each layer and the root, a CUDA mesh under the fake process group;
net of what was allocated before the model was moved to the GPU, cuBLAS warmed up first), and
the peak ``mw.analyze(..., device="cuda", parallel={"fsdp": n})`` traces. One JSON line each.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.testing._internal.distributed.fake_pg import FakeStore

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from parallel_truth import tiny_llama_config  # noqa: E402

import meta_widget as mw  # noqa: E402


def measured(n: int) -> int:
    import transformers

    config = tiny_llama_config()
    dist.init_process_group("fake", rank=0, world_size=n, store=FakeStore())
    try:
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(config).train()
        ids = torch.randint(0, config.vocab_size, (2, 128))
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        model.cuda()
        mesh = init_device_mesh("cuda", (n,))
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        ids = ids.cuda()
        params = [p for p in model.parameters() if p.requires_grad]
        out = model(ids)
        loss = out.logits.sum()
        loss.backward()
        del loss
        torch.optim.AdamW(params, foreach=False).step()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        del out
        return int(peak)
    finally:
        dist.destroy_process_group()


def main() -> None:
    a = torch.randn(256, 256, device="cuda")
    (a @ a).sum().item()  # cuBLAS workspace allocated before any measurement
    for n in (2, 4, 8):
        real = measured(n)
        traced = mw.analyze(
            tiny_llama_config(),
            input_size=(2, 128),
            mode="training",
            device="cuda",
            parallel={"fsdp": n},
        )
        print(
            json.dumps(
                {
                    "fsdp": n,
                    "traced": traced.peak_bytes,
                    "measured_cuda": real,
                    "ratio": round(traced.peak_bytes / real, 4),
                    "error": traced.error.message if traced.error else None,
                    "torch": torch.__version__,
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
