"""``meta-widget``: analyze a model from the terminal, print the summary, write an HTML report.

meta-widget examples/llama_70b.py:config --input 1,4096 --html llama.html
meta-widget torch.nn:Transformer --input 10,2,512 --input 12,2,512
meta-widget models:Net --input 1,3,32,32     (models.py in the current folder)
meta-widget meta-llama/Llama-3.1-8B --input 1,4096   (a Hub id: its config.json only)

Every mistake (a bad option, a name that does not import, an object that is not a model, a file
that cannot be written) is one line on stderr and a nonzero exit: 2 for the command line, 1 for
everything else (also a model whose forward pass fails: the summary shows the error, and a file
that calls ``sys.exit`` while being imported). ``--debug`` shows the Python traceback instead.

When the reader of standard output goes away early (``meta-widget ... | head``), the command
stops quietly with status 141, as a Unix tool ended by SIGPIPE does (128 + 13): nothing on
stderr, and ``set -o pipefail`` scripts can tell it from an error (1) or a mistake (2).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
import traceback
from collections.abc import Sequence
from typing import Any, NoReturn

from .choices import MODES, Mode
from .errors import MetaWidgetError
from .options import (
    OptionError,
    check_depth,
    dtype_options,
    input_dtypes,
    parse_dtype,
    parse_shape,
)
from .trace.explain import exception_message

__all__ = ["EXIT_PIPE", "CommandError", "UsageError", "build_parser", "load_object", "main"]

PROG = "meta-widget"
#: the exit status when standard output's reader went away (128 + SIGPIPE, as a shell reports a
#: tool that SIGPIPE ended)
EXIT_PIPE = 141


class UsageError(OptionError):
    """A command-line argument the command cannot use (exit status 2)."""


class CommandError(MetaWidgetError):
    """Something the command could not do with valid arguments (exit status 1)."""


def load_object(spec: str) -> Any:
    """``package.module:attr`` or ``path/to/file.py:attr`` -> the object.

    A plain module name is looked up in the current folder first, as ``python -m`` does (the
    ``meta-widget`` script's own folder is what Python puts on ``sys.path``). Errors raised while
    importing the user's code become a :class:`CommandError` that names the file and line.
    """
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr:
        raise UsageError(f"{spec!r} is not of the form module:attr (e.g. mypkg.models:Net)")
    if target.endswith(".py") or os.sep in target or (os.altsep and os.altsep in target):
        module = _import_file(target)
    else:
        module = _import_module(target)
    value: Any = module
    for part in attr.split("."):
        if not hasattr(value, part):
            raise UsageError(f"{target!r} has no attribute {attr!r}")
        value = getattr(value, part)
    return value


def _import_file(target: str) -> Any:
    if not os.path.isfile(target):
        raise UsageError(f"no file {target!r}")
    module_spec = importlib.util.spec_from_file_location("_meta_widget_target", target)
    if module_spec is None or module_spec.loader is None:
        raise UsageError(f"cannot import {target!r}: not a Python file")
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except SystemExit as exc:  # a script, not a module: its exit is no analysis
        raise _exited(target, exc) from exc
    except Exception as exc:  # the user's code: report it in one line, with where
        raise CommandError(f"importing {target!r} raised {_where(exc)}") from exc
    return module


def _exited(target: str, exc: SystemExit) -> CommandError:
    """The error for a file that called ``sys.exit`` (or raised ``SystemExit``) on import."""
    return CommandError(
        f"{target!r} called sys.exit({_code_text(exc.code)}) while being imported"
        f"{_location(exc)}, so "
        "there is no model to analyze: put the file's script part under "
        "`if __name__ == '__main__':`"
    )


def _import_module(target: str) -> Any:
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.insert(0, here)
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (target == exc.name or target.startswith(exc.name + ".")):
            raise UsageError(
                f"cannot import {target!r}: no module {exc.name!r} in the current folder or on "
                "the Python path (a file can be named as path/to/file.py:attr)"
            ) from exc
        raise CommandError(f"importing {target!r} raised {_where(exc)}") from exc
    except SystemExit as exc:  # a script, not a module: its exit is no analysis
        raise _exited(target, exc) from exc
    except Exception as exc:  # the user's code: report it in one line, with where
        raise CommandError(f"importing {target!r} raised {_where(exc)}") from exc


def _code_text(code: object) -> str:
    """``sys.exit``'s argument as written (an int, a message), or its type for other objects."""
    if type(code) in (int, str, type(None)):
        text = repr(code)
        return text if len(text) <= 200 else text[:200] + "..."
    return f"<{type(code).__name__} object>"


def _where(exc: BaseException) -> str:
    """``Type: message (file:line)``: the innermost frame of the user's code, in one line."""
    if isinstance(exc, SyntaxError) and exc.filename:
        message = " ".join(str(exc.msg or "").split())
        return f"{type(exc).__name__}: {message} ({exc.filename}:{exc.lineno})"
    message = " ".join(exception_message(exc).split())
    return f"{type(exc).__name__}: {message}{_location(exc)}"


def _location(exc: BaseException) -> str:
    """`` (file:line)`` of the innermost frame of the user's code in ``exc``'s traceback."""
    frames = [
        f
        for f in traceback.extract_tb(exc.__traceback__)
        if not f.filename.startswith("<frozen") and "importlib" not in f.filename
    ]
    return f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse prints the usage too: two lines
        _fail(f"{message} (see {PROG} --help)", 2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Analyze a PyTorch model on the meta device: tree, shapes, FLOPs, memory.",
        allow_abbrev=False,
    )
    parser.add_argument(
        "model",
        help="module:attr of an nn.Module, class, factory or config, or a Hugging Face Hub id "
        "(org/name: its config.json only)",
    )
    parser.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="SHAPE",
        help="an input shape, batch included, e.g. 1,3,224,224 (repeat for several inputs)",
    )
    parser.add_argument(
        "--dtype",
        action="append",
        default=[],
        metavar="DTYPE",
        help="dtype of each input (float32, long, ...); default float32, long for token ids",
    )
    parser.add_argument("--mode", choices=MODES, default=Mode.INFERENCE.value)
    parser.add_argument(
        "--new-tokens",
        type=int,
        metavar="N",
        help="with --mode generate: the tokens generate() makes (the input is the prompt)",
    )
    parser.add_argument("--depth", type=int, default=3, help="depth of the printed tree")
    parser.add_argument("--html", metavar="PATH", help="write a standalone HTML report here")
    parser.add_argument("--json", metavar="PATH", help="write the analysis as JSON here")
    parser.add_argument("--revision", help="a Hub id's branch, tag or commit (default main)")
    parser.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="let a Hub model's own code (its config's auto_map) run, as transformers does",
    )
    parser.add_argument(
        "--debug", action="store_true", help="show Python tracebacks instead of one-line errors"
    )
    return parser


