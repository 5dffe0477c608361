"""Errors raised while running on meta tensors, explained: what happened, where, and the fix.

The registry of explanations (``meta_widget.trace.known_errors``, ``register_explanation``): the
first whose matcher accepts the exception explains it. ``explain(exc)`` works on any exception,
also outside an analysis.
"""

from __future__ import annotations

import linecache
import os
import re
import traceback
from dataclasses import asdict, dataclass
from typing import Any

from .. import heavy
from .known_errors import EXPLANATIONS
from .sites import _cell_number


@dataclass(frozen=True)
class Explanation:
    """An exception, explained. Plain data: it pickles and serializes to JSON."""

    type: str
    message: str
    title: str
    explanation: str
    fix: str
    module: str | None = None
    call: int | None = None
    file: str | None = None
    line: int | None = None
    code: str | None = None
    op: str | None = None
    #: the class of the module (what names the root module, whose path is ``""``)
    module_type: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        name = self.module or self.module_type or self.module
        where = f" in module {name!r}" if name is not None else ""
        at = f"\n  at {where_text(self.file, self.line)}" if self.file else ""
        code = f"\n    {self.code}" if self.code else ""
        kind = f"{self.type}: " if self.type else ""
        return (
            f"{self.title}{where}: {kind}{_first_line(self.message)}{at}{code}\n"
            f"  Why: {self.explanation}\n  Fix: {self.fix}"
        )


META_ERRORS = frozenset(
    {
        "load_meta_state_dict",
        "bincount",
        "histogram",
        "equal",
        "meta_into_real",
        "cpu_argument",
        "storage_bytes",
        "pin_memory",
        "dlpack",
        "unallocated",
        "one_hot",
        "module_move",
        "numpy",
        "masked_select",
        "unique",
        "repeat_interleave",
        "load_state_dict_noop",
        "to_empty",
        "copy_out",
        "item",
        "nonzero",
        "no_meta_kernel",
        "device_mix",
    }
)
#: entries whose message does not name the meta device, but which only tensors without memory
#: (meta and fake tensors) raise
_META_WITHOUT_THE_WORD = frozenset({"unallocated"})


#: the title of an error no registered explanation knows
GENERIC_TITLE = "The forward pass raised an error"

_TYPE_PREFIX = re.compile(r"^\s*([A-Za-z_][\w.]*(?:Error|Exception|Warning)):\s*(.*)$", re.DOTALL)


def _as_exception(exc: BaseException | str) -> tuple[BaseException, str]:
    """``exc`` and the name of its type; a message (``"RuntimeError: ..."`` pasted from a
    traceback, or the bare text) becomes an exception without a traceback."""
    if isinstance(exc, BaseException):
        return exc, type(exc).__name__
    if isinstance(exc, str):
        typed = _TYPE_PREFIX.match(exc)
        if typed:
            return Exception(typed.group(2)), typed.group(1).rpartition(".")[2]
        return Exception(exc), ""
    raise TypeError(
        f"explain() takes an exception or an error message (str), not {type(exc).__name__}: "
        "e.g. mw.explain(exc) in an `except Exception as exc:` block, or "
        "mw.explain('RuntimeError: Tensor.item() cannot be called on meta tensors')."
    )


def exception_message(exc: BaseException) -> str:
    """``str(exc)``, for any exception object: one whose ``__str__`` raises or returns something
    other than text gives ``"<exception str() failed: E.__str__ raised RuntimeError>"`` instead
    (the words of Python's own traceback), so that explaining an error never raises another."""
    try:
        message = str(exc)
    except Exception as error:  # the exception's own code failed: name it, never show it
        return (
            f"<exception str() failed: {type(exc).__name__}.__str__ raised {type(error).__name__}>"
        )
    # a subclass of str may override the methods the matchers call: keep its characters only
    return message if type(message) is str else "".join(("", message))


def explanation_name(exc: BaseException | str) -> str | None:
    """The name of the registry entry that explains ``exc`` (``None``: only the generic one).

    ``exc`` may also be an error message (see :func:`explain`).
    """
    exc, _ = _as_exception(exc)
    message = exception_message(exc)
    for name, (matcher, *_) in EXPLANATIONS.items():
        if matcher(exc, message):
            return name
    return None


