"""The caching-allocator replay against the allocator's documented rules, on crafted sequences.

Every expected number follows by hand from the rules in ``c10/cuda/CUDACachingAllocator.cpp``
(PyTorch 2.x; see ``meta_widget/memory/caching.py``): 512 B rounding, the 1 MiB small pool in
2 MiB segments, 20 MiB segments for 1-10 MiB requests, 2 MiB rounding above, best fit, the split
thresholds, merging, ``max_split_size``, expandable segments, release-and-retry at capacity.
On a device, ``benchmarks/allocator_gpu.py`` checks the replay against
``torch.cuda.max_memory_reserved()``.
"""

from __future__ import annotations

import dataclasses
import json
import random
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import meta_widget as mw
from meta_widget.data.records import Allocation
from meta_widget.memory.allocator import AllocatorConfig, replay, run
from meta_widget.memory.caching import MIB, Block, CachingAllocator, allocation_size, round_size
from meta_widget.memory.device import CONTEXT_BYTES, OVERHEADS, device_bytes, workspaces

KB = 1024


def alloc(*sizes: int) -> list[tuple[object, int | None]]:
    """Steps allocating ``sizes`` under keys 0, 1, ... (never freed)."""
    return [(k, n) for k, n in enumerate(sizes)]


def free(*keys: int) -> list[tuple[object, int | None]]:
    return [(k, None) for k in keys]


# -- rounding and pools ------------------------------------------------------------------------
def test_one_byte_takes_512_and_4096_of_them_fill_one_small_segment() -> None:
    assert round_size(1) == 512
    assert round_size(513) == 1024
    full = run(alloc(*[1] * 4096))  # 4096 x 512 B = exactly one 2 MiB segment
    assert (full.peak_bytes, full.peak_allocated_bytes, full.segments) == (2 * MIB, 2 * MIB, 1)
    over = run(alloc(*[1] * 4097))  # one more 512 B block needs a second segment
    assert (over.peak_bytes, over.segments) == (4 * MIB, 2)


def test_the_small_pool_ends_at_one_mib() -> None:
    assert run(alloc(MIB)).peak_bytes == 2 * MIB  # small: a 2 MiB segment
    # 1 MiB + 1 B rounds to 1 MiB + 512 B: large pool, a 20 MiB segment
    assert run(alloc(MIB + 1)).peak_bytes == 20 * MIB
    assert allocation_size(round_size(10 * MIB - 512)) == 20 * MIB  # just under 10 MiB
    assert allocation_size(10 * MIB) == 10 * MIB  # at 10 MiB: the request, rounded to 2 MiB
    assert run(alloc(11 * MIB + 1)).peak_bytes == 12 * MIB


def test_a_3_mib_request_splits_a_20_mib_segment() -> None:
    # 3 MiB takes a 20 MiB segment and leaves 17 MiB cached; 17 MiB fits it exactly
    r = run(alloc(3 * MIB, 17 * MIB))
    assert (r.peak_bytes, r.segments, r.peak_allocated_bytes) == (20 * MIB, 1, 20 * MIB)
    # a third large request finds nothing left: a second segment
    assert run(alloc(3 * MIB, 17 * MIB, 2 * MIB)).peak_bytes == 40 * MIB


def test_the_large_pool_splits_only_a_rest_over_one_mib() -> None:
    # 9 MiB in a 20 MiB segment leaves 11 MiB; 10 MiB from it would leave exactly 1 MiB, not
    # over kSmallSize: the request holds the whole 11 MiB block (allocated 9 + 11 MiB)
    r = run(alloc(9 * MIB, 10 * MIB))
    assert (r.peak_bytes, r.peak_allocated_bytes) == (20 * MIB, 20 * MIB)
    # 10 MiB - 512 B leaves 1 MiB + 512 B: split, allocated 9 + 10 MiB - 512 B
    r = run(alloc(9 * MIB, 10 * MIB - 512))
    assert r.peak_allocated_bytes == 19 * MIB - 512


def test_an_expandable_segment_splits_a_large_rest_of_512_bytes() -> None:
    # expandable segments split as the small pool does (``should_split``): 20 MiB - 512 B
    # from a 20 MiB page leaves 512 B split off, allocated 20 MiB - 512 B, not the whole page
    expandable = AllocatorConfig(expandable_segments=True)
    r = run(alloc(20 * MIB - 512), expandable)
    assert (r.peak_bytes, r.peak_allocated_bytes) == (20 * MIB, 20 * MIB - 512)
    assert run(alloc(20 * MIB - 512)).peak_allocated_bytes == 20 * MIB  # cudaMalloc'd: whole


