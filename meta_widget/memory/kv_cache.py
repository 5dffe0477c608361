"""The KV cache of a traced ``generate()`` (``analyze(..., mode="generate")``): :class:`KVCache`.

Definitions (``docs/serving.md`` repeats them):

- ``bytes``: the cache ``generate()`` returned, at the end of generation: every tensor it holds,
  each storage once (what the caller keeps alive by holding ``output.past_key_values``).
- ``by_layer``: each layer's kind (``"full"``: every position; ``"sliding"``: the last
  ``window`` ones; ``"none"``: no tensor), bytes, positions held per sequence and window.
- ``bytes_per_token``: the bytes one position of one sequence takes, summed over the layers
  that hold it (each layer's per-position tensors, its keys and values, over its sequences
  times its positions; a static cache's positions are those it allocated).
- ``paged(budget)``: how many sequences of a length fit in what the weights leave of
  ``budget``, in blocks of ``block`` positions per layer as vLLM's paged attention allocates
  them: per sequence, each layer holds ``ceil(min(length, window) / block)`` blocks of
  ``block`` positions; full layers have no window. The answer is a :class:`PagedFit`: an
  ``int`` (the sequences), with ``reason`` saying what bounds it (why 0, when nothing fits).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from ..options import OptionError, check_budget
from ..units import format_bytes

if TYPE_CHECKING:
    import pandas as pd

    from ..trace.generate import CacheSummary, LayerCache

__all__ = ["KVCache", "PagedFit"]


class PagedFit(int):
    """:meth:`KVCache.paged`'s answer: the number of sequences that fit (an ``int``, usable as
    one), with what bounds it.

    Attributes
    ----------
    reason
        One line: why nothing fits (the weights exceed the budget, or one sequence's cache is
        larger than what they leave), or what the count divides.
    budget_bytes, weight_bytes, sequence_bytes, length, block
        The budget, the weights held first, one sequence's cache in blocks, its positions and
        the block size.
    """

    reason: str
    budget_bytes: int
    weight_bytes: int
    sequence_bytes: int
    length: int
    block: int

    def __new__(
        cls, sequences: int, *, budget: int, weights: int, sequence: int, length: int, block: int
    ) -> PagedFit:
        fit = super().__new__(cls, sequences)
        fit.budget_bytes, fit.weight_bytes, fit.sequence_bytes = budget, weights, sequence
        fit.length, fit.block = length, block
        fit.reason = _paged_reason(int(fit), budget, weights, sequence, length, block)
        return fit

    def __str__(self) -> str:
        return int.__repr__(self)

    def __repr__(self) -> str:
        return int.__repr__(self) if self else f"0 ({self.reason})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _paged_fit,
            (
                int(self),
                self.budget_bytes,
                self.weight_bytes,
                self.sequence_bytes,
                self.length,
                self.block,
            ),
        )


def _paged_fit(
    n: int, budget: int, weights: int, sequence: int, length: int, block: int
) -> PagedFit:
    return PagedFit(
        n, budget=budget, weights=weights, sequence=sequence, length=length, block=block
    )


def _paged_reason(n: int, budget: int, weights: int, sequence: int, length: int, block: int) -> str:
    """What bounds ``paged()``'s count, in one line."""
    if sequence <= 0:
        return "no layer of this model holds a KV cache"
    free = budget - weights
    each = (
        f"one sequence of {length:,} positions takes {format_bytes(sequence)} of cache "
        f"(blocks of {block})"
    )
    if free <= 0:
        return (
            f"the weights alone ({format_bytes(weights)}) exceed the {format_bytes(budget)} "
            "budget, leaving nothing for the cache: give a larger budget, or split or quantize "
            "the weights (parallel=, param_dtype=)"
        )
    if n == 0:
        return (
            f"{each}, more than the {format_bytes(free)} the weights "
            f"({format_bytes(weights)}) leave of the {format_bytes(budget)} budget"
        )
    return (
        f"{each}; the weights ({format_bytes(weights)}) leave {format_bytes(free)} of "
        f"{format_bytes(budget)}"
    )


