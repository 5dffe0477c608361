"""The Pareto front of a plan and its cost: which fitting candidates no other beats on both
speed and memory, and the GPU-hours a number of tokens takes on each.

Speed is ``Plan.best``'s: tokens per second (samples per second for inputs that are not
tokens; else minus the step time), not the step time itself, since candidates differ in the
tokens a step holds (two micro-batches hold twice the tokens). Memory is ``device_bytes``, what
one GPU holds (the number held against the budget).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import groupby
from typing import Any

from ..options import OptionError
from .candidates import Candidate

__all__ = ["check_tokens", "front", "gpu_hours", "speed"]


def speed(c: Candidate) -> tuple[int, float]:
    """Larger is faster: tokens per second, else samples per second, else minus the step."""
    if c.tokens_per_s is not None:
        return (2, c.tokens_per_s)
    if c.samples_per_s is not None:
        return (1, c.samples_per_s)
    return (0, -(c.step_s if c.step_s is not None else float("inf")))


def front(candidates: Sequence[Candidate]) -> list[bool]:
    """Per candidate, whether it is on the Pareto front of the fitting ones: it fits, was timed,
    and no fitting candidate is at least as fast with at most its ``device_bytes``, better in
    one of the two (equals are all on the front)."""
    fitting = [
        (c.device_bytes, speed(c), i)
        for i, c in enumerate(candidates)
        if c.fits and c.device_bytes is not None and c.step_s is not None
    ]
    fitting.sort(key=lambda t: (t[0], tuple(-x for x in t[1])))
    on = [False] * len(candidates)
    best: tuple[int, float] | None = None  # the fastest with fewer bytes than the group's
    for _, group in groupby(fitting, key=lambda t: t[0]):
        rows = list(group)
        fastest = rows[0][1]
        if best is None or fastest > best:
            for _, s, i in rows:
                on[i] = s == fastest
            best = fastest
    return on


def gpu_hours(c: Candidate, devices: int, tokens: float | None) -> float | None:
    """The GPU-hours ``tokens`` tokens take on ``c``: ``devices`` GPUs for ``tokens /
    tokens_per_s`` seconds (``tokens_per_s`` is the whole job's, every data-parallel rank's
    tokens); None without ``tokens`` or a token rate."""
    if tokens is None or not c.tokens_per_s:
        return None
    return devices * tokens / c.tokens_per_s / 3600


def check_tokens(tokens: Any) -> float:
    """``tokens`` a positive finite number (``15e12`` or ``15_000_000_000_000``)."""
    ok = isinstance(tokens, (int, float)) and not isinstance(tokens, bool)
    if not ok or not 0 < tokens < float("inf"):
        raise OptionError(
            f"plan: tokens={tokens!r} must be a positive number of tokens to train on "
            "(e.g. tokens=15e12)."
        )
    return float(tokens)
