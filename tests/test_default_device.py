"""Tensors a forward makes without a device land on meta, count in memory, and cost no RAM."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn
from truth import real_peak

import meta_widget as mw


class MakesTensors(nn.Module):
    """A forward that builds a causal mask, positions and a constant without ``device=``."""

    def __init__(self, d: int = 64) -> None:
        super().__init__()
        self.fc, self.out = nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t, d = x.shape[1], x.shape[2]
        mask = torch.full((t, t), float("-inf")).triu(1)  # device-less
        scores = self.fc(x) @ self.fc(x).transpose(1, 2) + mask
        pos = torch.arange(t)  # device-less
        table = torch.ones(t, d) * 0.5  # device-less
        return self.out(scores.softmax(-1) @ x + table[pos])


@pytest.mark.parametrize("mode", ["inference", "training"])
def test_device_less_tensors_count_like_on_a_real_cpu_run(mode: str) -> None:
    torch.manual_seed(0)
    model, x = MakesTensors(), torch.randn(2, 96, 64)
    training = mode == "training"
    a = mw.analyze(model, input_data=x, mode=mode, optimizer=None, device="cpu")
    assert a.error is None, a.error
    assert a.peak_bytes == real_peak(model, (x,), training=training)
    note = next(n for n in a.notes if "without a device" in n)
    assert note.startswith("3 tensor(s)") and "torch.full at test_default_device.py:" in note


def test_an_explicit_device_is_kept_and_the_default_device_is_put_back() -> None:
    seen: list[torch.device] = []

    class Explicit(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seen.append(torch.zeros(2, device="cpu").device)
            seen.append(torch.zeros(2, device=x.device).device)
            return x + 1

    a = mw.analyze(Explicit(), input_size=(2,))
    assert a.error is None
    assert seen == [torch.device("cpu"), torch.device("meta")]
    assert not any("without a device" in n for n in a.notes)
    assert torch.zeros(1).device.type == "cpu"
    with torch.device("meta"):  # a user's own default device survives an analysis
        mw.analyze(MakesTensors(), input_size=(1, 4, 64))
        assert torch.zeros(1).device.type == "meta"
    assert torch.zeros(1).device.type == "cpu"


_BIG = textwrap.dedent(
    """
    import resource, sys
    import torch
    from torch import nn
    import meta_widget as mw

    class Huge(nn.Module):
        def __init__(self, n):
            super().__init__()
            self.n, self.fc = n, nn.Linear(4, 4)
        def forward(self, x):
            big = torch.zeros(self.n)  # device-less: 4 bytes each
            return self.fc(x) + big[:4]

    def rss():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    mw.analyze(Huge(4), input_size=(2, 4))  # everything imported and warmed up
    before = rss()
    # a regression (the zeros made on the CPU) fails to allocate instead of taking 8 GiB
    with open("/proc/self/statm") as f:
        size = int(f.read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (size + 2**31, resource.RLIM_INFINITY))
    a = mw.analyze(Huge(2**31), input_size=(2, 4))
    print(a.error is None, a.peak_bytes, rss() - before)
    """
)


def test_an_8_gib_device_less_tensor_in_forward_costs_no_memory() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _BIG], capture_output=True, text=True, check=True, timeout=600
    )
    ok, peak, grown = out.stdout.split()
    assert ok == "True", out.stdout + out.stderr
    assert int(peak) >= 2**33  # counted: 8 GiB of float32 zeros
    assert int(grown) < 64 * 2**20, f"RSS grew by {int(grown) / 2**20:.0f} MiB"