@dataclass(frozen=True)
class KVCache:
    """The KV cache of a traced ``generate()`` (``Analysis.kv_cache``; None in other modes).

    Attributes
    ----------
    bytes
        The cache ``generate()`` returned, at the end of generation (distinct storages).
    layers
        One :class:`~meta_widget.trace.generate.LayerCache` per layer: ``kind`` (``"full"``,
        ``"sliding"``, ``"none"``), ``bytes``, ``tokens`` (positions per sequence), ``batch``,
        ``window``.
    cache_type
        The class of the cache (``"DynamicCache"``, ``"StaticCache"``...).
    batch, prompt_tokens, new_tokens
        The sequences generated, the prompt's length and the tokens made.
    weight_bytes
        The model's parameters and buffers: what ``paged`` leaves out of the budget.
    """

    bytes: int
    layers: tuple[LayerCache, ...]
    cache_type: str
    batch: int
    prompt_tokens: int
    new_tokens: int
    weight_bytes: int

    @classmethod
    def of(cls, summary: CacheSummary, weight_bytes: int) -> KVCache:
        """The cache of a trace's summary (``Trace.kv_cache``)."""
        return cls(
            bytes=summary.bytes,
            layers=summary.layers,
            cache_type=summary.cache_type,
            batch=summary.batch,
            prompt_tokens=summary.prompt_tokens,
            new_tokens=summary.new_tokens,
            weight_bytes=weight_bytes,
        )

    @property
    def bytes_per_token(self) -> float:
        """Bytes of one position of one sequence, over every layer that holds it."""
        return sum(_per_token(layer) for layer in self.layers)

    @property
    def by_layer(self) -> pd.DataFrame:
        """One row per layer: ``layer``, ``kind``, ``bytes``, ``tokens``, ``window``,
        ``token_bytes``."""
        from .. import heavy

        return heavy.pandas().DataFrame(
            [
                {
                    "layer": i,
                    "kind": layer.kind,
                    "bytes": layer.bytes,
                    "tokens": layer.tokens,
                    "window": layer.window,
                    "token_bytes": layer.token_bytes,
                }
                for i, layer in enumerate(self.layers)
            ],
            columns=["layer", "kind", "bytes", "tokens", "window", "token_bytes"],
        )

    def sequence_bytes(self, length: int, block: int = 16) -> int:
        """Bytes one sequence of ``length`` positions takes in ``block``-position blocks
        (``paged``'s unit): per layer, ``ceil(min(length, window) / block) * block`` positions."""
        total = 0.0
        for layer in self.layers:
            if layer.kind == "none" or not layer.tokens:
                continue
            held = min(length, layer.window) if layer.window else length
            total += math.ceil(held / block) * block * _per_token(layer)
        return math.ceil(total)

    def paged(self, budget: int | str, length: int | None = None, block: int = 16) -> PagedFit:
        """How many sequences of ``length`` positions (default: the prompt and the new tokens
        traced) fit in ``budget`` (bytes, or ``"80GiB"``) once the weights are held, their
        cache allocated in blocks of ``block`` positions per layer, as vLLM does (see
        :meth:`sequence_bytes`). Activations are not set aside. A :class:`PagedFit`: an
        ``int``, whose ``reason`` says why it is 0 when nothing fits."""
        limit = check_budget(budget)
        length = self.prompt_tokens + self.new_tokens if length is None else length
        for name, value in (("length", length), ("block", block)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise OptionError(f"paged(): {name} must be an int of 1 or more, not {value!r}")
        per_sequence = self.sequence_bytes(length, block)
        free = limit - self.weight_bytes
        n = 0 if per_sequence <= 0 or free <= 0 else free // per_sequence
        return PagedFit(
            n,
            budget=limit,
            weights=self.weight_bytes,
            sequence=per_sequence,
            length=length,
            block=block,
        )

    def __repr__(self) -> str:
        kinds: dict[str, int] = {}
        for layer in self.layers:
            kinds[layer.kind] = kinds.get(layer.kind, 0) + 1
        parts = ", ".join(f"{n} {k}" for k, n in kinds.items())
        return (
            f"<KVCache {self.cache_type}: {format_bytes(self.bytes)} for {self.batch} x "
            f"({self.prompt_tokens} + {self.new_tokens}) tokens, "
            f"{self.bytes_per_token:,.0f} B/token; layers: {parts}>"
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain data: the totals and each layer."""
        return {
            "bytes": self.bytes,
            "bytes_per_token": self.bytes_per_token,
            "cache_type": self.cache_type,
            "batch": self.batch,
            "prompt_tokens": self.prompt_tokens,
            "new_tokens": self.new_tokens,
            "layers": [asdict(layer) for layer in self.layers],
        }


def _per_token(layer: LayerCache) -> float:
    return 0.0 if layer.kind == "none" else layer.token_bytes
