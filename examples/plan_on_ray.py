"""``mw.plan`` on a Ray cluster, through the adapter of docs/explore.md.

    pip install "ray>=2.9"        # not a dependency of meta_widget
    python examples/plan_on_ray.py [--address auto]

``ray.util.multiprocessing.Pool`` is a ``multiprocessing.Pool``, not a
``concurrent.futures.Executor``; :class:`PoolExecutor` makes one, and ``mw.plan(...,
executor=)`` sends its runs to Ray's workers. Plans a small Llama (9 layers, 12 candidates
on 4 H100s) there and in this process alone, and prints whether the rows are the same (they
must be: workers change how fast, never what). Without ``--address`` a local Ray is started
with two CPUs. Run from the repository root (``PYTHONPATH=.``) so that Ray's workers import
this checkout, as a cluster's would import its installed meta_widget.

Run once on a 2-core machine (Ray 2.60, local): 12 of 12 candidates traced on Ray's workers,
rows identical to the single-process plan.
"""

from __future__ import annotations

import argparse
from concurrent.futures import Executor, Future
from typing import Any

import transformers

import meta_widget as mw


class PoolExecutor(Executor):
    """A ``concurrent.futures.Executor`` over a ``multiprocessing.Pool``-like pool (Ray's too)."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        future.set_running_or_notify_cancel()
        self.pool.apply_async(
            fn, args, kwargs, callback=future.set_result, error_callback=future.set_exception
        )
        return future


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--address", default=None, help="a running Ray cluster's, or 'auto'")
    args = parser.parse_args()
    import ray
    from ray.util.multiprocessing import Pool

    if args.address is None:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    else:
        ray.init(address=args.address)
    config = transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=9,
        num_attention_heads=4, num_key_value_heads=2, use_cache=False,  # trained: no KV cache
    )  # fmt: skip
    space: dict[str, Any] = dict(
        gpu="H100", devices=4, layouts=[{"fsdp": 4}, {"fsdp": 2, "tp": 2}, {"tp": 4}],
        precisions=["as given", "param_dtype bf16"], micro_batches=[1], budget="700MiB",
    )  # fmt: skip
    pool = Pool()
    try:
        on_ray = mw.plan(config, (2, 32), executor=PoolExecutor(pool), **space)
    finally:
        pool.terminate()
        ray.shutdown()
    alone = mw.plan(config, (2, 32), workers=1, **space)
    print(on_ray.to_dataframe().to_string())
    same = on_ray.to_dataframe().equals(alone.to_dataframe())
    print(f"rows identical to the plan in one process: {same}")


if __name__ == "__main__":
    main()
