"""``mode="generate"``: transformers' own ``generate()`` traced on meta, prefill then decode.

The trace calls ``module.generate(...)`` greedily (``do_sample=False``, one beam) for exactly
``new_tokens`` new tokens (``min_new_tokens = max_new_tokens``; with only ``max_length``,
``min_length = max_length``), the cache it asks for (``cache_implementation``), and
``return_dict_in_generate=True`` so that the cache it returns is live at the end, as a caller
holding it sees it. Every forward pass it runs is recorded as any forward pass is.

What a meta tensor cannot answer:

- **The stopping check.** Each step ``generate()`` asks whether every sequence has finished
  (``bool(unfinished_sequences.max() == 0)``, a value meta has not got). Asked outside the
  model's forward, by transformers' generation code, after the prefill has begun, it is answered
  by the token count: not finished until ``new_tokens`` tokens are made, then finished. That is
  what a real run with ``min_new_tokens = max_new_tokens`` does (the end-of-sequence token is
  suppressed until then); each answer is a recorded assumption (``kind="truth"``, counted).
- Other conditions on values (the special tokens' checks before the prefill) follow the policy
  of every trace (``meta_widget.trace.assume``).

The timeline is marked: the run of ``prefill`` from the start, a ``decode`` run at the start of
each decode step's forward (``Trace.phase_runs``); the recorder's own phase stays ``forward``
(every step is a forward pass: its records are those of one).

The cache's storages are a memory category of their own (:data:`KV_CACHE`, or
:data:`KV_CACHE_SLIDING` for sliding-window layers): at the start of each forward pass the
cache it is handed is marked, and at the end the cache returned, so that each storage a cache
ever held is the cache's on the timeline from its allocation to its free.

At the end the cache ``generate()`` returns is summarized (:class:`LayerCache`, plain data, no
tensors): each layer's kind (``"full"``, ``"sliding"``, or ``"none"`` for a layer holding no
tensor), bytes (distinct storages), tokens held and window.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from ..options import OptionError, TraceSpec
from .assume import Policy, Where
from .decode_skip import Skipper, Stretch

if TYPE_CHECKING:
    from .recorder import Recorder

__all__ = [
    "DECODE",
    "KV_CACHE",
    "KV_CACHE_SLIDING",
    "PREFILL",
    "CacheSummary",
    "Generation",
    "LayerCache",
    "StopChecks",
    "check_generates",
]

PREFILL, DECODE = "prefill", "decode"

#: the memory categories of the cache's storages: full-attention layers, sliding-window layers
KV_CACHE, KV_CACHE_SLIDING = "KV cache", "KV cache (sliding window)"

#: the folder of transformers' generation code (where the stopping check is asked)
_GENERATION = f"{os.sep}transformers{os.sep}generation{os.sep}"


def check_generates(module: torch.nn.Module) -> None:
    """Raise an ``OptionError`` unless ``module`` is a transformers ``GenerationMixin``."""
    if any(c.__name__ == "GenerationMixin" for c in type(module).__mro__) and callable(
        getattr(module, "generate", None)
    ):
        return
    raise OptionError(
        f"mode='generate' traces transformers' generate(), and {type(module).__name__} has none "
        "(not a GenerationMixin): pass a model with a language-model head (e.g. "
        "LlamaForCausalLM; for a config, set config.architectures = ['LlamaForCausalLM']), or "
        "use mode='inference'."
    )


@dataclass(frozen=True)
class LayerCache:
    """One layer of the cache ``generate()`` returned: ``kind`` (``"full"``, ``"sliding"`` or
    ``"none"``), ``bytes`` (its distinct storages), ``tokens`` (the positions it holds per
    sequence: the sequence dimension of its keys), ``batch`` and ``window`` (a sliding layer's
    ``sliding_window``, else None); ``token_bytes``: what one position of one sequence takes
    in it (the elements of its per-position tensors, keys and values, over ``batch * tokens``:
    a sliding layer's keys may be a view of a storage a position longer)."""

    kind: str
    bytes: int
    tokens: int
    batch: int
    window: int | None = None
    token_bytes: float = 0.0


@dataclass(frozen=True)
class CacheSummary:
    """The cache at the end of ``generate()``: its bytes (every tensor it holds, each storage
    once), its layers, and the lengths of the run."""

    bytes: int
    layers: tuple[LayerCache, ...]
    cache_type: str
    prompt_tokens: int
    new_tokens: int
    batch: int


def _returned_cache(output: Any) -> Any:
    """The cache ``generate()`` returned: ``output.cache`` (transformers 5, where reading
    ``past_key_values`` warns that the name is deprecated), else ``output.past_key_values``."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else getattr(output, "past_key_values", None)


class _MetaValueWarning(logging.Filter):
    """Drops a warning of transformers' generation code about values meta has not got: a
    check answered by the trace's policy, not a problem of the model. Every run warned that
    ``eos_token_id`` "should consist of positive integers, but is tensor(..., device='meta')"
    and "will not stop"; with a batch of more than one, that "the attention mask and the pad
    token id were not set", that it "cannot be inferred from input", and that "right-padding
    was detected" (the prompt's last tokens compared with the pad token: no values on meta,
    and no padding in a prompt of one length; the trace generates no text to spoil)."""

    PHRASES = ("device='meta'", "attention mask", "right-padding was detected")

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(phrase in message for phrase in self.PHRASES)


#: the logger of transformers' ``generate()`` (its warnings about the special tokens)
_GENERATION_LOG = logging.getLogger("transformers.generation.utils")


@dataclass
class StopChecks(Policy):
    """The trace's policy, with the stopping checks of ``generate()`` answered by the token
    count (see the module docstring). ``steps()`` is how many forward passes have begun."""

    steps: Callable[[], int] = lambda: 0
    new_tokens: Callable[[], int] = lambda: 0

    def lookup(self, where: Where) -> tuple[bool, Any]:
        found, value = super().lookup(where)
        if found:
            return found, value
        steps = self.steps()
        if steps and where.call < 0 and where.file is not None and _GENERATION in where.file:
            return True, steps >= self.new_tokens()
        return False, None

    @staticmethod
    def of_spec(spec: TraceSpec, generation: Generation) -> StopChecks:
        """The policy ``spec`` asks for, answering ``generation``'s stopping checks too (also
        with ``strict=True``: they are what generate mode is)."""
        base = Policy.of(spec.strict, spec.assume, spec.assume_nonzero)
        return StopChecks(
            truth=base.truth if base is not None else False,
            nonzero=base.nonzero if base is not None else False,
            values=base.values if base is not None else None,
            steps=lambda: generation.steps,
            new_tokens=lambda: generation.new_tokens,
        )


@dataclass
class Generation:
    """One traced ``generate()``: how many forward passes began, where each began on the
    timeline, and the summary of the cache it returned."""

    spec: TraceSpec
    steps: int = 0
    new_tokens: int = 0
    prompt_tokens: int = 0
    #: (event index, phase) of each run: the prefill from 0, a decode run per decode step (one
    #: per stretch of steps given by the rule, ``meta_widget.trace.decode_skip``)
    runs: list[tuple[int, str]] = field(default_factory=lambda: [(0, PREFILL)])
    cache: CacheSummary | None = None
    #: whether decode steps the per-step rule gives may go untraced (``decode_skip``)
    skipping: bool = True
    skipper: Skipper | None = None

    @property
    def stretches(self) -> list[Stretch]:
        """The stretches of decode steps given by the per-step rule (``decode_skip``)."""
        return self.skipper.stretches if self.skipper is not None else []

    def redo(self, exception: BaseException | None) -> str | None:
        """Why this trace must be made again with every decode step traced (a note for the
        analysis), or None: steps were skipped, and the rule failed or the trace raised."""
        skipper = self.skipper
        if skipper is None or not skipper.used:
            return None
        if skipper.failed is None and exception is None:
            return None
        why = skipper.failed or f"the trace raised {type(exception).__name__}"
        return (
            f"mode='generate': decode steps were not traced one by one where the per-step rule "
            f"gave them, and it did not hold ({why}): every step was traced again."
        )

    def run(
        self,
        recorder: Recorder,
        module: torch.nn.Module,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """``module.generate(*args, **kwargs, ...)`` with the options of ``spec``; returns its
        output (the cache in it)."""
        ids = args[0] if args else kwargs.get("input_ids")
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
            raise OptionError(
                "mode='generate' needs token ids of shape (batch, prompt length) as the first "
                "input: input_size=(batch, prompt_len) or input_data={'input_ids': ...}."
            )
        self.prompt_tokens = int(ids.shape[1])
        spec = self.spec
        lengths: dict[str, Any] = {}
        if spec.new_tokens is not None:
            self.new_tokens = spec.new_tokens
            lengths = dict(max_new_tokens=spec.new_tokens, min_new_tokens=spec.new_tokens)
            if spec.max_length is not None:
                lengths["max_length"] = spec.max_length
        else:
            assert spec.max_length is not None  # checked with the options
            self.new_tokens = spec.max_length - self.prompt_tokens
            if self.new_tokens < 1:
                raise OptionError(
                    f"max_length={spec.max_length} leaves no new token after a prompt of "
                    f"{self.prompt_tokens}: give a larger max_length, or new_tokens=N."
                )
            lengths = dict(max_length=spec.max_length, min_length=spec.max_length)

        skipper = self.skipper = Skipper(
            recorder, module, self.new_tokens, self.prompt_tokens, self.runs, self.skipping
        )

        def began(_module: torch.nn.Module, _args: Any, step_kwargs: dict[str, Any]) -> None:
            # transformers 5 hands the cache as ``cache``, 4 as ``past_key_values``
            mark_cache(recorder, step_kwargs.get("cache", step_kwargs.get("past_key_values")))
            self.steps += 1
            traced = skipper.before_step(self.steps, step_kwargs)
            if self.steps > 1 and traced:
                self.runs.append((len(recorder.storage.events), DECODE))

        # before the recorder's own pre-hook: a skipped step's call is not recorded
        handle = module.register_forward_pre_hook(began, prepend=True, with_kwargs=True)
        remove = skipper.install()
        quiet = _MetaValueWarning()
        _GENERATION_LOG.addFilter(quiet)
        try:
            output = module.generate(  # type: ignore[operator]
                *args,
                **kwargs,
                **lengths,
                do_sample=False,
                num_beams=1,
                return_dict_in_generate=True,
                cache_implementation=spec.cache_implementation,
            )
        finally:
            _GENERATION_LOG.removeFilter(quiet)
            handle.remove()
            remove()
        skipper.finish()
        mark_cache(recorder, _returned_cache(output))
        self.cache = summarize_cache(
            _returned_cache(output),
            self.prompt_tokens,
            self.new_tokens,
            int(ids.shape[0]),
        )
        return output


def mark_cache(recorder: Recorder, cache: Any) -> None:
    """Give each storage ``cache`` holds the memory category of the cache (:data:`KV_CACHE`,
    :data:`KV_CACHE_SLIDING` for a sliding layer's), kept once freed."""
    if cache is None:
        return
    inner = getattr(cache, "self_attention_cache", cache)
    layers = getattr(inner, "layers", None)
    sliding: set[int] = set()
    for layer in layers if layers is not None else ():
        if getattr(layer, "is_sliding", False):
            sliding.update(id(t) for t in _tensors(layer))
    for t in _tensors(cache):
        recorder.storage.set_category(t, KV_CACHE_SLIDING if id(t) in sliding else KV_CACHE)


def summarize_cache(cache: Any, prompt: int, new: int, batch: int) -> CacheSummary | None:
    """The :class:`CacheSummary` of a transformers cache object (None for no cache)."""
    if cache is None:
        return None
    inner = getattr(cache, "self_attention_cache", cache)  # an encoder-decoder's own
    layers = getattr(inner, "layers", None)
    summaries = tuple(_layer(layer) for layer in layers) if layers is not None else ()
    return CacheSummary(
        bytes=_storage_bytes(_tensors(cache)),
        layers=summaries,
        cache_type=type(cache).__name__,
        prompt_tokens=prompt,
        new_tokens=new,
        batch=batch,
    )


def _layer(layer: Any) -> LayerCache:
    tensors = list(_tensors(layer))
    keys = getattr(layer, "keys", None)
    held = _storage_bytes(tensors)
    if not held:
        return LayerCache("none", 0, 0, 0)
    sliding = bool(getattr(layer, "is_sliding", False))
    window = getattr(layer, "sliding_window", None) if sliding else None
    shape = keys.shape if isinstance(keys, torch.Tensor) and keys.dim() >= 3 else None
    tokens = int(shape[-2]) if shape is not None else 0
    batch = int(shape[0]) if shape is not None else 0
    # the positions the tensors show (a sliding layer's keys are a view of a longer storage)
    per_position = sum(
        t.numel() * t.element_size()
        for t in {id(t): t for t in tensors}.values()
        if shape is not None and t.dim() >= 3 and t.shape[0] == shape[0] and t.shape[-2] == tokens
    )
    return LayerCache(
        "sliding" if sliding else "full",
        held,
        tokens,
        batch,
        int(window) if isinstance(window, int) else None,
        per_position / (batch * tokens) if batch and tokens else 0.0,
    )


def _tensors(value: Any, depth: int = 0) -> Iterator[torch.Tensor]:
    """Every tensor a cache object holds: in its attributes (private ones too: a sliding
    layer's window as a tensor), lists, tuples and dicts, and the objects it holds."""
    if isinstance(value, torch.Tensor):
        yield value
    elif depth > 6 or value is None or isinstance(value, (int, float, bool, str, bytes)):
        return
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v, depth + 1)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v, depth + 1)
    elif hasattr(value, "__dict__") and not isinstance(value, (type, torch.nn.Module)):
        for v in vars(value).values():
            yield from _tensors(v, depth + 1)


def _storage_bytes(tensors: Any) -> int:
    """Bytes of the distinct storages behind ``tensors``."""
    seen: dict[Any, int] = {}
    for t in tensors:
        st = t.untyped_storage()
        seen[st._cdata] = st.nbytes()
    return sum(seen.values())
