"""The text summary: the module tree as a table a terminal user can read."""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING, Any

from ..units import NONE, format_bytes, format_count, format_flops, format_seconds, format_shapes

if TYPE_CHECKING:
    from ..data.tree import ModuleNode
    from .analyzed import Analyzed

#: "Output mem": the bytes of new storage a module's outputs hold (README "What the numbers mean")
_COLUMNS = ("Module · type", "Output shapes", "Params", "Param mem", "Output mem", "FLOPs")
#: a training step adds the FLOPs of each module's backward
_TRAINING_COLUMNS = (*_COLUMNS, "Bwd FLOPs")
_SHAPES_WIDTH = 38


def _signature(node: ModuleNode) -> tuple[object, ...]:
    """What makes two sibling modules 'the same' for folding: structure, sizes and shapes."""
    return (
        node.type,
        node.params,
        node.param_bytes,
        tuple(tuple(i.shape for _, i in c.outputs) for c in node.calls),
        tuple(_signature(c) for c in node.children),
    )


def fold_siblings(children: list[ModuleNode]) -> list[list[ModuleNode]]:
    """Group runs of consecutive identical siblings (``layers.0``–``layers.79``)."""
    groups: list[list[ModuleNode]] = []
    for child in children:
        if groups and _signature(groups[-1][0]) == _signature(child):
            groups[-1].append(child)
        else:
            groups.append([child])
    return groups


def _row(label: str, nodes: list[ModuleNode], training: bool = False) -> list[str]:
    first = nodes[0]
    shapes = [i.shape for c in first.calls for _, i in c.outputs]
    shape_text = format_shapes(shapes) if first.calls else NONE
    if len(first.calls) > 1:
        shape_text = f"{len(first.calls)} calls: " + format_shapes(
            [i.shape for _, i in first.calls[0].outputs]
        )
    if len(shape_text) > _SHAPES_WIDTH:
        shape_text = shape_text[: _SHAPES_WIDTH - 1] + "…"
    k = len(nodes)
    flops = sum(n.flops for n in nodes)
    act = sum(n.activation_bytes for n in nodes)
    backward = sum(n.backward_flops for n in nodes)
    extra = [format_flops(backward) if backward else NONE] if training else []
    return [
        label,
        shape_text,
        format_count(first.params * k) if first.params else NONE,
        format_bytes(first.param_bytes * k) if first.param_bytes else NONE,
        format_bytes(act) if act else NONE,
        format_flops(flops) if flops else NONE,
        *extra,
    ]


def summary_columns(analysis: Analyzed) -> tuple[str, ...]:
    """The column names of the summary table (a training step adds backward FLOPs)."""
    return _TRAINING_COLUMNS if analysis.traced and analysis.mode == "training" else _COLUMNS


def summary_rows(analysis: Analyzed, depth: int | None = 3) -> list[list[str]]:
    """The rows of the tree down to ``depth`` (None: all), repeated siblings folded: the first
    cell is the label with its tree branches, the others follow :func:`summary_columns`."""
    rows: list[list[str]] = []
    training = analysis.traced and analysis.mode == "training"
    error_path = analysis.error.module if analysis.error else None

    def visit(node: ModuleNode, prefix: str, child_prefix: str) -> None:
        mark = "  ← error here" if error_path is not None and node.path == error_path else ""
        mark += " *" if node.assumed else ""
        label = f"{node.name} · {node.type}" if node.path else analysis.title
        rows.append(_row(f"{prefix}{label}{mark}", [node], training))
        if depth is not None and node.depth >= depth:
            return
        groups = fold_siblings(node.children)
        for gi, group in enumerate(groups):
            last = gi == len(groups) - 1
            branch, cont = ("└─ ", "   ") if last else ("├─ ", "│  ")
            if len(group) == 1:
                visit(group[0], child_prefix + branch, child_prefix + cont)
            else:
                first, end = group[0].name, group[-1].name
                label = f"{child_prefix}{branch}{first}–{end} · {len(group)} × {group[0].type}"
                rows.append(_row(label, group, training))

    visit(analysis.root, "", "")
    return rows


#: the summary's width in characters: a notebook output, a terminal, a GitHub view show it whole
SUMMARY_WIDTH = 100

#: the narrowest the shapes column gets before it is left out of a table too wide for
#: ``SUMMARY_WIDTH`` (a shape cut shorter reads as nothing)
_MIN_SHAPES = 20


