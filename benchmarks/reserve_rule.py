"""How often the caching allocator's reserve comes by ``plan``'s per-layer rule, and whether it is
exact: for each candidate of a small Llama (64 wide, 9 layers), the allocator steps the rule
builds from the 3- and 4-layer traces (and the 2-layer one where a free outside the layers' runs
needs it, as ``plan`` traces it; ``meta_widget.explore.depth_reserve.Reserve.build``) against
the 9-layer trace's, step by step (every free freeing the allocation the full depth's frees),
and the reserves (issue 39).

    python benchmarks/reserve_rule.py [--size B,S] [--part K/N]

Six layouts on 8 GPUs x checkpointing x 3 precisions x 1 and 2 micro-batches: 72 candidates,
each printed as EXACT (steps and reserve the full depth's; "EXACT with 2 layers" where the
2-layer trace was needed), WRONG (a step or the reserve differs: a bug of the rule) or NONE (no
reserve by the rule: ``plan`` traces such a candidate at full depth when it may fit). ``--part
K/N`` runs every N-th candidate from the K-th, so that two processes share the work.
Results: benchmarks/results/plan.md.
"""

from __future__ import annotations

import argparse
import itertools
import warnings
from collections import Counter
from typing import Any

import meta_widget as mw
from meta_widget.explore import depth, depth_reserve
from meta_widget.memory.allocator import FREES, INITIAL, KIND, NBYTES
from meta_widget.timing.gpus import resolve_gpu

LAYERS = 9
LAYOUTS: list[dict[str, Any]] = [
    {"fsdp": 8},
    {"replicate": 2, "fsdp": 4},
    {"fsdp": 4, "tp": 2},
    {"replicate": 8},
    {"replicate": 2, "fsdp": 2, "tp": 2},
    {"fsdp": 4, "tp": 2, "sequence_parallel": True},
]
PRECISIONS: list[dict[str, Any]] = [{}, {"autocast": "bfloat16"}, {"param_dtype": "bfloat16"}]


def llama(layers: int) -> Any:
    import transformers

    return transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2,
    )  # fmt: skip


def verdict(size: tuple[int, int], options: dict[str, Any]) -> str:
    """EXACT, WRONG or NONE for one candidate (module docstring)."""
    kwargs = dict(mode="training", gpu="H100", **options)
    two, *samples = (
        depth.sample(mw.analyze(llama(d), size, **kwargs), d) for d in (2, *depth.DEPTHS)
    )
    layout = options["parallel"]
    dp = layout.get("replicate", 1) * layout.get("fsdp", 1)
    full = depth.extend(samples, LAYERS, resolve_gpu("H100"), dp)
    earlier = None
    if full is not None and full.device_bytes is None:
        full, earlier = depth.extend(samples, LAYERS, resolve_gpu("H100"), dp, two=two), two
    runs = depth.doubled(samples[0], samples[1])
    tables = [s.allocator_steps for s in samples]
    reserve = depth_reserve.Reserve(
        tables, depth._doubled, depth._repeat, None if earlier is None else earlier.allocator_steps
    )
    built = reserve.build(runs or [], LAYERS)
    if full is None or full.device_bytes is None or not isinstance(built, tuple):
        return "NONE"
    whole = mw.analyze(llama(LAYERS), size, **kwargs)
    table = depth.sample(whole, LAYERS).allocator_steps
    steps, places = built
    initial = len(steps) - len(places)
    index = {place: i + initial for i, place in enumerate(places)}
    same = (
        len(steps) == len(table)
        and all(table[:initial, KIND] == INITIAL)
        and table[initial, KIND] != INITIAL
        and all(
            index[key] == row[FREES] if nbytes is None else nbytes == row[NBYTES]
            for (key, nbytes), row in zip(steps, table, strict=True)
            if not isinstance(key[0], str)  # an initial tensor's step: its size only
        )
        and [n for _, n in steps[:initial]] == table[:initial, NBYTES].tolist()
    )
    exact = same and full.device_bytes == whole.footprint_bytes
    return ("EXACT" + ("" if earlier is None else " with 2 layers")) if exact else "WRONG"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="4,128", help="the input size B,S (default 4,128)")
    parser.add_argument("--part", default="0/1", help="K/N: every N-th candidate from the K-th")
    args = parser.parse_args()
    size = tuple(int(x) for x in args.size.split(","))
    k, n = (int(x) for x in args.part.split("/"))
    warnings.filterwarnings("ignore")
    tally: Counter[str] = Counter()
    space = itertools.product(LAYOUTS, (False, True), PRECISIONS, (1, 2))
    for i, (layout, checkpointing, precision, micro) in enumerate(space):
        if i % n != k:
            continue
        options = dict(
            parallel=layout, activation_checkpointing=checkpointing, micro_batches=micro,
            **precision,
        )  # fmt: skip
        found = verdict(size, options)
        tally[found] += 1
        print(f"{found:<6} {layout} checkpointing={checkpointing} {precision} mb={micro}")
    print(", ".join(f"{v} {key}" for key, v in sorted(tally.items())))


if __name__ == "__main__":
    main()