def _is_hub_id(spec: str) -> bool:
    """A model given as ``org/name`` (no ``:attr``, no file of that name): a Hub id."""
    if ":" in spec or os.path.exists(spec):
        return False
    try:
        from .sources.hub import hub_id  # huggingface_hub: only for such a name
    except ImportError:
        return False
    return hub_id(spec) is not None


def _fail(message: str, status: int) -> NoReturn:
    one_line = " ".join(message.split())
    print(f"{PROG}: error: {one_line}", file=sys.stderr)
    raise SystemExit(status)


def _check_writable(path: str, option: str) -> None:
    """Refuse an output path that cannot be written, before the (maybe long) analysis."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise UsageError(f"{option} {path!r} is a folder: give a file name")
    if not os.path.isdir(folder):
        raise UsageError(f"{option} {path!r}: the folder {folder!r} does not exist")
    if not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise UsageError(f"{option} {path!r} cannot be written (permission denied)")


def _write(path: str, text: str, option: str) -> None:
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as exc:
        raise CommandError(f"cannot write {option} {path!r}: {exc.strerror or exc}") from exc


def _run(args: argparse.Namespace) -> int:
    from .analysis import analyze  # torch: only once the arguments are known to be good

    check_depth(args.depth)
    shapes = [parse_shape(s) for s in args.input]
    dtypes = dtype_options([parse_dtype(d) for d in args.dtype])
    input_dtypes(dtypes, len(shapes))
    for path, option in ((args.html, "--html"), (args.json, "--json")):
        if path:
            _check_writable(path, option)
    model = args.model if _is_hub_id(args.model) else load_object(args.model)
    analysis = analyze(
        model,
        input_size=(shapes if len(shapes) != 1 else shapes[0]) if shapes else None,
        dtypes=dtypes,
        mode=args.mode,
        new_tokens=args.new_tokens,
        revision=args.revision,
        trust_remote_code=args.trust_remote_code,
    )
    print(analysis.summary(args.depth))
    if args.html:
        _write(args.html, analysis.to_html(), "--html")
        print(f"\nWrote {args.html}")
    if args.json:
        _write(args.json, analysis.to_json(), "--json")
        print(f"Wrote {args.json}")
    return 1 if analysis.error is not None else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; returns the exit status (errors exit through ``SystemExit``).

    A reader of standard output that goes away early (``| head``) ends it quietly with
    :data:`EXIT_PIPE`.
    """
    try:
        status = _main(argv)
        sys.stdout.flush()  # a closed pipe shows here, not as a warning at interpreter exit
    except BrokenPipeError:
        return _reader_gone()
    return status


def _reader_gone() -> int:
    """Standard output's reader went away: point stdout at /dev/null, so that Python's final
    flush at exit finds no closed pipe to warn about, and return :data:`EXIT_PIPE`."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is no file (main() called in-process): nothing to do
        pass
    return EXIT_PIPE


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    if args.debug:
        return _run(args)
    try:
        return _run(args)
    except BrokenPipeError:  # the reader of stdout went away: main() ends quietly
        raise
    except UsageError as exc:
        _fail(str(exc), 2)
    except OptionError as exc:  # the checks analyze shares with %meta: same message
        _fail(str(exc), 2)
    except CommandError as exc:
        _fail(f"{exc} (run with --debug for the traceback)", 1)
    except MetaWidgetError as exc:  # its messages say what and what to do (SourceError too)
        _fail(str(exc), 1)
    except KeyboardInterrupt:
        _fail("interrupted", 130)
    except Exception as exc:  # anything else still gets one line; --debug shows the traceback
        _fail(f"{_where(exc)} (run with --debug for the traceback)", 1)


if __name__ == "__main__":
    sys.exit(main())
