"""PyTorch's CUDA caching allocator as a model: :class:`CachingAllocator` (its rules only).

``torch.cuda.max_memory_allocated()`` counts the blocks tensors hold; the allocator *reserves*
more: it asks CUDA for whole segments (``cudaMalloc``) and keeps them cached when tensors die.
This is its algorithm (``c10/cuda/CUDACachingAllocator.cpp``, PyTorch 2.x, and
``docs/source/notes/cuda.rst``, "Memory management"), written again from the rules, for
``meta_widget.memory.allocator.replay`` to run over a trace. The rules, as the source states them:

- **Rounding.** A request is rounded up to a multiple of 512 B (``kMinBlockSize``; 1 B takes
  512 B). With ``roundup_power2_divisions`` = N, a request over ``512 * N`` is rounded up to the
  next of N equal steps between two powers of two instead (a power of two stays as it is).
- **Pools.** Rounded requests of at most 1 MiB (``kSmallSize``) come from the *small* pool, the
  rest from the *large* pool; a block never moves between pools, nor between streams.
- **Segments.** When no cached block fits, a new segment is reserved: 2 MiB (``kSmallBuffer``)
  for a small request, 20 MiB (``kLargeBuffer``) for a large one under 10 MiB
  (``kMinLargeAlloc``), the request rounded up to a multiple of 2 MiB (``kRoundLarge``) above.
- **Best fit.** The smallest free block of the pool (same stream) that is large enough; among
  equal sizes the lowest address. A request under ``max_split_size`` never takes a block of at
  least ``max_split_size`` ("oversize"); a request of at least ``max_split_size`` takes an
  oversize block only if it wastes less than ``max_non_split_rounding_size`` (default 20 MiB).
- **Splitting.** The block is split and the rest stays cached when the rest is at least 512 B
  (small pool, or any pool with expandable segments), or, in the large pool, when the rest is
  over 1 MiB and the request is under ``max_split_size``; otherwise the request holds the whole
  block (and ``allocated`` counts it whole, as PyTorch's statistics do).
- **Merging.** A freed block merges with the free neighbours of its own segment.
- **No release.** Segments stay reserved (no ``empty_cache()``). Only when a new segment would
  not fit under ``capacity`` does the allocator release cached memory and retry: first oversize
  free blocks (when ``max_split_size`` is set), then every segment wholly free (and the wholly
  free pages of expandable segments); a request that still does not fit is an out-of-memory
  error (:attr:`Reserved.failed_index`).
- **Expandable segments** (``expandable_segments:True``): one segment per pool and stream that
  grows by mapping pages (2 MiB in the small pool, 20 MiB in the large one) at the lowest
  address where the request fits, merging with a free block just before it. Pages are unmapped
  only when memory is released (above), not on a free.

Not modelled: CUDA graphs' private pools, ``garbage_collection_threshold``, several devices,
streams other than those the caller gives, events delaying a free across streams.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections.abc import Iterable
from dataclasses import dataclass

from ..options import OptionError

__all__ = [
    "DEFAULT_CONFIG",
    "KIB",
    "MIB",
    "AllocatorConfig",
    "CachingAllocator",
    "allocation_size",
    "round_size",
]

KIB = 1024
MIB = 1024 * KIB
#: the allocator's constants (``CUDACachingAllocator.cpp``)
MIN_BLOCK = 512  # kMinBlockSize
SMALL_SIZE = 1 * MIB  # kSmallSize: the largest small request
SMALL_BUFFER = 2 * MIB  # kSmallBuffer: a small pool's segment, and its expandable page
LARGE_BUFFER = 20 * MIB  # kLargeBuffer: a segment for 1-10 MiB requests, a large page
MIN_LARGE_ALLOC = 10 * MIB  # kMinLargeAlloc
ROUND_LARGE = 2 * MIB  # kRoundLarge
#: ``expandable_segments`` reserve address space for 1 1/8 of the device; with no capacity given
_ADDRESS_SPACE = 1 << 46
_NO_LIMIT = 1 << 62
_NUMBERS = ("max_split_size_mb", "max_non_split_rounding_mb", "roundup_power2_divisions")


@dataclass(frozen=True)
class AllocatorConfig:
    """The allocator's settings, named as ``PYTORCH_CUDA_ALLOC_CONF`` names them.

    Parameters
    ----------
    max_split_size_mb
        Blocks of at least this many MiB are never split (None: no limit, the default).
    max_non_split_rounding_mb
        How much larger than a request of at least ``max_split_size`` a cached oversize block
        may be and still serve it, in MiB (default 20, ``kLargeBuffer``).
    roundup_power2_divisions
        Round requests up to one of this many steps between powers of two (0 or 1: off).
    expandable_segments
        Grow one segment per pool and stream by pages instead of reserving new segments.
    """

    max_split_size_mb: int | None = None
    max_non_split_rounding_mb: int = 20
    roundup_power2_divisions: int = 0
    expandable_segments: bool = False

    def __post_init__(self) -> None:
        if self.max_split_size_mb is not None and self.max_split_size_mb <= 20:
            raise OptionError(
                f"max_split_size_mb must be over 20 (PyTorch refuses {self.max_split_size_mb}: "
                "a split block must leave room for kLargeBuffer); pass None for no limit"
            )
        d = self.roundup_power2_divisions
        if d < 0 or (d > 1 and d & (d - 1)):
            raise OptionError(f"roundup_power2_divisions must be a power of two, not {d}")

    @property
    def max_split_size(self) -> int:
        """``max_split_size_mb`` in bytes (a huge number when unset)."""
        return _NO_LIMIT if self.max_split_size_mb is None else self.max_split_size_mb * MIB

    @classmethod
    def parse(cls, text: str) -> AllocatorConfig:
        """The settings of a ``PYTORCH_CUDA_ALLOC_CONF`` string, e.g.
        ``"expandable_segments:True,max_split_size_mb:128"``; other keys are refused."""
        kwargs: dict[str, object] = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            key, _, value = item.partition(":")
            if key == "expandable_segments":
                kwargs[key] = value == "True"
            elif key in _NUMBERS and value.isdigit():
                kwargs[key] = int(value)
            else:
                raise OptionError(
                    f"PYTORCH_CUDA_ALLOC_CONF item {item!r} is not modelled: use "
                    "expandable_segments, max_split_size_mb, max_non_split_rounding_mb or "
                    "roundup_power2_divisions (a single number)"
                )
        return cls(**kwargs)  # type: ignore[arg-type]


#: PyTorch's defaults (no ``PYTORCH_CUDA_ALLOC_CONF``)
DEFAULT_CONFIG = AllocatorConfig()


def round_size(size: int, config: AllocatorConfig = DEFAULT_CONFIG) -> int:
    """The block size a request of ``size`` bytes is rounded up to (``round_size``)."""
    if size < MIN_BLOCK:
        return MIN_BLOCK
    d = config.roundup_power2_divisions
    if d > 1 and size > MIN_BLOCK * d:
        if size & (size - 1) == 0:
            return size
        floor = 1 << (size.bit_length() - 1)
        step = floor >> (d.bit_length() - 1)
        if step == 0:
            return floor << 1
        return size if size % step == 0 else (size // step + 1) * step
    return MIN_BLOCK * math.ceil(size / MIN_BLOCK)


def allocation_size(size: int) -> int:
    """The segment reserved for a rounded request that no cached block serves."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return ROUND_LARGE * math.ceil(size / ROUND_LARGE)


