"""The options of one analysis as frozen values: :class:`TraceSpec` (what one trace runs) and
:class:`Options` (that, and what the analysis around the trace takes).

Each option is one field with its check beside it (``checked`` runs them in field order, before
anything is built or traced: the same checks for ``analyze``, ``%meta`` and ``meta-widget``).
:func:`~meta_widget.trace.passes.trace` and one rank's trace take the :class:`TraceSpec` as it
is. So a new option that changes the trace touches three places: its field here (with its
check), ``analyze``'s signature and docstring, and the code where it acts.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch

from ..choices import GENERATE, Mode
from .checks import (
    DEFAULT_OPTIMIZER,
    check_assume,
    check_autocast,
    check_checkpoint_path,
    check_depth,
    check_device,
    check_fast,
    check_flag,
    check_gpu,
    check_grad_mode,
    check_launch,
    check_loss,
    check_micro_batches,
    check_mode,
    check_optimizer,
    check_optional_flag,
    check_param_dtype,
    checkpoint_selection,
)
from .errors import OptionError, OptionTypeError, show
from .layout import check_parallel
from .selective import SELECTIVE, SavePolicy, check_checkpoint_policy, save_policy
from .shapes import input_dtypes, input_shapes

__all__ = ["GENERATE", "Options", "TraceSpec"]

#: a field's check: (the given value, the fields checked before it, notes) -> the checked value
Check = Callable[[Any, Mapping[str, Any], list[str]], Any]


def _checked_by(check: Check) -> dict[str, Check]:
    """A field's metadata naming its check."""
    return {"check": check}


def _alone(check: Callable[[Any], Any]) -> Check:
    """A check of the value alone."""
    return lambda value, _before, _notes: check(value)


#: the largest ``new_tokens``: each decode step is traced
MAX_NEW_TOKENS = 1_000_000


def _mode(value: Any, _before: Mapping[str, Any], _notes: list[str]) -> str:
    if value == GENERATE:
        return GENERATE
    try:
        mode = check_mode(value)
    except OptionError as exc:
        raise type(exc)(f"{exc} (or {GENERATE!r})") from None
    check_grad_mode(mode)
    return mode


def _count(value: Any, name: str) -> int | None:
    """None, or an int of 1 or more."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise OptionTypeError(f"{name} must be an int of 1 or more, or None, not {show(value)}")
    if not 1 <= int(value) <= MAX_NEW_TOKENS:
        raise OptionError(f"{name} must be from 1 to {MAX_NEW_TOKENS:,}, not {int(value)}")
    return int(value)


def _new_tokens(value: Any, before: Mapping[str, Any], notes: list[str]) -> int | None:
    """``new_tokens``: how many tokens ``generate()`` makes (``mode="generate"``)."""
    count = _count(value, "new_tokens")
    if count is not None and before["mode"] != GENERATE:
        notes.append(f"new_tokens={count} was not used: only mode='generate' generates tokens.")
    return count


def _cache_implementation(value: Any, before: Mapping[str, Any], notes: list[str]) -> str | None:
    """``cache_implementation``: a name ``generate()`` takes (``"static"``, ``"dynamic"``...),
    checked by transformers itself when the trace runs."""
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise OptionTypeError(
            f"cache_implementation must be a name generate() takes (e.g. 'static', 'dynamic') "
            f"or None, not {show(value)}"
        )
    if before["mode"] != GENERATE:
        notes.append(f"cache_implementation={value!r} was not used: only mode='generate' has one.")
    return value


def _max_length(value: Any, before: Mapping[str, Any], _notes: list[str]) -> int | None:
    """``max_length``: the length (prompt and new tokens) ``generate()`` stops at; in
    ``mode="generate"`` one of it and ``new_tokens`` is needed."""
    length = _count(value, "max_length")
    if before["mode"] == GENERATE and length is None and before["new_tokens"] is None:
        raise OptionError(
            "mode='generate' needs new_tokens=N (the tokens generate() makes, exactly N) or "
            "max_length=L (prompt and new tokens together)."
        )
    return length


def _revision(value: Any) -> str | None:
    """``revision``: a Hub id's branch, tag or commit name, or None (``main``)."""
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise OptionTypeError(
            f"revision must be a branch, tag or commit of the Hub repository (a non-empty "
            f"string) or None, not {show(value)}"
        )
    return value