def test_the_small_pool_splits_a_rest_of_512_bytes() -> None:
    # 1 MiB, then 1 MiB - 512 B from the 1 MiB left leaves 512 B, split off: a 512 B request
    # then fits without a new segment
    r = run(alloc(MIB, MIB - 512, 512))
    assert (r.peak_bytes, r.peak_allocated_bytes, r.segments) == (2 * MIB, 2 * MIB, 1)


# -- reuse -----------------------------------------------------------------------------------------
def test_best_fit_takes_the_smaller_free_block() -> None:
    # two segments of 12 and 14 MiB, both freed; 11 MiB takes the 12 MiB one (best fit), so
    # 13 MiB still finds the 14 MiB one: nothing new is reserved
    steps = alloc(12 * MIB, 14 * MIB) + free(0, 1) + [(2, 11 * MIB), (3, 13 * MIB)]
    assert run(steps).peak_bytes == 26 * MIB


def test_a_freed_block_merges_with_its_free_neighbours() -> None:
    # three 6 MiB blocks in one 20 MiB segment; the first two freed merge into 12 MiB, where
    # an 11 MiB request fits without a new segment
    steps = alloc(6 * MIB, 6 * MIB, 6 * MIB) + free(0, 1) + [(3, 11 * MIB)]
    assert run(steps).peak_bytes == 20 * MIB
    # freeing all three (and the 2 MiB rest merged on) gives the whole segment back: 19 MiB fits
    steps = alloc(6 * MIB, 6 * MIB, 6 * MIB) + free(1, 0, 2) + [(3, 19 * MIB)]
    assert run(steps).peak_bytes == 20 * MIB


def test_no_reuse_across_pools() -> None:
    # a freed small segment never serves a large request, nor a freed large one a small request
    assert run(alloc(MIB) + free(0) + [(1, MIB + 512)]).peak_bytes == 22 * MIB
    assert run(alloc(3 * MIB) + free(0) + [(1, 512)]).peak_bytes == 22 * MIB


def test_no_reuse_across_streams() -> None:
    steps = alloc(3 * MIB) + free(0) + [(1, 3 * MIB)]
    assert run(steps).peak_bytes == 20 * MIB
    assert run(steps, stream=lambda key: int(key == 1)).peak_bytes == 40 * MIB


def test_blocks_over_max_split_size_are_never_split() -> None:
    config = AllocatorConfig(max_split_size_mb=64)
    steps = alloc(100 * MIB) + free(0) + [(1, 90 * MIB), (2, 5 * MIB)]
    # default: 90 MiB splits the cached 100 MiB segment and 5 MiB fits the 10 MiB left
    assert run(steps).peak_bytes == 100 * MIB
    # max_split_size 64 MiB: 90 MiB takes the whole 100 MiB block (within 20 MiB of it),
    # unsplit, so 5 MiB needs a 20 MiB segment of its own
    r = run(steps, config)
    assert (r.peak_bytes, r.peak_allocated_bytes) == (120 * MIB, 105 * MIB)
    # a request under max_split_size never takes an oversize block
    assert run(alloc(100 * MIB) + free(0) + [(1, 30 * MIB)], config).peak_bytes == 130 * MIB
    # nor a request more than 20 MiB (max_non_split_rounding_mb) smaller than it
    assert run(alloc(100 * MIB) + free(0) + [(1, 70 * MIB)], config).peak_bytes == 170 * MIB


def test_roundup_power2_divisions() -> None:
    config = AllocatorConfig(roundup_power2_divisions=4)
    assert round_size(4500) == 4608  # 512 B steps
    assert round_size(4500, config) == 5120  # 4096, 5120, 6144, 7168: the next step up
    assert round_size(4096, config) == 4096  # a power of two stays
    assert round_size(2000, config) == 2048  # not over 512 x 4: 512 B steps
    assert AllocatorConfig.parse("roundup_power2_divisions:4") == config


