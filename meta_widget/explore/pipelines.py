"""``mw.analyze_pipeline``: an object holding several models (a diffusers pipeline: text
encoders, a UNet or transformer, a VAE), analyzed part by part, with totals.

**Parts**: a diffusers pipeline's ``components`` that are ``nn.Module``s; a dict of modules; any
other object's attributes that are ``nn.Module``s (in the order they were set); or a folder
saved by diffusers (``model_index.json`` and each part's ``config.json``), each part built on
meta from its config, with no weights. The same module held under two names is one part.

**Inputs**: ``inputs={"part": value}``, where a value is a shape (``input_size``) or what
``input_data`` takes (a tensor, a tuple of them, a dict of keyword arguments). A part left out
gets its default, from its config (see ``default_inputs``), or is analyzed without inputs
(structural: parameters and weights only).

**Totals**: parameters and bytes add up over the parts. ``peak_bytes`` is the peak of running
the parts one after another with every part's weights resident: the sum of the parts'
parameter and buffer bytes, plus the largest of the parts' own excess over their weights
(``part.peak_bytes - part's parameter and buffer bytes``: its inputs, activations and
temporaries at its own peak).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .. import heavy
from ..analysis import Analysis, analyze
from ..units import format_bytes, format_count
from .pipeline_folder import PipelineError, parts_of_folder

if TYPE_CHECKING:
    import pandas as pd

    from ..views.widget import MetaWidget

__all__ = ["PipelineAnalysis", "PipelineError", "analyze_pipeline", "default_inputs"]

#: the text length a UNet's ``encoder_hidden_states`` get without a text encoder to ask
DEFAULT_TEXT_TOKENS = 77


@dataclass(eq=False, frozen=True)
class PipelineAnalysis:
    """Several models analyzed part by part (see :func:`analyze_pipeline`).

    ``parts`` maps each part's name to its :class:`~meta_widget.Analysis`; the totals add up
    over them, and ``peak_bytes`` is the peak of running them one after another with every
    part's weights resident (the module docstring of ``meta_widget.explore.pipelines`` has the
    formula).
    """

    title: str
    parts: dict[str, Analysis]
    notes: list[str]

    @property
    def total_params(self) -> int:
        return sum(a.total_params for a in self.parts.values())

    @property
    def trainable_params(self) -> int:
        return sum(a.trainable_params for a in self.parts.values())

    @property
    def param_bytes(self) -> int:
        return sum(a.param_bytes for a in self.parts.values())

    @property
    def weight_bytes(self) -> int:
        """Parameter and buffer bytes of every part: what stays resident."""
        return sum(_weights(a) for a in self.parts.values())

    @property
    def total_flops(self) -> int:
        return sum(a.total_flops for a in self.parts.values())

    @property
    def peak_bytes(self) -> int:
        """``weight_bytes`` plus the largest part's excess over its own weights."""
        return self.weight_bytes + max(
            (a.peak_bytes - _weights(a) for a in self.parts.values()), default=0
        )

    @property
    def peak_part(self) -> str | None:
        """The part whose run makes ``peak_bytes``."""
        if not self.parts:
            return None
        return max(self.parts, key=lambda k: self.parts[k].peak_bytes - _weights(self.parts[k]))

    def __getitem__(self, name: str) -> Analysis:
        return self.parts[name]

    def __repr__(self) -> str:
        return (
            f"PipelineAnalysis({self.title}: {len(self.parts)} parts, "
            f"{format_count(self.total_params)} params, peak {format_bytes(self.peak_bytes)})"
        )

    def to_dataframe(self) -> pd.DataFrame:
        """One row per part: ``part``, ``type``, ``params``, ``trainable_params``,
        ``param_bytes``, ``weight_bytes`` (parameters and buffers), ``flops``, ``peak_bytes``
        (its own run), ``excess_bytes`` (that peak less its weights), ``traced``."""
        rows = [
            {
                "part": name,
                "type": a.title,
                "params": a.total_params,
                "trainable_params": a.trainable_params,
                "param_bytes": a.param_bytes,
                "weight_bytes": _weights(a),
                "flops": a.total_flops,
                "peak_bytes": a.peak_bytes,
                "excess_bytes": a.peak_bytes - _weights(a),
                "traced": a.traced,
            }
            for name, a in self.parts.items()
        ]
        return heavy.pandas().DataFrame(rows)

    def summary(self) -> str:
        """The parts and the totals as a text table."""
        head = f"{'part':<20} {'type':<28} {'params':>10} {'weights':>11} {'peak':>11}"
        lines = [self.title, head, "-" * len(head)]
        for name, a in self.parts.items():
            lines.append(
                f"{name:<20} {a.title[:28]:<28} {format_count(a.total_params):>10} "
                f"{format_bytes(_weights(a)):>11} {format_bytes(a.peak_bytes):>11}"
            )
        lines += [
            "-" * len(head),
            f"{'total':<49} {format_count(self.total_params):>10} "
            f"{format_bytes(self.weight_bytes):>11} {format_bytes(self.peak_bytes):>11}",
            f"peak: every part's weights resident, plus {self.peak_part!r}'s run",
            *self.notes,
        ]
        return "\n".join(lines)

    def widget(self, part: str) -> MetaWidget:
        """The widget of one part (``self.parts[part].widget()``)."""
        if part not in self.parts:
            raise PipelineError(f"no part {part!r}: the parts are {list(self.parts)}.")
        return self.parts[part].widget()

    def _repr_html_(self) -> str:
        return str(self.to_dataframe().to_html(index=False))

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(self.summary())