def _dtypes(value: Any, before: Mapping[str, Any], _notes: list[str]) -> Any:
    size = before["input_size"]
    if size is not None or value is not None:
        input_dtypes(value, len(input_shapes(size)) if size is not None else 0)
    return value  # kept as given: the inputs are made from it (``sources.inputs``)


@dataclass(frozen=True)
class TraceSpec:
    """What one trace runs (``analyze``'s docstring says each option in full): a forward pass
    (``mode="inference"``), a training step with its ``optimizer`` (``foreach``) and ``loss``, or
    transformers' ``generate()`` (``mode="generate"``, ``new_tokens``, ``cache_implementation``,
    ``max_length``); the
    ``device`` whose attention kernel is accounted; the assumption policy (``strict``,
    ``assume``, ``assume_nonzero``); the op cache (``fast``); ``autocast``; ``micro_batches``;
    the modules run under ``activation_checkpointing`` and what they save
    (``checkpoint_policy``)."""

    mode: str = field(default=Mode.INFERENCE.value, metadata=_checked_by(_mode))
    optimizer: str | None = field(
        default=DEFAULT_OPTIMIZER,
        metadata=_checked_by(lambda v, before, notes: check_optimizer(v, before["mode"], notes)),
    )
    foreach: bool | None = field(
        default=None, metadata=_checked_by(lambda v, _b, _n: check_optional_flag(v, "foreach"))
    )
    #: how ``zero_grad`` clears the gradients between training steps: freed (PyTorch's default)
    #: or kept, zeroed, through the next step's forward pass
    set_to_none: bool = field(
        default=True, metadata=_checked_by(lambda v, _b, _n: check_flag(v, "set_to_none"))
    )
    loss: Callable[[Any], Any] | None = field(
        default=None, metadata=_checked_by(_alone(check_loss))
    )
    device: str = field(default="cuda", metadata=_checked_by(_alone(check_device)))
    strict: bool = field(
        default=False, metadata=_checked_by(lambda v, _b, _n: check_flag(v, "strict"))
    )
    assume: Mapping[str, Any] | None = field(
        default=None, metadata=_checked_by(_alone(check_assume))
    )
    assume_nonzero: bool | None = field(
        default=None,
        metadata=_checked_by(lambda v, _b, _n: check_optional_flag(v, "assume_nonzero")),
    )
    fast: bool = field(default=True, metadata=_checked_by(_alone(check_fast)))
    autocast: Any = field(default=None, metadata=_checked_by(_alone(check_autocast)))
    micro_batches: int = field(
        default=1,
        metadata=_checked_by(lambda v, before, _n: check_micro_batches(v, before["mode"])),
    )
    activation_checkpointing: bool | str | Sequence[str] = field(
        default=False, metadata=_checked_by(_alone(checkpoint_selection))
    )
    #: what selective checkpointing saves (``meta_widget.options.selective``)
    checkpoint_policy: Any = field(
        default=None,
        metadata=_checked_by(
            lambda v, before, notes: check_checkpoint_policy(
                v, before["activation_checkpointing"], notes
            )
        ),
    )
    #: ``mode="generate"``: the tokens ``generate()`` makes (exactly), its cache and length
    new_tokens: int | None = field(default=None, metadata=_checked_by(_new_tokens))
    cache_implementation: str | None = field(
        default=None, metadata=_checked_by(_cache_implementation)
    )
    max_length: int | None = field(default=None, metadata=_checked_by(_max_length))

    @property
    def training(self) -> bool:
        return self.mode == Mode.TRAINING

    @property
    def generating(self) -> bool:
        """``mode="generate"``: transformers' ``generate()`` is traced."""
        return self.mode == GENERATE

    def checked(self) -> tuple[Any, list[str]]:
        """Every field checked, in order, and the notes a given option leaves (an optimizer
        given in inference is not used): the same type, normalized."""
        notes: list[str] = []
        values: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            check = f.metadata.get("check")
            values[f.name] = check(value, values, notes) if check is not None else value
        return replace(self, **values), notes

    def trace_spec(self) -> TraceSpec:
        """The :class:`TraceSpec` part of these options."""
        return TraceSpec(**{f.name: getattr(self, f.name) for f in fields(TraceSpec)})

    @property
    def save_policy(self) -> SavePolicy | None:
        """What the checkpointed modules save, op by op (selective checkpointing), or None:
        they save nothing but their inputs (full checkpointing)."""
        return save_policy(self.checkpoint_policy, self.activation_checkpointing)

    def checkpointed(self, module: torch.nn.Module) -> list[torch.nn.Module]:
        """The modules of ``module`` whose forwards run under activation checkpointing (none in
        inference): with ``True`` or ``"selective"`` each child of a ``ModuleList`` (the blocks
        of a transformer), else those whose path or class name is given. The pipeline checks
        before the trace that each name picks a module of the model."""
        which = self.activation_checkpointing
        if not self.training or not which:
            return []
        if which is True or which == SELECTIVE:
            return [
                child
                for m in module.modules()
                if isinstance(m, torch.nn.ModuleList)
                for child in m.children()
            ]
        names = set(which)
        return [m for p, m in module.named_modules() if p in names or type(m).__name__ in names]


