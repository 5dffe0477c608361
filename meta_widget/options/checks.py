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
  also checked against the model (``meta_widget.distributed.parallel.check_world``).
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
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .. import heavy
from ..choices import Device, Mode, Optimizer, choose
from ..units import BYTE_UNITS, parse_bytes

if TYPE_CHECKING:
    import torch

from .errors import MAX_MICRO_BATCHES, OptionError, OptionTypeError, show
from .shapes import _is_dim, _one_dtype

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
        raise OptionTypeError(f"{argument} must be one of {names}, not {show(value)}")
    try:
        return str(choose(kind, value, argument).value)
    except ValueError as exc:
        raise OptionError(str(exc)) from None


def check_depth(depth: Any) -> int | None:
    """``None`` or a non-negative int."""
    if depth is None:
        return None
    if not _is_dim(depth):
        raise OptionTypeError(f"depth must be an integer (0 or more) or None, not {show(depth)}")
    value = operator.index(depth)
    if value < 0:
        raise OptionError(f"depth must be 0 or more, not {value}")
    return value


def check_fast(fast: Any) -> bool:
    """``fast``: ``True`` or ``False`` (the op cache on or off), nothing else."""
    if not isinstance(fast, bool):
        raise OptionTypeError(
            f"fast must be True (the op cache on, the default) or False (every kernel runs), "
            f"not {show(fast)}"
        )
    return fast


def checkpoint_selection(which: Any) -> bool | str | list[str]:
    """``activation_checkpointing``: ``True``/``False``, ``"selective"`` (the modules ``True``
    picks, op-level: ``options.selective``), or module paths or class names (a single string is
    one name)."""
    if isinstance(which, bool):
        return which
    if which is None:
        return False
    if which == "selective":
        return which
    if isinstance(which, str):
        return [which]
    if isinstance(which, (Sequence, set, frozenset)) and all(isinstance(n, str) for n in which):
        return list(which)
    raise OptionTypeError(
        f"activation_checkpointing={show(which)} must be True, False, 'selective', or module "
        "paths / class names as strings, e.g. ['model.layers.0', 'LlamaDecoderLayer']."
    )


def check_flag(value: Any, argument: str) -> bool:
    """``value`` as a ``bool`` option (``strict``): anything else, ``"yes"`` included, is
    refused."""
    if not isinstance(value, bool):
        raise OptionTypeError(f"{argument} must be True or False, not {show(value)}")
    return value


def check_optional_flag(value: Any, argument: str) -> bool | None:
    """``value`` as a ``bool`` option whose default is ``None`` (``assume_nonzero``)."""
    if value is not None and not isinstance(value, bool):
        raise OptionTypeError(
            f"{argument} must be True, False or None (the default), not {show(value)}"
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
        f"loss={show(loss)} is not a function: give loss=lambda output: ... returning a "
        "scalar tensor, or None (the sum of every floating output)."
    )


def check_listeners(listeners: Any) -> tuple[Callable[[Any], Any], ...]:
    """``listeners``: a list (or tuple) of functions, each called with every ``CallRecord``."""
    if not isinstance(listeners, Sequence) or isinstance(listeners, (str, bytes)):
        raise OptionTypeError(
            f"listeners={show(listeners)} is not a list of functions: e.g. "
            "listeners=[print] (each is called with every CallRecord as it completes)."
        )
    for i, listener in enumerate(listeners):
        if not callable(listener):
            raise OptionTypeError(
                f"listeners[{i}] = {show(listener)} is not a function: each listener is "
                "called with every CallRecord as it completes, e.g. listeners=[print]."
            )
    return tuple(listeners)


