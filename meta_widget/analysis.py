"""``analyze`` and the :class:`Analysis` it returns: the module tree with its calls, and totals.

``analyze`` checks nothing itself: it gathers its arguments into frozen :class:`Options` and
runs the pipeline (``meta_widget.pipeline``: check every option, build the meta model and
inputs, trace, assemble). An :class:`Analysis` is the result, not changed once built; its
methods are the views of it (tables, figures, text, JSON, HTML, the widget), and
``Analysis.rerun`` runs the pipeline again with some options replaced.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from types import EllipsisType
from typing import TYPE_CHECKING, Any

import torch

from . import heavy
from .checkpoints import CheckpointDiff, inspect_checkpoint
from .choices import Mode
from .data.flatten import TensorInfo, named_tensors
from .data.records import CallRecord
from .data.tree import ModuleNode
from .distributed.comms import CommRecord, comms_frame, comms_totals
from .materialization import MaterializeReport, materialize
from .memory.kv_cache import KVCache
from .memory.moe import MoE
from .memory.report import MemoryReport
from .options import DEFAULT_OPTIMIZER, OptionError, Options, carried_optimizer, check_graph
from .pipeline import run, time_step
from .sources import hub_model
from .sources.models import MetaModel
from .timing.gpus import resolve_gpu
from .trace.assume import Assumption
from .trace.costs import Cost
from .trace.explain import Explanation
from .trace.opcache import CacheStats
from .units import format_bytes, format_count, format_flops
from .views.estimates import distributed_table, what_if_table
from .views.figures import categories_figure, memory_figure, timeline_figure
from .views.graph_frame import Graph, graph_of
from .views.protocol import encode_analysis
from .views.summary import render_summary

if TYPE_CHECKING:
    import pandas as pd
    import plotly.graph_objects as go

    from .timing.gpus import GPU
    from .timing.model import StepTime
    from .views.widget import MetaWidget

#: how deep ``summary()`` and the widget open when ``analyze`` was given no ``depth``
DEFAULT_DEPTH = 3


@dataclass(eq=False, frozen=True)
class Analysis:
    """What meta_widget learned about a model from one meta pass (or from its structure alone).

    Numbers (definitions in the README):

    - ``total_params``: parameters, each tensor once (tied weights once); ``trainable_params``
      those with ``requires_grad``; ``active_params`` what one token uses (a mixture of
      experts: the shared parameters and ``k/E`` of the routed experts; else all).
    - ``total_flops``: FLOPs as ``torch.utils.flop_counter.FlopCounterMode`` counts them on the
      same meta inputs (matmuls, convolutions, attention; elementwise ops count 0).
    - ``param_bytes``: parameter bytes at their dtypes; ``activation_bytes``: every byte of
      storage allocated during the pass; ``peak_bytes``: the maximum of live bytes (parameters,
      buffers, inputs and not-yet-freed activations) over the pass.
    """

    title: str
    source: str
    mode: str
    modules: list[ModuleNode]
    calls: list[CallRecord]
    memory: MemoryReport
    total_flops: int
    error: Explanation | None
    notes: list[str]
    traced: bool
    seconds: float
    orphan_ops: dict[str, int] = field(default_factory=dict)
    #: the costs of ops outside any module call, by phase (``meta_widget.trace.costs``)
    orphan_costs: dict[str, dict[Cost, int]] = field(default_factory=dict)
    #: where the trace assumed a value it did not have (see ``meta_widget.trace.assume``)
    assumptions: list[Assumption] = field(default_factory=list)
    #: with ``analyze(..., checkpoint=path)``: how the checkpoint and the model disagree
    checkpoint_diff: CheckpointDiff | None = None
    #: what the op cache did: hits, misses, bypasses by reason (None: ``fast=False``, or no trace)
    fast_path: CacheStats | None = None
    #: the meta model (no data) that ``materialize`` builds a real copy of and ``rerun`` traces
    source_model: MetaModel | None = field(default=None, repr=False)
    #: the checked options, with the meta inputs: what ``rerun`` changes
    options: Options = field(default_factory=Options, repr=False)
    #: with ``parallel=``: the collectives rank 0 ran, in order (``comms`` is their DataFrame)
    comm_records: list[CommRecord] = field(default_factory=list)
    #: with ``gpu=``: the step's time on that accelerator (``forward_s``, ``step_s``, ``mfu``...;
    #: see ``meta_widget.timing.model``); None without ``gpu=`` or without a trace
    time: StepTime | None = None
    #: with ``mode="generate"``: the KV cache ``generate()`` returned (``bytes``,
    #: ``bytes_per_token``, ``by_layer``, ``paged(budget)``); None in other modes
    kv_cache: KVCache | None = None
    #: a mixture of experts: its routed expert groups (``meta_widget.memory.moe``); None if dense
    moe: MoE | None = None
    #: with ``pp`` > 1: each pipeline rank (``meta_widget.distributed.pipelining.StageReport``)
    stages: list[Any] = field(default_factory=list)
    #: the views made of this analysis, kept to be shown again (``widget()``'s, or the one the
    #: pipeline streamed into); not part of the result
    _views: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    # -- totals -------------------------------------------------------------------------------

    @property
    def root(self) -> ModuleNode:
        """The root of the module tree."""
        return self.modules[0]

    @property
    def total_params(self) -> int:
        return self.root.params

    @property
    def trainable_params(self) -> int:
        return self.root.trainable_params

    @property
    def active_params(self) -> int:
        """The parameters one token uses: all of them in a dense model; in a mixture of
        experts, the shared ones plus ``k`` of each layer's ``E`` routed experts (``k/E`` of
        their parameters), routing assumed balanced (``meta_widget.memory.moe``)."""
        return self._active(self.root)

    def _active(self, node: ModuleNode) -> int:
        return node.params if self.moe is None else self.moe.active(node.path, node.params)

    @property
    def param_bytes(self) -> int:
        return self.memory.param_bytes

    @property
    def activation_bytes(self) -> int:
        return self.memory.activation_bytes

    @property
    def peak_bytes(self) -> int:
        return self.memory.peak_bytes

    @property
    def footprint_bytes(self) -> int:
        """The bytes a memory budget is held against (``plan``'s ``fits``, ``max_fit``,
        ``plan_checkpointing``). With ``gpu=`` named, what that GPU would hold at the peak, as
        ``nvidia-smi`` shows it: ``memory.device_bytes`` (the caching allocator's reserve, the
        CUDA context, NCCL's buffers). Without ``gpu=``, or with ``device="cpu"`` (no caching
        allocator, no context), the tensors' peak: ``peak_bytes``."""
        m = self.memory
        on_gpu = self.options.gpu is not None and not str(self.options.device).startswith("cpu")
        return m.device_bytes if on_gpu and m.device_bytes > 0 else m.peak_bytes

    @property
    def depth(self) -> int:
        """How deep ``summary()`` and the widget open (``analyze``'s ``depth``, default 3)."""
        return DEFAULT_DEPTH if self.options.depth is None else self.options.depth

    @property
    def status(self) -> str:
        if self.error is not None:
            return "error"
        return "done" if self.traced else "structural"

    def __getitem__(self, path: str) -> ModuleNode:
        """The node of the module at ``path`` (``""`` for the root)."""
        for node in self.modules:
            if node.path == path:
                return node
        raise KeyError(f"no module {path!r} in {self.title}")

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.title}: {format_count(self.total_params)} params, "
            f"{format_flops(self.total_flops)}, peak {format_bytes(self.peak_bytes)}, "
            f"{len(self.calls)} calls, status {self.status}>"
        )

    # -- views --------------------------------------------------------------------------------

    def to_dataframe(self, per: str = "module") -> pd.DataFrame:
        """One row per module (``per="module"``, ``named_modules()`` order) or per call.

        Shapes are tuples of ints; ``input_shapes``/``output_shapes`` hold, per call, the shapes of
        every tensor in the call's arguments / output. With ``gpu=``, ``time_s`` is the time of
        the module's calls on that GPU (forward and backward, sub-modules included; per call:
        its own) and ``bound`` what bounds it: ``"compute"``, ``"memory"`` or ``"comm"``
        (both None without ``gpu=``; ``meta_widget.timing.model``). ``active_params``: the
        module's parameters one token uses (less than ``params`` only over routed experts).
        """
        pd = heavy.pandas()

        def shapes(items: list[tuple[str, TensorInfo]]) -> list[tuple[int, ...]]:
            return [info.shape for _, info in items]

        err = self.error.message if self.error else None
        rows: list[dict[str, Any]]
        if per == "module":
            rows = [
                {
                    "module": n.path,
                    "type": n.type,
                    "depth": n.depth,
                    "calls": sum(c.repeats for c in n.calls),
                    "input_shapes": [shapes(c.inputs) for c in n.calls],
                    "output_shapes": [shapes(c.outputs) for c in n.calls],
                    "params": n.params,
                    "trainable_params": n.trainable_params,
                    "active_params": self._active(n),
                    "param_bytes": n.param_bytes,
                    "buffer_bytes": n.buffer_bytes,
                    "activation_bytes": n.activation_bytes,
                    "flops": n.flops,
                    "backward_flops": n.backward_flops,
                    "error": err if n.error and self._error_node() is n else None,
                    "assumed": n.assumed,
                    **self._time_columns(n.path, n.calls),
                }
                for n in self.modules
            ]
            return pd.DataFrame(rows)
        if per == "call":
            rows = [
                {
                    "call": c.index,
                    "module": c.path,
                    "type": c.type,
                    "depth": c.depth,
                    "parent": c.parent,
                    "input_shapes": shapes(c.inputs),
                    "output_shapes": shapes(c.outputs),
                    "flops": c.flops,
                    "self_flops": c.self_flops,
                    "backward_flops": c.backward_flops,
                    "activation_bytes": c.activation_bytes,
                    "duration_s": c.duration_s,
                    "error": err if self.error and self.error.call == c.index else None,
                    "assumed": c.assumed,
                    **self._time_columns(c.path, [c]),
                }
                for c in self.calls
            ]
            return pd.DataFrame(rows)
        raise ValueError(f"per must be 'module' or 'call', not {per!r}")

    def time_on(self, gpu: str | GPU) -> StepTime:
        """The traced step timed on another accelerator (a name of ``mw.gpus()`` or an
        ``mw.GPU``), from the same records: nothing is traced again. ``analyze(..., gpu=)``
        gives :attr:`time` the same way."""
        if not self.traced:
            why = f"{self.title} was not traced (no inputs): it has no step to time"
            raise OptionError(f"time_on: {why}; analyze it with input_size= or input_data=.")
        inputs = [t for _, t in named_tensors(self.options.input_data)]
        records = self.calls, self.orphan_costs, self.comm_records
        return time_step(*records, resolve_gpu(gpu), inputs, self.options, self.total_flops)

    def _time_columns(self, path: str, calls: list[CallRecord]) -> dict[str, Any]:
        """``time_s`` and ``bound`` of ``calls`` (None, None without ``gpu=``)."""
        if self.time is None:
            return {"time_s": None, "bound": None}
        seconds, bound = self.time.module(path, calls)
        return {"time_s": seconds, "bound": bound or None}

    def _error_node(self) -> ModuleNode | None:
        if self.error is None or self.error.call is None:
            return None
        return self.modules[self.calls[self.error.call].module]

    @property
    def comms(self) -> pd.DataFrame:
        """With ``parallel=``: one row per collective rank 0 ran, in order: ``module`` (the one
        it serves), ``phase``, ``collective``, ``bytes`` (the whole tensor gathered, reduced or
        sent), ``group`` (mesh dimension) and ``group_size``; ``comms_per_step()`` sums them."""
        return comms_frame(self.comm_records)

    def comms_per_step(self) -> pd.DataFrame:
        """The collectives of the step summed by phase, collective and group (calls, bytes)."""
        return comms_totals(self.comm_records)

    def summary(self, depth: int | EllipsisType | None = ...) -> str:
        """A text table of the tree down to ``depth`` (None: all; default: :attr:`depth`), with
        totals."""
        return render_summary(self, self.depth if depth is ... else depth)

    def figure(self, kind: str = "memory", depth: int = 1) -> go.Figure:
        """A plotly figure: ``"memory"`` (bytes per module at ``depth``), ``"timeline"`` (live
        bytes over the pass, phases shaded) or ``"categories"`` (the peak by category)."""
        if kind == "memory":
            return memory_figure(self, depth)
        if kind == "timeline":
            return timeline_figure(self)
        if kind == "categories":
            return categories_figure(self)
        raise ValueError(f"kind must be 'memory', 'timeline' or 'categories', not {kind!r}")

    def graph(self, depth: int = 1, fold: bool = True) -> Graph:  # graph_of's docstring
        return graph_of(self, *check_graph(depth, fold))

    graph.__doc__ = graph_of.__doc__

    def to_payload(self) -> dict[str, Any]:
        """The analysis as the widget's payload (see ``meta_widget.views.protocol``)."""
        return encode_analysis(self)

    def to_json(self) -> str:
        """The payload as JSON (``version`` 1 of the schema in ``meta_widget.views.protocol``)."""
        return json.dumps(self.to_payload(), separators=(",", ":"))

    def to_html(self, path: str | None = None) -> str:
        """A standalone HTML page (bundle and data inline, no network) showing the widget.

        Written to ``path`` when given; the HTML is returned either way.
        """
        from .views.widget import standalone_html  # anywidget: ~0.5 s, loaded on first use

        html = standalone_html(self.to_payload())
        if path is not None:
            with open(path, "w", encoding="utf-8") as f:
                f.write(html)
        return html

    def what_if(self) -> pd.DataFrame:
        """Peak bytes by category at other precisions (an estimate scaled from this trace).

        Training: float32, bfloat16, float16, mixed bfloat16/float16 (fp32 master weights and
        optimizer state). Inference: float32, bfloat16, float16, int8 and int4 weights. The
        formulas are in ``meta_widget.views.estimates`` and ``docs/estimates.md``.
        """
        return what_if_table(self)

    def distributed(
        self,
        sizes: tuple[int, ...] = (1, 2, 8),
        *,
        dtype: str = "float32",
        mixed_precision: bool = False,
    ) -> pd.DataFrame:
        """Per-device bytes under DDP, ZeRO-1/2/3 (FSDP) and tensor parallelism: an estimate.

        Computed from the recorded categories (``meta_widget.views.estimates.distributed``); the
        formulas and a measured FSDP2 comparison are in ``docs/estimates.md``.
        """
        return distributed_table(self, sizes, dtype=dtype, mixed_precision=mixed_precision)

    def materialize(
        self, device: str = "cpu", checkpoint: Any = None, *, available_bytes: int | None = None
    ) -> tuple[torch.nn.Module, MaterializeReport]:
        """A real copy of the analyzed model on ``device``: initialized, or loaded.

        Tensors are allocated once each (ties kept), then ``reset_parameters()`` (or the
        transformers initializer) fills them, or ``checkpoint`` (a path or a state dict) is
        loaded with ``load_state_dict(assign=True)``. Refused with ``InsufficientMemoryError``,
        before allocating anything, when it does not fit in the free memory. The user's module
        is never touched. See ``meta_widget.materialization.materialize``.
        """
        if self.source_model is None:
            raise ValueError("this Analysis has no model to materialize (it was loaded from JSON)")
        return materialize(self.source_model, device, checkpoint, available_bytes=available_bytes)

    def rerun(self, **changes: Any) -> Analysis:
        """Analyze the same (meta) model and inputs again with some options changed.

        ``a.rerun(mode="training", optimizer="sgd")``, ``a.rerun(device="cpu")``, and other
        inputs: ``a.rerun(input_size=(8, 4096))`` (batch size, sequence length), traced again
        (``widget=True`` shows its progress). The keyword arguments of :func:`analyze`; the
        widget's mode, optimizer and device switches call this.
        """
        if self.source_model is None:
            raise ValueError("this Analysis cannot be re-run (it was not made by mw.analyze)")
        widget = changes.pop("widget", None)
        listeners = changes.pop("listeners", ())
        if "optimizer" not in changes:  # not chosen again: no "not used" note in inference
            changes["optimizer"] = carried_optimizer(self.options.optimizer)
        if changes.get("mode") == Mode.INFERENCE and "micro_batches" not in changes:
            changes["micro_batches"] = 1  # accumulation belongs to training: not carried over
        if "input_size" in changes and "input_data" not in changes:
            changes["input_data"] = None
        if "input_size" in changes or "input_data" in changes:
            changes["input_notes"] = ()  # new inputs: their own notes
        try:
            options = replace(self.options, **changes)
        except TypeError:
            unknown = sorted(set(changes) - set(Options.__dataclass_fields__))
            raise TypeError(f"rerun() got unknown options {unknown}; see mw.analyze") from None
        return run(self.source_model, options, Analysis, widget, listeners)

    def widget(self) -> MetaWidget:
        """The widget showing this analysis, made once (displaying ``a`` shows it).

        Its mode, optimizer and device switches re-run the analysis in the kernel: the
        widget's ``analysis`` is then the new one (``a.widget().analysis``), ``a`` is unchanged.
        """
        from .views.widget import MetaWidget  # anywidget: ~0.5 s, loaded on first use

        view = self._views.get("widget")
        if view is None:
            view = self._views["widget"] = MetaWidget(payload=self.to_payload(), depth=self.depth)
            view.analysis = self
        return view  # type: ignore[no-any-return]

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget()._repr_mimebundle_(**kwargs)

    def _ipython_display_(self) -> None:
        """In IPython: the widget's output, then its static view as an output of its own (see
        ``MetaWidget._ipython_display_``)."""
        self.widget()._ipython_display_()


