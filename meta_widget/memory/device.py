"""What a process holds on the GPU beyond its tensors: one table, each figure with its source.

``device_bytes`` = the caching allocator's reserved peak (``allocator.replay``) + the CUDA
context + NCCL's buffers under ``parallel=``. The cuBLAS workspace is *not* added here: PyTorch
allocates it through the caching allocator (``getNewWorkspace`` in
``aten/src/ATen/cuda/CublasHandlePool.cpp``), so the replay holds it as an allocation of its own
and it is part of the reserved bytes (:func:`workspaces`).

:data:`OVERHEADS` is the table; ``docs/numbers.md`` prints it. A figure no source gives is
marked as an estimate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .caching import KIB, MIB

if TYPE_CHECKING:
    from ..data.records import Event

__all__ = [
    "CONTEXT_BYTES",
    "NCCL_BUFFSIZE",
    "OVERHEADS",
    "Overhead",
    "cublas_workspace_bytes",
    "device_bytes",
    "nccl_bytes",
    "workspaces",
]


@dataclass(frozen=True)
class Overhead:
    """One figure of :data:`OVERHEADS`: what it is, for which GPUs, its bytes and source."""

    what: str
    applies_to: str
    nbytes: int
    source: str
    estimate: bool = False


#: cuBLAS's workspace per (thread, stream), PyTorch's default (``parseChosenWorkspaceSize``):
#: ``:4096:8`` (8 x 4 MiB) on compute capability 9.x, 10.x and 12.x, ``:4096:2:16:8`` before
CUBLAS_WORKSPACE_HOPPER = 4096 * KIB * 8
CUBLAS_WORKSPACE_OLDER = 4096 * KIB * 2 + 16 * KIB * 8
#: the CUDA context with lazy module loading, measured with nvidia-smi (see OVERHEADS)
CONTEXT_BYTES = 426 * MIB
#: NCCL_BUFFSIZE's default: the buffer of one channel to one peer
NCCL_BUFFSIZE = 4 * MIB
#: channels of one communicator and peers of each (a ring: the previous and next rank);
#: an estimate, NCCL picks the channels from the topology at run time
NCCL_CHANNELS = 16
NCCL_PEERS = 2

OVERHEADS: tuple[Overhead, ...] = (
    Overhead(
        "cuBLAS workspace (held inside reserved, one per thread that runs a GEMM)",
        "compute capability 9.x, 10.x, 12.x (Hopper, Blackwell)",
        CUBLAS_WORKSPACE_HOPPER,
        "PyTorch aten/src/ATen/cuda/CublasHandlePool.cpp, parseChosenWorkspaceSize: default "
        "':4096:8' (32 MiB) for major 9/10/12; CUBLAS_WORKSPACE_CONFIG ':SIZE:COUNT' KiB "
        "overrides it; cuBLASLt shares it (TORCH_CUBLASLT_UNIFIED_WORKSPACE, default on)",
    ),
    Overhead(
        "cuBLAS workspace (held inside reserved, one per thread that runs a GEMM)",
        "older GPUs (Ampere, Ada, ...)",
        CUBLAS_WORKSPACE_OLDER,
        "PyTorch CublasHandlePool.cpp: default ':4096:2:16:8' = 2 x 4 MiB + 8 x 16 KiB",
    ),
    Overhead(
        "CUDA context (driver state, kernels loaded lazily)",
        "CUDA >= 11.7 with CUDA_MODULE_LOADING=LAZY (PyTorch's default since 1.13)",
        CONTEXT_BYTES,
        "426 MiB in nvidia-smi on an RTX 6000 Ada, PyTorch 2.10+cu130 (unsloth-zoo PR #1053); "
        "'around 400MB' (ptrblck, pytorch#109888); 287,047,680 B with a 6.4 MB tensor, CUDA "
        "11.7 (pytorch PR #86509). Other GPUs, drivers and libraries loaded (cuDNN, NCCL) "
        "move it by an estimated +-150 MiB",
        estimate=True,
    ),
    Overhead(
        "CUDA context, eager module loading",
        "CUDA < 11.7, or CUDA_MODULE_LOADING=EAGER",
        666_632_192,
        "pytorch PR #86509: 666,632,192 B with CUDA_MODULE_LOADING=DEFAULT (CUDA 11.7); "
        "over 1000 MB before 11.7 (ptrblck, pytorch#107667); not used by device_bytes",
        estimate=True,
    ),
    Overhead(
        "NCCL buffers, per communicator (parallel= only)",
        "NCCL_BUFFSIZE default; 16 channels x 2 ring peers",
        NCCL_CHANNELS * NCCL_PEERS * NCCL_BUFFSIZE,
        "NCCL docs, Environment Variables, NCCL_BUFFSIZE: 'the size of the buffer used by "
        "NCCL when communicating data between pairs of GPUs', default 4194304 (4 MiB), per "
        "channel and peer; the channel count (NCCL picks 2-32 from the topology) is an "
        "estimate, as are the LL/LL128 protocol buffers left out",
        estimate=True,
    ),
)

#: the ops that call cuBLAS (a GEMM or GEMV), as trace events name them
_GEMMS = frozenset(
    "aten." + name
    for name in (
        "mm",
        "addmm",
        "bmm",
        "baddbmm",
        "addbmm",
        "mv",
        "addmv",
        "dot",
        "vdot",
        "_addmm_activation",
        "_scaled_mm",
        "_int_mm",
    )
)


def cublas_workspace_bytes(capability: int | None = 9) -> int:
    """PyTorch's default cuBLAS workspace on a GPU of compute capability major ``capability``
    (None: unknown, taken as Hopper's, today's training GPUs)."""
    return CUBLAS_WORKSPACE_HOPPER if capability in (None, 9, 10, 12) else CUBLAS_WORKSPACE_OLDER


def workspaces(events: Sequence[Event], nbytes: int) -> list[tuple[int, int]]:
    """Where a real run allocates its cuBLAS workspaces, as ``replay``'s ``extra``: one per
    thread, before its first GEMM. The forward pass and the optimizer run on the Python
    thread; autograd runs the backward on a thread of its own (one per CUDA device), which
    makes its own handle and workspace. ``(event, nbytes)`` pairs; none without GEMMs."""
    out: list[tuple[int, int]] = []
    seen: set[bool] = set()
    for i, e in enumerate(events):
        backward = e.phase == "backward"
        if backward not in seen and e.nbytes > 0 and e.op.split(" ")[0] in _GEMMS:
            seen.add(backward)
            out.append((i, nbytes))
    return out


def nccl_bytes(communicators: int) -> int:
    """NCCL's buffers for ``communicators`` communicators (an estimate, see OVERHEADS)."""
    return communicators * NCCL_CHANNELS * NCCL_PEERS * NCCL_BUFFSIZE


def device_bytes(reserved: int, communicators: int = 0, context: int = CONTEXT_BYTES) -> int:
    """What ``nvidia-smi`` would show the process using at its peak: the reserved peak, the
    CUDA context and NCCL's buffers for ``communicators`` (0: one device)."""
    return reserved + context + nccl_bytes(communicators)