class Block:
    """A piece of a segment: free, allocated or (expandable) unmapped address space."""

    __slots__ = (
        "allocated",
        "mapped",
        "next",
        "page",
        "prev",
        "ptr",
        "segment",
        "size",
        "small",
        "stream",
    )

    def __init__(self, ptr: int, size: int, small: bool, stream: int, segment: int) -> None:
        self.ptr = ptr
        self.size = size
        self.small = small
        self.stream = stream
        self.segment = segment
        self.allocated = False
        self.mapped = True
        self.page = 0  # an expandable segment's page size, 0 for a cudaMalloc'd segment
        self.prev: Block | None = None
        self.next: Block | None = None

    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None


class _Pool:
    """One pool's cached blocks: the free ones in best-fit order (stream, size, address) and
    the unmapped address space of expandable segments by (stream, address)."""

    def __init__(self, small: bool) -> None:
        self.small = small
        self.free: list[tuple[int, int, int]] = []
        self.unmapped: list[tuple[int, int]] = []
        self.blocks: dict[tuple[int, ...], Block] = {}

    def add(self, b: Block) -> None:
        key = (b.stream, b.size, b.ptr)  # the free blocks' order: stream, size, address
        insort(self.free, key)
        self.blocks[key] = b

    def remove(self, b: Block) -> None:
        free = self.free
        i = bisect_left(free, (b.stream, b.size, b.ptr))
        assert self.blocks.pop(free.pop(i)) is b

    def add_unmapped(self, b: Block) -> None:
        insort(self.unmapped, (b.stream, b.ptr))
        self.blocks[(b.stream, b.ptr)] = b

    def remove_unmapped(self, b: Block) -> None:
        i = bisect_left(self.unmapped, (b.stream, b.ptr))
        assert self.blocks.pop(self.unmapped.pop(i)) is b