def _weights(a: Analysis) -> int:
    return a.memory.param_bytes + a.memory.buffer_bytes


def _get(config: Any, key: str) -> Any:
    if isinstance(config, Mapping):
        return config.get(key)
    return getattr(config, key, None)


def _size(value: Any) -> tuple[int, int]:
    if isinstance(value, (tuple, list)):
        return int(value[0]), int(value[-1])
    return int(value), int(value)


def default_inputs(config: Any, text_tokens: int = DEFAULT_TEXT_TOKENS) -> Any:
    """The inputs a pipeline part gets when none are given, from its config (batch 1).

    - a UNet (``in_channels``, ``sample_size``, ``cross_attention_dim``): ``sample`` (1,
      in_channels, sample_size, sample_size), ``timestep`` [1], ``encoder_hidden_states`` (1,
      ``text_tokens``, cross_attention_dim); none where it needs added conditions
      (``addition_embed_type``, SDXL): pass them;
    - a VAE (``latent_channels``, ``in_channels``, ``sample_size``): ``sample`` (1,
      in_channels, sample_size, sample_size), through its ``forward``: encoded and decoded;
    - a transformers text model (``vocab_size``, ``max_position_embeddings``): ``input_ids``
      (1, max_position_embeddings) of zeros;
    - anything else: None (analyzed without inputs).
    """
    channels, sample = _get(config, "in_channels"), _get(config, "sample_size")
    if channels is not None and sample is not None and _get(config, "cross_attention_dim"):
        if _get(config, "addition_embed_type") or _get(config, "class_embed_type"):
            return None
        h, w = _size(sample)
        cross = _get(config, "cross_attention_dim")
        return {
            "sample": torch.zeros(1, channels, h, w),
            "timestep": torch.tensor([1]),
            "encoder_hidden_states": torch.zeros(1, text_tokens, _size(cross)[0]),
        }
    if channels is not None and sample is not None and _get(config, "latent_channels"):
        h, w = _size(sample)
        return {"sample": torch.zeros(1, channels, h, w)}
    positions = _get(config, "max_position_embeddings")
    if positions and _get(config, "vocab_size"):
        return {"input_ids": torch.zeros(1, positions, dtype=torch.long)}
    return None


