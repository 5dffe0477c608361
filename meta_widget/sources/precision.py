"""Pure low-precision training: parameters (and so gradients and optimizer state) in one dtype.

``analyze(..., param_dtype=torch.bfloat16)`` analyzes the model as ``model.to(torch.bfloat16)``
would leave it: every floating parameter and buffer in that dtype, on a copy of the meta model
(the user's module is never changed). PyTorch's optimizers keep their state at the dtype of the
parameters, so AdamW's two moments are bf16 too, as in a plain ``model.to(torch.bfloat16)`` run;
fp32 master weights and fp32 optimizer state are what ``autocast=`` models instead. Floating
inputs are given the same dtype (the model could not take fp32 inputs), unless ``dtypes`` says
otherwise.
"""

from __future__ import annotations

from typing import Any

import torch

from .inputs import MetaInputs
from .models import MetaModel, meta_copy

__all__ = ["cast_inputs", "with_param_dtype"]


def with_param_dtype(meta: MetaModel, dtype: torch.dtype) -> MetaModel:
    """``meta`` with every floating parameter and buffer in ``dtype``.

    The module is cast in place only when meta_widget owns it; the user's own meta module is
    cast on a copy (:func:`~.sources.meta_copy`), or, when it is in ``dtype`` already, analyzed
    as it is and still not owned: its dtypes never change.
    """
    floating = [
        t for t in (*meta.module.parameters(), *meta.module.buffers()) if t.is_floating_point()
    ]
    module, owned = meta.module, meta.owned
    if any(t.dtype != dtype for t in floating):
        if not owned:
            module, owned = meta_copy(module), True
        module.to(dtype)
    note = f"Parameters and buffers analyzed in {str(dtype).removeprefix('torch.')} (param_dtype)."
    return MetaModel(module, meta.source, owned, [*meta.notes, note], meta.rebuild)


def cast_inputs(inputs: MetaInputs, dtype: torch.dtype) -> MetaInputs:
    """``inputs`` with every floating tensor in ``dtype`` (integer ids are left alone)."""

    def cast(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return value.to(dtype) if value.is_floating_point() else value
        if isinstance(value, dict):
            return type(value)({k: cast(v) for k, v in value.items()})
        if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
            return type(value)(cast(v) for v in value)
        return value

    return MetaInputs(cast(inputs.args), cast(inputs.kwargs), inputs.notes)