# -- expandable segments, capacity ---------------------------------------------------------------
def test_expandable_segments_reserve_less_for_a_growing_sequence() -> None:
    # 25, 45, 65 MiB, each freed before the next: every one needs a new segment (26 + 46 + 66)
    steps = [(0, 25 * MIB), (0, None), (1, 45 * MIB), (1, None), (2, 65 * MIB), (2, None)]
    assert run(steps).peak_bytes == 138 * MIB
    # one segment grown by 20 MiB pages: 40, then 60, then 80 MiB mapped
    expandable = AllocatorConfig.parse("expandable_segments:True")
    r = run(steps, expandable)
    assert (r.peak_bytes, r.segments, r.end_bytes) == (80 * MIB, 1, 80 * MIB)
    # shrinking back reuses the mapped pages: nothing more
    assert run([*steps, (3, 30 * MIB), (3, None)], expandable).peak_bytes == 80 * MIB
    # the small pool grows by 2 MiB pages
    assert run(alloc(*[MIB] * 3), expandable).peak_bytes == 4 * MIB


def test_capacity_releases_cached_segments_and_retries() -> None:
    steps = alloc(30 * MIB) + free(0) + [(1, 40 * MIB)]
    assert run(steps).peak_bytes == 70 * MIB  # no limit: the cached 30 MiB stays
    # 30 + 40 MiB would pass 60 MiB: the wholly free 30 MiB segment is released, then 40 fits
    r = run(steps, capacity=60 * MIB)
    assert (r.peak_bytes, r.end_bytes, r.retries, r.failed_index) == (40 * MIB, 40 * MIB, 1, -1)
    # still live, it cannot be released: out of memory at the second request
    r = run(alloc(30 * MIB, 40 * MIB), capacity=60 * MIB)
    assert (r.failed_index, r.peak_bytes) == (1, 30 * MIB)


def test_capacity_unmaps_free_pages_of_expandable_segments() -> None:
    expandable = AllocatorConfig(expandable_segments=True)
    # 30 MiB maps two 20 MiB pages; freed, then 50 MiB on another stream needs three pages of
    # a segment of its own: 40 + 60 is past 90 MiB, so the 40 free MiB are unmapped first
    steps = alloc(30 * MIB) + free(0) + [(1, 50 * MIB)]
    r = run(steps, expandable, capacity=90 * MIB, stream=lambda key: int(key == 1))
    assert (r.peak_bytes, r.end_bytes, r.retries) == (60 * MIB, 60 * MIB, 1)


# -- a trace's allocations ------------------------------------------------------------------------
def test_replay_orders_initial_tensors_then_events_frees_first() -> None:
    # A (12 MiB) is freed at event 1, where B (12 MiB) is allocated: frees go first, so B
    # reuses A's block; the initial 1 MiB tensor comes before both, in the small pool
    allocations = [
        Allocation(1, 12 * MIB, 0, -1, "forward", freed=1),
        Allocation(2, 12 * MIB, 1, -1, "forward"),
    ]
    r = replay(allocations, initial=[MIB])
    assert (r.peak_bytes, r.peak_index, r.peak_event) == (14 * MIB, 1, 0)
    # an extra allocation (a cuBLAS workspace) placed at event 1 comes after the free
    r = replay(allocations, initial=[MIB], extra=[(1, 12 * MIB)])
    assert (r.peak_bytes, r.peak_event) == (26 * MIB, 1)


def test_cublas_workspaces_one_per_thread_before_its_first_gemm() -> None:
    from meta_widget.data.records import Event

    events = [
        Event(8, 8, 0, "aten.relu", "forward"),
        Event(8, 16, 0, "aten.addmm", "forward"),
        Event(8, 24, 0, "aten.mm", "forward"),
        Event(8, 32, 0, "aten.mm (workspace)", "backward"),
        Event(8, 40, 0, "aten.mm", "backward"),
        Event(8, 48, 0, "aten.mm", "optimizer"),
    ]
    assert workspaces(events, 32 * MIB) == [(1, 32 * MIB), (3, 32 * MIB)]


def test_device_bytes_adds_context_and_nccl_from_the_table() -> None:
    assert device_bytes(100) == 100 + CONTEXT_BYTES
    assert device_bytes(100, communicators=1) == 100 + CONTEXT_BYTES + 16 * 2 * 4 * MIB
    assert all(o.source for o in OVERHEADS)  # every figure says where it comes from


def test_analyze_reports_reserved_and_device_bytes() -> None:
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)
    )
    a = mw.analyze(model, input_size=(64, 256), mode="training", device="cuda")
    mem = a.memory
    assert mem.reserved_bytes >= a.peak_bytes
    assert mem.device_bytes > mem.reserved_bytes
    assert mem.device_bytes == mem.reserved_bytes + CONTEXT_BYTES
    # inference: weight 512 KiB, bias 2 KiB, input 64 KiB, output 128 KiB, all small requests
    # that fit one 2 MiB segment; the cuBLAS workspace of the forward's addmm is 32 MiB
    a = mw.analyze(torch.nn.Linear(256, 512), input_size=(64, 256), device="cuda")
    assert a.memory.reserved_bytes == 2 * MIB + 32 * MIB


