"""The collectives one rank runs in a parallel trace, and what FSDP2's buffers are.

A :class:`CommWatcher` rides on the recorder of a parallel trace
(``meta_widget.distributed.parallel``):

- every collective op that reaches the dispatcher (``c10d`` ops FSDP2 calls, the functional
  collectives of DTensor and tensor parallelism) becomes a :class:`CommRecord`: the collective,
  its bytes, the process group, the phase, the point of the memory timeline where it ran, and
  the module it serves;
- FSDP2 labels its work with ``record_function`` (``FSDP::all_gather (layers.3)``): the labels
  name the module a collective serves, and the storage allocated under them is known for what
  it is: ``communication buffers`` (all-gather outputs, reduce-scatter inputs) and ``unsharded
  parameters`` (the gathered parameters, copied out of the all-gather output);
- FSDP2 frees and re-allocates unsharded parameters by resizing their storage in place
  (``UntypedStorage.resize_``, which no dispatch mode sees): the watcher patches it for the
  length of the trace and tells the storage tracker.

Bytes of a collective: the bytes of the whole tensor it gathers, reduces or sends: an
all-gather's output, a reduce-scatter's input, an all-reduce's tensor, an all-to-all's input.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from .. import heavy
from ..choices import Phase
from ..data.records import CallRecord
from ..registry import Registry
from .dtensor_cache import DTensorCache
from .fake_kernels import past_the_fake_mode

_LIFT_FRESH = torch.ops.aten.lift_fresh.default

if TYPE_CHECKING:
    import pandas as pd

    from ..trace.recorder import Recorder
    from ..undo import Undo

__all__ = [
    "CommRecord",
    "CommWatcher",
    "collective",
    "comms_frame",
    "comms_totals",
]


@dataclass(frozen=True, slots=True)
class CommRecord:
    """One collective one rank ran (plain data).

    ``bytes``: the whole tensor gathered, reduced or sent (see the module docstring); ``group``:
    the mesh dimension (``"fsdp"``, ``"tp"``) and ``group_size`` its ranks; ``module``: the module
    it serves (FSDP2's label, or the module whose call ran it; ``""`` the root); ``event``: the
    index of the memory timeline at which it ran; ``call``: the module call it ran in, or -1.
    """

    index: int
    collective: str
    bytes: int
    group: str
    group_size: int
    module: str
    phase: str
    event: int
    call: int
    op: str


#: op (overload packet name) -> (collective, bytes of one call from (args, out))
COLLECTIVES: Registry[str, tuple[str, Callable[[tuple[Any, ...], Any], int]]] = Registry(
    "collective"
)


def collective(name: str, *ops: str) -> Callable[[Callable[..., int]], Callable[..., int]]:
    """Register how many bytes the ``ops`` (one collective, ``name``) move per call."""

    def register(count: Callable[..., int]) -> Callable[..., int]:
        for op in ops:
            COLLECTIVES.register(op, (name, count))
        return count

    return register


def _nbytes(x: Any) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(y) for y in x)
    return 0


@collective(
    "all_gather",
    "c10d._allgather_base_",
    "c10d.allgather_",
    "c10d.allgather_into_tensor_coalesced_",
)
def _c10d_output(args: tuple[Any, ...], out: Any) -> int:
    return _nbytes(args[0])


@collective(
    "all_gather",
    "_c10d_functional.all_gather_into_tensor",
    "_c10d_functional.all_gather_into_tensor_coalesced",
    "_c10d_functional_autograd.all_gather_into_tensor",
)
def _functional_output(args: tuple[Any, ...], out: Any) -> int:
    return _nbytes(out)


@collective(
    "reduce_scatter",
    "c10d._reduce_scatter_base_",
    "c10d.reduce_scatter_",
    "c10d.reduce_scatter_tensor_coalesced_",
)
def _c10d_input(args: tuple[Any, ...], out: Any) -> int:
    return _nbytes(args[1])


@collective(
    "reduce_scatter",
    "_c10d_functional.reduce_scatter_tensor",
    "_c10d_functional.reduce_scatter_tensor_coalesced",
    "_c10d_functional_autograd.reduce_scatter_tensor",
)
@collective(
    "all_reduce",
    "c10d.allreduce_",
    "c10d.allreduce_coalesced_",
    "_c10d_functional.all_reduce",
    "_c10d_functional.all_reduce_",
    "_c10d_functional.all_reduce_coalesced",
)
@collective(
    "all_to_all",
    "_c10d_functional.all_to_all_single",
    "_c10d_functional_autograd.all_to_all_single",
)
@collective("broadcast", "c10d.broadcast_", "_c10d_functional.broadcast")
def _first_argument(args: tuple[Any, ...], out: Any) -> int:
    return _nbytes(args[0])


@collective("send", "c10d.send")
@collective("recv", "c10d.recv_")
def _point_to_point(args: tuple[Any, ...], out: Any) -> int:
    return _nbytes(args[0])


@collective("all_to_all", "c10d.alltoall_base_")
def _c10d_all_to_all(args: tuple[Any, ...], out: Any) -> int:
    return _nbytes(args[1])


#: FSDP2's record_function labels: "FSDP::all_gather (layers.0)", "FSDP::post_forward"
_FSDP_LABEL = re.compile(r"^FSDP::(?P<kind>\w+)(?: \((?P<fqn>[^)]*)\))?")
#: what storage allocated under an FSDP2 label is
REGION_CATEGORIES = {
    "all_gather": "communication buffers",
    "all_gather_copy_out": "unsharded parameters",
    "post_backward_reduce": "communication buffers",
}
_ENTER = "profiler._record_function_enter_new"
_WAIT = torch.ops._c10d_functional.wait_tensor.default
_EXIT = "profiler._record_function_exit"
#: the name of each op seen (``str`` of its packet), by op
_NAMES: dict[Any, str] = {}


def _wait_tensor(t: torch.Tensor) -> torch.Tensor:
    """``wait_tensor`` as a device runs it: it returns the tensor it waited for (the fake kernel
    returns a new one, which would count as a second copy of every collective's output)."""
    _WAIT(t)
    return t


class CommWatcher:
    """Watches one parallel trace's ops (see the module docstring). ``groups`` maps process
    group names to (mesh dimension, size)."""

    def __init__(
        self,
        groups: dict[str, tuple[str, int]],
        unlabeled: dict[str, tuple[str, int]] | None = None,
    ) -> None:
        self.groups = groups
        #: groups whose collectives outside FSDP2's regions are another dimension's: a
        #: context-parallel group that FSDP2 shards over too (``fsdp=1``), its ring's
        #: all-gathers ``cp`` and FSDP2's ``fsdp`` (``distributed.context.context_groups``)
        self.unlabeled = unlabeled or {}
        self.records: list[CommRecord] = []
        self._labels: list[str] = []
        self._seen = 0
        self._recorder: Recorder | None = None

    def attach(self, recorder: Recorder, undo: Undo) -> None:
        """Observe ``recorder``'s ops, count FLOPs on local shards, and see storage resizes
        (until ``undo`` runs)."""
        self._recorder = recorder
        recorder.local_flops = True
        recorder.observer = self.observe
        recorder.kernels[_WAIT] = _wait_tensor
        recorder.kernels.update(past_the_fake_mode())
        lift = recorder.kernels.get(_LIFT_FRESH, _LIFT_FRESH)

        def lift_fresh(*args: Any, **kwargs: Any) -> Any:
            # the optimizer's device-less tensors (AdamW's step counters, ``torch.tensor(0.0)``)
            # are on the host in a real run, as a single-device trace leaves them
            out = lift(*args, **kwargs)
            if recorder.phase == Phase.OPTIMIZER and isinstance(out, torch.Tensor):
                recorder.storage.on_host(out)
            return out

        recorder.kernels[_LIFT_FRESH] = lift_fresh
        if recorder.cache is not None:  # the fast path: DTensor calls cached too
            recorder.dtensors = DTensorCache(recorder.cache.stats)
        recorder.asides.append(self._set_aside)
        thread = threading.get_ident()
        original = torch.UntypedStorage.resize_

        def restore() -> None:
            torch.UntypedStorage.resize_ = original  # type: ignore[method-assign]

        def resize_(st: torch.UntypedStorage, size: int) -> Any:
            out = original(st, size)
            if threading.get_ident() == thread:
                self._resized(st)
            return out

        undo.add(restore)
        torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign, assignment]

    def _set_aside(self) -> Callable[[], None]:
        """Record collectives in a list of their own until the returned function puts the
        first list back: the collectives of one step (``Recorder.set_aside``)."""
        kept = self.records
        self.records = []

        def restore() -> None:
            self.records = kept

        return restore

    def observe(self, func: Any, args: tuple[Any, ...], out: Any, owner: CallRecord | None) -> None:
        """After each op: follow FSDP2's labels, record collectives, tag new storage."""
        name = _NAMES.get(func)
        if name is None:
            name = _NAMES[func] = str(func._overloadpacket)  # 2 us a call: once an op
        if name == _ENTER:
            self._labels.append(args[0] if args and isinstance(args[0], str) else "")
        elif name == _EXIT:
            if self._labels:
                self._labels.pop()
        else:
            found = COLLECTIVES.get(name)
            if found is not None:
                self._record(name, found[0], found[1](args, out), args, owner)
        self._tag()

    def _fsdp(self) -> tuple[str, str | None] | None:
        """The innermost FSDP2 label as (kind, module path), or None."""
        for label in reversed(self._labels):
            match = _FSDP_LABEL.match(label)
            if match is not None:
                return match["kind"], match["fqn"]
        return None

    def _record(
        self, op: str, kind: str, nbytes: int, args: tuple[Any, ...], owner: CallRecord | None
    ) -> None:
        recorder = self._recorder
        assert recorder is not None
        fsdp = self._fsdp()
        module = owner.path if owner is not None else ""
        if fsdp is not None:
            module = fsdp[1] or ""
        group, size = self._group(args, self.unlabeled if fsdp is None else {})
        self.records.append(
            CommRecord(
                index=len(self.records),
                collective=kind,
                bytes=nbytes,
                group=group,
                group_size=size,
                module=module,
                phase=recorder.phase,
                event=len(recorder.storage.events),
                call=owner.index if owner is not None else -1,
                op=op,
            )
        )

    def _group(self, args: tuple[Any, ...], first: dict[str, tuple[str, int]]) -> tuple[str, int]:
        for a in args:
            name = None
            if isinstance(a, str):
                name = a
            elif isinstance(a, torch.ScriptObject):
                try:
                    name = torch.distributed.ProcessGroup.unbox(a).group_name
                except (RuntimeError, TypeError, AttributeError):
                    continue
            if name is not None and name in first:
                return first[name]
            if name is not None and name in self.groups:
                return self.groups[name]
        return "", 0

    def _tag(self) -> None:
        """Give storage allocated under an FSDP2 label its category."""
        recorder = self._recorder
        assert recorder is not None
        allocations = recorder.storage.allocations
        if len(allocations) == self._seen:
            return
        fsdp = self._fsdp()
        category = REGION_CATEGORIES.get(fsdp[0]) if fsdp is not None else None
        if category is not None:
            for a in allocations[self._seen :]:
                a.category = category
        self._seen = len(allocations)

    def _resized(self, st: torch.UntypedStorage) -> None:
        recorder = self._recorder
        assert recorder is not None
        owner, backward = recorder.callstack.owner()
        recorder.storage.resized(st, "resize_", owner, backward)
        self._tag()


#: the columns of ``Analysis.comms``
COMM_COLUMNS = ("module", "phase", "collective", "bytes", "group", "group_size", "event", "op")


def comms_frame(records: list[CommRecord]) -> pd.DataFrame:
    """One row per collective, in order (``Analysis.comms``)."""
    pd = heavy.pandas()
    return pd.DataFrame(
        [{c: getattr(r, c) for c in COMM_COLUMNS} for r in records], columns=list(COMM_COLUMNS)
    )


def comms_totals(records: list[CommRecord]) -> pd.DataFrame:
    """The collectives of one step, summed by phase, collective and group: ``calls``, ``bytes``."""
    pd = heavy.pandas()
    totals: dict[tuple[str, str, str], list[int]] = {}
    for r in records:
        entry = totals.setdefault((r.phase, r.collective, r.group), [0, 0])
        entry[0] += 1
        entry[1] += r.bytes
    return pd.DataFrame(
        [
            {"phase": p, "collective": c, "group": g, "calls": n, "bytes": b}
            for (p, c, g), (n, b) in totals.items()
        ],
        columns=["phase", "collective", "group", "calls", "bytes"],
    )
