"""Recorded assumptions: what the trace takes for granted when it needs a value meta has not got.

A meta tensor has no values, so a Python branch on one (``if mask.all():``), ``.item()``, and
data-dependent shapes (``nonzero``, ``x[mask]``, ``masked_select``) cannot run. While
``mw.analyze`` traces (and only then: the policy lives in the recorder's dispatch mode, nothing
global is patched), the :class:`Policy` answers instead of failing, and every answer is recorded as
an :class:`Assumption` with the module and the source line that asked:

- the truth value of a boolean tensor (``bool(t)``, ``if t:``, ``t.all()``/``t.any()`` as a
  condition): ``True`` unless ``assume`` says otherwise for that site;
- ``nonzero``, boolean-mask indexing and ``masked_select``: every element is selected (upper-bound
  shapes); tensors computed from such results are marked as assumed;
- a number (``.item()``, ``int(t)``, ``float(t)``): only from ``assume``, keyed by
  ``"file.py:LINE"`` or by module path; otherwise the trace fails with an explanation naming
  that key.

``strict=True`` turns the policy off (today's explained errors). A second table, ``META_FIXES``,
replaces meta kernels that are stricter than real devices (``_grouped_mm`` accepts only bf16 on
meta while the CPU and CUDA kernels take float32), so such models trace with exact shapes.
"""

from __future__ import annotations

import linecache
import operator
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import torch

from .errors import MetaWidgetError

aten = torch.ops.aten


class MetaValueNeeded(MetaWidgetError, RuntimeError):
    """The trace needs a number from a meta tensor and ``assume`` does not give it."""


@dataclass
class Assumption:
    """One site where the trace assumed a value instead of failing.

    ``kind`` is ``"truth"`` (a boolean tensor used as a condition), ``"nonzero"`` (every element
    selected), or ``"value"`` (a number given through ``assume``). ``count`` is how many times
    the site was reached (e.g. once per layer).
    """

    kind: str
    op: str
    value: str
    module: str
    call: int
    file: str | None
    line: int | None
    code: str | None
    count: int = 1

    @property
    def site(self) -> str:
        """The key to override this assumption with: ``"file.py:LINE"`` (or the module path)."""
        if self.file is None:
            return self.module
        return f"{os.path.basename(self.file)}:{self.line}"

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["site"] = self.site
        return out

    def __str__(self) -> str:
        where = f"{_short(self.file)}:{self.line}" if self.file else "?"
        times = f" ({self.count}×)" if self.count > 1 else ""
        return (
            f"{self.kind}: {self.op} -> {self.value} in {self.module or '<root>'} at {where}{times}"
        )


def _short(path: str) -> str:
    """A library path from its package on (``transformers/masking_utils.py``)."""
    marker = "site-packages" + os.sep
    return path.split(marker, 1)[1] if marker in path else path


@dataclass
class Policy:
    """What to assume. ``values`` maps ``"file.py:LINE"`` or a module path to a value."""

    truth: bool = True
    nonzero: bool = True
    values: Mapping[str, Any] | None = None

    def lookup(self, file: str | None, line: int | None, module: str) -> tuple[bool, Any]:
        """The user's value for a site: by ``file:line`` (basename or path suffix), then module."""
        values = self.values or {}
        if file is not None:
            for key, value in values.items():
                name, _, number = key.rpartition(":")
                if number.isdigit() and int(number) == line and file.endswith(name):
                    return True, value
        if module in values:
            return True, values[module]
        return False, None


def _internal(path: str) -> bool:
    here = os.path.dirname(os.path.abspath(__file__)) + os.sep
    torch_dir = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
    return path.startswith((here, torch_dir)) or path.startswith("<")


def caller_site() -> tuple[str | None, int | None, str | None]:
    """The innermost Python frame outside PyTorch and meta_widget: (file, line, code)."""
    frame = sys._getframe(1)
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if not _internal(path):
            code = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
            return frame.f_code.co_filename, frame.f_lineno, code or None
        frame = frame.f_back  # type: ignore[assignment]
    return None, None, None


# ---------------------------------------------------------------------------------------------
# upper-bound implementations of data-dependent ops (meta in, meta out)


