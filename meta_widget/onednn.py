"""``nn.LSTM`` inference as the CPU runs it: oneDNN's RNN kernel, one layer at a time.

On a CPU with oneDNN (every x86 build of PyTorch), ``torch.lstm`` on ``float32`` does not run
the cell step by step: each layer and direction is one ``mkldnn_rnn_layer`` call. That kernel
allocates the layer's output and final states, the sum of the two biases, a copy of both weight
matrices in oneDNN's own layout, and a scratchpad holding the gates of every time step, all
freed when it returns but the output and states. A meta trace never takes that path (meta
decomposes ``torch.lstm`` into the cell's ops, which keep different buffers: 0.59× the CPU
allocator's peak on a 2-layer LSTM). While tracing inference for ``device="cpu"``,
:func:`onednn_lstm` runs those steps instead, when PyTorch would take that path: the outputs
come from ``mkldnn_rnn_layer``'s own meta kernel, the kernel's internal buffers are allocated
(and freed) around it. What oneDNN adds to the scratchpad beyond the gates (its state buffers
and alignment, sized at run time: 30–80 KB on the layers measured) is not counted.

Training keeps the decomposition: oneDNN's training workspace is sized by oneDNN at run time, so
there the trace counts the cell's own tensors (the README says so).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["LSTM", "mkldnn_rnn_layer_flops", "onednn_lstm"]

aten = torch.ops.aten
#: ``torch.lstm``, as a torch-function mode sees it (``nn.LSTM`` calls it as ``_VF.lstm``)
LSTM = torch.lstm
_GATES = 4  # an LSTM cell's gates: input, forget, cell, output
_ONEDNN_LSTM = 2  # ideep's rnn_kind for an LSTM


def _takes_onednn(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """PyTorch's ``use_mkldnn`` for this call, in inference: a padded (not packed) ``float32``
    input on a build with oneDNN enabled, and no projections."""
    if kwargs or len(args) != 9 or not isinstance(args[1], (list, tuple)):
        return False  # a packed sequence (its batch sizes second), or an unexpected form
    x, hx, params, has_biases, layers, _, _, bidirectional, _ = args
    per_layer = (4 if has_biases else 2) * (2 if bidirectional else 1)
    return (
        torch.backends.mkldnn.is_available()
        and torch._C._get_mkldnn_enabled()
        and x.dtype == torch.float32
        and x.numel() > 0
        and len(hx) == 2
        and len(params) == per_layer * layers
        and not (torch.is_grad_enabled() and any(p.requires_grad for p in (x, *params)))
    )


def onednn_lstm(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``torch.lstm`` as oneDNN runs it on the CPU (``func`` itself where PyTorch would not)."""
    if not _takes_onednn(args, kwargs):
        return func(*args, **kwargs)
    x, hx, params, has_biases, layers, _, _, bidirectional, batch_first = args
    x = (x.transpose(0, 1) if batch_first else x).contiguous()
    h0, c0 = hx[0].contiguous(), hx[1].contiguous()
    directions = 2 if bidirectional else 1
    per_layer = 4 if has_biases else 2
    # each direction's output is held until the next layer's replaces it, as PyTorch does
    layer_input, outputs, hys, cys = x, [x] * directions, [], []
    for layer in range(layers):
        for direction in range(directions):
            index = layer * directions + direction
            weights = params[index * per_layer : (index + 1) * per_layer]
            out, hy, cy = _layer(layer_input, weights, h0[index], c0[index], direction > 0, args)
            outputs[direction] = out
            hys.append(hy)
            cys.append(cy)
            del out
        layer_input = outputs[0] if directions == 1 else torch.cat(outputs, -1)
    del outputs
    output = layer_input.transpose(0, 1) if batch_first else layer_input
    return output, torch.stack(hys), torch.stack(cys)


def _layer(
    x: torch.Tensor,
    weights: list[torch.Tensor],
    h: torch.Tensor,
    c: torch.Tensor,
    reverse: bool,
    args: tuple[Any, ...],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One ``mkldnn_rnn_layer`` call: its outputs (its meta kernel), then the buffers it holds
    while it runs: the summed bias, the weights in oneDNN's layout, the gates of every step."""
    _, _, _, has_biases, layers, _, _, bidirectional, batch_first = args
    w_ih, w_hh = weights[0], weights[1]
    # without biases PyTorch passes zeros the size of the weights
    b_ih, b_hh = (
        (weights[2], weights[3]) if has_biases else (torch.zeros_like(w_ih), torch.zeros_like(w_hh))
    )
    hidden = h.shape[-1]
    out, hy, cy, _ = aten.mkldnn_rnn_layer(
        x, w_ih, w_hh, b_ih, b_hh, h, c, reverse, [], _ONEDNN_LSTM, hidden, layers,
        has_biases, bidirectional, batch_first, False,
    )  # fmt: skip
    bias = b_ih + b_hh if has_biases else x.new_zeros(_GATES * hidden)
    reordered = (w_ih.clone(), w_hh.clone())
    gates = x.new_empty((x.shape[0], x.shape[1], _GATES * hidden))
    del gates, reordered, bias
    return out, hy, cy


def mkldnn_rnn_layer_flops(x: Any, w_ih: Any, w_hh: Any, *args: Any, **kwargs: Any) -> int:
    """The gate matmuls of every step: ``x @ W_ih^T`` and ``h @ W_hh^T`` (``FlopCounterMode``
    has no formula for the kernel; the same count as the cell's decomposition)."""
    steps, batch = x.shape[0], x.shape[1]
    gates, inputs = w_ih.shape
    return 2 * steps * batch * gates * (inputs + w_hh.shape[1])
