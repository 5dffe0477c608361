"""The checks that ``analyze``, ``%meta`` and the ``meta-widget`` command share.

Each argument a user can get wrong is checked here, once, before anything is built or traced,
and a mistake raises :class:`OptionError` (a ``ValueError``; :class:`OptionTypeError` is also a
``TypeError``) with a one-line message that says what was given and what to give instead. The
magic prefixes it with ``%meta:``, the command with ``meta-widget: error:``; the text is the same.

Decisions (documented in the README):

- ``dtypes`` may be one dtype (``torch.long`` or ``"long"``): it applies to every input.
- ``activation_checkpointing="blocks.0"`` is one module path or class name, not its characters.
- ``optimizer`` belongs to training: in inference it is not an error (the widget's mode switch
  keeps it for the next training run), but ``Analysis.notes`` says it was not used.
- Dimensions may be any integer type (``numpy.int64`` included), never ``bool``; a shape whose
  tensor would hold more than ``2**63 - 1`` bytes is refused.
- Work is bounded before it starts: at most ``MAX_MICRO_BATCHES`` micro-batches (each is traced
  in full) and ``MAX_RANKS`` ranks in a ``parallel=`` world (``fsdp * tp``); the degrees are
  also checked against the model (``meta_widget.parallel.check_world``).
- ``loss`` is a function (no loss is known by name), ``listeners`` a list of functions,
  ``checkpoint`` a ``str`` or ``os.PathLike`` path, ``strict`` and ``assume_nonzero`` booleans.
- A training analysis is refused inside ``torch.inference_mode()``, which no code can turn
  autograd back on in (``torch.no_grad()`` is fine: the trace turns gradients on itself).
"""

from __future__ import annotations

import inspect
import numbers
import operator
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import heavy
from .choices import Device, Mode, Optimizer, choose
from .errors import MetaWidgetError
from .units import BYTE_UNITS, parse_bytes

if TYPE_CHECKING:
    import torch

__all__ = [
    "DEFAULT_OPTIMIZER",
    "InputError",
    "OptionError",
    "OptionTypeError",
    "ParallelPlan",
    "carried_optimizer",
    "check_assume",
    "check_autocast",
    "check_budget",
    "check_buildable",
    "check_checkpoint_path",
    "check_depth",
    "check_device",
    "check_fast",
    "check_flag",
    "check_grad_mode",
    "check_listeners",
    "check_loss",
    "check_micro_batches",
    "check_mode",
    "check_optimizer",
    "check_optional_flag",
    "check_parallel",
    "check_param_dtype",
    "checkpoint_selection",
    "dtype_options",
    "input_dtypes",
    "input_shapes",
    "parse_dtype",
    "parse_shape",
]

#: the largest element count or byte count a tensor can have (PyTorch sizes are int64)
INT64_MAX = 2**63 - 1
#: the most micro-batches one analysis traces: each is a whole forward, loss and backward
MAX_MICRO_BATCHES = 1024
#: the most ranks (``fsdp * tp``) a ``parallel=`` trace stands for: the largest published
#: training jobs (16,384 GPUs); FSDP2 splits every parameter into one piece per rank, so the
#: trace's work grows with the world size
MAX_RANKS = 16384


class OptionError(MetaWidgetError, ValueError):
    """An argument of ``analyze``, ``%meta`` or ``meta-widget`` that cannot be used."""


class OptionTypeError(OptionError, TypeError):
    """An argument of the wrong type (also a ``TypeError``)."""


class InputError(OptionError):
    """The inputs given to ``analyze`` cannot be turned into model arguments."""


# -- shapes ----------------------------------------------------------------------------------

_SHAPE_EXAMPLES = (
    "Examples: input_size=(1, 3, 224, 224), or input_size=[(1, 16), (1, 16)] for two inputs."
)


