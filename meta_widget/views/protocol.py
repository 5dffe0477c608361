"""The wire format between the kernel and the front end (and the JSON of ``Analysis.to_json``).

This module and ``js/protocol.ts`` are the two places the contract is typed; a test checks both
against a recorded sample (``tests/test_protocol.py``).

Payload (``version`` 1)
-----------------------
One JSON object, dictionary-encoded so that 80 identical decoder layers cost little::

    {
      "version": 1,
      "title": "LlamaForCausalLM",        # the root module's class name
      "source": "config",                 # module | factory | config | checkpoint
      "mode": "inference",                # inference | training
      "optimizer": "adamw",               # in training: adamw | adam | sgd | sgd-momentum | null
      "device": "cuda",                   # the target device of the kernels: cuda | cpu | math
      "status": "done",                   # structural | running | done | error
      "strings": ["", "model", ...],      # every name, type, dtype and op name, once
      "shapes": [[1, 4096], ...],         # every shape and stride tuple, once
      "tensors": [[shape, dtype, stride, requires_grad]],   # ids into shapes/strings; rg 0/1
      "modules": {                        # columnar; row i = i-th entry of named_modules()
        "name": [sid],                    # local attribute name; "" for the root
        "type": [sid],                    # class name
        "parent": [int],                  # row of the parent module; -1 for the root
        "params": [int],                  # parameters in the subtree, tied ones counted once
        "param_bytes": [int],             # their bytes at the recorded dtypes
        "float_params": [int],            # how many of them are floating point (dtype what-ifs)
        "buffer_bytes": [int],            # buffers in the subtree, bytes
        "own_params": [[[name_sid, tensor_id], ...]],   # parameters defined on this module itself
        "extra_repr": [sid],              # optional: Module.extra_repr() ("in_features=64, …")
      },
      "calls": {                          # columnar; row j = j-th module call, in start order
        "module": [int],                  # module row
        "parent": [int],                  # row of the enclosing call; -1 at the top
        "flops": [int],                   # FLOPs of this call, its sub-calls included
        "self_flops": [int],              # FLOPs of ops run in this call's own body
        "activation_bytes": [int],        # bytes of new storage its outputs hold
        "inputs": [[[name_sid, tensor_id], ...]],   # every tensor of args and kwargs, flattened
        "outputs": [[[name_sid, tensor_id], ...]],  # every tensor of the output, flattened
        "ops": [[[op_sid, flops], ...]],  # FLOPs by aten op, own body only, ops with FLOPs > 0
        "duration_us": [int],
        "error": [0 | 1],                 # 1 where the call raised
        "assumed": [0 | 1],               # 1 where the call took an assumption or holds results
                                          # computed from one (meta_widget.trace.assume)
        "more_calls": [int],              # generate: the calls of the model this record also
                                          # stands for (a stretch of decode steps summed, as
                                          # CallRecord.repeats - 1); 0 elsewhere
        "backward_ops": [[[op_sid, flops], ...]],  # training: FLOPs by op of the backward of
                                          # what the call's own body computed (a call's whole
                                          # backward, sub-calls included, is their sum over
                                          # its subtree: the front end adds them up)
      },
      "timeline": {                       # live bytes over the pass: its envelope, at most
                                          # TIMELINE_POINTS points (see timeline_points)
        "event": [int],                   # each point's event number (allocations and frees
                                          # counted from 0; points are a thinned subset)
        "bytes": [int],                   # live bytes after the event
        "call": [int],                    # innermost call running at the event (-1: none)
        "op": [sid],                      # aten op that allocated (or "free")
        "phase": [sid],                   # forward | backward | optimizer
        "categories": {name: [int]},      # the live bytes by memory category at the same
                                          # points (they add up to "bytes"); all-zero ones left out
      },
      "memory": {"categories": {name: bytes},   # live at the peak; they add up to peak_bytes
                 "phases": {phase: first timeline index}, "peak_phase": str | null,
                 "peak_step": 1 | 2 | null, "first_step_peak_bytes": int,   # 2: steady
                 "reserved_bytes", "device_bytes",   # allocator's reserve; GPU's (nvidia-smi)
                 "gradient_bytes", "optimizer_state_bytes", "optimizer_host_bytes",
                 "what_if": {"fp32" | "bf16" | "fp16" | "int8" | "int4":   # the switch
                             {category: bytes, "total", "activation_scale"}},
                 "modules": {                     # what each module's subtree owns (each
                                                  # parameter at its first owner, see
                                                  # meta_widget.memory.modules)
                     "tied": [[row, bytes, float_params]],  # of the parameters the subtree
                                                  # reaches, those owned outside it (GPT-2's
                                                  # lm_head: its weight is transformer.wte's),
                                                  # on one device; rows left out own all of theirs
                     "param_bytes": [int],        # sent where one rank holds other bytes than
                     "float_params": [int],       # modules.param_bytes/float_params count (FSDP,
                                                  # TP): what the subtree owns on the rank;
                                                  # else modules' minus "tied"
                     "gradient_bytes": [int],     # training: per module row; left out when
                     "optimizer_state_bytes": [int]}},   # all 0 (inference)
      "totals": {"params", "trainable_params", "flops", "param_bytes", "buffer_bytes",
                 "input_bytes", "activation_bytes", "peak_bytes"},
      "peak": {"bytes": int, "call": int, "module": str, "op": str} | null,
      "error": {"type", "message", "title", "module", "call", "file", "line", "code", "op",
                "explanation", "fix", "module_type"} | null,
      "checkpoint": {...} (only with analyze(..., checkpoint=path): CheckpointDiff.to_dict()),
      "comms": {"point": [timeline index], "collective": [...], "bytes": [...], "group": [...],
                "module": [...], "phase": [...]}  (only with analyze(..., parallel=...)),
      "time": {"gpu": str, "memory_bytes": int, "step_s", "forward_s", "backward_s",
               "optimizer_s", "comm_s", "bubble_s" (a pipeline rank's wait, part of step_s),
               "mfu", "hfu", "tokens_per_s": float | null,
               "modules": {"time_s": [float], "bound": ["compute" | "memory" | "comm" | ""]}}
              (only with analyze(..., gpu=...): meta_widget.timing.model.StepTime; per module
              row, its calls' time forward and backward and what bounds it),
      "serving": {...} (only in mode="generate": meta_widget.views.serving),
      "stages": {"pp", "schedule", "virtual_stages", "microbatches", "shown", "slots",
                 "ranks": [{"rank", "stages", "modules", "peak_bytes", "categories", "bubble",
                            "step_s", "send_bytes", "recv_bytes", "actions", "slots",
                            "comms"}]}
              (only with parallel=Parallel(pp > 1): every pipeline rank, its schedule's
              actions in their time slots and its collectives per mesh dimension;
              stages.encode_stages),
      "settings": [[label, tooltip]],     # what changes the numbers besides mode: autocast,
                                          # param dtype, parallel layout, micro-batches,
                                          # checkpointing (encode_settings); [] by default
      "graph": {"levels": [{"depth": int, "nodes": [row], "calls": [int],   # -1 the inputs,
                 "src": [row], "dst": [row], "tensor": [tensor_id],       # -2 the outputs,
                 "ops": [[op_sid]], "count": [int],                       # -3 the KV cache,
                 "kind": [sid],   # "data" | "tied" | "residual" | "cache"  -4... op nodes:
                 "opnodes": [[row, kind_sid, name_sid, detail_sid, flops]]}  # -4, -5, ...
                 or {"depth": int, "as": int}]}   # the same graph as depth "as"
              (the graph of module rows at depth 1, 2, ... unfolded, while small, with the
              attentions and residual adds as op nodes of the module running them:
              graph_frame.encode_graph; the front end folds it as the tree),
      "notes": [str],
      "assumptions": [{"kind", "op", "value", "module", "call", "file", "line", "code",
                       "count", "site", "stack", "module_type", "backward"}],
                      # where the trace assumed a value it did not have
    }

The columns named in ``OPTIONAL_COLUMNS`` (``buffer_bytes``, ``error``, ``assumed``,
``backward_ops``, ``more_calls``) are left out of a payload, and of a streamed batch, when all
their values are 0 (or empty): a missing column reads as zeros (empty lists).

Tensor names in ``inputs``/``outputs`` are paths into the Python structure: ``"args[0]"``,
``"attention_mask"``, ``"[0]"``, ``"logits"``, ``"past_key_values.layers[0].keys"``.

Messages, kernel -> front end (custom messages, while tracing)
-------------------------------------------------------------
- ``{"type": "waiting", "state": "warm-up" | "build" | "trace" | "analyze", "text": str,
  "elapsed_s": float}``: what the running analysis waits for now, in words
  (``meta_widget.views.waiting``), sent once as the pipeline enters each state; ``elapsed_s``:
  how long the state had lasted when sent (the warm-up: since it started). The view counts the
  seconds on itself. ``warm-up`` and ``build`` come before ``start`` (no module tree yet),
  ``trace`` right after it, ``analyze`` after the trace's last ``calls``. An analysis that stops
  before its ``start`` (the model did not build, an option does not fit it) sends ``error``.
- ``{"type": "start", "expected_calls": int, "payload": <payload, status "running", no calls>}``:
  the module tree (names, types, parameters: known without a trace). The view shows every
  module as a row at once, its shapes, output memory and FLOPs pending until its calls arrive.
- ``{"type": "calls", "strings": [...], "shapes": [...], "tensors": [...],
  "calls": {"index": [int], ...the call columns above...}}``: the dictionaries are *appended* to
  the ones already received (ids continue), then the calls are added at their ``index`` rows.
  Calls complete in post-order (a child before its parent), hence the explicit index.
- ``{"type": "phase", "phase": "backward" | "optimizer"}``: a training step's forward pass is
  over (every forward call was sent) and this phase runs now; it records no new calls.
- ``{"type": "done", "elapsed_s": float, "total_s": float}``: the final payload is now in the
  ``payload`` trait; ``elapsed_s`` the trace's seconds, ``total_s`` the whole analysis's (from
  ``analyze``'s start with ``widget=True``, or the re-run's: the model built, traced, analyzed).
- ``{"type": "error", "error": {...the error object...}}``
- ``{"type": "ready"}``: the answer to ``hello``: a kernel-side widget is behind the view; its
  last stream's ``done`` follows, so a view mounted after the stream says how it ended.

Messages, front end -> kernel
-----------------------------
- ``{"type": "hello"}``: a view with a kernel mounted. A widget restored from a saved notebook has
  no kernel-side object: nothing answers, and its re-run switches stay off.
- ``{"type": "select", "module": int}``: the user selected a module row.
- ``{"type": "rerun", "mode": str, "optimizer": str | null, "device": str}``: analyze again with
  these options (``meta_widget.views.widget.RERUN_OPTIONS``), streaming into the same widget.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..choices import KernelMessage, Precision, ViewMessage
from ..units import DTYPE_BYTES
from .estimates import recorded_element_size, what_if
from .graph_frame import encode_graph
from .serving import encode_serving
from .settings import encode_settings
from .stages import encode_stages

if TYPE_CHECKING:
    from ..data.flatten import TensorInfo
    from ..data.records import CallRecord
    from ..data.tree import ModuleNode
    from ..memory.report import MemoryReport
    from ..trace.explain import Explanation
    from .analyzed import Analyzed

VERSION = 1

#: Columns of ``payload["modules"]`` and ``payload["calls"]``, in the order the JS side expects.
MODULE_COLUMNS = (
    "name",
    "type",
    "parent",
    "params",
    "param_bytes",
    "float_params",
    "buffer_bytes",
    "own_params",
    "extra_repr",
)
CALL_COLUMNS = (
    "module",
    "parent",
    "flops",
    "self_flops",
    "activation_bytes",
    "inputs",
    "outputs",
    "ops",
    "duration_us",
    "error",
    "assumed",
    "backward_ops",
    "more_calls",
)
#: the message types of each direction (``choices.KernelMessage``, ``choices.ViewMessage``);
#: ``widget.MESSAGE_HANDLERS`` is built from ``MESSAGE_TYPES_FROM_JS``: one handler per type
MESSAGE_TYPES_TO_JS = tuple(m.value for m in KernelMessage)
MESSAGE_TYPES_FROM_JS = tuple(m.value for m in ViewMessage)


class Dictionary:
    """Interns strings, shapes and tensor descriptions as integer ids, appending as it goes.

    ``take_new()`` returns what was added since the last call, for incremental messages.
    """

    def __init__(self) -> None:
        self.strings: list[str] = []
        self.shapes: list[list[int]] = []
        self.tensors: list[list[int]] = []
        self._string_ids: dict[str, int] = {}
        self._shape_ids: dict[tuple[int, ...], int] = {}
        self._tensor_ids: dict[tuple[int, int, int, int], int] = {}
        self._sent = (0, 0, 0)

    def string(self, value: str) -> int:
        sid = self._string_ids.get(value)
        if sid is None:
            sid = self._string_ids[value] = len(self.strings)
            self.strings.append(value)
        return sid

    def shape(self, value: tuple[int, ...]) -> int:
        sid = self._shape_ids.get(value)
        if sid is None:
            sid = self._shape_ids[value] = len(self.shapes)
            self.shapes.append(list(value))
        return sid

    def tensor(self, shape: tuple[int, ...], dtype: str, stride: tuple[int, ...], rg: bool) -> int:
        key = (self.shape(shape), self.string(dtype), self.shape(stride), int(rg))
        tid = self._tensor_ids.get(key)
        if tid is None:
            tid = self._tensor_ids[key] = len(self.tensors)
            self.tensors.append(list(key))
        return tid

    def take_new(self) -> dict[str, list[Any]]:
        s, h, t = self._sent
        new: dict[str, list[Any]] = {
            "strings": self.strings[s:],
            "shapes": self.shapes[h:],
            "tensors": self.tensors[t:],
        }
        self._sent = (len(self.strings), len(self.shapes), len(self.tensors))
        return new


def encode_modules(nodes: Sequence[ModuleNode], d: Dictionary) -> dict[str, list[Any]]:
    """The ``modules`` columns for ``nodes`` (``named_modules()`` order)."""
    return {
        "name": [d.string(n.name) for n in nodes],
        "type": [d.string(n.type) for n in nodes],
        "parent": [n.parent for n in nodes],
        "params": [n.params for n in nodes],
        "param_bytes": [n.param_bytes for n in nodes],
        "float_params": [n.float_params for n in nodes],
        "buffer_bytes": [n.buffer_bytes for n in nodes],
        "own_params": [[[d.string(k), _tensor(d, i)] for k, i in n.own_params] for n in nodes],
        **_extra_reprs(nodes, d),
    }


def _extra_reprs(nodes: Sequence[ModuleNode], d: Dictionary) -> dict[str, list[int]]:
    """``{"extra_repr": [sid]}``: each module's constructor settings (``Module.extra_repr()``),
    left out when no module has any (a checkpoint's tree, an older ModuleNode)."""
    texts = [getattr(n, "extra_repr", "") for n in nodes]
    return {"extra_repr": [d.string(t) for t in texts]} if any(texts) else {}


def _tensor(d: Dictionary, info: TensorInfo) -> int:
    return d.tensor(info.shape, info.dtype, info.stride, info.requires_grad)


def encode_calls(records: Sequence[CallRecord], d: Dictionary) -> dict[str, list[Any]]:
    """The ``calls`` columns for ``records`` (plus ``index``, used by streamed batches)."""
    return {
        "index": [r.index for r in records],
        "module": [r.module for r in records],
        "parent": [r.parent for r in records],
        "flops": [r.flops for r in records],
        "self_flops": [r.self_flops for r in records],
        "activation_bytes": [r.activation_bytes for r in records],
        "inputs": [[[d.string(k), _tensor(d, i)] for k, i in r.inputs] for r in records],
        "outputs": [[[d.string(k), _tensor(d, i)] for k, i in r.outputs] for r in records],
        "ops": [[[d.string(k), v] for k, v in r.ops.items()] for r in records],
        "duration_us": [round(r.duration_s * 1e6) for r in records],
        "error": [int(r.error) for r in records],
        "assumed": [int(r.assumed) for r in records],
        "backward_ops": [[[d.string(k), v] for k, v in r.backward_ops.items()] for r in records],
        "more_calls": [r.repeats - 1 for r in records],
    }


def encode_header(
    nodes: Sequence[ModuleNode], d: Dictionary, *, title: str, source: str, mode: str, status: str
) -> dict[str, Any]:
    """A payload with the module table and no calls (what the ``start`` message carries)."""
    modules = encode_modules(nodes, d)
    payload: dict[str, Any] = {
        "version": VERSION,
        "title": title,
        "source": source,
        "mode": mode,
        "status": status,
        "strings": d.strings,
        "shapes": d.shapes,
        "tensors": d.tensors,
        "modules": modules,
        "calls": {k: [] for k in CALL_COLUMNS},
        "timeline": {"bytes": [], "call": [], "op": [], "phase": []},
        "memory": {},
        "totals": {},
        "peak": None,
        "error": None,
        "notes": [],
        "assumptions": [],
    }
    return payload


def encode_comms(records: Sequence[Any], kept: list[int]) -> dict[str, list[Any]]:
    """A parallel trace's collectives (``meta_widget.distributed.comms.CommRecord``) as columns;
    ``point``
    is the index into the payload's thinned timeline at or after each one's event (``kept``:
    the timeline indices the payload keeps, ascending)."""
    last = max(len(kept) - 1, 0)
    return {
        "point": [min(bisect.bisect_left(kept, r.event), last) for r in records],
        "collective": [r.collective for r in records],
        "bytes": [r.bytes for r in records],
        "group": [r.group for r in records],
        "module": [r.module for r in records],
        "phase": [r.phase for r in records],
    }


def encode_analysis(a: Analyzed) -> dict[str, Any]:
    """The whole analysis as one payload."""
    d = Dictionary()
    payload = encode_header(
        a.modules, d, title=a.title, source=a.source, mode=a.mode, status=a.status
    )
    calls = encode_calls(a.calls, d)
    del calls["index"]
    payload["calls"] = drop_zero_columns(calls)
    payload["modules"] = drop_zero_columns(payload["modules"])
    mem = a.memory
    phases = mem.timeline_phases()
    keep = timeline_points([b for b, _, _ in mem.timeline], phases)
    payload["timeline"] = {
        "event": list(keep),
        "bytes": [mem.timeline[i][0] for i in keep],
        "call": [mem.timeline[i][1] for i in keep],
        "op": [d.string(mem.timeline[i][2]) for i in keep],
        "phase": [d.string(phases[i]) for i in keep],
        "categories": {
            name: [series[i] for i in keep]
            for name, series in mem.timeline_categories.items()
            if any(series)
        },
    }
    if a.comm_records:  # a parallel trace: its collectives, placed on the timeline
        payload["comms"] = encode_comms(a.comm_records, keep)
    payload["settings"] = encode_settings(a.options, a.stages)
    if a.stages:  # a pipeline: every rank (the Stages tab)
        payload["stages"] = encode_stages(a)
    first_kept: dict[str, int] = {}
    for j, i in enumerate(keep):
        first_kept.setdefault(phases[i], j)
    payload["memory"] = {
        "categories": dict(mem.categories),
        "phases": {name: first_kept.get(name, 0) for name in mem.phases},
        "peak_phase": mem.peak_phase,
        "peak_step": mem.peak_step,
        "first_step_peak_bytes": mem.first_step_peak_bytes,
        "reserved_bytes": mem.reserved_bytes,
        "device_bytes": mem.device_bytes,
        "gradient_bytes": mem.gradient_bytes,
        "optimizer_state_bytes": mem.optimizer_state_bytes,
        "optimizer_host_bytes": mem.optimizer_host_bytes,
        "what_if": encode_what_if(mem),
        "modules": encode_module_memory(a),
    }
    payload["totals"] = {
        "params": a.total_params,
        "trainable_params": a.trainable_params,
        "flops": a.total_flops,
        "param_bytes": mem.param_bytes,
        "buffer_bytes": mem.buffer_bytes,
        "input_bytes": mem.input_bytes,
        "activation_bytes": mem.activation_bytes,
        "peak_bytes": mem.peak_bytes,
    }
    payload["peak"] = (
        {
            "bytes": mem.peak_bytes,
            "call": mem.peak_call if mem.peak_call is not None else -1,
            "module": mem.peak_module or "",
            "op": mem.peak_op or "",
        }
        if a.traced
        else None
    )
    payload["error"] = encode_error(a.error)
    payload["notes"] = list(a.notes)
    payload["optimizer"] = a.options.optimizer
    payload["device"] = a.options.device
    payload["assumptions"] = [x.to_dict() for x in a.assumptions]
    if a.checkpoint_diff is not None:
        payload["checkpoint"] = a.checkpoint_diff.to_dict()
    if a.time is not None:
        payload["time"] = encode_time(a)
    serving = encode_serving(a)
    if serving is not None:  # mode="generate": meta_widget.views.serving
        payload["serving"] = serving
    if a.traced and a.calls:  # the Graph tab's (see meta_widget.views.graph_frame)
        payload["graph"] = encode_graph(a, lambda info: _tensor(d, info), d.string)
    return payload


def encode_time(a: Analyzed) -> dict[str, Any]:
    """``payload["time"]``: the step time on ``analyze(..., gpu=)``'s GPU (``a.time``, a
    ``meta_widget.timing.model.StepTime``) and each module row's time and bound."""
    t = a.time
    per_module = [t.module(n.path, n.calls) for n in a.modules]
    return {
        "gpu": t.gpu.name,
        "memory_bytes": t.gpu.memory_bytes,
        "step_s": t.step_s,
        "forward_s": t.forward_s,
        "backward_s": t.backward_s,
        "optimizer_s": t.optimizer_s,
        "comm_s": t.comm_s,
        "bubble_s": t.bubble_s,
        "mfu": t.mfu,
        "hfu": t.hfu,
        "tokens_per_s": t.tokens_per_s,
        "modules": {
            "time_s": [seconds for seconds, _ in per_module],
            "bound": [bound for _, bound in per_module],
        },
    }


def encode_module_memory(a: Analyzed) -> dict[str, list[Any]]:
    """``payload["memory"]["modules"]``: subtree sums of ``a.memory.by_module`` (see the module
    docstring): the parameters the subtree reaches but does not own (sparse), and where the
    rank holds other bytes than the tree counts (FSDP, tensor parallelism) what it owns."""
    owned = a.memory.by_module
    if owned is None or len(owned.param_bytes) != len(a.modules):
        return {"tied": []}  # structural, or a traced module whose rows are not the tree's
    sums = owned.subtree([n.parent for n in a.modules])
    out: dict[str, list[Any]] = {"tied": [list(row) for row in sums.tied()]}
    if any(  # one rank of several: what the rank holds, where the tree counts the model
        n.param_bytes != reached or n.float_params != floats
        for n, reached, floats in zip(
            a.modules, sums.reached_bytes, sums.reached_floats, strict=True
        )
    ):
        out["param_bytes"], out["float_params"] = sums.param_bytes, sums.float_params
    for name in ("gradient_bytes", "optimizer_state_bytes"):
        column = getattr(sums, name)
        if any(column):
            out[name] = column
    return out


#: the widget's precision switch: each choice and the ``what_if`` arguments it stands for
#: (compute dtype, or None: the recorded one; weight-only format, or None)
PRECISION_CHOICES: dict[Precision, tuple[str | None, str | None]] = {
    Precision.FP32: ("float32", None),
    Precision.BF16: ("bfloat16", None),
    Precision.FP16: ("float16", None),
    Precision.INT8: (None, "int8"),
    Precision.INT4: (None, "int4"),
}


def encode_what_if(report: MemoryReport) -> dict[str, dict[str, float]]:
    """The peak by category at each precision the widget's switch offers: ``what_if``'s numbers.

    Each choice maps to :func:`meta_widget.views.estimates.what_if` (the one definition; its
    docstring
    has the formulas): bf16/fp16 put weights, gradients, optimizer state *and activations* in
    that dtype; int8/int4 quantize the weights only (inference), activations stay at the
    recorded dtype. ``activation_scale`` is the factor activations and temporaries get (``c /
    r``), which the front end applies to the timeline and the per-module output memory.
    """
    r = recorded_element_size(report)
    recorded = "float32" if r >= 4 else "bfloat16"  # any 2-byte dtype scales the same
    out: dict[str, dict[str, float]] = {}
    for name, (dtype, weights) in PRECISION_CHOICES.items():
        if weights is not None and report.mode == "training":
            continue  # weight-only quantization is an inference what-if
        compute = dtype or recorded
        entry: dict[str, float] = dict(what_if(report, dtype=compute, weights=weights))
        entry["activation_scale"] = DTYPE_BYTES[compute] / r
        out[name.value] = entry
    return out


#: integer columns left out of a payload when every value is 0 (they read as zeros)
OPTIONAL_COLUMNS = ("buffer_bytes", "error", "assumed", "backward_ops", "more_calls")


def drop_zero_columns(columns: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """``columns`` without the optional ones that hold only zeros (they read as zeros)."""
    return {k: v for k, v in columns.items() if not (k in OPTIONAL_COLUMNS and not any(v))}


#: the most timeline points sent: about the pixels of a chart's width
TIMELINE_POINTS = 512


def timeline_points(
    values: Sequence[int], phases: Sequence[str], limit: int = TIMELINE_POINTS
) -> list[int]:
    """Indices of the timeline points worth drawing, at most about ``limit`` of them.

    The ends and the first point of each phase always; then the turning points (a run of rises
    or falls draws the same line from its ends); if still too many, the lowest and the highest
    point of each of ``limit / 2`` equal slices. The peak is always kept, exactly. (A 70B
    forward records ~6,000 events: sent whole, they were half the payload.)
    """
    n = len(values)
    turns = [
        i
        for i in range(n)
        if i in (0, n - 1)
        or (values[i] - values[i - 1]) * (values[i + 1] - values[i]) <= 0
        or phases[i] != phases[i - 1]
    ]
    if len(turns) <= limit:
        return turns
    must = {i for i in turns if i in (0, n - 1) or phases[i] != phases[i - 1]}
    size = -(-len(turns) // (limit // 2))
    for start in range(0, len(turns), size):
        chunk = turns[start : start + size]
        must.add(min(chunk, key=lambda i: values[i]))
        must.add(max(chunk, key=lambda i: values[i]))
    return sorted(must)


def encode_error(error: Explanation | None) -> dict[str, Any] | None:
    if error is None:
        return None
    out = error.to_dict()
    out["call"] = error.call if error.call is not None else -1
    return out
