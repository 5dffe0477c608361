"""Decode steps that the per-step rule gives, not traced one by one (``mode="generate"``).

Within a stretch of decode steps that crosses no sliding-window boundary, each step is the one
before it with every size that depends on the cache's length one position longer, exactly
(:mod:`meta_widget.trace.decode_steps`). So once three traced steps follow one rule, the steps
up to two before the stretch's end are not traced:

- **Paused.** At the start of a skipped step (a forward pre-hook of the model, before the
  recorder's), the call stack records no call (``CallStack.paused``) and the storage tracker
  notes nothing (``StorageTracker.pause``: new storages are kept aside). ``generate()``'s own
  code between the forward passes still runs under the recorder: its ops are costed as
  always, and its stopping check is answered and counted as in every step.
- **The forward pass, stubbed.** The model's ``forward`` returns an output of the form the last
  traced step returned (its logits as an empty meta tensor, the same cache object), without
  running the model. In the last skipped step it brings the cache to where the skipped steps
  leave it: each cache layer's ``update`` that the last traced step made is made twice, with
  the keys and values of all the skipped steps but one, then of one, so each layer ends with
  the shapes, strides and storage sizes that step-by-step updates leave (a concatenation
  makes a new storage either way; a sliding layer keeps a view of the last one; a static one
  writes in place). ``torch.cat`` on meta costs ~0.3 ms, 160 a step for a 80-layer model:
  two updates per layer per stretch instead of one per layer per step.
- **Summed.** When tracing resumes, the skipped steps' calls are added as summed records
  (``decode_steps.summed_steps``: one per call of a step, each standing for that call in every
  skipped step) and one event stands for their storage (``StorageTracker.resume``: the frees
  of what died, the allocations of what lives, e.g. the cache). The live bytes then must be
  the rule's prediction.
- **Checked.** The two steps traced after the stretch must be the rule's, every number of
  every event and call (``decode_steps.follows``). On any mismatch, on an exception while a
  stretch was skipped, or on live bytes the rule did not predict, the whole ``generate()`` is
  traced again with every step (``passes.trace``), and the analysis says so in its notes.

The peak is never in a skipped step: each event's live bytes are linear in the step over a
stretch (the rule), so their maximum lies at the stretch's ends, and the first and last steps
of a stretch are traced (where the maximum is reached in a skipped step too, it is reached
first in the stretch's first step, traced: the peak is the timeline's first maximum).

Not skipped: steps near a sliding window's boundary (the cache's length within 3 positions of
a layer's window, from the cache's layers and the model's config) and a chunked-attention
model's (``attention_chunk_size``); a model whose decode forward passes make assumptions; an
output holding anything but tensors and objects (the cache); ``fast=False``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._python_dispatch import _disable_current_modes

from .decode_steps import StepRecord, extrapolate, follows, per_step, step_record, summed_steps

if TYPE_CHECKING:
    from .recorder import Recorder

__all__ = ["ENABLED", "SKIPPED", "Skipper", "Stretch"]

#: whether any decode step may go untraced (a switch for tests comparing with full traces;
#: ``fast=False`` traces every step too)
ENABLED = True
#: the op name of the event that stands for a stretch of skipped decode steps
SKIPPED = "decode steps (by the rule)"
#: steps whose cache length is this close to a window are traced
_MARGIN = 3
#: an update of a cache layer: (layer, keys' shape, dtype, values' shape, dtype)
Update = tuple[int, tuple[int, ...], torch.dtype, tuple[int, ...], torch.dtype]


@dataclass(frozen=True)
class Stretch:
    """Decode steps ``first`` to ``last`` (forward passes; the prefill is 1), not traced one by
    one: given by the rule from step ``rule`` to the next; their summed records are
    ``calls[call:call + count]``, their event ``events[event]``."""

    first: int
    last: int
    rule: int
    call: int
    count: int
    event: int


class Skipper:
    """Decides, at the start of each forward pass of a traced ``generate()``, whether it is
    traced, and skips, stubs, sums and checks the others (see the module docstring).

    ``passes`` is how many forward passes ``generate()`` runs, ``prompt`` the prompt's length,
    ``runs`` the trace's phase runs (each stretch's is added to it); ``enabled=False`` (and
    :data:`ENABLED` false, or a chunked-attention model): every step traced.
    """

    def __init__(
        self,
        recorder: Recorder,
        module: torch.nn.Module,
        passes: int,
        prompt: int,
        runs: list[tuple[int, str]],
        enabled: bool = True,
    ) -> None:
        self.recorder, self.module, self.passes, self.prompt = recorder, module, passes, prompt
        self.runs = runs
        self.enabled = (
            enabled
            and ENABLED
            and not getattr(getattr(module, "config", None), "attention_chunk_size", None)
        )
        self.stretches: list[Stretch] = []
        #: why the rule did not hold (then every step is traced again), or None
        self.failed: str | None = None
        #: whether any step was skipped (a stretch may have begun and not ended: an error)
        self.used = False
        self.step = 0
        #: traced steps: (first call, first event, live bytes) at their start, and at their end
        self._starts: dict[int, tuple[int, int, int]] = {}
        self._ends: dict[int, tuple[int, int]] = {}
        self._records: dict[int, StepRecord] = {}
        self._updates: dict[int, list[Update]] = {}
        self._log: list[Update] | None = None
        self._form: tuple[type, list[tuple[str, Any]]] | None = None
        self._cache: Any = None
        self._update: Callable[..., Any] | None = None  # the cache's own update
        self._pending: tuple[int, int] | None = None  # (first skipped step, step resumed at)
        self._windows: set[int] = set()
        self._assumed = False

    # -- the hooks ----------------------------------------------------------------------------

    def install(self) -> Callable[[], None]:
        """Put the stub in front of the model's ``forward``; returns what takes it away."""
        if not self.enabled:
            return lambda: None
        module = self.module
        own = module.__dict__.get("forward")
        original = module.forward

        @functools.wraps(original)  # generate() reads its signature (what inputs to pass)
        def forward(*args: Any, **kwargs: Any) -> Any:
            if self._pending is not None:
                return self._stub()
            return self._traced(original, args, kwargs)

        module.forward = forward  # type: ignore[method-assign]

        def remove() -> None:
            if own is not None:
                module.forward = own  # type: ignore[method-assign]
            else:
                module.__dict__.pop("forward", None)
            if self._cache is not None:
                self._cache.__dict__.pop("update", None)
            self.recorder.callstack.paused = False

        return remove

    def before_step(self, step: int, kwargs: dict[str, Any]) -> bool:
        """Forward pass ``step`` begins (before the recorder sees it): whether it is traced."""
        self.step = step
        if not self.enabled:
            return True
        for old in [k for k in self._records if k < step - 3]:
            del self._records[old]  # recomputed if asked again: the records stay
        if step - 1 in self._starts and step - 1 not in self._ends:
            self._ends[step - 1] = (
                len(self.recorder.callstack.calls),
                len(self.recorder.storage.events),
            )
        if self._pending is not None:
            if step < self._pending[1]:
                return False
            self._resume(step)
        elif self._skips_from(step):
            return False
        self._begin(step, kwargs)
        return True

    def _begin(self, step: int, kwargs: dict[str, Any]) -> None:
        rec = self.recorder
        self._starts[step] = (
            len(rec.callstack.calls),
            len(rec.storage.events),
            rec.storage.live_bytes,
        )
        if step < 2:
            return
        cache = self._cache
        if cache is None:
            self._cache = cache = next((v for v in kwargs.values() if _is_cache(v)), None)
            if cache is not None:
                self._wrap_update(cache)
        self._log = self._updates[step] = []
        self._updates.pop(step - 3, None)

    def _wrap_update(self, cache: Any) -> None:
        self._update = update = cache.update
        windows = [getattr(getattr(self.module, "config", None), "sliding_window", None)]
        for layer in getattr(cache, "layers", ()):
            if getattr(layer, "is_sliding", False):  # a static layer's: its length
                windows += [
                    getattr(layer, "sliding_window", None),
                    getattr(layer, "max_cache_len", None),
                ]
        self._windows.update(w for w in windows if isinstance(w, int) and w > 0)

        def logged(keys: Any, values: Any, layer: int, *args: Any, **kwargs: Any) -> Any:
            if self._log is not None and self._pending is None:
                self._log.append(
                    (layer, tuple(keys.shape), keys.dtype, tuple(values.shape), values.dtype)
                )
            return update(keys, values, layer, *args, **kwargs)

        cache.update = logged

    def _traced(self, original: Callable[..., Any], args: Any, kwargs: dict[str, Any]) -> Any:
        """A traced forward pass: run, with what a stub needs noted (the output's form)."""
        recorded = self.recorder.assumptions.recorded
        before = sum(a.count for a in recorded.values())
        out = original(*args, **kwargs)
        if self.step >= 2:
            self._assumed |= sum(a.count for a in recorded.values()) != before
            self._form = _form(out)
        return out

    # -- skipping -------------------------------------------------------------------------------

    def _skips_from(self, step: int) -> bool:
        """Whether to skip from ``step``: the three steps before it are traced, on one side of
        every window, and follow one rule, and the stretch goes on for two more steps at least
        (the last two of it are traced)."""
        a, b, c = step - 3, step - 2, step - 1
        if not self.enabled or self.failed or self._assumed or self._form is None or a < 2:
            return False
        if self._cache is None or any(x not in self._ends for x in (a, b, c)):
            return False
        side = self._side(a)
        if side is None or self._side(b) != side or self._side(c) != side:
            return False
        resume = self._last(c) - 1
        if (
            resume - step < 2
            or not self._updates.get(c)
            or self._updates.get(b) != self._updates[c]
        ):
            return False
        if not follows(self._record(a), self._record(b), self._record(c)):
            return False
        self._pending = (step, resume)
        self.used = True
        self.recorder.callstack.paused = True
        self.recorder.storage.pause(_held(self._cache))
        return True

    def _side(self, step: int) -> tuple[bool, ...] | None:
        """Which side of each window the cache's length is on at ``step``'s start; None within
        ``_MARGIN`` positions of one (there the step's records change form)."""
        length = self.prompt + step - 2
        if any(abs(length - w) <= _MARGIN for w in self._windows):
            return None
        return tuple(length > w for w in sorted(self._windows))

    def _last(self, step: int) -> int:
        """The last decode step of ``step``'s stretch whose records end before another step
        begins (not the last forward pass, whose events run to the end of ``generate()``)."""
        last = self.passes - 1
        length = self.prompt + step - 2
        for w in self._windows:
            if length < w:
                last = min(last, w - _MARGIN - 1 - self.prompt + 2)
        return last

    def _record(self, step: int) -> StepRecord:
        found = self._records.get(step)
        if found is None:
            c0, e0, _ = self._starts[step]
            c1, e1 = self._ends[step]
            calls, events = self.recorder.callstack.calls, self.recorder.storage.events
            found = self._records[step] = step_record(calls, events, step, (c0, c1), (e0, e1))
        return found

    def _stub(self) -> Any:
        """A skipped forward pass: the last traced step's form of output, the cache brought to
        the end of the stretch in its last step."""
        assert self._pending is not None and self._form is not None
        first, resume = self._pending
        with _disable_current_modes():
            if self.step == resume - 1:
                self._catch_up(resume - first, first - 1)
            kind, fields = self._form
            made = {
                name: torch.empty(v[0], dtype=v[1], device="meta") if isinstance(v, _Shape) else v
                for name, v in fields
            }
        return kind(**made)

    def _catch_up(self, skipped: int, last_traced: int) -> None:
        assert self._update is not None
        for layer, ks, kd, vs, vd in self._updates[last_traced]:
            if skipped > 1:
                self._update(_empty(ks, kd, skipped - 1), _empty(vs, vd, skipped - 1), layer)
            self._update(_empty(ks, kd, 1), _empty(vs, vd, 1), layer)

    def _resume(self, step: int) -> None:
        """Trace again from ``step``: the skipped steps summed, their storage in one event."""
        assert self._pending is not None
        first, _ = self._pending
        self._pending = None
        rec = self.recorder
        a = first - 3
        (a0, _, _), (b0, _, _), (c0, _, _) = (self._starts[x] for x in (a, a + 1, a + 2))
        calls = rec.callstack.calls
        index = len(calls)
        summed = summed_steps(
            calls[a0:b0], calls[b0:c0], (first - a, step - 1 - a), index, len(rec.storage.events)
        )
        calls.extend(summed)
        event = len(rec.storage.events)
        rec.storage.resume(_held(self._cache), SKIPPED, index)
        rec.callstack.paused = False
        self.runs.append((event, "decode"))
        self.stretches.append(Stretch(first, step - 1, a, index, len(summed), event))
        for c in reversed(summed):
            for listener in rec.callstack.listeners:
                listener(c)
        live_b, live_c = self._starts[a + 1][2], self._starts[a + 2][2]
        expected = live_c + (step - a - 2) * (live_c - live_b)
        if rec.storage.live_bytes != expected:
            self.failed = (
                f"after decode steps {first}-{step - 1} the live bytes were "
                f"{rec.storage.live_bytes:,}, not the rule's {expected:,}"
            )

    def finish(self) -> None:
        """Check the steps traced after each stretch against the rule (see the module
        docstring); ``failed`` says what differed."""
        for s in self.stretches:
            if self.failed:
                return
            a, b = self._record(s.rule), self._record(s.rule + 1)
            rule = per_step(a, b)
            for step in (s.last + 1, s.last + 2):
                if step not in self._ends:
                    continue
                if (
                    rule is None
                    or extrapolate(a, rule, step - a.step).atoms != self._record(step).atoms
                ):
                    self.failed = (
                        f"decode step {step} was not the rule's (of steps {a.step}-{a.step + 2})"
                    )
                    return


