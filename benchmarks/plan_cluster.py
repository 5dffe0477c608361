"""``mw.plan`` on a Dask cluster against the default local pool: the same rows, and the time.

    python benchmarks/plan_cluster.py [--layouts N] [--dask-workers N] [--address tcp://...]

Plans the 70B of ``benchmarks/plan.py`` (Llama-3-70B training at (1, 4096) on 8 H100s; its
first ``--layouts`` layouts, 12 candidates each, default 2) twice: on ``plan``'s default
executor (this process and a local pool) and on a Dask cluster (``--address`` of a running
scheduler, or a ``LocalCluster`` of ``--dask-workers`` processes, one thread each, started
here). Prints the wall time of each, the load average, and whether the two plans' rows are
equal (they must be: workers change how fast, never what). Run it from the repository root
with ``PYTHONPATH=.`` so that the workers import this checkout.
"""

from __future__ import annotations

import argparse
import os
import time
import warnings
from typing import Any

from plan import llama_70b

import meta_widget as mw
from meta_widget.explore.candidates import Space
from meta_widget.timing.gpus import resolve_gpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layouts", type=int, default=2)
    parser.add_argument("--dask-workers", type=int, default=2)
    parser.add_argument("--address", default=None, help="a running Dask scheduler")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    from dask.distributed import Client, LocalCluster

    space = Space.checked(8, "training", resolve_gpu("H100"), None, None, None, None)
    layouts = [
        dict(zip(("replicate", "fsdp", "tp"), layout, strict=True))
        for layout in space.layouts[: args.layouts]
    ]
    common: dict[str, Any] = dict(gpu="H100", devices=8, layouts=layouts)
    config = llama_70b(80)
    times = {}
    load = os.getloadavg()[0]
    start = time.perf_counter()
    local = mw.plan(config, (1, 4096), **common)
    times["default pool"] = time.perf_counter() - start
    cluster = None
    if args.address is None:
        cluster = LocalCluster(
            n_workers=args.dask_workers, threads_per_worker=1, dashboard_address=None
        )
    with Client(args.address or cluster) as client:
        client.wait_for_workers(1)
        start = time.perf_counter()
        dask = mw.plan(config, (1, 4096), executor=client.get_executor(), **common)
        times["dask"] = time.perf_counter() - start
    if cluster is not None:
        cluster.close()
    same = local.to_dataframe().equals(dask.to_dataframe())
    for name, seconds in times.items():
        print(f"{name}: {len(local)} candidates in {seconds:.1f} s")
    print(
        f"rows equal: {same}; load average {load:.1f} before, {os.getloadavg()[0]:.1f} after, "
        f"on {os.cpu_count()} cores"
    )


if __name__ == "__main__":
    main()
