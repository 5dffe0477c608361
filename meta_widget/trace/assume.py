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

import operator
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..errors import MetaWidgetError
from .bounds import bound_for, run_bound
from .sites import find_site, source_name
from .storage import on_meta, storage_key

if TYPE_CHECKING:
    from ..data.records import CallRecord

aten = torch.ops.aten


class MetaValueNeeded(MetaWidgetError, RuntimeError):
    """The trace needs a number from a meta tensor and ``assume`` does not give it."""


@dataclass
class Assumption:
    """One site where the trace assumed a value instead of failing.

    ``kind`` is ``"truth"`` (a boolean tensor used as a condition), ``"nonzero"`` (every element
    selected), ``"bound"`` (a data-dependent size taken at its upper bound, see
    :func:`register_bound`) or ``"value"`` (a number given through ``assume``). ``count`` is how
    many times the site was reached (e.g. once per layer). ``file``/``line``/``code`` are the
    model's line (shared helpers skipped, see :mod:`meta_widget.trace.sites`), ``stack`` the frames
    from
    the op out to it (innermost first); in backward (``backward=True``) there is no model line:
    ``module`` and ``call`` are the module and forward call that made the autograd node.
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
    stack: list[str] = field(default_factory=list)
    #: the class of the module (what names the root module, whose path is ``""``)
    module_type: str = ""
    backward: bool = False

    @property
    def where(self) -> str:
        """The module, by path; the root by its class."""
        return self.module or self.module_type or "<root>"

    @property
    def site(self) -> str:
        """The key to override this assumption with: ``"file.py:LINE"`` (``"In[8]:3"`` for a
        notebook cell), or without a line the module (``"module@CALL"`` in backward)."""
        return site_key(self.file, self.line, self.where, self.call, self.backward)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["site"] = self.site
        return out

    def __str__(self) -> str:
        at = f" at {self.site}" if self.file else " (backward)" if self.backward else ""
        times = f" ({self.count}×)" if self.count > 1 else ""
        return f"{self.kind}: {self.op} -> {self.value} in {self.where}{at}{times}"


def site_key(file: str | None, line: int | None, where: str, call: int, backward: bool) -> str:
    """The ``assume=`` key of a site (see :attr:`Assumption.site`)."""
    if file is None:
        return f"{where}@{call}" if backward else where
    return f"{source_name(file)}:{line}"


@dataclass(frozen=True)
class Where:
    """Where an op runs: the model's line (if any), the short stack, and the call that owns it."""

    file: str | None
    line: int | None
    code: str | None
    stack: list[str]
    module: str
    module_type: str
    call: int
    backward: bool

    @classmethod
    def here(cls, owner: CallRecord | None, backward: bool) -> Where:
        site, frames = find_site(2)
        return cls(
            site.file if site else None,
            site.line if site else None,
            site.code if site else None,
            [str(f) for f in frames],
            owner.path if owner else "",
            owner.type if owner else "",
            owner.index if owner else -1,
            backward,
        )

    @property
    def site(self) -> str:
        return site_key(
            self.file, self.line, self.module or self.module_type, self.call, self.backward
        )

    def module_keys(self) -> set[str]:
        """The keys that name this site's module: its path, the root's class, ``path@call``."""
        label = self.module or self.module_type
        return {self.module, label, f"{label}@{self.call}"}


@dataclass
class Policy:
    """What to assume. ``values`` maps ``"file.py:LINE"`` or a module path to a value."""

    truth: bool = True
    nonzero: bool = True
    values: Mapping[str, Any] | None = None

    @staticmethod
    def of(
        strict: bool, assume: Mapping[str, Any] | None, assume_nonzero: bool | None
    ) -> Policy | None:
        """The policy ``analyze``'s options ask for: on unless ``strict`` (then only what
        ``assume`` and ``assume_nonzero`` give); None for no assumption at all."""
        if not strict:
            return Policy(truth=True, nonzero=assume_nonzero is not False, values=assume)
        if assume or assume_nonzero:
            return Policy(truth=False, nonzero=bool(assume_nonzero), values=assume)
        return None

    def lookup(self, where: Where) -> tuple[bool, Any]:
        """The user's value for a site: by ``file:line`` (base name, ``In[N]`` or path suffix),
        then by module (see :meth:`Where.module_keys`)."""
        values = self.values or {}
        file = where.file
        if file is not None:
            shown = source_name(file)
            for key, value in values.items():
                name, _, number = key.rpartition(":")
                if (
                    number.isdigit()
                    and int(number) == where.line
                    and (name == shown or file.endswith(name))
                ):
                    return True, value
        for key in where.module_keys():
            if key in values:
                return True, values[key]
        return False, None


# ---------------------------------------------------------------------------------------------
# upper-bound implementations of data-dependent ops (meta in, meta out)


def nonzero_upper_bound(t: torch.Tensor) -> torch.Tensor:
    """``nonzero`` as if every element were nonzero: shape ``(numel, ndim)``."""
    return torch.empty((t.numel(), t.dim()), dtype=torch.long, device=t.device)


