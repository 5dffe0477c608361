"""Finding an assumption's site must not keep the model's tensors alive.

Reading ``frame.f_locals`` (before Python 3.13) snapshots a running frame's locals into a dict
the frame keeps: a tensor the code lets go of afterwards stayed alive until the method returned,
and the recorded peak grew by it. The truth is a real CPU run under ``MemTracker``.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed._tools.mem_tracker import MemTracker

import meta_widget as mw


class Branchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(256, 256)
        self.b = nn.Linear(256, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        if h.mean() > -1e9:  # a value meta cannot know: an assumption is taken here
            h = h * 2  # the first h is let go of here ...
        h = self.b(h)  # ... so it is not alive at this peak
        return h + 1


def test_taking_an_assumption_keeps_no_tensor_alive() -> None:
    model = Branchy().eval()
    x = torch.randn(512, 256)
    a = mw.analyze(model, input_data=x, device="cpu")
    assert [s.site for s in a.assumptions] == [f"test_site_frames.py:{_line('h.mean()')}"]
    tracker = MemTracker()
    tracker.track_external(model, x)
    with torch.no_grad(), tracker:
        out = model(x)
    del out
    real = int(tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"])
    assert a.peak_bytes == real


def _line(text: str) -> int:
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if text in line and "if " in line)
