"""IPython extension: ``%load_ext meta_widget``.

- ``%meta EXPR [--input 1,3,224,224 ...] [--dtype long ...]
  [--mode inference|training|generate [--new-tokens N]] [--depth N]``: evaluates ``EXPR`` in
  the notebook's namespace (an ``nn.Module``, a class, a factory, a transformers config, a
  Hugging Face Hub id ``org/name`` with ``[--revision R] [--trust-remote-code]``, or the path
  of a checkpoint) and returns its analysis (or the checkpoint's
  :class:`~meta_widget.checkpoints.CheckpointInfo`), shown as the widget when the magic ends
  the cell: ``a = %meta model --input 1,3,224,224`` keeps it.
- ``%%meta [--input ...]``: runs the cell under ``torch.device("meta")`` (a 70B model is built for
  free) and shows an analysis of every ``nn.Module`` the cell bound to a name.
- Errors that the meta device raises in *any* cell get the traceback as usual, then
  ``meta_widget.explain``'s explanation and fix. ``%unload_ext meta_widget`` removes the magics
  and puts back the exception handler that was there before.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
import traceback
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from IPython.core.error import UsageError

from . import heavy, warmstart
from .analysis import analyze
from .checkpoints import CheckpointError, inspect_checkpoint
from .choices import MODES, Mode
from .options import (
    OptionError,
    check_depth,
    dtype_options,
    input_dtypes,
    parse_dtype,
    parse_shape,
)
from .sources.models import SourceError
from .trace.explain import exception_message, explain, is_meta_error, raised_on_meta
from .undo import on_meta

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

__all__ = ["load_ipython_extension", "parse_magic_line", "unload_ipython_extension"]

USAGE = (
    "%meta EXPR [--input SHAPE ...] [--dtype DTYPE ...] [--mode inference|training|generate]"
    " [--new-tokens N] [--depth N] [--revision R] [--trust-remote-code]"
    " | %%meta [same options] with code in the cell"
)
_OPTION_START = re.compile(r"(?:^|\s)(--?[A-Za-z])")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse would print and exit
        raise UsageError(f"%meta: {message}. Usage: {USAGE}")


def _parser() -> _Parser:
    p = _Parser(prog="%meta", add_help=False, allow_abbrev=False)
    p.add_argument("--input", action="append", default=[], metavar="SHAPE")
    p.add_argument("--dtype", action="append", default=[], metavar="DTYPE")
    p.add_argument("--mode", choices=MODES, default=Mode.INFERENCE.value)
    p.add_argument("--new-tokens", type=int, default=None)
    p.add_argument("--depth", type=int, default=None)
    p.add_argument("--revision", default=None)
    p.add_argument("--trust-remote-code", action="store_true")
    return p


@dataclass
class MagicArgs:
    """The parsed arguments of ``%meta`` / ``%%meta``."""

    expr: str
    input_size: Any = None
    dtypes: Any = None
    mode: str = "inference"
    #: ``--mode generate``: the tokens ``generate()`` makes
    new_tokens: int | None = None
    depth: int | None = None
    given: list[str] = field(default_factory=list)
    #: a Hub id's branch, tag or commit, and whether its own code may run
    revision: str | None = None
    trust_remote_code: bool = False


def parse_magic_line(line: str) -> MagicArgs:
    """Split ``EXPR --opt ...`` and parse the options; bad ones raise ``UsageError`` (one line)."""
    match = _OPTION_START.search(line)
    expr, rest = (line[: match.start(1)], line[match.start(1) :]) if match else (line, "")
    try:
        tokens = shlex.split(rest)
    except ValueError as exc:
        raise UsageError(f"%meta: cannot split the options {rest!r} ({exc}).") from None
    ns = _parser().parse_args(tokens)
    try:  # the checks analyze and the command share: one message each
        shapes = [parse_shape(s) for s in ns.input]
        dtypes = dtype_options([parse_dtype(d) for d in ns.dtype])
        input_dtypes(dtypes, len(shapes))
        check_depth(ns.depth)
    except OptionError as exc:
        raise UsageError(f"%meta: {exc}") from None
    given = [t for t in tokens if t.startswith("--")]
    return MagicArgs(
        expr=expr.strip(),
        input_size=(shapes[0] if len(shapes) == 1 else shapes) if shapes else None,
        dtypes=dtypes,
        mode=ns.mode,
        new_tokens=ns.new_tokens,
        depth=ns.depth,
        given=given,
        revision=ns.revision,
        trust_remote_code=ns.trust_remote_code,
    )


def _analyze(obj: Any, args: MagicArgs, what: str) -> Any:
    try:
        return analyze(
            obj,
            args.input_size,
            dtypes=args.dtypes,
            mode=args.mode,
            new_tokens=args.new_tokens,
            depth=args.depth,
            revision=args.revision,
            trust_remote_code=args.trust_remote_code,
        )
    except OptionError as exc:
        raise UsageError(f"%meta: {exc}") from None
    except SourceError:
        raise UsageError(
            f"%meta: {what} evaluates to {type(obj).__name__}, not a model: give an nn.Module, "
            "a class or zero-argument function that builds one, a transformers config, or a "
            "checkpoint path."
        ) from None


def _inspect(path: str, args: MagicArgs) -> Any:
    extra = [g for g in args.given if g in ("--input", "--dtype", "--mode", "--new-tokens")]
    if extra:
        raise UsageError(
            f"%meta: {', '.join(extra)} do(es) not apply to a checkpoint ({path!r}); to run a "
            "model on inputs, give the model (mw.analyze(model, checkpoint=path) compares both)."
        )
    try:
        return inspect_checkpoint(path)
    except CheckpointError as exc:
        raise UsageError(f"%meta: {exc}") from None


def _is_hub_id(text: str) -> bool:
    """``org/name`` that is no file or folder here: a Hugging Face Hub id."""
    if os.path.exists(text):
        return False
    try:
        from .sources.hub import hub_id  # huggingface_hub: only for such a name
    except ImportError:
        return False
    return hub_id(text) is not None


def meta_magic(shell: InteractiveShell, line: str, cell: str | None = None) -> Any:
    """``%meta`` and ``%%meta`` (see the module docstring)."""
    args = parse_magic_line(line)
    if cell is None:
        return _line(shell, args)
    if args.expr:
        raise UsageError(
            f"%%meta takes only options on its line, not {args.expr!r}: put the code that builds "
            "the model in the cell body."
        )
    _cell(shell, args, cell)
    return None


def _line(shell: InteractiveShell, args: MagicArgs) -> Any:
    if not args.expr:
        raise UsageError(f"%meta needs a model, e.g. %meta model --input 1,3,224,224. {USAGE}")
    try:
        obj = shell.ev(args.expr)
    except (NameError, SyntaxError, AttributeError) as exc:
        if os.path.exists(args.expr):
            return _inspect(args.expr, args)
        if _is_hub_id(args.expr):  # %meta org/name, unquoted
            return _analyze(args.expr, args, repr(args.expr))
        raise UsageError(
            f"%meta: cannot evaluate {args.expr!r} ({type(exc).__name__}: {exc}); give a name or "
            "expression of the notebook, or a checkpoint path in quotes."
        ) from None
    if isinstance(obj, str) and _is_hub_id(obj):
        return _analyze(obj, args, repr(args.expr))
    if isinstance(obj, (str, os.PathLike)):
        return _inspect(os.fspath(obj), args)
    return _analyze(obj, args, repr(args.expr))


def _cell(shell: InteractiveShell, args: MagicArgs, cell: str) -> None:
    ns = shell.user_ns
    before = {k: v for k, v in ns.items() if not k.startswith("_")}
    code = shell.transform_cell(cell)
    filename = shell.compile.cache(code, shell.execution_count, raw_code=cell)
    compiled = shell.compile(code, filename, "exec")
    # the default device is put back exactly, whatever interrupts the cell (see undo.on_meta)
    on_meta(lambda: exec(compiled, shell.user_global_ns, ns))
    bound = [
        (k, v)
        for k, v in ns.items()
        if not k.startswith("_") and isinstance(v, torch.nn.Module) and before.get(k) is not v
    ]
    if not bound:
        print(
            "%%meta: the cell bound no nn.Module to a name; assign the model, e.g. "
            "`model = MyNet()`, to see its analysis."
        )
        return
    for name, module in bound:
        analysis = _analyze(module, args, name)
        if len(bound) > 1:
            print(f"{name}: {type(module).__name__}")
        heavy.display(analysis)


# ---------------------------------------------------------------------------------------------
# the exception hook


def _explained_traceback(
    shell: InteractiveShell, etype: type, value: BaseException, tb: Any, tb_offset: int | None
) -> Any:
    """The custom exception handler: the usual traceback, plus the explanation of meta errors.

    It survives any exception object (``__str__`` or ``__repr__`` raising, odd ``args``, cycles
    of ``__cause__``): IPython unregisters a handler that raises, which would turn explanations
    off for the rest of the session.
    """
    # IPython records the error for %tb, %debug and pdb in showtraceback, which a custom handler
    # bypasses: record it first, on every path (the previous handler's included)
    _record_last_exception(etype, value, tb)
    state = _STATE.get(id(shell))
    note = _explanation_note(value)
    previous = state.previous if state is not None else None
    # (the exception's type decides, as IPython's own `except custom_exceptions` does)
    if previous is not None and previous.types and issubclass(etype, previous.types):
        stb = previous.handler(etype, value, tb, tb_offset=tb_offset)
        if note:
            print(note)
        return stb
    if not note:
        _show_plain(shell, etype, value, tb, tb_offset)
        return None
    try:
        stb = shell.InteractiveTB.structured_traceback(etype, value, tb, tb_offset=tb_offset)
    except Exception:  # IPython's formatter failed on this object: IPython's own fallback shows it
        _show_plain(shell, etype, value, tb, tb_offset)
        print(note)
        return None
    stb = [*stb, note]
    _show(shell, etype, value, stb)
    if shell.call_pdb:  # `%pdb on`: showtraceback would enter the debugger here
        shell.debugger(force=True)
    return stb


def _explanation_note(value: BaseException) -> str:
    """The text printed below a meta error's traceback, or below any error a meta kernel raised
    (a shape mismatch on meta: its words differ from CPU's); "" for other errors.

    ``explain`` handles any exception object; what else may fail here is a matcher added with
    ``meta_widget.explain.register_explanation``: the note then says so instead.
    """
    try:
        explained = is_meta_error(value) or raised_on_meta(value)
        return _explanation_text(explain(value)) if explained else ""
    except Exception as error:  # e.g. a registered matcher's own bug: say so, keep the handler
        return (
            f"\nmeta_widget could not explain this error: {type(error).__name__} while matching "
            "it against the explanations (a matcher added with register_explanation?)."
        )


def _show_plain(
    shell: InteractiveShell, etype: type, value: BaseException, tb: Any, tb_offset: int | None
) -> None:
    """IPython's usual traceback; Python's own when the front end cannot show this object."""
    try:
        shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
    except Exception:  # e.g. ipykernel sends str(value), which may raise: Python's printer copes
        traceback.print_exception(etype, value, tb)


def _show(shell: InteractiveShell, etype: type, value: BaseException, stb: list[str]) -> None:
    """Show a structured traceback, with ``value``'s text made safe for the front end."""
    try:
        shell._showtraceback(etype, value, stb)  # type: ignore[arg-type]
    except Exception:  # ipykernel sends str(value): send its text, made safe, instead
        shell._showtraceback(etype, exception_message(value), stb)  # type: ignore[arg-type]


def _record_last_exception(etype: type, value: BaseException, tb: Any) -> None:
    """Set ``sys.last_type/last_value/last_traceback`` (and ``sys.last_exc`` on 3.12+), as
    IPython's ``showtraceback`` and the standard interpreter do for an uncaught error."""
    sys.last_type = etype
    sys.last_value = value
    sys.last_traceback = tb
    if sys.version_info >= (3, 12):
        sys.last_exc = value


def _explanation_text(explanation: Any) -> str:
    return f"\nmeta_widget explains: {explanation}"


@dataclass
class _Handler:
    types: tuple[type[BaseException], ...]
    handler: Any


@dataclass
class _State:
    previous: _Handler | None
    installed: Any
    magics: dict[str, Any]


_STATE: dict[int, _State] = {}


def load_ipython_extension(ip: InteractiveShell) -> None:
    """``%load_ext meta_widget``: add ``%meta``/``%%meta``, explain meta errors in every cell, and
    warm PyTorch's meta path up in the background (``meta_widget.warm``)."""
    if id(ip) in _STATE:
        return
    warmstart.start()  # PyTorch's first meta forward, in the background (meta_widget.warm)
    shell: Any = ip
    table = shell.magics_manager.magics
    saved = {kind: table[kind].get("meta") for kind in ("line", "cell")}

    def meta(line: str, cell: str | None = None) -> Any:
        return meta_magic(ip, line, cell)

    meta.__doc__ = __doc__
    shell.register_magic_function(meta, magic_kind="line_cell", magic_name="meta")
    previous = _Handler(tuple(ip.custom_exceptions), getattr(ip, "CustomTB", None))
    ip.set_custom_exc((Exception,), _explained_traceback)
    _STATE[id(ip)] = _State(previous=previous, installed=ip.CustomTB, magics=saved)


def unload_ipython_extension(ip: InteractiveShell) -> None:
    """``%unload_ext meta_widget``: remove the magics and restore the previous exception handler."""
    state = _STATE.pop(id(ip), None)
    if state is None:
        return
    table = ip.magics_manager.magics  # type: ignore[union-attr]
    for kind, old in state.magics.items():
        if old is None:
            table[kind].pop("meta", None)
        else:
            table[kind]["meta"] = old
    if ip.CustomTB is state.installed and state.previous is not None:
        # (a handler installed by someone else after ours is left in place)
        ip.CustomTB = state.previous.handler
        ip.custom_exceptions = state.previous.types
