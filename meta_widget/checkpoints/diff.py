"""A model against a checkpoint: missing, unexpected, mis-shaped and re-typed keys."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from .entries import CheckpointInfo


@dataclass
class CheckpointDiff:
    """How a model's state dict and a checkpoint disagree. Plain data (``to_dict()``).

    - ``missing``: keys the model expects that the checkpoint lacks (they would stay
      uninitialized); tied names whose partner is in the checkpoint are in ``tied`` instead.
    - ``unexpected``: checkpoint keys the model has no place for.
    - ``shape_mismatches``: ``(name, model shape, checkpoint shape)``: ``load_state_dict``
      raises on these.
    - ``dtype_mismatches``: ``(name, model dtype, checkpoint dtype)``: loading casts to the
      model's dtype (or, with ``assign=True``, keeps the checkpoint's); usually harmless.
    - ``tied``: ``(missing name, the tied name it shares its tensor with)``.
    - ``duplicates``: ``(name, shape listed, shape of the other tensor under that name)``: a
      ``torch.save`` file holding two tensors under one dotted name (``"fc.weight"`` beside
      ``{"fc": {"weight": ...}}``); which one loads depends on how the keys are flattened, so
      the checkpoint does not fit until the file is fixed. Each is also checked for shape.
    - ``hints``: likely causes, e.g. a ``module.`` prefix left by DataParallel.
    """

    matched: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    shape_mismatches: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = field(
        default_factory=list
    )
    dtype_mismatches: list[tuple[str, str, str]] = field(default_factory=list)
    tied: list[tuple[str, str]] = field(default_factory=list)
    duplicates: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)
    hints: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when ``load_state_dict(strict=True)`` would accept the checkpoint (and each
        name holds one tensor)."""
        return not (self.missing or self.unexpected or self.shape_mismatches or self.duplicates)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["shape_mismatches"] = [
            {"name": n, "model": list(m), "checkpoint": list(c)}
            for n, m, c in self.shape_mismatches
        ]
        out["dtype_mismatches"] = [
            {"name": n, "model": m, "checkpoint": c} for n, m, c in self.dtype_mismatches
        ]
        out["tied"] = [{"name": n, "tied_to": t} for n, t in self.tied]
        out["duplicates"] = [
            {"name": n, "listed": list(a), "other": list(b)} for n, a, b in self.duplicates
        ]
        out["ok"] = self.ok
        return out

    def __str__(self) -> str:
        def some(names: list[str]) -> str:
            return ", ".join(names[:5]) + (f", … ({len(names)} in all)" if len(names) > 5 else "")

        lines = [
            f"{len(self.matched)} keys match"
            + ("; the checkpoint fits the model." if self.ok else ".")
        ]
        if self.missing:
            lines.append(f"missing from the checkpoint ({len(self.missing)}): {some(self.missing)}")
        if self.unexpected:
            lines.append(f"unexpected ({len(self.unexpected)}): {some(self.unexpected)}")
        lines.extend(self.duplicate_lines())
        lines.extend(self.shape_lines())
        if self.dtype_mismatches:
            lines.append(self.dtype_line(self.dtype_mismatches))
        lines.extend(f"tied: {n} shares {t}" for n, t in self.tied)
        lines.extend(f"hint: {h}" for h in self.hints)
        return "\n".join(lines)

    def shape_lines(self) -> list[str]:
        """The shape mismatches as :meth:`__str__` says them (the first 8, then a count)."""
        lines = [
            f"shape mismatch: {n}: model {list(m)}, checkpoint {list(c)}"
            for n, m, c in self.shape_mismatches[:8]
        ]
        if len(self.shape_mismatches) > 8:
            lines.append(f"… and {len(self.shape_mismatches) - 8} more shape mismatches")
        return lines

    def duplicate_lines(self) -> list[str]:
        """The names given twice, as :meth:`__str__` says them."""
        return [
            f"given twice in the checkpoint: {n} (shapes {list(a)} and {list(b)}): a key with "
            "dots beside nested keys that read the same; fix the file"
            for n, a, b in self.duplicates
        ]

    @staticmethod
    def dtype_line(mismatches: list[tuple[str, str, str]]) -> str:
        """``mismatches`` (name, model dtype, checkpoint dtype) as :meth:`__str__` says them."""
        n, m, c = mismatches[0]
        return f"dtype differs for {len(mismatches)} key(s), e.g. {n}: model {m}, checkpoint {c}"


def checkpoint_diff(module: torch.nn.Module, info: CheckpointInfo) -> CheckpointDiff:
    """Compare ``module``'s state dict with the checkpoint ``info`` (names, shapes, dtypes).

    ``module`` may be on any device, meta included; it is only read (``state_dict`` with
    ``keep_vars=True``, no data touched). This is what ``mw.analyze(model, checkpoint=path)``
    runs to report the diff on the Analysis (``analysis.checkpoint_diff``).

    Parameters
    ----------
    module
        The model, as it would receive ``load_state_dict``.
    info
        The checkpoint, from :func:`inspect_checkpoint`.

    Returns
    -------
    CheckpointDiff
        Missing, unexpected, mis-shaped and re-typed keys, each by name.
    """
    expected = module.state_dict(keep_vars=True)
    stored = {t.name: t for t in info.tensors}
    by_tensor: dict[int, list[str]] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        by_tensor.setdefault(id(p), []).append(name)
    tied_to = {n: names for names in by_tensor.values() if len(names) > 1 for n in names}

    diff = CheckpointDiff()
    for extra in info.duplicates:
        listed = stored.get(extra.name, extra)
        diff.duplicates.append((extra.name, listed.shape, extra.shape))
        model = expected.get(extra.name)
        if model is not None and tuple(model.shape) != extra.shape:
            diff.shape_mismatches.append((extra.name, tuple(model.shape), extra.shape))
    for name, tensor in expected.items():
        entry = stored.get(name)
        if entry is None:
            partner = next((n for n in tied_to.get(name, ()) if n in stored), None)
            if partner is not None:
                diff.tied.append((name, partner))
            else:
                diff.missing.append(name)
            continue
        diff.matched.append(name)
        shape = tuple(tensor.shape)
        if shape != entry.shape:
            diff.shape_mismatches.append((name, shape, entry.shape))
        dtype = str(tensor.dtype).removeprefix("torch.")
        if dtype != entry.dtype:
            diff.dtype_mismatches.append((name, dtype, entry.dtype))
    diff.unexpected = [n for n in stored if n not in expected]
    diff.hints = _prefix_hints(list(expected), diff.missing, diff.unexpected)
    return diff


def _prefix_hints(expected: list[str], missing: list[str], unexpected: list[str]) -> list[str]:
    """Spot a prefix added or dropped on every key (``module.`` from DataParallel, ``model.``)."""
    if not missing or not unexpected:
        return []
    hints = []
    want = set(expected)
    for u in unexpected[:1]:
        for m in missing[:1]:
            if u.endswith("." + m):
                prefix = u[: -len(m)]
                fixed = sum(
                    1 for n in unexpected if n.startswith(prefix) and n[len(prefix) :] in want
                )
                hints.append(
                    f"{fixed} checkpoint keys carry an extra prefix {prefix!r} (e.g. {u!r}): strip "
                    f"it, {{k.removeprefix({prefix!r}): v for k, v in state_dict.items()}}."
                )
            elif m.endswith("." + u):
                prefix = m[: -len(u)]
                hints.append(
                    f"the model's keys start with {prefix!r} but the checkpoint's do not (e.g. "
                    f"{m!r} vs {u!r}): load it into the {prefix.rstrip('.')!r} submodule."
                )
    return hints
