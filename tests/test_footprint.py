"""What a budget is held against (issue 35): with ``gpu=``, what that GPU would hold at the peak
(``MemoryReport.device_bytes``: the caching allocator's reserve, the CUDA context, NCCL's
buffers), else the tensors' peak; ``max_fit`` and the summary say so."""

from __future__ import annotations

from typing import Any

import transformers

import meta_widget as mw
from meta_widget.memory.device import CONTEXT_BYTES
from meta_widget.units import format_bytes

SIZE = (2, 64)


def llama() -> Any:
    return transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2,
    )  # fmt: skip


def test_with_a_gpu_the_footprint_is_what_the_gpu_holds_else_the_peak() -> None:
    on_gpu = mw.analyze(llama(), SIZE, mode="training", gpu="H100")
    m = on_gpu.memory
    assert m.reserved_bytes >= m.peak_bytes + m.workspace_bytes > 0
    assert m.device_bytes == m.reserved_bytes + CONTEXT_BYTES  # one device: no NCCL buffers
    assert on_gpu.footprint_bytes == m.device_bytes
    plain = mw.analyze(llama(), SIZE, mode="training")
    assert plain.footprint_bytes == plain.peak_bytes == on_gpu.peak_bytes
    cpu = mw.analyze(llama(), SIZE, mode="training", gpu="H100", device="cpu")
    assert cpu.footprint_bytes == cpu.peak_bytes
    text = on_gpu.summary()
    assert f"On the H100: {format_bytes(m.device_bytes)} as nvidia-smi would show it" in text
    assert f"reserved {format_bytes(m.reserved_bytes)}" in text
    assert "On the H100" not in plain.summary()


def test_max_fit_with_a_gpu_holds_what_the_gpu_holds_against_the_budget() -> None:
    budget = 600 * 2**20  # the CUDA context alone is 426 MiB
    fit = mw.max_fit(llama(), (1, 64), budget=budget, mode="training", gpu="H100")
    at = mw.analyze(llama(), (fit.size, 64), mode="training", gpu="H100")
    assert fit.peak_bytes == at.footprint_bytes == at.memory.device_bytes <= budget
    assert fit.next_peak_bytes is not None and fit.next_peak_bytes > budget
    assert at.peak_bytes < budget - CONTEXT_BYTES  # the tensors alone would fit more
    without = mw.max_fit(llama(), (1, 64), budget=budget, mode="training", limit=fit.size * 4)
    assert without.size > fit.size  # held against the tensors' peak, more fits
