"""Where in the model's own code something happened: the site an assumption is shown and keyed by.

The Python stack at an op mixes the model's code with PyTorch, meta_widget's trace machinery and
libraries' shared helpers (``transformers/utils/import_utils.py``'s ``torch_compilable_check``
evaluates conditions for hundreds of models; ``masking_utils.py`` builds every model's mask). A
site keyed at such a helper would address every check that goes through it. So
:func:`find_site` walks the stack outwards from the op and keeps the *model frames*: not
PyTorch's, not meta_widget's, and none past the trace's own entry (what called
``mw.analyze`` is no part of the model). The site is the innermost model frame that is not a
shared helper (:func:`is_helper`) or is a method of an ``nn.Module`` (the model's code, wherever
it lives); the frames from the op out to it are kept as the short stack the widget shows.

Code run in a notebook cell is named the way the notebook shows it, ``In[8]``, not by IPython's
temporary file name (``/tmp/ipykernel_4242/3602321631.py``), which changes with every kernel.
In the backward pass no model frame is running (the autograd engine runs the nodes): such a
site has no file, and is keyed by the module and forward call that made the node.
"""

from __future__ import annotations

import linecache
import os
import re
import sys
from dataclasses import dataclass
from types import FrameType

import torch

__all__ = ["Frame", "find_site", "is_helper", "source_name"]

_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_TORCH = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep

#: the frames of meta_widget that run the model: the stack beyond them is the caller of analyze
_TRACE_ENTRIES = frozenset({"step", "_forward", "_backward"})

#: a library's shared helper: a file in a ``utils`` folder, or named ``utils.py``/``*_utils.py``
_HELPER = re.compile(r"(^|/)utils/|(^|/|_)utils\.py$")


@dataclass(frozen=True)
class Frame:
    """One model frame: its file, line, source line (stripped) and function."""

    file: str
    line: int
    code: str | None
    function: str
    #: the frame runs a method of an ``nn.Module`` (a model's own code, not a helper)
    in_module: bool = False

    def __str__(self) -> str:
        return f"{source_name(self.file)}:{self.line} in {self.function}"


def is_helper(file: str) -> bool:
    """Whether ``file`` is a shared helper whose checks are made on its caller's behalf."""
    return bool(_HELPER.search(file.replace(os.sep, "/")))


def _internal(frame: FrameType) -> bool | None:
    """True for PyTorch's and meta_widget's frames, None for the trace's entry (stop there)."""
    raw = frame.f_code.co_filename
    if raw.startswith("<") and not raw.startswith("<ipython-input-"):
        return True  # <string>, <frozen ...>: no source to show
    path = os.path.abspath(raw)
    if path.startswith(_HERE):
        return None if frame.f_code.co_name in _TRACE_ENTRIES else True
    return path.startswith(_TORCH)


def model_frames(frame: FrameType | None) -> list[Frame]:
    """The model frames from ``frame`` outwards (innermost first), up to the trace's entry."""
    frames: list[Frame] = []
    while frame is not None:
        internal = _internal(frame)
        if internal is None:
            break
        if internal is False:
            code = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
            frames.append(
                Frame(
                    frame.f_code.co_filename,
                    frame.f_lineno,
                    code or None,
                    frame.f_code.co_name,
                    _in_module(frame),
                )
            )
        frame = frame.f_back
    return frames


def _in_module(frame: FrameType) -> bool:
    """Whether ``frame`` runs a method of an ``nn.Module`` subclass, found from its code's
    qualified name and module globals. Never from ``frame.f_locals``: before Python 3.13 reading
    it snapshots the locals into a dict the frame keeps, so a tensor the model's code lets go of
    afterwards (``hidden = residual + hidden``) stayed alive until the method returned, and the
    trace's memory with it (a GPT-2 block's peak was 512 KiB high)."""
    code = frame.f_code
    qualname: str | None = getattr(code, "co_qualname", None)  # Python >= 3.11
    if qualname is None or "<locals>" in qualname:  # a class made inside a function
        return code.co_argcount > 0 and code.co_varnames[0] == "self"
    owner_path = qualname.split(".")[:-1]
    if not owner_path:
        return False
    owner: object = frame.f_globals.get(owner_path[0])
    for part in owner_path[1:]:
        owner = getattr(owner, part, None)
    return isinstance(owner, type) and issubclass(owner, torch.nn.Module)


def find_site(skip: int = 1) -> tuple[Frame | None, list[Frame]]:
    """The site of the op running now and the short stack up to it (innermost first).

    The site is the innermost model frame that is a method of an ``nn.Module`` or outside the
    shared helpers; when there is none, the innermost. ``(None, [])`` when
    no model frame runs (the backward pass).
    """
    frames = model_frames(sys._getframe(skip))
    for i, frame in enumerate(frames):
        if frame.in_module or not is_helper(frame.file):
            return frame, frames[: i + 1]
    if not frames:
        return None, []
    return frames[0], frames[:1]


def source_name(file: str) -> str:
    """A file as its site names it: ``In[8]`` for a notebook cell, else its base name."""
    cell = _cell_number(file)
    if cell is not None:
        return f"In[{cell}]"
    return os.path.basename(file)


def _cell_number(file: str) -> int | None:
    """The execution count of the IPython cell compiled as ``file``, if IPython runs."""
    ipython = sys.modules.get("IPython")
    shell = getattr(ipython, "get_ipython", lambda: None)() if ipython is not None else None
    names = getattr(getattr(shell, "compile", None), "_filename_map", None)
    if isinstance(names, dict):
        number = names.get(file)
        if isinstance(number, int):
            return number
    match = re.match(r"<ipython-input-(\d+)-", file)
    return int(match.group(1)) if match else None