def _mask_to_indices(index: Any) -> list[Any]:
    """Replace boolean masks in an index list by the long indices of an all-true mask."""
    out: list[Any] = []
    for ix in index:
        if isinstance(ix, torch.Tensor) and ix.dtype in (torch.bool, torch.uint8):
            n, device = ix.numel(), ix.device
            out.extend(torch.empty((n,), dtype=torch.long, device=device) for _ in range(ix.dim()))
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
    return torch.empty((int(torch.Size(shape).numel()),), dtype=t.dtype, device=t.device)


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
    return torch.empty(shape, dtype=dtype, device=a.device)


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


def _native_batch_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    running_mean: torch.Tensor | None,
    running_var: torch.Tensor | None,
    training: bool,
    momentum: float,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``native_batch_norm`` as the real kernels allocate: in eval (running statistics) the CPU
    kernel returns empty ``save_mean``/``save_invstd``, where the meta kernel makes
    ``num_features`` floats each; in training the meta kernel is right."""
    out = aten.native_batch_norm.default(
        x, weight, bias, running_mean, running_var, training, momentum, eps
    )
    if training or running_mean is None:
        return out  # type: ignore[no-any-return]
    empty = torch.empty((0,), dtype=out[1].dtype, device=out[1].device)
    return out[0], empty, empty.new_empty((0,))


META_FIXES: dict[Any, Callable[..., Any]] = {
    aten._grouped_mm.default: _grouped_mm,
    aten.native_batch_norm.default: _native_batch_norm,
}


class MetaFixes(TorchDispatchMode):
    """Runs the ops of ``META_FIXES`` by their fix, outside a trace (a pipeline's stages run on
    meta to find the tensors between them: a mixture of experts' ``_grouped_mm`` in float32
    among them)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # as the recorder's mode: nothing here is compiled

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        return META_FIXES.get(func, func)(*args, **(kwargs or {}))


#: ops whose result depends on values: handled by the policy when it is on
DATA_DEPENDENT = frozenset(
    {
        aten._local_scalar_dense.default,
        aten._nested_tensor_from_mask_left_aligned.default,
        aten.nonzero.default,
        aten.masked_select.default,
        aten.index.Tensor,
        aten.index_put.default,
        aten.index_put_.default,
        aten._index_put_impl_.default,
    }
)


#: what a ``nonzero``-like assumption takes
_ALL = "every element selected"


def data_dependent(func: Any) -> bool:
    """Whether the policy answers ``func``: a data-dependent op, or one with a registered bound."""
    return func in DATA_DEPENDENT or bound_for(func) is not None


# ---------------------------------------------------------------------------------------------
# the policy at work during one trace


