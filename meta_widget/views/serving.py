"""``payload["serving"]``: what the widget's serving view shows of ``mode="generate"``.

Every number is the analysis' own (``Analysis.kv_cache``, ``Analysis.time``); this module only
gathers them for the wire (see ``protocol.py``)::

    "serving": {"batch", "prompt_tokens", "new_tokens", "cache_type",
                "kv_bytes", "kv_bytes_per_token",          # KVCache.bytes, .bytes_per_token
                "layers": {kind: [layers, bytes]},         # full / sliding / none
                "prefill_s", "per_token_s", "tokens_per_s", "decode_tokens_per_s",  # with gpu=
                "paged": {"gpu", "budget_bytes", "sequences", "length", "block",
                          "sequence_bytes", "weight_bytes", "reason"} | null}
"""

from __future__ import annotations

from typing import Any

__all__ = ["encode_serving"]


def encode_serving(a: Any) -> dict[str, Any] | None:
    """The serving view's numbers of ``a`` (``mode="generate"`` with a cache), else None."""
    cache = getattr(a, "kv_cache", None)
    if a.mode != "generate" or cache is None:
        return None
    layers: dict[str, list[int]] = {}
    for layer in cache.layers:
        count = layers.setdefault(layer.kind, [0, 0])
        count[0] += 1
        count[1] += layer.bytes
    out: dict[str, Any] = {
        "batch": cache.batch,
        "prompt_tokens": cache.prompt_tokens,
        "new_tokens": cache.new_tokens,
        "cache_type": cache.cache_type,
        "kv_bytes": cache.bytes,
        "kv_bytes_per_token": cache.bytes_per_token,
        "layers": layers,
        "paged": None,
    }
    t = a.time
    if t is not None and t.prefill_s is not None:
        out.update(
            prefill_s=t.prefill_s,
            per_token_s=t.per_token_s,
            tokens_per_s=t.tokens_per_s,
            decode_tokens_per_s=t.decode_tokens_per_s,
        )
        fit = cache.paged(t.gpu.memory_bytes)
        out["paged"] = {
            "gpu": t.gpu.name,
            "budget_bytes": fit.budget_bytes,
            "sequences": int(fit),
            "length": fit.length,
            "block": fit.block,
            "sequence_bytes": fit.sequence_bytes,
            "weight_bytes": fit.weight_bytes,
            "reason": fit.reason,
        }
    return out