def _unique_modules(items: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    seen: set[int] = set()
    for name, value in items:
        if isinstance(value, torch.nn.Module) and id(value) not in seen:
            seen.add(id(value))
            out[name] = value
    return out


def _parts_of(pipe: Any) -> dict[str, Any]:
    """name -> an nn.Module, or a factory building one on meta (a config folder's part)."""
    if isinstance(pipe, (str, os.PathLike)):
        return dict(parts_of_folder(Path(pipe)))
    if isinstance(pipe, torch.nn.Module):
        raise PipelineError(
            f"{type(pipe).__name__} is one nn.Module: analyze it with mw.analyze, or pass an "
            "object or dict holding several."
        )
    components = getattr(pipe, "components", None)
    if isinstance(components, Mapping):
        items = list(components.items())
    elif isinstance(pipe, Mapping):
        items = list(pipe.items())
    else:
        items = list(getattr(pipe, "__dict__", {}).items())
    parts = _unique_modules([(str(k), v) for k, v in items])
    if not parts:
        raise PipelineError(
            f"a {type(pipe).__name__} holds no nn.Module: pass a diffusers pipeline, a dict of "
            "modules, an object whose attributes are modules, or a pipeline's config folder."
        )
    return parts


def _inputs_kwargs(value: Any) -> dict[str, Any]:
    is_shape = isinstance(value, (tuple, list)) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    )
    if is_shape and value:
        return {"input_size": tuple(value)}
    return {"input_data": value}


def _text_tokens(parts: dict[str, Any]) -> int:
    for name, part in parts.items():
        config = part[1] if isinstance(part, tuple) else getattr(part, "config", None)
        if name.startswith("text_encoder") and _get(config, "max_position_embeddings"):
            return int(_get(config, "max_position_embeddings"))
    return DEFAULT_TEXT_TOKENS


def analyze_pipeline(
    pipe: Any, inputs: Mapping[str, Any] | None = None, **options: Any
) -> PipelineAnalysis:
    """Analyze each model of a pipeline with its own inputs, and add them up.

    Parameters
    ----------
    pipe
        A diffusers pipeline (its ``components`` that are modules), a dict of modules, an
        object whose attributes are modules, or the path of a folder diffusers saved
        (``model_index.json`` and each part's ``config.json``: built on meta, no weights).
    inputs
        Part name -> its inputs: a shape (``input_size``), or what ``input_data`` takes.
        Parts left out get ``default_inputs`` from their config, else none (structural).
    **options
        Other options of ``mw.analyze`` (``mode``, ``device``, ``param_dtype``...), the same
        for every part.

    Returns
    -------
    PipelineAnalysis
        ``parts`` (name -> Analysis), totals, ``peak_bytes`` (every part's weights resident
        plus the largest part's run), ``to_dataframe()`` with a row per part, ``summary()``.

    Raises
    ------
    PipelineError
        The object holds no module, a name in ``inputs`` is no part, or the folder is not a
        pipeline's, or names a part outside itself (an absolute key, ``..``, a link), a part
        whose config is past ``sources.config_limits``, needs its own code (``auto_map``), or
        needs diffusers where it cannot be imported (``meta_widget.explore.pipeline_folder``).
    """
    parts = _parts_of(pipe)
    given = dict(inputs or {})
    unknown = sorted(set(given) - set(parts))
    if unknown:
        raise PipelineError(f"inputs for {unknown}: no such part; the parts are {list(parts)}.")
    tokens = _text_tokens(parts)
    analyses: dict[str, Analysis] = {}
    notes: list[str] = []
    for name, part in parts.items():
        model, config = part if isinstance(part, tuple) else (part, getattr(part, "config", None))
        value = given[name] if name in given else default_inputs(config, tokens)
        if name not in given and value is None:
            notes.append(f"{name}: no inputs given or defaulted; parameters and weights only.")
        kwargs = _inputs_kwargs(value) if value is not None else {}
        analyses[name] = analyze(model, **kwargs, **options)
    title = type(pipe).__name__ if not isinstance(pipe, (str, os.PathLike)) else str(pipe)
    return PipelineAnalysis(title, analyses, notes)