class CachingAllocator:
    """One device's caching allocator (see the module docstring): :meth:`malloc`, :meth:`free`.

    ``capacity``: the bytes it may reserve (None: unlimited). ``reserved`` / ``allocated`` are
    the bytes of segments (mapped pages) reserved and of blocks handed out, with their peaks.
    """

    def __init__(self, config: AllocatorConfig = DEFAULT_CONFIG, capacity: int | None = None):
        self.config = config
        self.capacity = capacity
        # read on every request (the config is frozen)
        self._split_limit = config.max_split_size
        self._expandable = config.expandable_segments
        self._oversize_slack = config.max_non_split_rounding_mb * MIB
        self.pools = (_Pool(small=True), _Pool(small=False))
        self.reserved = self.allocated = self.peak_reserved = self.peak_allocated = 0
        self.segments = 0
        self.retries = 0
        self._next_ptr = 0
        self._expandables = 0

    def unlink(self, held: Iterable[Block] = ()) -> None:
        """Cut the links between neighbouring blocks (each segment's list, a cycle of references)
        once a replay is over, so that its blocks are freed without the garbage collector:
        ``held`` are the blocks handed out and not freed, the pools know the rest."""
        todo = [*held, *(b for pool in self.pools for b in pool.blocks.values())]
        while todo:
            b = todo.pop()
            for other in (b.prev, b.next):
                if other is not None:
                    todo.append(other)
            b.prev = b.next = None

    # -- requests -------------------------------------------------------------------------
    def malloc(self, nbytes: int, stream: int = 0) -> Block | None:
        """Hand out a block for ``nbytes`` on ``stream``; None: out of memory under capacity."""
        size = round_size(nbytes, self.config)
        pool = self.pools[0] if size <= SMALL_SIZE else self.pools[1]
        block = self._best_fit(pool, size, stream)
        if block is None:
            block = self._new_block(pool, size, stream)
        if block is None and self._release_oversize(pool, size, stream):
            block = self._new_block(pool, size, stream)
        if block is None:
            self.retries += 1
            self._release_all()
            block = self._new_block(pool, size, stream)
        if block is None:
            return None
        if self._should_split(block, size):
            pool.add(_split_off(block, size))
        block.allocated = True
        self.allocated += block.size
        if self.allocated > self.peak_allocated:
            self.peak_allocated = self.allocated
        return block

    def free(self, block: Block) -> None:
        """Return ``block`` to its pool, merged with its free neighbours."""
        block.allocated = False
        self.allocated -= block.size
        pool = self.pools[0] if block.small else self.pools[1]
        before, after = block.prev, block.next
        if before is not None and not before.allocated:
            self._merge(block, before, pool)
        if after is not None and not after.allocated:
            self._merge(block, after, pool)
        pool.add(block)

    # -- finding a block ------------------------------------------------------------------
    def _best_fit(self, pool: _Pool, size: int, stream: int) -> Block | None:
        free = pool.free
        i = bisect_left(free, (stream, size, -1))
        if i == len(free) or free[i][0] != stream:
            return None
        if self._expandable:
            # the size a block of an expandable segment can grow to decides the best fit
            while (
                pool.blocks[free[i]].page
                and i + 1 < len(free)
                and free[i + 1][0] == stream
                and _growable(pool.blocks[free[i + 1]]) < _growable(pool.blocks[free[i]])
            ):
                i += 1
        block = pool.blocks[free[i]]
        limit = self._split_limit
        if size < limit <= block.size:
            return None  # an oversize block for a request that is not
        if size >= limit and block.size >= size + self._oversize_slack:
            return None
        del pool.blocks[free.pop(i)]  # ``pool.remove(block)``, its place known
        return block

    def _should_split(self, block: Block, size: int) -> bool:
        rest = block.size - size
        if block.small or self._expandable:
            return rest >= MIN_BLOCK
        return size < self._split_limit and rest > SMALL_SIZE

    # -- reserving --------------------------------------------------------------------------
    def _new_block(self, pool: _Pool, size: int, stream: int) -> Block | None:
        if self.config.expandable_segments:
            return self._expand(pool, size, stream)
        nbytes = allocation_size(size)
        if self.capacity is not None and self.reserved + nbytes > self.capacity:
            return None
        block = Block(self._next_ptr, nbytes, pool.small, stream, self._next_ptr)
        self._next_ptr += nbytes + ROUND_LARGE  # a gap: segments never touch
        self.segments += 1
        self._grow(nbytes)
        return block

    def _grow(self, nbytes: int) -> None:
        self.reserved += nbytes
        self.peak_reserved = max(self.peak_reserved, self.reserved)

    def _expand(self, pool: _Pool, size: int, stream: int) -> Block | None:
        candidate = self._expandable_candidate(pool, size, stream)
        if not candidate.mapped:
            mapped = self._map(pool, candidate, min(candidate.size, size))
            if mapped is None:
                return None
            candidate = mapped
        while candidate.size < size:
            after = candidate.next
            assert after is not None and not after.mapped
            mapped = self._map(pool, after, min(size - candidate.size, after.size))
            if mapped is None:
                return None
            candidate = mapped
        pool.remove(candidate)
        return candidate

    def _expandable_candidate(self, pool: _Pool, size: int, stream: int) -> Block:
        """The lowest address of an expandable segment of ``stream`` with room for ``size``
        (free and unmapped blocks in a row), or a new segment's address space."""
        for where in pool.unmapped:
            if where[0] != stream:
                continue
            block = pool.blocks[where]
            c = block.prev if block.prev is not None and not block.prev.allocated else block
            room, b = 0, c  # type: tuple[int, Block | None]
            while room < size and b is not None and not b.allocated:
                room, b = room + b.size, b.next
            if room >= size:
                return c
        space = _ADDRESS_SPACE if self.capacity is None else self.capacity + self.capacity // 8
        page = SMALL_BUFFER if pool.small else LARGE_BUFFER
        space = page * math.ceil(space / page)
        self._expandables += 1
        base = (1 << 56) + (self._expandables << 48)  # far from every other segment
        block = Block(base, space, pool.small, stream, base)
        block.page, block.mapped = page, False
        self.segments += 1
        pool.add_unmapped(block)
        return block

    def _map(self, pool: _Pool, block: Block, size: int) -> Block | None:
        """Map the pages covering the first ``size`` bytes of unmapped ``block``; the mapped
        block merges with free mapped neighbours. None when the pages exceed ``capacity``."""
        nbytes = block.page * math.ceil(size / block.page)
        if self.capacity is not None and self.reserved + nbytes > self.capacity:
            return None
        pool.remove_unmapped(block)
        block.mapped = True
        if nbytes < block.size:
            rest = _split_off(block, nbytes)
            rest.mapped = False
            pool.add_unmapped(rest)
        self._merge(block, block.prev, pool)
        self._merge(block, block.next, pool)
        pool.add(block)
        self._grow(nbytes)
        return block

    def _merge(self, dst: Block, src: Block | None, pool: _Pool) -> None:
        if src is None or src.allocated or src.mapped != dst.mapped:
            return
        if src.mapped:
            pool.remove(src)
        else:
            pool.remove_unmapped(src)
        if dst.prev is src:
            dst.ptr, dst.prev = src.ptr, src.prev
            if src.prev is not None:
                src.prev.next = dst
        else:
            dst.next = src.next
            if src.next is not None:
                src.next.prev = dst
        dst.size += src.size

    # -- releasing ---------------------------------------------------------------------------
    def _release_oversize(self, pool: _Pool, size: int, stream: int) -> bool:
        """Free cached oversize blocks (whole segments) until ``size`` would fit
        (``release_available_cached_blocks``); False when ``max_split_size`` is unset."""
        limit = self.config.max_split_size
        if limit == _NO_LIMIT:
            return False
        target = max(size, limit)
        i = bisect_left(pool.free, (stream, target, -1))
        if i < len(pool.free) and pool.free[i][0] == stream:
            return self._release(pool, pool.blocks[pool.free[i]])
        released = 0
        for where in reversed(pool.free[:i]):
            if released >= target or where[0] != stream or where[1] < limit:
                break
            if self._release(pool, pool.blocks[where]):
                released += where[1]
        return released >= target

    def _release(self, pool: _Pool, block: Block) -> bool:
        if block.is_split() or block.page:
            return False
        pool.remove(block)
        self.reserved -= block.size
        self.segments -= 1
        return True

    def _release_all(self) -> None:
        """``release_cached_blocks``: every wholly free segment, every free page."""
        for pool in self.pools:
            for block in [pool.blocks[where] for where in pool.free]:
                if block.page:
                    self._unmap(pool, block)
                elif not block.is_split():
                    self._release(pool, block)

    def _unmap(self, pool: _Pool, block: Block) -> None:
        page = block.page
        first = block.segment + page * math.ceil((block.ptr - block.segment) / page)
        last = block.segment + page * ((block.ptr + block.size - block.segment) // page)
        if first >= last:
            return
        pool.remove(block)
        for start, end in ((block.ptr, first), (last, block.ptr + block.size)):
            if end > start:  # the free bytes around the unmapped pages stay mapped
                part = Block(start, end - start, block.small, block.stream, block.segment)
                part.page = page
                if start < first:
                    part.prev, part.next = block.prev, block
                    if block.prev is not None:
                        block.prev.next = part
                    block.prev = part
                else:
                    part.prev, part.next = block, block.next
                    if block.next is not None:
                        block.next.prev = part
                    block.next = part
                pool.add(part)
        block.ptr, block.size, block.mapped = first, last - first, False
        self.reserved -= block.size
        self._merge(block, block.prev, pool)
        self._merge(block, block.next, pool)
        if block.is_split():
            pool.add_unmapped(block)
        else:
            self.segments -= 1  # nothing mapped is left: the segment goes


def _growable(b: Block) -> int:
    """What a free block of an expandable segment can grow to: itself and the unmapped space
    right after it."""
    return b.size + (b.next.size if b.next is not None and not b.next.mapped else 0)


def _split_off(block: Block, size: int) -> Block:
    """Cut ``block`` to its first ``size`` bytes; the rest becomes the block after it in its
    segment (same stream, segment and page size), returned for the caller to pool."""
    rest = Block(block.ptr + size, block.size - size, block.small, block.stream, block.segment)
    rest.page = block.page
    rest.prev, rest.next = block, block.next
    if block.next is not None:
        block.next.prev = rest
    block.next = rest
    block.size = size
    return rest
