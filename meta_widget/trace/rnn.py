"""Recurrent layers as the CPU runs them, not as meta decomposes them.

**LSTM** (inference): on a CPU with oneDNN (every x86 build of PyTorch), ``torch.lstm`` on
``float32`` does not run the cell step by step: each layer and direction is one
``mkldnn_rnn_layer`` call. That kernel allocates the layer's output and final states, the sum of
the two biases, a copy of both weight matrices in oneDNN's own layout, and a scratchpad holding
the gates of every time step, all freed when it returns but the output and states. A meta trace
never takes that path (meta decomposes ``torch.lstm`` into the cell's ops, which keep different
buffers: 0.59× the CPU allocator's peak on a 2-layer LSTM). :func:`onednn_lstm` runs those steps
instead, when PyTorch would take that path: the outputs come from ``mkldnn_rnn_layer``'s own meta
kernel, the kernel's internal buffers are allocated (and freed) around it. What oneDNN adds to
the scratchpad beyond the gates (its state buffers and alignment, sized at run time) is not
counted. Training keeps the decomposition: oneDNN's training workspace is sized by oneDNN at run
time.

**GRU** (inference and training): PyTorch's CPU code projects the whole input sequence through
``W_ih`` in one matmul before the steps, a branch it takes only for CPU tensors (``FullLayer``
in ``RNN.cpp``); on meta each step projects its own input. :func:`cpu_gru` runs the CPU branch:
the same ops, in the same order, as PyTorch's C++ (one direction; a bidirectional GRU keeps the
decomposition).

Both are used for ``device="cpu"`` only (:class:`meta_widget.trace.kernels.AttentionKernels`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["GRU", "LSTM", "cpu_gru", "mkldnn_rnn_layer_flops", "onednn_lstm"]

aten = torch.ops.aten
#: ``torch.lstm``, as a torch-function mode sees it (``nn.LSTM`` calls it as ``_VF.lstm``)
LSTM = torch.lstm
#: ``torch.gru``, likewise
GRU = torch.gru
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


def _takes_cpu_branch(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """A padded (not packed) sequence in one direction, in ``torch.gru``'s positional form."""
    return (
        not kwargs
        and len(args) == 9
        and isinstance(args[1], torch.Tensor)
        and isinstance(args[2], (list, tuple))
        and not args[7]
    )


def cpu_gru(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``torch.gru`` as PyTorch's CPU code runs it (``func`` itself for other forms)."""
    if not _takes_cpu_branch(args, kwargs):
        return func(*args, **kwargs)
    x, hx, params, has_biases, layers, dropout, train, _, batch_first = args
    per_layer = 4 if has_biases else 2
    hiddens = hx.unbind(0)
    layer_input = x.transpose(0, 1) if batch_first else x
    finals = []
    for layer in range(layers):
        weights = params[layer * per_layer : (layer + 1) * per_layer]
        biases = (weights[2], weights[3]) if has_biases else (None, None)
        layer_input, hidden = _gru_layer(layer_input, hiddens[layer], weights[:2], biases)
        finals.append(hidden)
        if dropout and train and layer < layers - 1:
            layer_input = F.dropout(layer_input, dropout, True)
    output = layer_input.transpose(0, 1) if batch_first else layer_input
    return output, torch.stack(finals, 0)


def _gru_layer(
    x: torch.Tensor,
    hidden: torch.Tensor,
    weights: list[torch.Tensor],
    biases: tuple[torch.Tensor | None, torch.Tensor | None],
) -> tuple[torch.Tensor, torch.Tensor]:
    """``FullLayer`` on the CPU: the input projected for every step at once, then the cell."""
    projected = F.linear(x, weights[0], biases[0])
    outputs = []
    for step in projected.unbind(0):
        hidden = _gru_cell(step, hidden, weights[1], biases[1])
        outputs.append(hidden)
    return torch.stack(outputs, 0), hidden


def _gru_cell(
    projected: torch.Tensor, hidden: torch.Tensor, w_hh: torch.Tensor, b_hh: torch.Tensor | None
) -> torch.Tensor:
    """``GRUCell`` on an input already projected, in PyTorch's order (gates in place)."""
    i_reset, i_input, i_new = projected.unsafe_chunk(3, 1)
    h_reset, h_input, h_new = F.linear(hidden, w_hh, b_hh).unsafe_chunk(3, 1)
    reset = h_reset.add_(i_reset).sigmoid_()
    update = h_input.add_(i_input).sigmoid_()
    new = i_new.add(h_new.mul_(reset)).tanh_()
    return (hidden - new).mul_(update).add_(new)