class _Shape(tuple):  # type: ignore[type-arg]
    """A tensor of an output, as its (shape, dtype)."""


def _form(out: Any) -> tuple[type, list[tuple[str, Any]]] | None:
    """An output's type and fields, each tensor as its shape and dtype; None for an output a
    stub cannot make (not a mapping of tensors and objects)."""
    items = getattr(out, "items", None)
    if not callable(items):
        return None
    fields: list[tuple[str, Any]] = []
    for name, v in items():
        if isinstance(v, torch.Tensor):
            fields.append((name, _Shape((tuple(v.shape), v.dtype))))
        elif isinstance(v, (list, tuple, dict)) or not isinstance(name, str):
            return None
        else:
            fields.append((name, v))
    return type(out), fields


def _is_cache(value: Any) -> bool:
    """Whether ``value`` is a transformers cache: layers and an ``update``."""
    return isinstance(getattr(value, "layers", None), list) and callable(
        getattr(value, "update", None)
    )


def _empty(shape: tuple[int, ...], dtype: torch.dtype, positions: int) -> torch.Tensor:
    """A meta tensor of ``shape`` with ``positions`` in its sequence dimension (-2)."""
    return torch.empty((*shape[:-2], positions, shape[-1]), dtype=dtype, device="meta")


def _held(cache: Any) -> Iterable[torch.Tensor]:
    """The tensors of each layer of ``cache``."""
    for layer in getattr(cache, "layers", ()):
        for v in vars(layer).values():
            if isinstance(v, torch.Tensor):
                yield v
