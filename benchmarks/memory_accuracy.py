"""Predicted peak memory against PyTorch's MemTracker on a real CPU run of the same model.

    python benchmarks/memory_accuracy.py

For each model of a small corpus (an MLP, a CNN, tiny transformers GPT-2 and Llama with SDPA and
with eager attention), in inference and for one AdamW training step: the peak that
``mw.analyze(..., device="cpu")`` predicts on meta, and the peak that
``torch.distributed._tools.mem_tracker.MemTracker`` measures while the same model runs for real on
the CPU with the same inputs (parameters, buffers and inputs tracked as external). The target is
a ratio within 5% of 1.00 on every row.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.distributed._tools.mem_tracker import MemTracker

import meta_widget as mw
from meta_widget.trace.passes import default_loss


def mlp() -> tuple[nn.Module, dict[str, Any]]:
    model = nn.Sequential(
        nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 10)
    )
    return model, {"x": torch.randn(64, 512)}


def cnn() -> tuple[nn.Module, dict[str, Any]]:
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, 10),
    )
    return model, {"x": torch.randn(16, 3, 64, 64)}


def _hf(name: str, attention: str) -> Callable[[], tuple[nn.Module, dict[str, Any]]]:
    def build() -> tuple[nn.Module, dict[str, Any]]:
        import transformers

        if name == "gpt2":
            config: Any = transformers.GPT2Config(
                n_layer=2, n_embd=128, n_head=4, vocab_size=1000, n_positions=256
            )
            cls: Any = transformers.GPT2LMHeadModel
        else:
            config = transformers.LlamaConfig(
                hidden_size=128,
                intermediate_size=344,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                vocab_size=1000,
                max_position_embeddings=256,
            )
            cls = transformers.LlamaForCausalLM
        config._attn_implementation = attention
        torch.manual_seed(0)
        model = cls(config)
        ids = torch.randint(0, 1000, (4, 256))
        return model, {"input_ids": ids, "use_cache": False}

    return build


CORPUS: dict[str, Callable[[], tuple[nn.Module, dict[str, Any]]]] = {
    "MLP": mlp,
    "CNN (BatchNorm)": cnn,
    "GPT-2 tiny, SDPA": _hf("gpt2", "sdpa"),
    "GPT-2 tiny, eager attention": _hf("gpt2", "eager"),
    "Llama tiny, SDPA": _hf("llama", "sdpa"),
    "Llama tiny, eager attention": _hf("llama", "eager"),
}


def _call(model: nn.Module, inputs: dict[str, Any]) -> Any:
    if "x" in inputs:
        return model(inputs["x"])
    return model(**inputs)


def measured_peak(model: nn.Module, inputs: dict[str, Any], training: bool) -> int:
    """Peak bytes MemTracker sees on the CPU for the same pass meta_widget records."""
    model.train(training)
    tensors = [v for v in inputs.values() if isinstance(v, torch.Tensor)]
    tracker = MemTracker()
    if not training:
        tracker.track_external(model, *tensors)
        with torch.no_grad(), tracker:
            out = _call(model, inputs)
        del out
    else:
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, foreach=False)
        tracker.track_external(model, optimizer, *tensors)
        with tracker:
            out = _call(model, inputs)
            loss = default_loss(out)
            loss.backward()
            del loss
            optimizer.step()
        del out
        optimizer.zero_grad(set_to_none=True)
    snapshot = tracker.get_tracker_snapshot("peak")
    return int(snapshot[torch.device("cpu")]["Total"])


def predicted_peak_for(
    model: nn.Module, inputs: dict[str, Any], training: bool, device: str = "cpu"
) -> int:
    """The peak ``mw.analyze`` predicts for ``device``'s kernels."""
    data: Any = (inputs["x"],) if "x" in inputs else inputs
    a = mw.analyze(
        model, input_data=data, mode="training" if training else "inference", device=device
    )
    if a.error is not None:
        raise RuntimeError(str(a.error))
    return a.peak_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args()
    print(f"torch {torch.__version__}; peak bytes (MiB); ratio = predicted / measured\n")
    print("| model | mode | predicted (meta) | measured (MemTracker, CPU) | ratio |")
    print("|---|---|---|---|---|")
    worst = 0.0
    for name, build in CORPUS.items():
        for training in (False, True):
            model, inputs = build()
            predicted = predicted_peak_for(model, inputs, training)
            measured = measured_peak(model, inputs, training)
            ratio = predicted / measured
            worst = max(worst, abs(ratio - 1))
            mode = "training (AdamW)" if training else "inference"
            print(
                f"| {name} | {mode} | {predicted / 2**20:.2f} | {measured / 2**20:.2f} "
                f"| {ratio:.3f} |"
            )
    print(f"\nLargest deviation: {worst * 100:.1f}% (target: within 5% on every row).")


if __name__ == "__main__":
    main()