@dataclass(frozen=True)
class Options(TraceSpec):
    """The options of one analysis, as :func:`analyze` takes them (its docstring says each):
    the :class:`TraceSpec` and what the analysis around the trace takes (the inputs, the depth
    shown, a checkpoint to compare, low-precision parameters, one rank of several devices, the
    accelerator the step is timed on).

    The options an :class:`Analysis` keeps hold its meta inputs in ``input_data``, never real
    data; ``rerun`` replaces fields.
    """

    input_size: Any = None
    input_data: Any = None
    dtypes: Any = field(default=None, metadata=_checked_by(_dtypes))
    depth: int | None = field(default=None, metadata=_checked_by(_alone(check_depth)))
    checkpoint: Any = field(default=None, metadata=_checked_by(_alone(check_checkpoint_path)))
    param_dtype: Any = field(default=None, metadata=_checked_by(_alone(check_param_dtype)))
    parallel: Any = field(default=None, metadata=_checked_by(_alone(check_parallel)))
    #: the accelerator ``Analysis.time`` is for: a name of ``mw.gpus()`` or an ``mw.GPU``
    #: (timed from the records: no part of the trace)
    gpu: Any = field(default=None, metadata=_checked_by(_alone(check_gpu)))
    #: how the timed step launches its kernels: ``"eager"`` (each op pays the host's launch
    #: time), ``"graphs"`` (CUDA graphs replayed: none); None: ``"graphs"`` with
    #: ``mode="generate"`` (as servers run), else ``"eager"``
    launch: str | None = field(default=None, metadata=_checked_by(_alone(check_launch)))
    #: a Hugging Face Hub id's branch, tag or commit (``meta_widget.sources.hub``)
    revision: str | None = field(default=None, metadata=_checked_by(_alone(_revision)))
    #: whether a Hub model's own code (its config's ``auto_map``) may run
    trust_remote_code: bool = field(
        default=False, metadata=_checked_by(_alone(lambda v: check_flag(v, "trust_remote_code")))
    )
    #: notes about the inputs made from ``input_size``/``dtypes`` (carried over by ``rerun``)
    input_notes: tuple[str, ...] = ()

    def checked(self) -> tuple[Options, list[str]]:
        return super().checked()  # type: ignore[no-any-return]