def _shorten(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters, shortened in the middle."""
    if len(text) <= width:
        return text
    head = (width - 1) // 2
    return text[:head] + "…" + text[len(text) - (width - 1 - head) :]


def _shorten_label(label: str, width: int) -> str:
    """A row's label (branches, name, " · ", class) in ``width`` characters: the name gives
    first, then the class, both in the middle; the branches never."""
    if len(label) <= width:
        return label
    name_at = len(label) - len(label.lstrip("│├└─ "))
    branches, rest = label[:name_at], label[name_at:]
    name, sep, kind = rest.partition(" · ")
    room = width - len(branches) - len(sep) - len(kind)
    if room >= 4:
        return branches + _shorten(name, room) + sep + kind
    return branches + _shorten(rest, max(4, width - len(branches)))


def _fit(
    rows: list[list[str]], columns: tuple[str, ...]
) -> tuple[list[list[str]], list[int], tuple[str, ...]]:
    """The table in at most ``SUMMARY_WIDTH`` characters: the shapes column narrows (to
    ``_MIN_SHAPES``), then goes; then the labels shorten. Returns rows, widths and columns."""

    def widths_of(table: list[list[str]]) -> list[int]:
        return [max(len(r[i]) for r in table) for i in range(len(table[0]))]

    widths = widths_of([list(columns), *rows])
    over = sum(widths) + 2 * (len(widths) - 1) - SUMMARY_WIDTH
    if over <= 0:
        return rows, widths, columns
    if widths[1] - over >= _MIN_SHAPES:
        widths[1] -= over
        for r in rows:
            r[1] = r[1] if len(r[1]) <= widths[1] else r[1][: widths[1] - 1] + "…"
        return rows, widths, columns
    # no room for shapes worth reading: the column goes (Analysis.calls has them)
    columns = (columns[0], *columns[2:])
    rows = [[r[0], *r[2:]] for r in rows]
    widths = widths_of([list(columns), *rows])
    over = sum(widths) + 2 * (len(widths) - 1) - SUMMARY_WIDTH
    if over > 0:
        widths[0] -= over
        for r in rows:
            r[0] = _shorten_label(r[0], widths[0])
    return rows, widths, columns


def _wrap(line: str) -> list[str]:
    """``line`` wrapped at ``SUMMARY_WIDTH``, continuation lines indented."""
    return textwrap.wrap(line, SUMMARY_WIDTH, subsequent_indent="  ", break_on_hyphens=False) or [
        ""
    ]


def render_summary(analysis: Analyzed, depth: int | None = 3) -> str:
    """The tree down to ``depth`` (None: everything), repeated siblings folded, then totals;
    at most ``SUMMARY_WIDTH`` characters wide (labels shortened in the middle, sentences
    wrapped)."""
    rows, widths, columns = _fit(summary_rows(analysis, depth), summary_columns(analysis))
    texts = 2 if "Output shapes" in columns else 1  # left-aligned: the label, the shapes

    def line(cells: list[str]) -> str:
        left = [c.ljust(w) for c, w in zip(cells[:texts], widths[:texts], strict=True)]
        right = [c.rjust(w) for c, w in zip(cells[texts:], widths[texts:], strict=True)]
        return "  ".join(left + right).rstrip()

    rule = "─" * (sum(widths) + 2 * (len(widths) - 1))
    out = [*_wrap(summary_header(analysis)), rule, line(list(columns)), rule]
    out.extend(line(r) for r in rows)
    out.append(rule)
    for text in totals_lines(analysis):
        for piece in text.split("\n"):  # an error's own lines (where, code, why, fix) kept
            out.extend(_wrap(piece) if len(piece) > SUMMARY_WIDTH else [piece])
    return "\n".join(out)


def summary_header(analysis: Analyzed) -> str:
    """The first line: class, source, mode, and what was traced."""
    return f"{analysis.title} ({analysis.source}) · {analysis.mode} · " + (
        f"{len(analysis.calls)} module calls traced in {analysis.seconds:.2f} s"
        if analysis.traced
        else "structure only (no inputs given)"
    )


def _seconds(s: float) -> str:
    return format_seconds(s)


def _launch(time: Any) -> str:
    """The launch regime a time assumes (``StepTime.launch``), in words."""
    return "CUDA graphs" if getattr(time, "launch", "eager") == "graphs" else "eager launch"


def time_lines(time: Any) -> list[str]:
    """With ``gpu=``: the step's time on it (``Analysis.time``, a ``StepTime``), its parts,
    MFU and throughput; nothing without."""
    if time is None:
        return []
    if getattr(time, "prefill_s", None) is not None:  # mode="generate"
        per = _seconds(time.per_token_s) if time.per_token_s is not None else "-"
        return [
            f"Time on {time.gpu.name}: generate {_seconds(time.step_s)} = prefill "
            f"{_seconds(time.prefill_s)} + {per} per output token · "
            f"{time.tokens_per_s or 0:,.0f} tokens/s · {_launch(time)}"
        ]
    parts = [f"forward {_seconds(time.forward_s)}"]
    if time.backward_s or time.optimizer_s:
        parts += [
            f"backward {_seconds(time.backward_s)}",
            f"optimizer {_seconds(time.optimizer_s)}",
        ]
    if time.comm_s:
        parts.append(
            f"collectives {_seconds(time.comm_s)} ({_seconds(time.exposed_comm_s)} exposed)"
        )
    if getattr(time, "bubble_s", 0.0):
        parts.append(f"bubble {_seconds(time.bubble_s)} (waiting in the pipeline's schedule)")
    rate = (
        f"{time.tokens_per_s:,.0f} tokens/s"
        if time.tokens_per_s is not None
        else f"{time.samples_per_s:,.1f} samples/s"
        if time.samples_per_s is not None
        else ""
    )
    return [
        f"Time on {time.gpu.name}: step {_seconds(time.step_s)} = "
        + " + ".join(parts)
        + f" · MFU {time.mfu:.1%}"
        + (f" (HFU {time.hfu:.1%} with the recomputation)" if time.recompute_flops else "")
        + (f" · {rate}" if rate else "")
    ]


def totals_lines(analysis: Analyzed) -> list[str]:
    """The lines under the table: totals, the peak by category, notes, assumptions, error.

    The memory words are the README's ("What the numbers mean"): *output mem* of a module, the
    bytes *allocated* by the whole pass (freed or not), the *peak* of live bytes and its
    *categories*, which add up to it.
    """
    mem = analysis.memory
    dtypes = ", ".join(f"{d} {format_bytes(b)}" for d, b in mem.params_by_dtype.items())
    out = [
        f"Parameters: {format_count(analysis.total_params)} "
        f"(trainable {format_count(analysis.trainable_params)}) · "
        f"parameter memory {format_bytes(mem.param_bytes)}" + (f" ({dtypes})" if dtypes else "")
    ]
    if mem.buffer_bytes:
        out.append(f"Buffers: {format_bytes(mem.buffer_bytes)}")
    if analysis.traced:
        where = f" in {mem.peak_owner} ({mem.peak_op})" if mem.peak_owner else ""
        out.append(
            f"FLOPs: {format_flops(analysis.total_flops)} · inputs {format_bytes(mem.input_bytes)}"
            f" · allocated by the forward pass {format_bytes(mem.activation_bytes)} (freed or not)"
            f" · peak {format_bytes(mem.peak_bytes)}{where}"
        )
        cats = " + ".join(f"{k} {format_bytes(v)}" for k, v in mem.categories.items() if v)
        step = (
            f", step {mem.peak_step} of 2: the steady state; the first step peaks at "
            f"{format_bytes(mem.first_step_peak_bytes)}"
            if mem.peak_step == 2
            else (", step 1 of 2" if mem.peak_step == 1 else "")
        )
        out.append(f"Peak ({mem.peak_phase}{step}) = {cats}")
        time = getattr(analysis, "time", None)
        if time is not None and mem.device_bytes > mem.reserved_bytes > 0:
            out.append(
                f"On the {time.gpu.name}: {format_bytes(mem.device_bytes)} as nvidia-smi would "
                "show it (what plan and max_fit hold against a budget) = PyTorch's caching "
                f"allocator reserved {format_bytes(mem.reserved_bytes)} (the peak's tensors in its "
                f"rounded blocks and segments, cuBLAS workspaces) + "
                f"{format_bytes(mem.device_bytes - mem.reserved_bytes)} outside it (the CUDA "
                "context; NCCL's buffers under parallel=)"
            )
    if analysis.traced and analysis.mode == "training":
        out.append(
            f"After the step: gradients {format_bytes(mem.gradient_bytes)} · optimizer state "
            f"{format_bytes(mem.optimizer_state_bytes)} on the device"
            + (
                f" (+{format_bytes(mem.optimizer_host_bytes)} on the host)"
                if mem.optimizer_host_bytes
                else ""
            )
        )
    cache = getattr(analysis, "kv_cache", None)
    if cache is not None:  # mode="generate"
        kinds: dict[str, int] = {}
        for layer in cache.layers:
            kinds[layer.kind] = kinds.get(layer.kind, 0) + 1
        layers = ", ".join(f"{n} {kind}" for kind, n in kinds.items())
        out.append(
            f"KV cache ({cache.cache_type}): {format_bytes(cache.bytes)} at the end, "
            f"{format_bytes(round(cache.bytes_per_token))} per token · layers: {layers}"
        )
    out.extend(time_lines(getattr(analysis, "time", None)))
    if analysis.checkpoint_diff is not None:
        out.append("Checkpoint: " + str(analysis.checkpoint_diff).replace("\n", "\n  "))
    out.extend(f"Note: {n}" for n in analysis.notes)
    if analysis.assumptions:
        out.append(
            f"Assumed ({len(analysis.assumptions)} site(s); rows marked * hold assumed results; "
            "override with assume={'file.py:LINE': value}, or strict=True):"
        )
        out.extend(f"  - {a}" for a in analysis.assumptions)
    if analysis.error is not None:
        out.append("")
        out.append("Error: " + str(analysis.error))
    return out