def _is_dim(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    try:
        operator.index(value)  # int, numpy integers, 0-dim integer tensors
    except TypeError:
        return False
    return True


def _is_shape(value: Any) -> bool:
    return (
        isinstance(value, Sequence)
        and not isinstance(value, (str, bytes))
        and all(_is_dim(d) for d in value)
    )


def check_shape(shape: Sequence[Any]) -> tuple[int, ...]:
    """``shape`` as a tuple of Python ints: non-negative, and few enough elements for int64."""
    dims = tuple(operator.index(d) for d in shape)
    if any(d < 0 for d in dims):
        raise InputError(f"the input shape {dims} has a negative dimension: sizes are 0 or more.")
    numel = 1
    for d in dims:
        numel *= d
    if numel > INT64_MAX:
        raise InputError(
            f"the input shape {dims} has {numel:.3g} elements, more than a tensor can hold "
            "(2**63 - 1): check the dimensions (a missing comma joins two numbers)."
        )
    return dims


def input_shapes(input_size: Any) -> list[tuple[int, ...]]:
    """``input_size`` (one shape or a list of shapes) as a list of int tuples."""
    if _is_shape(input_size):
        return [check_shape(input_size)]
    if (
        isinstance(input_size, Sequence)
        and not isinstance(input_size, (str, bytes))
        and input_size
        and all(_is_shape(s) for s in input_size)
    ):
        return [check_shape(s) for s in input_size]
    raise InputError(
        f"input_size={_show(input_size)} is not a shape or a list of shapes (of integers). "
        + _SHAPE_EXAMPLES
    )


def check_bytes(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    """Refuse a shape whose tensor of ``dtype`` would need more bytes than int64 counts."""
    numel = 1
    for d in shape:
        numel *= d
    if numel * dtype.itemsize > INT64_MAX:
        raise InputError(
            f"the input shape {shape} of {dtype} needs {numel * dtype.itemsize:.3g} bytes, more "
            "than a tensor can address (2**63 - 1): check the dimensions."
        )


_FIELD = re.compile(r"[,x]")


def parse_shape(text: str) -> tuple[int, ...]:
    """``"1,3,224,224"`` (or ``"1x3x224x224"``) -> ``(1, 3, 224, 224)``; empty fields refused."""
    fields = _FIELD.split(text.replace(" ", ""))
    if not text.strip() or any(f == "" for f in fields):
        raise InputError(
            f"cannot read the shape {text!r}: a dimension is missing (empty field); write "
            "integers separated by commas, e.g. 1,3,224,224"
        )
    try:
        dims = tuple(int(f) for f in fields)
    except ValueError:
        raise InputError(
            f"cannot read the shape {text!r}: write integers separated by commas, e.g. 1,3,224,224"
        ) from None
    return check_shape(dims)


# -- dtypes ----------------------------------------------------------------------------------

_DTYPE_ALIASES = {"long": "int64", "int": "int32", "float": "float32", "half": "float16"}


def parse_dtype(text: str) -> torch.dtype:
    """``"long"``, ``"bfloat16"``, ``"torch.float16"`` -> the ``torch.dtype``."""
    torch = heavy.torch()

    name = text.strip().removeprefix("torch.")
    dtype = getattr(torch, _DTYPE_ALIASES.get(name, name), None) if name else None
    if not isinstance(dtype, torch.dtype):
        raise OptionError(f"unknown dtype {text!r}: use e.g. float32, bfloat16, long, int32")
    return dtype


def dtype_options(dtypes: list[torch.dtype]) -> torch.dtype | list[torch.dtype] | None:
    """Repeated ``--dtype`` options as ``analyze`` takes them: one given applies to every
    input, several are one per input."""
    if not dtypes:
        return None
    return dtypes[0] if len(dtypes) == 1 else dtypes


def _one_dtype(value: Any) -> torch.dtype:
    torch = heavy.torch()

    if isinstance(value, torch.dtype):
        return value
    if isinstance(value, str):
        return parse_dtype(value)
    raise OptionTypeError(
        f"dtypes holds {_show(value)} ({type(value).__name__}), not a dtype: give torch dtypes "
        "such as torch.long, or their names ('long')."
    )


def input_dtypes(dtypes: Any, count: int) -> list[torch.dtype] | None:
    """One dtype per input shape: a list as long as ``count``, or one dtype for every input."""
    torch = heavy.torch()

    if dtypes is None:
        return None
    if count == 0:
        raise OptionError(
            "dtypes applies to the shapes of input_size, and none was given: pass input_size, "
            "or give input_data tensors of the dtypes you want."
        )
    if isinstance(dtypes, (torch.dtype, str)):
        return [_one_dtype(dtypes)] * count
    if not isinstance(dtypes, Sequence):
        raise OptionTypeError(
            f"dtypes={_show(dtypes)} is not a dtype or a list of dtypes: e.g. dtypes=[torch.long]."
        )
    chosen = [_one_dtype(d) for d in dtypes]
    if len(chosen) != count:
        raise InputError(
            f"{len(chosen)} dtypes (dtypes= / --dtype) for {count} input shapes (input_size= / "
            "--input): give one dtype per input, in the same order, or one dtype for all."
        )
    return chosen


# -- the other options -------------------------------------------------------------------------


class _NotChosen(str):
    """An optimizer name the caller did not give in this call (the default, or one a re-run
    carries over): a distinct type, so that a given optimizer is noticed."""

    __slots__ = ()


#: ``analyze``'s default optimizer: equal to ``"adamw"``, but not the caller's choice
DEFAULT_OPTIMIZER = _NotChosen("adamw")


def carried_optimizer(optimizer: Any) -> Any:
    """``optimizer`` as a re-run carries it over: the same name, not chosen in that call."""
    return _NotChosen(optimizer) if isinstance(optimizer, str) else optimizer


def check_mode(mode: Any) -> str:
    return _choose(Mode, mode, "mode")


def check_device(device: Any) -> str:
    return _choose(Device, device, "device")


def check_optimizer(optimizer: Any, mode: str, notes: list[str]) -> str | None:
    """The optimizer's name (``None``: no step); in inference a given one is noted as unused."""
    if optimizer is None:
        return None
    name = _choose(Optimizer, optimizer, "optimizer")
    if mode == Mode.INFERENCE and not isinstance(optimizer, _NotChosen):
        notes.append(
            f"optimizer={name!r} was not used: an inference analysis runs no optimizer step "
            "(mode='training' does)."
        )
    return name


def _choose(kind: Any, value: Any, argument: str) -> str:
    if not isinstance(value, str):
        names = ", ".join(repr(m.value) for m in kind)
        raise OptionTypeError(f"{argument} must be one of {names}, not {_show(value)}")
    try:
        return str(choose(kind, value, argument).value)
    except ValueError as exc:
        raise OptionError(str(exc)) from None


def check_depth(depth: Any) -> int | None:
    """``None`` or a non-negative int."""
    if depth is None:
        return None
    if not _is_dim(depth):
        raise OptionTypeError(f"depth must be an integer (0 or more) or None, not {_show(depth)}")
    value = operator.index(depth)
    if value < 0:
        raise OptionError(f"depth must be 0 or more, not {value}")
    return value


def check_fast(fast: Any) -> bool:
    """``fast``: ``True`` or ``False`` (the op cache on or off), nothing else."""
    if not isinstance(fast, bool):
        raise OptionTypeError(
            f"fast must be True (the op cache on, the default) or False (every kernel runs), "
            f"not {_show(fast)}"
        )
    return fast


def checkpoint_selection(which: Any) -> bool | list[str]:
    """``activation_checkpointing``: ``True``/``False``, or module paths or class names (a single
    string is one name)."""
    if isinstance(which, bool):
        return which
    if which is None:
        return False
    if isinstance(which, str):
        return [which]
    if isinstance(which, (Sequence, set, frozenset)) and all(isinstance(n, str) for n in which):
        return list(which)
    raise OptionTypeError(
        f"activation_checkpointing={_show(which)} must be True, False, or module paths / class "
        "names as strings, e.g. ['model.layers.0', 'LlamaDecoderLayer']."
    )


def check_flag(value: Any, argument: str) -> bool:
    """``value`` as a ``bool`` option (``strict``): anything else, ``"yes"`` included, is
    refused."""
    if not isinstance(value, bool):
        raise OptionTypeError(f"{argument} must be True or False, not {_show(value)}")
    return value


def check_optional_flag(value: Any, argument: str) -> bool | None:
    """``value`` as a ``bool`` option whose default is ``None`` (``assume_nonzero``)."""
    if value is not None and not isinstance(value, bool):
        raise OptionTypeError(
            f"{argument} must be True, False or None (the default), not {_show(value)}"
        )
    return value


def check_loss(loss: Any) -> Callable[[Any], Any] | None:
    """``loss``: None (the sum of every floating output) or a function ``loss(output)``
    returning a scalar tensor; no loss is known by name."""
    if loss is None or callable(loss):
        return loss  # type: ignore[no-any-return]
    if isinstance(loss, str):
        raise OptionError(
            f"unknown loss {loss!r}: no loss is known by name. Give a function of the model's "
            "output that returns a scalar tensor, e.g. loss=lambda out: torch.nn.functional."
            "mse_loss(out, torch.zeros_like(out)), or leave loss=None (the sum of every "
            "floating output)."
        )
    raise OptionTypeError(
        f"loss={_show(loss)} is not a function: give loss=lambda output: ... returning a "
        "scalar tensor, or None (the sum of every floating output)."
    )


def check_listeners(listeners: Any) -> tuple[Callable[[Any], Any], ...]:
    """``listeners``: a list (or tuple) of functions, each called with every ``CallRecord``."""
    if not isinstance(listeners, Sequence) or isinstance(listeners, (str, bytes)):
        raise OptionTypeError(
            f"listeners={_show(listeners)} is not a list of functions: e.g. "
            "listeners=[print] (each is called with every CallRecord as it completes)."
        )
    for i, listener in enumerate(listeners):
        if not callable(listener):
            raise OptionTypeError(
                f"listeners[{i}] = {_show(listener)} is not a function: each listener is "
                "called with every CallRecord as it completes, e.g. listeners=[print]."
            )
    return tuple(listeners)


def check_checkpoint_path(path: Any) -> str | os.PathLike[str] | None:
    """``checkpoint``: None, or a path as a ``str`` or ``os.PathLike`` (``pathlib.Path``)."""
    if path is None:
        return None
    if isinstance(path, (bytes, bytearray, memoryview)):
        raise OptionTypeError(
            f"checkpoint={_show(path)} is a bytes path: give it as a str "
            "(checkpoint=os.fsdecode(path)) or a pathlib.Path."
        )
    if isinstance(path, str) or (
        isinstance(path, os.PathLike) and isinstance(os.fspath(path), str)
    ):
        return path
    raise OptionTypeError(
        f"checkpoint={_show(path)} ({type(path).__name__}) is not a path: give the checkpoint's "
        "path as a str or pathlib.Path (a .safetensors, .pt/.pth/.bin or *.index.json file, "
        "or a model folder)."
    )


def check_grad_mode(mode: str) -> None:
    """Refuse a training analysis inside ``torch.inference_mode()``: autograd is off there for
    good (``torch.enable_grad()`` cannot turn it back on), so nothing could be back-propagated.
    ``torch.no_grad()`` is fine: the trace turns gradients on itself."""
    torch = heavy.torch()

    if mode == Mode.TRAINING and torch.is_inference_mode_enabled():
        raise OptionError(
            "mode='training' was asked for inside torch.inference_mode(), which turns autograd "
            "off for everything made in it (enable_grad() cannot turn it back on), so no "
            "backward pass could be traced: call mw.analyze outside the `with "
            "torch.inference_mode():` block (torch.no_grad() is fine), or use mode='inference'."
        )


def check_assume(assume: Any) -> dict[str, Any] | None:
    """``assume``: ``{"file.py:LINE" or module path: number or bool}``."""
    if assume is None:
        return None
    if not isinstance(assume, Mapping):
        raise OptionTypeError(
            f"assume must be a dict of site -> value, not {type(assume).__name__}: e.g. "
            "assume={'model.py:42': 8, 'encoder.router': True}."
        )
    for key, value in assume.items():
        if not isinstance(key, str):  # ("" is the root module)
            raise OptionTypeError(
                f"assume key {_show(key)} is not a site: keys are 'file.py:LINE' strings or "
                "module paths, e.g. assume={'model.py:42': 8}."
            )
        if not isinstance(value, (bool, numbers.Real)):
            raise OptionTypeError(
                f"assume[{key!r}] = {_show(value)} is not a number or a bool: give the value "
                "the code would have read (.item(), int(t)) or the truth value of the condition."
            )
    return dict(assume)


def check_buildable(model: Any) -> None:
    """Refuse a class or function that cannot be called without arguments, naming them."""
    torch = heavy.torch()

    is_class = isinstance(model, type)
    if is_class and not issubclass(model, torch.nn.Module):
        return  # not a module class: the sources say what they accept
    if isinstance(model, torch.nn.Module):
        return  # (one wrapped by FSDP2 / tensor parallelism is traced as it is: wrapping.py)
    if not callable(model):
        return
    required = _required_parameters(model)
    if not required:
        return
    name = getattr(model, "__name__", None) or repr(model)
    what = "class" if is_class else "function"
    sample = ", ".join(f"{p}=..." for p in required)
    raise OptionTypeError(
        f"the {what} {name} needs arguments to build the model ({', '.join(required)}): pass "
        f"an instance, or a function that builds it: mw.analyze(lambda: {name}({sample}))."
    )


def _required_parameters(factory: Callable[..., Any]) -> list[str]:
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # builtins without a signature: nothing to check
        return []
    return [
        p.name
        for p in signature.parameters.values()
        if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]


def _show(value: Any, limit: int = 80) -> str:
    """``repr(value)``, shortened to one line of at most ``limit`` characters."""
    text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# -- exploration (sweep, max_fit) ---------------------------------------------------------------


def check_budget(budget: Any) -> int:
    """A memory budget in bytes: an int of bytes or a string with a unit (``"80GiB"``,
    ``"80GB"``: binary units are powers of 1024, decimal ones of 1000); more than 0."""
    if isinstance(budget, bool) or not isinstance(budget, (numbers.Integral, str)):
        raise OptionTypeError(
            f"budget={_show(budget)} is not a size: give bytes as an int, or a string with a "
            "unit, e.g. budget='80GiB' (80 x 2**30) or budget='80GB' (80 x 10**9)."
        )
    if isinstance(budget, str):
        try:
            value = parse_bytes(budget)
        except ValueError:
            units = ", ".join(u.replace("I", "i") for u in BYTE_UNITS)
            raise OptionError(
                f"cannot read budget={budget!r}: write a number and a unit ({units}), e.g. "
                "'80GiB' (80 x 2**30 bytes) or '80GB' (80 x 10**9); 'G' alone is ambiguous."
            ) from None
    else:
        value = int(budget)
    if value <= 0:
        raise OptionError(f"budget={_show(budget)} must be more than 0 bytes.")
    return value


# -- precision (autocast, low-precision parameters, micro-batches) ------------------------------

_AUTOCAST_DTYPES = ("bfloat16", "float16")


def check_autocast(dtype: Any) -> torch.dtype | None:
    """``autocast``: None, or the 16-bit dtype autocast computes in (``torch.bfloat16``,
    ``"float16"``...)."""
    if dtype is None or dtype is False:
        return None
    chosen = _one_dtype(dtype) if isinstance(dtype, str) else dtype
    if str(chosen).removeprefix("torch.") not in _AUTOCAST_DTYPES:
        raise OptionError(
            f"autocast={_show(dtype)}: autocast computes in torch.bfloat16 or torch.float16 "
            "(or None for no autocast)."
        )
    return chosen  # type: ignore[no-any-return]


def check_param_dtype(dtype: Any) -> torch.dtype | None:
    """``param_dtype``: None, or a floating dtype every floating parameter is stored in."""
    if dtype is None:
        return None
    chosen = _one_dtype(dtype)
    if not chosen.is_floating_point:
        raise OptionError(
            f"param_dtype={_show(dtype)} is not a floating dtype: e.g. torch.bfloat16 for pure "
            "bf16 training (parameters, gradients and optimizer state in bf16)."
        )
    return chosen


def check_micro_batches(count: Any, mode: str) -> int:
    """``micro_batches``: an int from 1 to ``MAX_MICRO_BATCHES``; more than 1 only in
    training."""
    if not _is_dim(count) or operator.index(count) < 1:
        raise OptionError(
            f"micro_batches={_show(count)} must be an int of 1 or more: the forward and "
            "backward passes run per optimizer step (gradient accumulation)."
        )
    if operator.index(count) > MAX_MICRO_BATCHES:
        raise OptionError(
            f"micro_batches={_show(count)} is more than {MAX_MICRO_BATCHES}, the most one "
            "analysis traces: each micro-batch is a whole forward, loss and backward pass, "
            "traced in full. Trace a few (e.g. micro_batches=4): the memory of the second "
            "micro-batch repeats in every later one, and the FLOPs of one micro-batch times "
            "the count are the step's."
        )
    if operator.index(count) > 1 and mode != Mode.TRAINING:
        raise OptionError(
            f"micro_batches={count} accumulates gradients, which only a training step has: "
            "pass mode='training', or leave micro_batches=1."
        )
    return operator.index(count)


# -- parallel --------------------------------------------------------------------------------

_PARALLEL_EXAMPLE = (
    'e.g. parallel={"fsdp": 8}, {"tp": 2}, {"fsdp": 4, "tp": 2}, with optional "blocks" '
    '(module paths or class names fully_shard wraps) and "tp_plan" ({path: "colwise"})'
)


@dataclass(frozen=True)
class ParallelPlan:
    """``parallel=`` checked: FSDP2 over ``fsdp`` ranks and/or tensor parallelism over ``tp``
    (``fsdp * tp`` ranks in all, this trace is rank 0), the modules ``fully_shard`` wraps
    (``blocks``: None, each child of the outermost ``ModuleList``s) and the TP plan (``tp_plan``:
    None, the transformers config's)."""

    fsdp: int = 1
    tp: int = 1
    blocks: tuple[str, ...] | None = None
    tp_plan: tuple[tuple[str, str], ...] | None = None

    @property
    def world(self) -> int:
        return self.fsdp * self.tp


def check_parallel(parallel: Any) -> ParallelPlan | None:
    """``parallel``: None, or a dict with ``fsdp`` and/or ``tp`` sizes (see ``ParallelPlan``)."""
    if parallel is None:
        return None
    if isinstance(parallel, ParallelPlan):
        return parallel
    if not isinstance(parallel, Mapping):
        raise OptionTypeError(
            f"parallel must be a dict, not {type(parallel).__name__}: {_PARALLEL_EXAMPLE}."
        )
    unknown = sorted(set(map(str, parallel)) - {"fsdp", "tp", "blocks", "tp_plan"})
    if unknown:
        raise OptionError(f"parallel has unknown keys {unknown}: {_PARALLEL_EXAMPLE}.")
    sizes = _parallel_sizes(parallel)
    blocks = parallel.get("blocks")
    if blocks is not None:
        blocks = (blocks,) if isinstance(blocks, str) else blocks
        if not isinstance(blocks, Sequence) or not all(isinstance(b, str) for b in blocks):
            raise OptionTypeError(
                f"parallel['blocks'] must be module paths or class names, not {_show(blocks)}."
            )
        blocks = tuple(blocks)
    plan = parallel.get("tp_plan")
    if plan is not None:
        if not isinstance(plan, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in plan.items()
        ):
            raise OptionTypeError(
                f"parallel['tp_plan'] must map module paths to style names, not {_show(plan)}: "
                'e.g. {"layers.*.up": "colwise", "layers.*.down": "rowwise"}.'
            )
        plan = tuple(plan.items())
    return ParallelPlan(sizes["fsdp"], sizes["tp"], blocks, plan)


def _parallel_sizes(parallel: Mapping[str, Any]) -> dict[str, int]:
    """``fsdp`` and ``tp`` checked: whole numbers of devices, 2 to ``MAX_RANKS`` in all."""
    sizes = {}
    for key in ("fsdp", "tp"):
        value = parallel.get(key, 1)
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) < 1:
            raise OptionError(
                f"parallel[{key!r}] must be a whole number of devices >= 1, not {_show(value)}: "
                f"{_PARALLEL_EXAMPLE}."
            )
        if int(value) > MAX_RANKS:
            raise OptionError(
                f"parallel[{key!r}]={_show(value)} is more than {MAX_RANKS} devices, the most a "
                "parallel= trace stands for (the largest published training jobs): give the "
                f"degree of one job, {_PARALLEL_EXAMPLE}."
            )
        sizes[key] = int(value)
    world = sizes["fsdp"] * sizes["tp"]
    if world < 2:
        raise OptionError(
            f"parallel={_show(dict(parallel))} is one device: give fsdp or tp > 1 "
            f"({_PARALLEL_EXAMPLE}), or leave parallel out."
        )
    if world > MAX_RANKS:
        raise OptionError(
            f"parallel={_show(dict(parallel))} is {world} ranks (fsdp x tp), more than "
            f"{MAX_RANKS}, the most a parallel= trace stands for: lower fsdp or tp."
        )
    return sizes