def nonzero_upper_bound(t: torch.Tensor) -> torch.Tensor:
    """``nonzero`` as if every element were nonzero: shape ``(numel, ndim)``."""
    return torch.empty((t.numel(), t.dim()), dtype=torch.long, device="meta")


def _mask_to_indices(index: Any) -> list[Any]:
    """Replace boolean masks in an index list by the long indices of an all-true mask."""
    out: list[Any] = []
    for ix in index:
        if isinstance(ix, torch.Tensor) and ix.dtype in (torch.bool, torch.uint8):
            n = ix.numel()
            out.extend(torch.empty((n,), dtype=torch.long, device="meta") for _ in range(ix.dim()))
        else:
            out.append(ix)
    return out


def has_mask(index: Any) -> bool:
    return any(
        isinstance(ix, torch.Tensor) and ix.dtype in (torch.bool, torch.uint8) for ix in index or ()
    )


def index_upper_bound(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``x[mask]`` (and ``x[mask] = v``) with every mask element selected."""
    args = (args[0], _mask_to_indices(args[1]), *args[2:])
    return func(*args, **kwargs)


def masked_select_upper_bound(t: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    shape = torch.broadcast_shapes(t.shape, mask.shape)
    return torch.empty((int(torch.Size(shape).numel()),), dtype=t.dtype, device="meta")


# ---------------------------------------------------------------------------------------------
# meta kernels stricter than real devices


def _grouped_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    offs: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``torch._grouped_mm``'s output on meta for any float dtype (the meta kernel wants bf16)."""
    dtype = out_dtype or a.dtype
    if a.dim() == 2 and b.dim() == 3:  # (tokens, k) x (groups, k, n) -> (tokens, n)
        shape: tuple[int, ...] = (a.shape[0], b.shape[-1])
    elif a.dim() == 3:  # (groups, m, k) x (groups, k, n), or x (k, n) with offsets along n
        shape = (a.shape[0], a.shape[1], b.shape[-1])
    else:  # (m, k) x (k, n) with offsets along k: one (m, n) result per group
        groups = offs.shape[0] if offs is not None else 1
        shape = (groups, a.shape[0], b.shape[-1])
    return torch.empty(shape, dtype=dtype, device="meta")


def grid_value(mask_shape: tuple[int, ...], offset: int) -> int:
    """Element ``offset`` of ``nonzero`` of an all-true mask of ``mask_shape`` (row-major)."""
    ndim = max(len(mask_shape), 1)
    row, col = divmod(offset, ndim)
    coords: list[int] = []
    for size in reversed(mask_shape):
        row, rest = divmod(row, size) if size else (0, 0)
        coords.append(rest)
    return list(reversed(coords))[col] if coords else 0


#: 0-dim ops whose result the recorder computes when every input value is known (e.g. an index
#: read from an upper-bound ``nonzero`` compared with a constant, as MoE routing loops do)
SCALAR_OPS: dict[Any, Callable[[Any, Any], Any]] = {
    aten.eq.Scalar: operator.eq,
    aten.eq.Tensor: operator.eq,
    aten.ne.Scalar: operator.ne,
    aten.ne.Tensor: operator.ne,
    aten.lt.Scalar: operator.lt,
    aten.lt.Tensor: operator.lt,
    aten.le.Scalar: operator.le,
    aten.le.Tensor: operator.le,
    aten.gt.Scalar: operator.gt,
    aten.gt.Tensor: operator.gt,
    aten.ge.Scalar: operator.ge,
    aten.ge.Tensor: operator.ge,
    aten.add.Tensor: operator.add,
    aten.sub.Tensor: operator.sub,
    aten.mul.Tensor: operator.mul,
}

META_FIXES: dict[Any, Callable[..., Any]] = {aten._grouped_mm.default: _grouped_mm}

#: ops whose result depends on values: handled by the policy when it is on
DATA_DEPENDENT = frozenset(
    {
        aten._local_scalar_dense.default,
        aten.nonzero.default,
        aten.masked_select.default,
        aten.index.Tensor,
        aten.index_put.default,
        aten.index_put_.default,
        aten._index_put_impl_.default,
    }
)
