"""What the views read of an analysis: the :class:`Analyzed` protocol.

The views render an :class:`~meta_widget.analysis.Analysis` but sit below it (the Analysis has
methods that call them, and the pipeline that builds it streams into the widget): they depend
on the shape of what they show, written here, not on the class that holds it. A test checks
that ``Analysis`` has every member named here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..data.records import CallRecord
    from ..data.tree import ModuleNode
    from ..distributed.comms import CommRecord
    from ..memory.report import MemoryReport
    from ..options import Options
    from ..trace.assume import Assumption
    from ..trace.explain import Explanation

__all__ = ["Analyzed"]


class Analyzed(Protocol):
    """An analysis as the views read it (``meta_widget.analysis.Analysis`` says each)."""

    @property
    def title(self) -> str: ...

    @property
    def source(self) -> str: ...

    @property
    def mode(self) -> str: ...

    @property
    def modules(self) -> list[ModuleNode]: ...

    @property
    def calls(self) -> list[CallRecord]: ...

    @property
    def memory(self) -> MemoryReport: ...

    @property
    def total_flops(self) -> int: ...

    @property
    def error(self) -> Explanation | None: ...

    @property
    def notes(self) -> list[str]: ...

    @property
    def traced(self) -> bool: ...

    @property
    def seconds(self) -> float: ...

    @property
    def assumptions(self) -> list[Assumption]: ...

    @property
    def checkpoint_diff(self) -> Any:
        """a ``meta_widget.checkpoints.CheckpointDiff`` (its layer is above the views) or None"""

    @property
    def options(self) -> Options: ...

    @property
    def time(self) -> Any:
        """a ``meta_widget.timing.model.StepTime`` (``analyze(..., gpu=)``) or None"""

    @property
    def comm_records(self) -> list[CommRecord]: ...

    @property
    def stages(self) -> list[Any]:
        """a pipeline's ranks (``meta_widget.distributed.pipelining.StageReport``), or []"""

    @property
    def root(self) -> ModuleNode: ...

    @property
    def total_params(self) -> int: ...

    @property
    def trainable_params(self) -> int: ...

    @property
    def peak_bytes(self) -> int: ...

    @property
    def status(self) -> str: ...

    def summary(self, depth: Any = ...) -> str: ...

    def to_payload(self) -> dict[str, Any]: ...

    def rerun(self, **changes: Any) -> Analyzed: ...
