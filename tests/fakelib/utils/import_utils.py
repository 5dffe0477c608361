"""Shaped like transformers' ``utils/import_utils.py``: one check helper that models of the
library call for their own conditions (``torch_compilable_check``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def compilable_check(
    cond: Any, msg: str | Callable[[], str], error_type: type[Exception] = ValueError
) -> None:
    """Raise ``error_type(msg)`` unless ``cond`` holds (a bool, a tensor or a callable)."""
    message = msg if callable(msg) else (lambda: msg)
    if callable(cond):
        cond = cond()
    if isinstance(cond, torch.Tensor):
        torch._check_tensor_all_with(error_type, cond, message)
    else:
        torch._check_with(error_type, cond, message)
