"""Record the samples the protocol tests of both sides read: ``python tests/make_fixtures.py``.

- ``js/fixtures/gpt2-tiny.json``: the payload of a tiny GPT-2 analysis.
- ``js/fixtures/gpt2-tiny.messages.json``: the messages streamed while tracing it.
- ``js/fixtures/failing.json``: the payload of an analysis whose trace failed in a submodule.
- ``js/fixtures/gpt2-tiny.training.json``: the payload of a training step of the tiny GPT-2,
  timed on an H100 (its ``time``).
- ``js/fixtures/llama-generate.json``: the payload of a tiny Llama's ``generate()`` timed on an
  H100 (its ``serving``; decode steps summed by the rule: ``more_calls``).
- ``js/fixtures/pipeline-llama.json``: the payload of a pipeline-parallel training step of a
  tiny Llama (two pipeline ranks, 1F1B over four micro-batches, timed on an H100): its
  ``stages``.
- ``js/fixtures/graph-llama.json``: the payload of a training step of a 4-layer Llama with tied
  embeddings (input (1, 8)): its ``graph``, the Graph tab's tests' model.
- ``js/fixtures/fsdp-gpt2.json``: the payload of a training step of the tiny GPT-2 (tied
  embeddings) under FSDP over 2 ranks: the memory chart's columns as one rank holds them.
- ``js/fixtures/choices.json``: the fixed name sets (``meta_widget.choices``) the front end's
  constants must equal.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "js", "fixtures")
sys.path.insert(0, HERE)


class Capture:
    """A stand-in for the widget's comm that keeps what would be sent."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.payload: dict[str, Any] = {}

    def send(self, message: dict[str, Any]) -> None:
        self.sent.append(json.loads(json.dumps(message)))


def choices() -> dict[str, list[str]]:
    """Each fixed name set of ``meta_widget.choices``, in its order (and the comparison's
    numbers, the columns of the compare view)."""
    from meta_widget import choices as c
    from meta_widget.explore.comparison import NUMBERS

    return {
        "modes": [m.value for m in c.Mode],
        "phases": [p.value for p in c.Phase],
        "devices": [d.value for d in c.Device],
        "optimizers": [o.value for o in c.Optimizer],
        "memory_categories": [m.value for m in c.MemoryCategory],
        "precisions": [p.value for p in c.Precision],
        "statuses": [s.value for s in c.Status],
        "explore_kinds": [k.value for k in c.ExploreKind],
        "kernel_messages": [m.value for m in c.KernelMessage],
        "view_messages": [m.value for m in c.ViewMessage],
        "wait_states": [s.value for s in c.WaitState],
        "compare_numbers": list(NUMBERS),
    }


def samples() -> dict[str, Any]:
    from models import Failing, gpt2_config, llama_config

    import meta_widget as mw
    from meta_widget.views.widget import CallStream

    torch.manual_seed(0)
    a = mw.analyze(gpt2_config(), input_size=(1, 8))
    capture = Capture()
    stream = CallStream(
        capture,  # type: ignore[arg-type]
        a.modules,
        title=a.title,
        source=a.source,
        mode=a.mode,
        batch=8,
        interval_s=1e9,
    )
    for rec in sorted(a.calls, key=lambda c: (c.end_event, -c.depth)):
        stream.add(rec)
    stream.finish(a)
    failing = mw.analyze(Failing("shape"), input_size=(2, 4))
    training = mw.analyze(
        gpt2_config(), input_size=(1, 8), mode="training", optimizer="adamw", gpu="H100"
    )
    generate = mw.analyze(
        llama_config(), input_size=(1, 8), mode="generate", new_tokens=40, gpu="H100"
    )
    config = llama_config()
    config.num_hidden_layers = 4
    pipeline = mw.analyze(
        config,
        input_size=(4, 16),
        mode="training",
        gpu="H100",
        parallel=mw.Parallel(pp=2, microbatches=4),
    )
    config = llama_config()
    config.num_hidden_layers = 4
    config.tie_word_embeddings = True
    graph = mw.analyze(config, input_size=(1, 8), mode="training")
    fsdp = mw.analyze(
        gpt2_config(), input_size=(1, 8), mode="training", parallel=mw.Parallel(fsdp=2)
    )
    return {
        "llama-generate.json": generate.to_payload(),
        "graph-llama.json": graph.to_payload(),
        "gpt2-tiny.json": a.to_payload(),
        "gpt2-tiny.messages.json": capture.sent,
        "failing.json": failing.to_payload(),
        "gpt2-tiny.training.json": training.to_payload(),
        "pipeline-llama.json": pipeline.to_payload(),
        "fsdp-gpt2.json": fsdp.to_payload(),
        "choices.json": choices(),
    }


def normalize(value: Any) -> Any:
    """Drop what changes from run to run (timings, absolute paths) for comparisons."""
    if isinstance(value, dict):
        return {
            k: normalize(v)
            for k, v in value.items()
            if k not in ("duration_us", "elapsed_s", "total_s", "file")
        }
    if isinstance(value, list):
        return [normalize(v) for v in value]
    return value


def main() -> None:
    os.makedirs(FIXTURES, exist_ok=True)
    for name, data in samples().items():
        with open(os.path.join(FIXTURES, name), "w", encoding="utf-8") as f:
            json.dump(normalize(data), f, indent=1)
            f.write("\n")
        print("wrote", name)


if __name__ == "__main__":
    main()
