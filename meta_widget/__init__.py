"""meta_widget: see any PyTorch model on the meta device, without spending a byte on its weights.

>>> import meta_widget as mw
>>> a = mw.analyze(model, input_size=(1, 3, 224, 224))
>>> a.total_params, a.total_flops, a.peak_bytes
>>> a  # in a notebook: the widget

Heavy libraries (torch, pandas, plotly, anywidget) are imported on first use, so that
``import meta_widget`` stays fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "GPU",
    "Analysis",
    "BoundError",
    "CheckpointError",
    "CheckpointPlan",
    "CommandError",
    "Comparison",
    "ConcurrentTraceError",
    "EstimateError",
    "Fit",
    "FitError",
    "Graph",
    "GraphDependencyError",
    "HubError",
    "InputError",
    "InsufficientMemoryError",
    "KVCache",
    "LayoutError",
    "MaterializeError",
    "MeasureError",
    "Measured",
    "MemorySnapshot",
    "MetaValueNeeded",
    "MetaWidget",
    "MetaWidgetError",
    "NothingFitsError",
    "OptionError",
    "OptionTypeError",
    "Options",
    "Parallel",
    "ParallelError",
    "PipelineAnalysis",
    "PipelineError",
    "Plan",
    "PlanError",
    "RemoteCodeError",
    "SnapshotError",
    "SourceError",
    "Sweep",
    "TraceSpec",
    "UnsafeCheckpointError",
    "UsageError",
    "analyze",
    "analyze_pipeline",
    "checkpoint_diff",
    "compare",
    "explain",
    "gpus",
    "inspect_checkpoint",
    "load_ipython_extension",
    "load_snapshot",
    "materialize",
    "max_fit",
    "measure",
    "plan",
    "plan_checkpointing",
    "register_bound",
    "register_explanation",
    "register_source",
    "sweep",
    "unload_ipython_extension",
]

# errors.py and trace/explain.py import only the standard library at the top. No public name is
# also a submodule's (tests/test_docs.py): Python binds an imported submodule over the name.
from .errors import MetaWidgetError
from .trace.explain import explain

#: where each public name lives, imported on first use
_WHERE = {
    "Analysis": "analysis",
    "Options": "options",
    "analyze": "analysis",
    "MetaWidget": "views.widget",
    "inspect_checkpoint": "checkpoints",
    "checkpoint_diff": "checkpoints",
    "CheckpointError": "checkpoints",
    "UnsafeCheckpointError": "checkpoints",
    "materialize": "materialization",
    "MaterializeError": "materialization",
    "InsufficientMemoryError": "materialization",
    "load_ipython_extension": "magics",
    "unload_ipython_extension": "magics",
    "OptionError": "options",
    "OptionTypeError": "options",
    "InputError": "options",
    "LayoutError": "options",
    "Parallel": "options",
    "SourceError": "sources.models",
    "HubError": "sources.hub",
    "RemoteCodeError": "sources.hub",
    "ConcurrentTraceError": "trace.passes",
    "EstimateError": "views.estimates",
    "ParallelError": "distributed.parallel",
    "MetaValueNeeded": "trace.assume",
    "register_bound": "trace.bounds",
    "register_explanation": "trace.known_errors",
    "register_source": "sources.models",
    "TraceSpec": "options",
    "BoundError": "trace.bounds",
    "UsageError": "cli",
    "CommandError": "cli",
    "sweep": "explore.sweeps",
    "Sweep": "explore.sweeps",
    "max_fit": "explore.fit",
    "Fit": "explore.fit",
    "FitError": "explore.fit",
    "NothingFitsError": "explore.fit",
    "compare": "explore.comparison",
    "gpus": "timing.gpus",
    "GPU": "timing.gpus",
    "KVCache": "memory.kv_cache",
    "Comparison": "explore.comparison",
    "plan_checkpointing": "explore.checkpointing",
    "CheckpointPlan": "explore.checkpointing",
    "PlanError": "explore.checkpointing",
    "plan": "explore.plan",
    "measure": "explore.measure",
    "Measured": "explore.measure",
    "MeasureError": "explore.measure",
    "analyze_pipeline": "explore.pipelines",
    "PipelineAnalysis": "explore.pipelines",
    "PipelineError": "explore.pipelines",
    "load_snapshot": "views.snapshot",
    "MemorySnapshot": "views.snapshot",
    "SnapshotError": "memory.snapshot",
    "Plan": "explore.plan_result",
    "Graph": "views.graph_frame",
    "GraphDependencyError": "views.graph_frame",
}

if TYPE_CHECKING:
    from .analysis import Analysis, analyze
    from .checkpoints import (
        CheckpointError,
        UnsafeCheckpointError,
        checkpoint_diff,
        inspect_checkpoint,
    )
    from .cli import CommandError, UsageError
    from .distributed.parallel import ParallelError
    from .explore.checkpointing import CheckpointPlan, PlanError, plan_checkpointing
    from .explore.comparison import Comparison, compare
    from .explore.fit import Fit, FitError, NothingFitsError, max_fit
    from .explore.measure import Measured, MeasureError, measure
    from .explore.pipelines import PipelineAnalysis, PipelineError, analyze_pipeline
    from .explore.plan import plan
    from .explore.plan_result import Plan
    from .explore.sweeps import Sweep, sweep
    from .magics import load_ipython_extension, unload_ipython_extension
    from .materialization import InsufficientMemoryError, MaterializeError, materialize
    from .memory.kv_cache import KVCache
    from .memory.snapshot import SnapshotError
    from .options import (
        InputError,
        LayoutError,
        OptionError,
        Options,
        OptionTypeError,
        Parallel,
        TraceSpec,
    )
    from .sources.hub import HubError, RemoteCodeError
    from .sources.models import SourceError, register_source
    from .timing.gpus import GPU, gpus
    from .trace.assume import MetaValueNeeded
    from .trace.bounds import BoundError, register_bound
    from .trace.known_errors import register_explanation
    from .trace.passes import ConcurrentTraceError
    from .views.estimates import EstimateError
    from .views.graph_frame import Graph, GraphDependencyError
    from .views.snapshot import MemorySnapshot, load_snapshot
    from .views.widget import MetaWidget


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'meta_widget' has no attribute {name!r}")
    with _warm.imports:  # the warm-up's thread imports the same modules (meta_widget.warm)
        value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])


# in a Jupyter kernel, PyTorch's first meta forward is paid in the background (meta_widget.warm)
from . import warm as _warm  # noqa: E402
from . import warmstart as _warmstart  # noqa: E402

_warmstart.start_in_kernel()