class Assumptions:
    """The assumption policy at work in one trace: answers data-dependent ops, records each
    answer as an :class:`Assumption` at its module and source line, and follows what derives
    from an assumed shape (``tainted`` storages) or from known values (an upper-bound
    ``nonzero``'s index grid, 0-dim results computed from it).

    ``stack`` is the recorder's call stack (innermost call last), read to name the module;
    ``tainted`` the set of storages with assumed shapes, which the call stack reads too.
    """

    def __init__(
        self,
        policy: Policy | None,
        stack: list[CallRecord],
        tainted: set[int],
        owner: Callable[[], tuple[CallRecord | None, bool]] | None = None,
    ) -> None:
        self.policy = policy
        self.recorded: dict[tuple[Any, ...], Assumption] = {}
        #: storages whose shape came from an assumption (shared with the call stack)
        self.tainted = tainted
        #: values known despite meta: storage -> mask shape of an upper-bound nonzero (its
        #: values are the index grid), or a Python number for a 0-dim result computed from them
        self.known: dict[int, Any] = {}
        self._stack = stack
        self._owner = owner

    def answer(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Answer a data-dependent op under the policy, recording what was assumed."""
        policy = self.policy
        assert policy is not None
        first = args[0] if args else None
        if (
            func is aten._local_scalar_dense.default
            and isinstance(first, torch.Tensor)
            and _constant(first)
        ):
            # a fake tensor of known value (an optimizer's step counter): its value, as the
            # fake mode below would give it, without the trip through it (50 us, 4 a parameter)
            with torch._C.DisableTorchFunction(), torch._C._DisableTorchDispatch():
                return first.constant.item()  # type: ignore[attr-defined]
        if not isinstance(first, torch.Tensor) or not on_meta(first) or _constant(first):
            return func(*args, **kwargs)
        if func is aten._local_scalar_dense.default:
            return self._scalar(first)
        if func is aten._nested_tensor_from_mask_left_aligned.default:
            return self._left_aligned()
        if not policy.nonzero:
            return func(*args, **kwargs)
        bound = bound_for(func)
        if bound is not None:
            out, n = run_bound(bound, func, args, kwargs)
            value = bound.what if n is None else f"{bound.what} (size {n})"
            self._record("bound", bound.op, value, self._where())
        elif func is aten.nonzero.default:
            out = nonzero_upper_bound(first)
            self.known[storage_key(out)] = tuple(first.shape)
            self._record("nonzero", "nonzero", _ALL, self._where())
        elif func is aten.masked_select.default:
            out = masked_select_upper_bound(first, args[1])
            self._record("nonzero", "masked_select", _ALL, self._where())
        elif has_mask(args[1] if len(args) > 1 else None):
            out = index_upper_bound(func, args, kwargs)
            if func is not aten.index.Tensor:  # in place: the shape of x is unchanged
                self._record("nonzero", "x[mask] = v", _ALL, self._where())
                return out
            self._record("nonzero", "x[mask]", _ALL, self._where())
        else:
            return func(*args, **kwargs)
        self.taint(out)
        return out

    def _where(self) -> Where:
        """The site of the op running now, and the call that owns it (in backward, the call
        that made the autograd node)."""
        if self._owner is not None:
            owner, backward = self._owner()
        else:
            owner, backward = (self._stack[-1] if self._stack else None), False
        return Where.here(owner, backward)

    def _left_aligned(self) -> bool:
        """Whether a padding mask keeps each sequence's tokens first (what
        ``nn.TransformerEncoder`` checks before its nested-tensor path): a truth value."""
        where = self._where()
        found, value = self.policy.lookup(where) if self.policy is not None else (False, None)
        answer = bool(value) if found else True
        self._record("truth", "padding mask left-aligned", answer, where)
        return answer

    def _scalar(self, t: torch.Tensor) -> Any:
        """``.item()`` of a meta tensor: a known value, a truth assumption, or the user's number."""
        policy = self.policy
        assert policy is not None
        known = self._known_value(t)
        if known is not None:
            return known
        where = self._where()
        found, value = policy.lookup(where)
        if t.dtype == torch.bool and (found or policy.truth):
            answer = bool(value) if found else True
            self._record("truth", "bool(tensor)", answer, where)
            return answer
        if not found:
            raise MetaValueNeeded(
                "Tensor.item() cannot be called on meta tensors: the code needs a number "
                f"from a {t.dtype} tensor here. Pass it with assume={{{where.site!r}: value}}."
            )
        number = float(value) if t.dtype.is_floating_point else int(value)
        self._record("value", "item()", number, where)
        return number

    def follow(self, func: Any, args: tuple[Any, ...], out: Any) -> None:
        """After any op: taint what derives from an assumed shape; fold known 0-dim values."""
        if self.tainted and _any_in(args, self.tainted):
            self.taint(out)
        if self.known and func in SCALAR_OPS:
            self._fold_scalar(func, args, out)

    def taint(self, out: Any) -> None:
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and on_meta(t):
                self.tainted.add(storage_key(t))

    def _known_value(self, t: torch.Tensor) -> Any:
        """The value of a one-element tensor read from a known storage, else None."""
        entry = self.known.get(storage_key(t))
        if entry is None or t.numel() != 1:
            return None
        if isinstance(entry, tuple):
            return grid_value(entry, int(t.storage_offset()))
        return entry

    def _fold_scalar(self, func: Any, args: tuple[Any, ...], out: Any) -> None:
        """Compute a 0-dim result whose inputs are all known values."""
        if not isinstance(out, torch.Tensor) or out.numel() != 1 or len(args) < 2:
            return
        values = []
        for a in args[:2]:
            if isinstance(a, torch.Tensor):
                a = self._known_value(a)
                if a is None:
                    return
            values.append(a)
        self.known[storage_key(out)] = SCALAR_OPS[func](values[0], values[1])

    def _record(self, kind: str, op: str, value: Any, where: Where) -> None:
        key = (kind, op, str(value), where.file, where.line, where.module, where.backward)
        found = self.recorded.get(key)
        if found is not None:
            found.count += 1
        else:
            self.recorded[key] = Assumption(
                kind,
                op,
                str(value),
                where.module,
                where.call,
                where.file,
                where.line,
                where.code,
                stack=where.stack,
                module_type=where.module_type,
                backward=where.backward,
            )
        for rec in self._stack:
            rec.assumed = True
        if where.backward and where.call >= 0 and self._owner is not None:
            owner, _ = self._owner()
            if owner is not None:
                owner.assumed = True


def _constant(t: torch.Tensor) -> bool:
    """A fake tensor whose value is known (e.g. an optimizer's step counter in a parallel trace)."""
    return getattr(t, "constant", None) is not None


def _any_in(args: tuple[Any, ...], keys: set[int]) -> bool:
    """Whether a tensor among ``args`` (or in a list argument) has its storage in ``keys``."""
    for a in args:
        if isinstance(a, torch.Tensor):
            if on_meta(a) and storage_key(a) in keys:
                return True
        elif isinstance(a, (list, tuple)):
            for b in a:
                if isinstance(b, torch.Tensor) and on_meta(b) and storage_key(b) in keys:
                    return True
    return False