def check_checkpoint_path(path: Any) -> str | os.PathLike[str] | None:
    """``checkpoint``: None, or a path as a ``str`` or ``os.PathLike`` (``pathlib.Path``)."""
    if path is None:
        return None
    if isinstance(path, (bytes, bytearray, memoryview)):
        raise OptionTypeError(
            f"checkpoint={show(path)} is a bytes path: give it as a str "
            "(checkpoint=os.fsdecode(path)) or a pathlib.Path."
        )
    if isinstance(path, str) or (
        isinstance(path, os.PathLike) and isinstance(os.fspath(path), str)
    ):
        return path
    raise OptionTypeError(
        f"checkpoint={show(path)} ({type(path).__name__}) is not a path: give the checkpoint's "
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
                f"assume key {show(key)} is not a site: keys are 'file.py:LINE' strings or "
                "module paths, e.g. assume={'model.py:42': 8}."
            )
        if not isinstance(value, (bool, numbers.Real)):
            raise OptionTypeError(
                f"assume[{key!r}] = {show(value)} is not a number or a bool: give the value "
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


# -- exploration (sweep, max_fit) ---------------------------------------------------------------


def check_graph(depth: Any, fold: Any) -> tuple[int, bool]:
    """``Analysis.graph``'s ``depth`` (an int >= 0, the root 0) and ``fold`` (True or False)."""
    if isinstance(depth, bool) or not isinstance(depth, numbers.Integral) or depth < 0:
        raise OptionError(
            f"graph: depth={show(depth)} must be a whole number of 0 or more (the root is 0, "
            "its children 1), e.g. a.graph(depth=2)."
        )
    if not isinstance(fold, bool):
        raise OptionTypeError(
            f"graph: fold={show(fold)} must be True (fold repeated siblings such as layers.0 "
            "... layers.79 into one node) or False (list every one)."
        )
    return int(depth), fold


#: the largest memory figure accepted (a budget, a GPU's memory): 16 EiB, all a 64-bit address
#: space can name; past it a figure is a typo or an attempt to overflow, not a device
MAX_BUDGET_BYTES = 2**64


def check_budget(budget: Any, name: str = "budget") -> int:
    """A memory budget in bytes: an int of bytes or a string with a unit (``"80GiB"``,
    ``"80GB"``: binary units are powers of 1024, decimal ones of 1000); more than 0 and at most
    ``MAX_BUDGET_BYTES`` (16 EiB). ``name`` is the argument the messages name."""
    if isinstance(budget, bool) or not isinstance(budget, (numbers.Integral, str)):
        raise OptionTypeError(
            f"{name}={show(budget)} is not a size: give bytes as an int, or a string with a "
            f"unit, e.g. {name}='80GiB' (80 x 2**30) or {name}='80GB' (80 x 10**9)."
        )
    if isinstance(budget, str):
        try:
            value = parse_bytes(budget)
        except OverflowError:  # a number past float's range: past any bound
            value = MAX_BUDGET_BYTES + 1
        except ValueError:
            units = ", ".join(u.replace("I", "i") for u in BYTE_UNITS)
            raise OptionError(
                f"cannot read {name}={show(budget)}: write a number and a unit ({units}), e.g. "
                "'80GiB' (80 x 2**30 bytes) or '80GB' (80 x 10**9); 'G' alone is ambiguous."
            ) from None
    else:
        value = int(budget)
    if value <= 0:
        raise OptionError(f"{name}={show(budget)} must be more than 0 bytes.")
    if value > MAX_BUDGET_BYTES:
        raise OptionError(
            f"{name}={show(budget)} is past 16 EiB (2**64 bytes, all a 64-bit address space "
            "can name): give the memory of one device, e.g. '80GiB'."
        )
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
            f"autocast={show(dtype)}: autocast computes in torch.bfloat16 or torch.float16 "
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
            f"param_dtype={show(dtype)} is not a floating dtype: e.g. torch.bfloat16 for pure "
            "bf16 training (parameters, gradients and optimizer state in bf16)."
        )
    return chosen


def check_micro_batches(count: Any, mode: str) -> int:
    """``micro_batches``: an int from 1 to ``MAX_MICRO_BATCHES``; more than 1 only in
    training."""
    if not _is_dim(count) or operator.index(count) < 1:
        raise OptionError(
            f"micro_batches={show(count)} must be an int of 1 or more: the forward and "
            "backward passes run per optimizer step (gradient accumulation)."
        )
    if operator.index(count) > MAX_MICRO_BATCHES:
        raise OptionError(
            f"micro_batches={show(count)} is more than {MAX_MICRO_BATCHES}, the most one "
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


# -- the accelerator the time is for --------------------------------------------------------


#: the launch regimes the time model knows (``meta_widget.timing.efficiency``)
LAUNCHES = ("eager", "graphs")


def check_launch(launch: Any) -> str | None:
    """``launch``: None, ``"eager"`` or ``"graphs"``."""
    if launch is None or launch in LAUNCHES:
        return launch  # type: ignore[no-any-return]
    if not isinstance(launch, str):
        raise OptionTypeError(f"launch must be 'eager' or 'graphs', not {show(launch)}.")
    raise OptionError(
        f"launch={launch!r} is not a launch regime: 'eager' (each op pays the host's launch "
        "time, PyTorch's default) or 'graphs' (CUDA graphs replayed, as servers and "
        "torch.compile(mode='reduce-overhead') run)."
    )


def check_gpu(gpu: Any) -> Any:
    """``gpu``: None, a name of ``mw.gpus()`` or an ``mw.GPU(...)``. Only the type is checked
    here (the table lives with the time model, a layer above): ``meta_widget.timing.gpus.
    resolve_gpu`` turns a name into its figures, or lists the known names, before tracing."""
    if gpu is None:
        return None
    if isinstance(gpu, str):
        if not gpu.strip():
            raise OptionError("gpu='' names no accelerator: pass a name of mw.gpus(), e.g. 'H100'.")
        return gpu
    if all(hasattr(gpu, name) for name in ("memory_bytes", "hbm_bytes_per_s", "peak")):
        return gpu  # an mw.GPU (or one like it)
    raise OptionTypeError(
        f"gpu must be a name of mw.gpus() (e.g. 'H100') or an mw.GPU(...), not "
        f"{type(gpu).__name__} {show(gpu)}."
    )
