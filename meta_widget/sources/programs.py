"""Compiled and exported programs as sources: what PyTorch made of a module, traced as a module.

- a ``torch.export.ExportedProgram``: its module (``program.module()``, a ``GraphModule``
  holding the program's parameters and buffers under their original names), copied to meta;
- a ``torch.compile``d module (``OptimizedModule``): the module it compiled (``_orig_mod``),
  so no graph is compiled on meta and none of PyTorch's compile-time warnings (global hooks
  firing once more) reaches the user;
- a TorchScript module (``torch.jit.script`` / ``trace``): refused in one line, since its code
  runs in TorchScript's interpreter, where no hook fires and whose tensors cannot be swapped
  for meta ones; the message says what to pass instead.

Each is registered before the plain module source (``register_source(..., first=True)``).
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

import torch

from .models import MetaModel, SourceError, _from_module, register_source

__all__ = ["from_compiled", "from_exported", "refuse_script"]


def _is_exported(obj: Any) -> bool:
    return isinstance(obj, torch.export.ExportedProgram)


@register_source("exported program", _is_exported, first=True)
def from_exported(program: Any) -> MetaModel:
    """The meta copy of ``program.module()``, noted as such."""
    with warnings.catch_warnings():
        # copying the GraphModule pickles its tree specs, whose old spelling torch warns about
        warnings.filterwarnings("ignore", message=r".*LeafSpec.*", category=FutureWarning)
        module = program.module()
        meta = _from_module(module)
    meta.source = "exported program"
    meta.notes.append(
        "An ExportedProgram: its module (program.module(), a GraphModule with the program's "
        "parameters and buffers) was traced. Its graph calls no submodule, so the tree shows "
        "the parameters by their original names and every op under the root."
    )
    return meta


def _is_compiled(obj: Any) -> bool:
    # torch.compile loaded dynamo if obj is one of its modules: never loaded here for nothing
    frames = sys.modules.get("torch._dynamo.eval_frame")
    return frames is not None and isinstance(obj, frames.OptimizedModule)


@register_source("compiled module", _is_compiled, first=True)
def from_compiled(compiled: Any) -> MetaModel:
    """The meta source of the module ``torch.compile`` wrapped (``_orig_mod``)."""
    original = compiled._orig_mod
    meta = _from_module(original)
    meta.source = "compiled module"
    meta.notes.append(
        f"A torch.compile'd {type(original).__name__}: the module it compiled (_orig_mod) was "
        "traced, op by op as eager PyTorch runs it; the numbers are those of the eager module "
        "(compiled kernels may fuse ops and need less memory)."
    )
    return meta


def _is_script(obj: Any) -> bool:
    return isinstance(obj, torch.jit.ScriptModule)


@register_source("TorchScript module", _is_script, first=True)
def refuse_script(module: Any) -> MetaModel:
    """TorchScript cannot be traced on meta: :class:`SourceError` saying what to pass."""
    name = getattr(module, "original_name", type(module).__name__)
    raise SourceError(
        f"{name} is a TorchScript module (torch.jit.script / trace), whose code runs in "
        "TorchScript's interpreter where module hooks do not fire and meta tensors cannot "
        "replace its weights: pass the Python module you scripted (mw.analyze(MyModel(...))), "
        "or torch.export.export(module, args) of it."
    )