def test_config_refuses_what_pytorch_refuses() -> None:
    with pytest.raises(mw.OptionError, match="max_split_size_mb"):
        AllocatorConfig(max_split_size_mb=16)
    with pytest.raises(mw.OptionError, match="garbage_collection_threshold"):
        AllocatorConfig.parse("garbage_collection_threshold:0.6")
    assert AllocatorConfig.parse("expandable_segments:True,max_split_size_mb:128") == (
        AllocatorConfig(expandable_segments=True, max_split_size_mb=128)
    )


def test_the_gpu_benchmark_predicts_on_the_cpu() -> None:
    """``benchmarks/allocator_gpu.py``'s CPU side: its MLP (512 -> 2048 -> 2048 -> 10, batch 64)
    in inference. The 4 MiB first weight takes a 20 MiB segment and leaves 16 MiB cached, which
    the 16 MiB second weight fits exactly; biases, the last weight, the 128 KiB input and the
    512 KiB activations fit one 2 MiB small segment; the first addmm allocates the 32 MiB cuBLAS
    workspace: 20 + 2 + 32 MiB."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import allocator_gpu

    row = allocator_gpu.run_predict(("MLP | inference",))["MLP | inference"]
    assert row["predicted_reserved_bytes"] == (20 + 2 + 32) * MIB
    assert row["predicted_device_bytes"] == row["predicted_reserved_bytes"] + CONTEXT_BYTES


def test_initial_tensors_in_the_order_module_to_moves_them() -> None:
    """Children first, then a module's own parameters, then its buffers, a shared module once:
    the order ``Module._apply`` (what ``.to("cuda")`` runs) hands the tensors to its function."""
    from meta_widget.memory.report import moved_order

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = nn.Parameter(torch.zeros(1))
            self.proj = nn.Linear(2, 3)
            self.register_buffer("mask", torch.zeros(2))
            self.norm = nn.BatchNorm1d(4)
            self.again = self.proj  # shared

    net = Net()
    seen: list[torch.Tensor] = []
    net._apply(lambda t: seen.append(t) or t)
    first = [t for i, t in enumerate(seen) if all(t is not u for u in seen[:i])]
    order = moved_order(net)
    assert len(order) == len(first) and all(a is b for a, b in zip(order, first, strict=True))


def _mapped_bytes(alloc: CachingAllocator, live: dict[int, Block]) -> int:
    """The bytes of the mapped blocks of every segment, checking that the blocks of each
    segment tile it in address order and that no two free neighbours were left unmerged."""
    blocks = {b for pool in alloc.pools for b in pool.blocks.values()} | set(live.values())
    walked: set[Block] = set()
    mapped = 0
    for head in (b for b in blocks if b.prev is None):
        b: Block | None = head
        while b is not None:
            walked.add(b)
            after = b.next
            if after is not None:
                assert after.prev is b and b.ptr + b.size == after.ptr
                assert b.allocated or after.allocated or b.mapped != after.mapped
            mapped += b.size if b.mapped else 0
            b = after
    assert walked == blocks
    return mapped


@pytest.mark.parametrize("seed", range(24))
def test_random_sequences_keep_the_books(seed: int) -> None:
    """Reserved is the bytes of the segments' mapped blocks, allocated those of the live
    blocks, capacity is never passed, whatever the settings and the order."""
    rnd = random.Random(seed)
    configs = [
        AllocatorConfig(),
        AllocatorConfig(expandable_segments=True),
        AllocatorConfig(max_split_size_mb=64),
        AllocatorConfig(roundup_power2_divisions=4),
    ]
    capacity = (None, 200 * MIB, 400 * MIB)[seed % 3]
    alloc = CachingAllocator(configs[seed % 4], capacity)
    live: dict[int, Block] = {}
    for step in range(200):
        if live and rnd.random() < 0.45:
            alloc.free(live.pop(rnd.choice(list(live))))
        else:
            top = rnd.choice((4096, 2 * MIB, 30 * MIB, 120 * MIB))
            nbytes = rnd.randint(max(1, top // 4), top)
            block = alloc.malloc(nbytes, stream=rnd.choice((0, 0, 1)))
            if block is not None:
                assert block.size >= nbytes
                live[step] = block
        assert _mapped_bytes(alloc, live) == alloc.reserved
        assert alloc.allocated == sum(b.size for b in live.values())
        assert capacity is None or alloc.reserved <= capacity


def test_a_parallel_trace_adds_nccl_buffers_per_mesh_dimension() -> None:
    """FSDP2 over 2 ranks: one communicator, NCCL_BUFFSIZE (4 MiB) x 16 channels x 2 ring
    peers on top of reserved and the context; one device: none."""

    class Deep(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(256, 256) for _ in range(4)])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self.layers:
                x = layer(x)
            return x

    one = mw.analyze(Deep, input_size=(8, 256), mode="training").memory
    assert one.device_bytes - one.reserved_bytes == CONTEXT_BYTES
    sharded = mw.analyze(Deep, input_size=(8, 256), mode="training", parallel={"fsdp": 2})
    mem = sharded.memory
    assert mem.device_bytes - mem.reserved_bytes == CONTEXT_BYTES + 16 * 2 * 4 * MIB


#: passes of benchmarks/results/gpu_truth_h200.json (torch.cuda.max_memory_allocated on an
#: H200, net of the cuBLAS workspaces warmed up before): the four GPT-2 training rows are those
#: where the trace's live bytes are 2.5 % low (tests/test_cuda_truth.py, CLOSE), because the
#: allocator hands a request a whole block when the rest is too small to split
H200_ROWS = (
    "GPT-2 tiny, SDPA | training",
    "GPT-2 tiny, SDPA | training, 4 micro-batches",
    "GPT-2 tiny, eager attention | training",
    "GPT-2 tiny, eager attention | training, 4 micro-batches",
    "MLP | training",
    "CNN (BatchNorm) | training",
    "Llama tiny, SDPA | training",
)


@pytest.mark.parametrize("name", H200_ROWS)
def test_replayed_blocks_equal_the_h200s_max_memory_allocated(name: str) -> None:
    """The replay's allocated peak (blocks as the allocator hands them out: rounded, whole when
    not split) against a real device's ``max_memory_allocated``, within 0.5 %."""
    from meta_widget.memory.report import moved_order, storage_sizes, tensor_sizes
    from meta_widget.trace.passes import trace

    root = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(root / "benchmarks"))
    import gpu_truth

    measured = json.loads((root / "benchmarks/results/gpu_truth_h200.json").read_text())
    case = gpu_truth.CASES[name]
    model, inputs = case.build()
    data = (inputs["x"],) if "x" in inputs else inputs
    a = mw.analyze(
        model, input_data=data, mode="training", device="cuda", foreach=False, **case.options
    )
    assert a.source_model is not None
    given = a.options.input_data
    args, kwargs = ((), given) if isinstance(given, dict) else (tuple(given), {})
    t = trace(a.source_model.module, args, kwargs, a.options.trace_spec())
    tensors = [v for v in inputs.values() if isinstance(v, torch.Tensor)]
    initial = [n for _, n in tensor_sizes(moved_order(a.source_model.module))]
    # the measurement is one step: the first step's allocations, their frees within it
    end = t.step_starts[1] if len(t.step_starts) > 1 else len(t.events)
    first = [
        dataclasses.replace(x, freed=x.freed if x.freed < end else -1)
        for x in t.allocations
        if x.event < end
    ]
    r = replay(first, initial + storage_sizes(tensors))
    truth = measured["cases"][name]["peak_bytes"]
    assert r.peak_allocated_bytes == pytest.approx(truth, rel=0.005)


STORED = Path(__file__).resolve().parent.parent / "benchmarks/results/allocator_h200.json"


@pytest.mark.skipif(
    not STORED.exists(),
    reason="no device measurement yet: run benchmarks/allocator_gpu.py --measure "
    "benchmarks/results/allocator_h200.json on a CUDA machine",
)
def test_reserved_within_3_percent_of_the_devices_max_memory_reserved() -> None:
    """Each case of the stored measurement: the replay's reserved peak against the device's
    ``torch.cuda.max_memory_reserved()`` (the prediction recomputed here, not read back)."""
    sys.path.insert(0, str(STORED.parent.parent))
    import allocator_gpu

    measured = json.loads(STORED.read_text())["cases"]
    for name, row in measured.items():
        if "max_memory_reserved" not in row:
            continue
        predicted = allocator_gpu.prediction(allocator_gpu.CASES[name])
        got = predicted["predicted_reserved_bytes"]
        assert got == pytest.approx(row["max_memory_reserved"], rel=0.03), name
