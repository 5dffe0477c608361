"""What a plan's candidates can take, found before any trace.

Two things decide, for each candidate, that it cannot be traced, and neither is a guess:

- its *layout* against the model: ``analyze``'s own check of ``parallel=``
  (``meta_widget.distributed.parallel.check_world``: tp dividing the heads and key/value heads,
  pp splitting a transformers decoder into at most one stage a layer, ep only for a mixture of
  experts whose experts it divides, cp with a pipeline or experts...), run once
  per layout on the model built on ``meta`` once (:class:`LayoutChecks`): no trace;
- its *batch*: with ``global_batch=``, every data-parallel rank's share of the sequences
  (``global_batch / (replicate * fsdp)``) split over its micro-batches (gradient accumulation,
  or the pipeline's); and with a pipeline, the batch of one rank dividing into the pipeline's
  micro-batches (``meta_widget.distributed.pipelining.check_batch``).

A candidate refused is a row of the plan with ``error`` the refusal's type and message
(``"LayoutError: parallel tp=4 does not divide the 2 heads ..."``), and is not traced.

The same check, before the candidates are made, chooses the default tensor-parallel layouts'
form: sequence-parallel (:func:`sequence_parallel_where_taken`) and, for a mixture of experts,
with expert parallelism over the tensor-parallel ranks (:func:`experts_where_taken`), where the
model takes it.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from ..distributed.parallel import ParallelError
from ..options import LayoutError, OptionError, OptionTypeError
from ..options.selective import SELECTIVE
from ..sources.models import is_transformers_config
from .candidates import Candidate, Layout

__all__ = [
    "LayoutChecks",
    "check_global_batch",
    "check_selective",
    "experts_where_taken",
    "on_meta",
    "refuse",
    "sequence_length",
    "sequence_parallel_where_taken",
    "set_inputs",
    "uneven_checkpointing",
]


def check_global_batch(
    global_batch: Any, seq_len: Any, input_size: Any, input_data: Any
) -> tuple[int, int] | None:
    """``global_batch`` and ``seq_len`` checked: both whole numbers >= 1, given together and
    neither with ``input_size`` nor ``input_data`` (None when neither is given)."""
    if global_batch is None and seq_len is None:
        return None
    if input_size is not None or input_data is not None:
        raise OptionError(
            "plan: give input_size (one rank's micro-batch, e.g. (8, 2048)) or global_batch= "
            "and seq_len= (the sequences of one optimizer step over every rank, and their "
            "length), not both: with global_batch, plan works out each candidate's batch per "
            "rank."
        )
    for name, value in (("global_batch", global_batch), ("seq_len", seq_len)):
        if value is None:
            other = "seq_len" if name == "global_batch" else "global_batch"
            raise OptionError(
                f"plan: {other}= needs {name}= too (e.g. global_batch=512, seq_len=8192: "
                "512 sequences of 8,192 tokens an optimizer step)."
            )
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise OptionTypeError(f"plan: {name} must be a whole number >= 1, not {value!r}.")
    return int(global_batch), int(seq_len)


def check_selective(model: Any, checkpointing: Sequence[Any]) -> None:
    """Refuse ``"selective"`` checkpointing for a transformers model that writes a KV cache in
    training (``config.use_cache``): the recomputed forward finds the cache grown and runs
    other ops than the first, which the selective mode refuses: every such candidate would
    fail, as a real run does (``trace.known_errors``, ``selective_checkpoint_mismatch``)."""
    if SELECTIVE not in checkpointing:
        return
    config = model if is_transformers_config(model) else getattr(model, "config", None)
    # an encoder's config may say use_cache (BERT's does) and keep none: is_decoder says so
    writes = getattr(config, "use_cache", False) and getattr(config, "is_decoder", True)
    if is_transformers_config(config) and writes:
        raise OptionError(
            f"plan: activation_checkpointing 'selective' with {type(config).__name__}'s "
            "use_cache=True: each decoder layer writes its keys and values to a cache in the "
            "forward, so the recomputation in backward finds the cache grown and runs other ops "
            "than the forward, which torch.utils.checkpoint's selective mode refuses (a real run "
            "fails the same way). Set config.use_cache = False, as transformers' own gradient "
            "checkpointing does in training, or leave 'selective' out."
        )


def uneven_checkpointing(
    module: nn.Module, settings: Sequence[Any], layers: int | None
) -> tuple[tuple[str, ...], ...]:
    """The checkpointing settings of ``settings`` that name modules, checked against
    ``module`` (the model built on meta): each must pick a module of it (an ``OptionError``
    before any trace, as ``analyze`` would raise for every candidate). Returned: those that
    pick other modules in one of its ``layers`` decoder layers than in another (a path into one
    layer, ``"model.layers.0"``), whose candidates are traced at full depth: the per-layer rule
    holds only where every layer runs alike. Class names (``"LlamaMLP"``) and paths outside
    the layers pick alike."""
    known = {name for path, m in module.named_modules() for name in (path, type(m).__name__)}
    blocks = next(
        (
            (path, m)
            for path, m in module.named_modules()
            if isinstance(m, nn.ModuleList) and layers is not None and len(m) == layers
        ),
        None,
    )
    uneven: list[tuple[str, ...]] = []
    for names in (s for s in settings if isinstance(s, tuple)):
        wanted = set(names)
        missing = wanted - known
        if missing:
            first = next(
                (
                    (f"{path}.0", type(m[0]).__name__)
                    for path, m in module.named_modules()
                    if isinstance(m, nn.ModuleList) and len(m)
                ),
                ("model.layers.0", "LlamaMLP"),
            )
            raise OptionError(
                f"plan: activation_checkpointing {list(names)} names {sorted(missing)}, which "
                f"picks no module of {type(module).__name__}: give module paths (as "
                "Analysis.to_dataframe()['module'] shows them) or class names, e.g. "
                f"[{first[0]!r}] or [{first[1]!r}]."
            )
        if blocks is not None:
            path, found = blocks
            each = {_picks(layer, f"{path}.{i}", wanted) for i, layer in enumerate(found)}
            if len(each) > 1:
                uneven.append(names)
    return tuple(uneven)


def _picks(layer: nn.Module, prefix: str, wanted: set[str]) -> frozenset[str]:
    """The modules of ``layer`` (at path ``prefix``) that ``wanted``'s paths or class names
    pick, by their path within the layer."""
    return frozenset(
        rel
        for rel, m in layer.named_modules()
        if ".".join(filter(None, (prefix, rel))) in wanted or type(m).__name__ in wanted
    )


def set_inputs(candidates: Sequence[Candidate], global_batch: int, seq_len: int) -> None:
    """Give each candidate its input of one rank, ``(batch, seq_len)`` token ids: its
    data-parallel rank's share of ``global_batch``, one micro-batch of it (a pipeline's: the
    whole share, which its schedule splits); or, where the share does not divide, its
    ``error``."""
    for c in candidates:
        dp = c.layout.data_parallel
        if global_batch % dp:
            c.error = _message(
                f"global_batch={global_batch} does not divide over the {dp} data-parallel "
                f"ranks of {c.layout.label()} (replicate x fsdp): give a global_batch that "
                f"is a multiple of {dp}."
            )
            continue
        share = global_batch // dp
        if c.layout.pp > 1:
            c.input_size = (share, seq_len)
        elif share % c.micro_batches:
            c.error = _message(
                f"global_batch={global_batch} is {share} sequences a data-parallel rank of "
                f"{c.layout.label()}, which do not split into micro_batches="
                f"{c.micro_batches}: give a global_batch that is a multiple of "
                f"{dp * c.micro_batches}."
            )
        else:
            c.input_size = (share // c.micro_batches, seq_len)


@dataclass
class LayoutChecks:
    """``analyze``'s check of a plan's layouts against the model built on meta once
    (``module``; None when every layout is one device: nothing to check), each layout checked
    once however many times it is asked about."""

    module: nn.Module | None
    _found: dict[Layout, str | None] = field(default_factory=dict, repr=False)

    def refusal(self, layout: Layout) -> str | None:
        """Why ``analyze`` refuses ``layout`` (the error's type and message), or None."""
        if self.module is None or layout.devices == 1:
            return None
        if layout not in self._found:
            from ..distributed.parallel import check_world  # FSDP2 and DTensor: for parallel=

            plan = layout.parallel()
            assert plan is not None  # more than one device
            self._found[layout] = _refusal(check_world, plan, self.module)
        return self._found[layout]

    def built(self, model: Any) -> nn.Module:
        """The model built on meta (built now when no layout needed it)."""
        if self.module is None:
            from ..sources.models import to_meta

            self.module = to_meta(model).module
        return self.module


def on_meta(model: Any, layouts: Sequence[Layout]) -> LayoutChecks:
    """The checks of ``layouts`` against ``model``, built on meta once (not built when every
    layout is one device)."""
    if all(layout.devices == 1 for layout in layouts):
        return LayoutChecks(None)
    from ..sources.models import to_meta

    return LayoutChecks(to_meta(model).module)


def sequence_parallel_where_taken(
    layouts: Sequence[Layout], checks: LayoutChecks, sequence: int | None
) -> tuple[Layout, ...]:
    """The default ``layouts``, each with tensor parallelism (``tp > 1``) sharding the sequence
    as well (``sequence_parallel``) where the model takes it: ``analyze``'s own check of the
    layout passes (a transformers tensor-parallel plan whose styles sequence parallelism
    converts: Llama's, Mistral's, Qwen's...; norms inside the blocks) and ``tp`` divides the
    ``sequence`` where it is known. Elsewhere plain tensor parallelism, as before.

    The same bytes on the wire (an all-reduce is a reduce-scatter and an all-gather) and the
    activations between the blocks ``tp`` times smaller (``meta_widget.distributed.sequence``):
    tensor parallelism as torchtitan and Megatron-LM train with it. Without it nothing of a
    405B fits on 16,384 H100s (``benchmarks/results/llama3_405b.md``), and a tensor-parallel
    layout without data parallelism cannot run the multi-tensor optimizer (its norms stay plain
    tensors beside DTensors), so one layout of each is tried, not both."""
    found = []
    for layout in layouts:
        if layout.tp > 1 and not layout.sequence_parallel and (sequence or 0) % layout.tp == 0:
            sharded = dataclasses.replace(layout, sequence_parallel=True)
            if checks.refusal(sharded) is None:
                layout = sharded
        found.append(layout)
    return tuple(found)


def experts_where_taken(
    layouts: Sequence[Layout], checks: LayoutChecks, experts: int | None, node: int
) -> tuple[Layout, ...]:
    """The default ``layouts`` of a mixture of ``experts`` routed experts, each with tensor
    parallelism (``tp > 1``) reaching its experts by expert parallelism that borrows the
    tensor-parallel ranks (``layouts.expert_degree``: torchtitan's expert tensor parallelism
    1) where the model takes it (``analyze``'s own check: MoE blocks of a router and the
    experts, as Mixtral's). Tensor parallelism alone leaves every expert whole on every
    tensor-parallel rank, running every token: the same layout with ``ep`` holds a share of
    them and runs a share of the tokens, so it is tried instead. Elsewhere, as before."""
    from .layouts import expert_degree

    found = []
    for layout in layouts:
        if experts and layout.tp > 1 and layout.ep == 1:
            ep = expert_degree(layout, experts, node)
            routed = dataclasses.replace(layout, ep=ep)
            if ep > 1 and checks.refusal(routed) is None:
                layout = routed
        found.append(layout)
    return tuple(found)


def sequence_length(input_size: Any, whole: tuple[int, int] | None) -> int | None:
    """The sequence length of a plan's input: ``seq_len=``, or an ``input_size`` of token ids'
    second number; None for other inputs."""
    if whole is not None:
        return whole[1]
    if isinstance(input_size, Sequence) and len(input_size) >= 2:
        length = input_size[1]
        if isinstance(length, int) and not isinstance(length, bool):
            return length
    return None


def refuse(candidates: Sequence[Candidate], checks: LayoutChecks, input_size: Any) -> int:
    """Set the ``error`` of every candidate (none refused yet) whose layout the model cannot
    take (``checks``: each layout checked once, those :func:`sequence_parallel_where_taken`
    checked not again), or whose batch its pipeline cannot split, as ``analyze`` would refuse
    it. Returns how many were refused."""
    todo = [c for c in candidates if c.error is None and c.layout.devices > 1]
    if not todo or checks.module is None:
        return 0
    from ..distributed.pipelining import check_batch  # torch.distributed: only for parallel=

    refused = 0
    for c in todo:
        why = checks.refusal(c.layout)
        batch = _batch(c.input_size if c.input_size is not None else input_size)
        if why is None and c.layout.pp > 1 and batch is not None:
            plan = c.layout.parallel()
            assert plan is not None  # more than one device
            why = _refusal(check_batch, plan, batch)
        if why is not None:
            c.error = why
            refused += 1
    return refused


def _batch(size: Any) -> int | None:
    """The batch of an ``input_size`` of token ids (its first number), if it has one."""
    if isinstance(size, Sequence) and len(size) >= 2 and isinstance(size[0], int):
        return size[0]
    return None


def _refusal(check: Callable[..., None], *args: Any) -> str | None:
    """The message of the layout error ``check(*args)`` raises, None when it passes."""
    try:
        check(*args)
    except (LayoutError, ParallelError) as e:
        return f"{type(e).__name__}: {e}"
    return None


def _message(text: str) -> str:
    return f"{LayoutError.__name__}: {text}"
