"""FSDP2's shard of a parameter, cut without cutting every other rank's.

FSDP2 (torch 2.13, ``_fsdp_param.FSDPParam``) cuts each parameter into one chunk per rank of
its mesh (``_fsdp_common._chunk_with_empty``: ``torch.chunk``, then an empty tensor for each
rank past the last chunk) and reads two of them: this rank's, and the first, whose size is the
padded shard's. On the fake process group of a large mesh that is one fake tensor per rank, per
parameter, per trace: a 2-layer trace of the 405B under FSDP 2,048 x TP 8 spent 3.3 of its
5.7 s making them.

:func:`cut_on_demand` swaps in :class:`Chunks`, the same list with each chunk cut when it is
read: ``narrow`` at the offset and length ``torch.chunk`` gives it (the same view: size, stride
and storage offset), an empty tensor past the last, as ``_chunk_with_empty`` pads. It is on
while a parallel trace's world exists (``World.__enter__``); :func:`cut_every_chunk` puts
FSDP2's own back (``World.__exit__``, on every path).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, overload

import torch
from torch.distributed.fsdp._fully_shard import _fsdp_common, _fsdp_param

__all__ = ["Chunks", "cut_every_chunk", "cut_on_demand"]

#: FSDP2's own function, which ``_fsdp_param`` imported by name
_ORIGINAL = _fsdp_common._chunk_with_empty


class Chunks(Sequence[torch.Tensor]):
    """``_chunk_with_empty(tensor, num_chunks, dim)`` as a list whose chunks are cut when read:
    chunk ``i`` of ``torch.chunk`` (``ceil(size / num_chunks)`` rows a chunk, the last
    shorter), then empty 1-D tensors up to ``num_chunks``."""

    def __init__(self, tensor: torch.Tensor, num_chunks: int, dim: int) -> None:
        self._tensor, self._count, self._dim = tensor, num_chunks, dim
        self._size = tensor.size(dim)
        self._step = -(-self._size // num_chunks)
        self._cut = -(-self._size // self._step)  # the chunks torch.chunk returns

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> torch.Tensor: ...
    @overload
    def __getitem__(self, index: slice) -> list[torch.Tensor]: ...
    def __getitem__(self, index: int | slice) -> torch.Tensor | list[torch.Tensor]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._count))]
        i = index + self._count if index < 0 else index
        if not 0 <= i < self._count:
            raise IndexError(f"chunk {index} of {self._count}")
        if i >= self._cut:
            return self[0].new_empty(0)
        start = i * self._step
        return self._tensor.narrow(self._dim, start, min(self._step, self._size - start))


def _chunk_on_demand(tensor: torch.Tensor, num_chunks: int, dim: int) -> Any:
    if num_chunks < 1 or tensor.size(dim) == 0:  # FSDP2's own answer (or error)
        return _ORIGINAL(tensor, num_chunks, dim)
    return Chunks(tensor, num_chunks, dim)


def cut_on_demand() -> None:
    """From now on FSDP2 cuts only the chunks it reads (``World.__enter__``)."""
    _fsdp_param._chunk_with_empty = _chunk_on_demand  # type: ignore[attr-defined]


def cut_every_chunk() -> None:
    """FSDP2's own ``_chunk_with_empty`` again (``World.__exit__``, on every path)."""
    _fsdp_param._chunk_with_empty = _ORIGINAL  # type: ignore[attr-defined]