def is_meta_error(exc: BaseException | str) -> bool:
    """True when ``exc`` is an error the meta device raised (``.item()``, ``nonzero``, ``.cpu()``,
    a device mix with meta...), as opposed to an error that real devices raise too.

    ``exc`` may also be an error message (see :func:`explain`).
    """
    exc, _ = _as_exception(exc)
    name = explanation_name(exc)
    return name in META_ERRORS and (
        "meta" in exception_message(exc).lower() or name in _META_WITHOUT_THE_WORD
    )


def _first_line(message: str) -> str:
    return message.strip().splitlines()[0] if message.strip() else ""


def explain(
    exc: BaseException | str,
    *,
    module: str | None = None,
    call: int | None = None,
    op: str | None = None,
) -> Explanation:
    """Explain ``exc`` in plain language: what happened, where, and what to do.

    ``module`` and ``call`` locate it in an analysis; the source line is the innermost frame of
    the traceback outside PyTorch and meta_widget (the model's own code, or a library's).
    ``exc`` may also be an error message, as printed on a traceback's last line
    (``"RuntimeError: Tensor.item() cannot be called on meta tensors"``) or without its type:
    it is explained the same way, with no source line. Anything else raises ``TypeError``.
    Any exception object is explained, also one whose ``__str__`` or ``__repr__`` raises (see
    :func:`exception_message`).
    """
    exc, type_name = _as_exception(exc)
    message = exception_message(exc)
    file, line, code = user_frame(exc)
    title, explanation, fix = next(
        ((t, e, f) for matcher, t, e, f in EXPLANATIONS.values() if matcher(exc, message)),
        (
            GENERIC_TITLE,
            "The model's code raised this error while running on meta tensors.",
            "Read the message and the source line; if the same code works on a real device, "
            "it depends on tensor values that meta tensors do not have.",
        ),
    )
    return Explanation(
        type=type_name,
        message=message,
        title=title,
        explanation=explanation,
        fix=fix,
        module=module,
        call=call,
        file=file,
        line=line,
        code=code,
        op=op,
    )


def _internal_dirs() -> tuple[str, ...]:
    torch = heavy.torch()
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return (os.path.dirname(os.path.abspath(torch.__file__ or "")) + os.sep, here + os.sep)


def user_frame(exc: BaseException) -> tuple[str | None, int | None, str | None]:
    """The innermost traceback frame outside PyTorch and meta_widget: (file, line, code)."""
    internal = _internal_dirs()
    found: tuple[str | None, int | None, str | None] = (None, None, None)
    for frame in traceback.extract_tb(exc.__traceback__):
        path = os.path.abspath(frame.filename)
        if path.startswith(internal) or frame.filename.startswith("<frozen"):
            continue
        code = frame.line or linecache.getline(frame.filename, frame.lineno or 0).strip()
        found = (frame.filename, frame.lineno, code or None)
    return (cell_name(found[0]), *found[1:]) if found[0] else found


#: the prefix of a notebook cell's name, as IPython's tracebacks write it
CELL = "Cell In["


def cell_name(file: str) -> str:
    """``file`` as IPython's traceback names it: ``Cell In[7]`` for the code of a cell (the
    kernel compiles it as ``/tmp/ipykernel_…/….py``), else ``file`` itself."""
    number = _cell_number(file)
    return f"{CELL}{number}]" if number is not None else file


def where_text(file: str, line: int | None) -> str:
    """A source line as tracebacks write it: ``Cell In[7], line 6`` or ``path.py:6``."""
    if not line:
        return file
    return f"{file}, line {line}" if file.startswith(CELL) else f"{file}:{line}"


#: where PyTorch's meta kernels written in Python live (registrations, references, primitives,
#: decompositions): an error raised there is a meta tensor's, whatever its words
_META_KERNELS = (
    f"torch{os.sep}_meta_registrations.py",
    f"torch{os.sep}_refs{os.sep}",
    f"torch{os.sep}_prims{os.sep}",
    f"torch{os.sep}_prims_common{os.sep}",
    f"torch{os.sep}_decomp{os.sep}",
)


def raised_on_meta(exc: BaseException) -> bool:
    """True when ``exc`` was raised inside PyTorch's Python meta kernels: an op on meta tensors
    refused its arguments (a shape mismatch reads "a and b must have same reduction dim" there,
    "mat1 and mat2 shapes cannot be multiplied" on CPU). Unlike :func:`is_meta_error`, the
    error itself would happen on a real device too; it is explained because it happened on
    meta, where PyTorch's words differ from the ones users know."""
    return any(
        any(part in os.path.abspath(frame.filename) for part in _META_KERNELS)
        for frame in traceback.extract_tb(exc.__traceback__)
    )