# ---------------------------------------------------------------------------------------------
# analyze


def analyze(
    model: Any,
    input_size: Any = None,
    *,
    input_data: Any = None,
    dtypes: torch.dtype | str | Sequence[torch.dtype | str] | None = None,
    mode: str = "inference",
    optimizer: str | None = DEFAULT_OPTIMIZER,
    foreach: bool | None = None,
    set_to_none: bool = True,
    loss: Callable[[Any], Any] | None = None,
    device: str = "cuda",
    activation_checkpointing: bool | str | Sequence[str] = False,
    checkpoint_policy: Any = None,
    depth: int | None = None,
    widget: bool | MetaWidget | None = None,
    strict: bool = False,
    assume: Mapping[str, Any] | None = None,
    assume_nonzero: bool | None = None,
    checkpoint: Any = None,
    autocast: torch.dtype | str | None = None,
    param_dtype: torch.dtype | str | None = None,
    micro_batches: int = 1,
    parallel: Mapping[str, Any] | None = None,
    gpu: str | GPU | None = None,
    launch: str | None = None,
    listeners: Sequence[Callable[[CallRecord], None]] = (),
    fast: bool = True,
    new_tokens: int | None = None,
    cache_implementation: str | None = None,
    max_length: int | None = None,
    revision: str | None = None,
    trust_remote_code: bool = False,
) -> Analysis:
    """Analyze ``model`` on the meta device: its tree, shapes, parameters, FLOPs and memory.

    Parameters
    ----------
    model
        An ``nn.Module`` on any device (analyzed through meta stand-ins; never moved, changed or
        left with hooks), a class or zero-argument function that builds one (built on meta), or
        a transformers config (built with its model class on meta), a Hugging Face Hub id
        (``"org/name"``: its ``config.json`` alone, from the cache or the Hub, built on meta;
        a string naming an existing file or folder is a checkpoint path instead), a
        ``torch.export`` program or a ``torch.compile``d module (their module is traced). One
        already wrapped by
        FSDP2's ``fully_shard`` and/or ``parallelize_module`` under a fake process group is
        traced as it stands, as rank ``dist.get_rank()`` (``meta_widget.distributed.wrapped``).
    input_size
        A shape or a list of shapes, batch dimension included (torchinfo's convention).
    input_data
        A tensor, a tuple/list of positional arguments or a dict of keyword arguments, nested
        freely; real tensors are replaced by meta tensors of the same shape and dtype.
    dtypes
        One dtype per ``input_size`` shape, or one dtype for all of them (``torch.long`` or its
        name ``"long"``). Default float32; integer ids for models whose first layer is an
        embedding, with a note.
    mode
        ``"inference"`` (``eval()``, no autograd, one forward pass), ``"training"``
        (``train()``: two steps of forward, loss, backward and optimizer step, each a phase of
        the memory timeline; ``peak_bytes`` is the second, steady step's, which holds the
        optimizer state throughout, ``memory.first_step_peak_bytes`` the first's; refused
        inside ``torch.inference_mode()``, where autograd is off) or
        ``"generate"``: transformers' own ``model.generate()`` on the token ids of
        ``input_size=(batch, prompt_len)``, greedy, exactly ``new_tokens`` new tokens, its
        prefill and each decode step marked on the timeline; ``Analysis.kv_cache`` is the
        cache it returns and ``peak_bytes`` the peak of the whole ``generate()``. The stopping
        check is answered by the token count (a recorded assumption). A model without
        ``generate()`` (not a ``GenerationMixin``) is an ``OptionError``. See
        ``docs/serving.md``.
    optimizer, foreach
        In training: ``"adamw"`` (default), ``"adam"``, ``"sgd"``, ``"sgd-momentum"`` or None
        (no step; given in inference it is unused, and ``notes`` says so), built as
        ``torch.optim`` builds it with ``foreach=foreach``: None, PyTorch's default on
        ``device`` (multi-tensor on ``"cuda"``, a list of temporaries at once; one parameter
        at a time on ``"cpu"``). See ``meta_widget.trace.optimizers``.
    set_to_none
        In training: how ``zero_grad`` clears the gradients before the second step: ``True``
        (PyTorch's default) frees them; ``False`` keeps them, zeroed, through its forward pass.
    loss
        In training: a function ``loss(output) -> scalar tensor`` (no loss is known by name);
        default the sum of every floating output.
    device
        The device the memory numbers are for; it picks the attention kernel that
        ``scaled_dot_product_attention`` is accounted as: ``"cuda"`` (flash / memory-efficient,
        default), ``"cpu"`` (the CPU flash kernel) or ``"math"`` (the math path, which keeps the
        whole score matrix; what meta itself runs).
    activation_checkpointing
        In training: ``True`` checkpoints every block (each child of a ``ModuleList``, e.g. the
        decoder layers of a transformer); a module path or class name, or a list of them,
        picks them; ``"selective"``: the blocks, op-level (``checkpoint_policy``).
    checkpoint_policy
        Ops whose outputs checkpointed modules save (names, ops, or a PyTorch SAC policy
        function); default torchtitan's for ``"selective"``. See ``meta_widget.options.selective``.
    depth
        The depth the widget and ``summary()`` open at (default 3).
    widget
        ``True`` shows the widget before tracing and streams calls into it; a ``MetaWidget`` is
        used as is. Default: no widget (display the returned Analysis to see one).
    strict
        ``False`` (default): where the trace needs a value a meta tensor has not got, it takes a
        documented assumption and records it in ``Analysis.assumptions`` (a boolean condition is
        ``True``; ``nonzero``/``x[mask]`` select every element). ``True``: no assumptions; such
        code ends the trace with an explained error.
    assume
        Values for sites the trace cannot decide, keyed by ``"file.py:LINE"`` or module path:
        numbers for ``.item()``/``int()``/``float()``, booleans to override a truth assumption.
    assume_nonzero
        Whether ``nonzero``, boolean masking and ``masked_select`` get upper-bound shapes
        (default: on unless ``strict``).
    checkpoint
        A checkpoint path (``.safetensors``, ``torch.save`` file, sharded ``*.index.json``) to
        compare with the model, read without loading data: ``Analysis.checkpoint_diff`` lists
        missing, unexpected and mis-shaped keys.
    autocast
        ``torch.bfloat16`` or ``torch.float16``: the forward pass and the loss run as under
        ``torch.autocast(device, dtype)`` on the target ``device`` (its op lists: ``"cuda"``, or
        the CPU's for ``"cpu"`` and ``"math"``); parameters, gradients and optimizer state stay
        at their dtype (fp32 master weights). See ``meta_widget.trace.autocast``.
    param_dtype
        Pure low-precision: every floating parameter and buffer (and so the gradients and
        torch's optimizer state) in this dtype, as after ``model.to(dtype)``; floating inputs
        too unless ``dtypes`` is given. See ``meta_widget.sources.precision``.
    micro_batches
        In training: forward, loss and backward run this many times (each on the given
        inputs, the loss divided by the count), gradients accumulating, then one optimizer
        step. FLOPs and calls count every micro-batch. At most ``MAX_MICRO_BATCHES`` (1024):
        each is traced in full.
    parallel
        Trace one rank of several devices on PyTorch's own engine (``docs/parallel.md``):
        ``{"fsdp": 8}`` (FSDP2's ``fully_shard`` on each block, then the root), ``{"tp": 2}``
        (``parallelize_module``), both, HSDP ``{"replicate": 2, "fsdp": 4}``; optional
        ``"blocks"``, ``"tp_plan"`` and ``"mp"`` (FSDP2's ``MixedPrecisionPolicy``). Memory,
        FLOPs and ``comms`` are rank 0's, for the batch given to one rank; the layout is checked
        before any process group is made (``ParallelError``).
    gpu, launch
        The accelerator to time the step on (a name of ``mw.gpus()``, e.g. ``"H100"``, or an
        ``mw.GPU(...)``; unknown: ``OptionError``): ``Analysis.time`` holds the step's time and
        per module ``time_s``, ``bound`` (``docs/speed-model.md``). ``launch``: ``"eager"`` (each
        op at least the host's ~5 us) or ``"graphs"`` (CUDA graphs: none); default ``"graphs"``
        with ``mode="generate"``, else ``"eager"`` (``Analysis.time.launch``).
    listeners
        A list of functions, each called with every :class:`CallRecord` as it completes.
    fast
        ``True`` (default): an op seen on the same input metadata is rebuilt from the op cache
        (``Analysis.fast_path``); ``False``: every kernel runs. The results are the same.
    revision, trust_remote_code
        A Hub id's branch, tag or commit (default ``main``); whether a Hub model's own code may
        run (default ``False``: ``RemoteCodeError``), as transformers does.

    Returns
    -------
    Analysis
        Also when the forward pass fails: ``error`` then explains it, and the records made
        before the failure are kept. Given a checkpoint path as ``model``, the
        :class:`~meta_widget.checkpoints.CheckpointInfo` of ``inspect_checkpoint`` instead.

    Raises
    ------
    OptionError
        Before anything is built or traced, for an argument that cannot be used (a
        ``ValueError``; ``OptionTypeError``, also a ``TypeError``, for a wrong type): the checks
        of ``meta_widget.options``, shared with ``%meta`` and ``meta-widget``.
    """
    # every parameter of this signature that is an option (all but model, widget, listeners):
    # a new option is a field of Options and a parameter here, nothing more
    given = locals()
    options = Options(**{f.name: given[f.name] for f in fields(Options) if f.name in given})
    if isinstance(model, (str, bytes, os.PathLike)):  # a path (bytes too) or a Hub id
        options.checked()  # the same checks, for the same messages
        hub = hub_model(model, options.revision, options.trust_remote_code)
        if hub is None:  # a path: the checkpoint's view
            return inspect_checkpoint(model)  # type: ignore[return-value]
        model = hub
    return run(model, options, Analysis, widget, listeners)
