"""The fast path (the op cache) changes nothing: every record the same with ``fast=False``.

Each model is analyzed twice, with and without the cache, and everything an analysis reports is
compared record by record: calls (shapes, FLOPs by op, bytes, events, errors, assumptions),
the allocation and free timeline, allocations, peak and categories, totals, the explained error.
The models are the test corpus and models built to break a cache: blocks that branch on a
Python attribute, shared weights fed different shapes, views and hidden views, in-place and
``out=`` ops, random ops, ops that read values, CPU tensors mixed in.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
import torch
from models import (
    DictModel,
    Failing,
    Reused,
    SmallCNN,
    SmallLSTM,
    bert_config,
    gpt2_config,
    llama_config,
    t5_config,
)
from torch import nn
from torch.nn import functional as F

import meta_widget as mw
from meta_widget.options import OptionTypeError
from meta_widget.trace.passes import trace

#: fields that differ between any two runs: wall time, autograd's global sequence counter, and
#: storage addresses
_VOLATILE = {"duration_s", "grad_seq", "key"}


def _plain(records: Any) -> list[dict[str, Any]]:
    return [{k: v for k, v in dataclasses.asdict(r).items() if k not in _VOLATILE} for r in records]


def snapshot(a: mw.Analysis) -> dict[str, Any]:
    """Everything ``a`` reports, as plain data."""
    return {
        "calls": _plain(a.calls),
        "memory": dataclasses.asdict(a.memory),
        "total_flops": a.total_flops,
        "orphan_ops": a.orphan_ops,
        "assumptions": _plain(a.assumptions),
        "error": None if a.error is None else repr(a.error),
        "notes": a.notes,
    }


def assert_same_analysis(a: mw.Analysis, b: mw.Analysis) -> None:
    """``a`` and ``b`` report the same: every record of :func:`snapshot`, the peak and the
    step time."""
    left, right = snapshot(a), snapshot(b)
    for key in left:
        assert left[key] == right[key], key
    assert a.peak_bytes == b.peak_bytes
    assert a.time is not None and b.time is not None
    assert a.time.step_s == b.time.step_s


def assert_same_parallel(fast: mw.Analysis, slow: mw.Analysis) -> None:
    """:func:`assert_same_analysis` of two parallel traces, ``fast`` without an error, and
    their collectives, timelines and what the GPU holds the same too."""
    assert fast.error is None, fast.error
    assert_same_analysis(fast, slow)
    assert fast.comm_records == slow.comm_records
    assert fast.memory.timeline == slow.memory.timeline
    assert fast.footprint_bytes == slow.footprint_bytes


def trace_snapshot(a: mw.Analysis, fast: bool) -> dict[str, Any]:
    """The raw trace of ``a``'s meta model and inputs again: events and allocations included."""
    options = a.options
    data = options.input_data
    args, kwargs = ((), data) if isinstance(data, dict) else (tuple(data), {})
    assert a.source_model is not None
    t = trace(a.source_model.module, args, kwargs, replace(options.trace_spec(), fast=fast))
    assert (t.fast_path is not None) == fast
    return {
        "calls": _plain(t.calls),
        "events": t.events,
        "allocations": _plain(t.allocations),
        "orphan": (t.orphan_flops, t.orphan_ops),
        "failure": (repr(t.exception), t.failed_op, t.error_call),
        "assumptions": _plain(t.assumptions),
        "phases": t.phase_starts,
        "state": (len(t.grad_keys), len(t.state_keys), t.state_other_bytes),
    }


def assert_same(
    model: Callable[[], nn.Module], min_hits: int = 1, raw: bool = True, **kwargs: Any
) -> mw.Analysis:
    """Analyze ``model()`` with and without the fast path; every record must be the same."""
    # from one line: assumptions taken in backward name the line that called analyze
    fast, slow = (mw.analyze(model(), fast=on, **kwargs) for on in (True, False))
    assert slow.fast_path is None
    assert fast.fast_path is not None and fast.fast_path.hits >= min_hits, fast.fast_path
    a, b = snapshot(fast), snapshot(slow)
    for key in a:
        assert a[key] == b[key], key
    if not raw:  # options the plain trace below cannot take
        return fast
    a, b = trace_snapshot(fast, True), trace_snapshot(fast, False)
    for key in a:
        assert a[key] == b[key], key
    return fast


def ids(*shape: int) -> torch.Tensor:
    return torch.randint(1, 90, shape)


def from_config(config: Any) -> Callable[[], nn.Module]:
    import transformers

    def build() -> nn.Module:
        with torch.device("meta"):
            return getattr(transformers, config.architectures[0])(config)  # type: ignore[no-any-return]

    return build


# -- the test corpus ----------------------------------------------------------------------------

CORPUS: dict[str, tuple[Callable[[], nn.Module], dict[str, Any]]] = {
    "gpt2": (from_config(gpt2_config()), {"input_data": ids(2, 12)}),
    "llama": (from_config(llama_config()), {"input_data": ids(2, 12)}),
    "bert": (from_config(bert_config()), {"input_data": ids(2, 12)}),
    "t5": (
        from_config(t5_config()),
        {"input_data": {"input_ids": ids(2, 12), "decoder_input_ids": ids(2, 7)}},
    ),
    "cnn": (SmallCNN, {"input_size": (2, 3, 16, 16)}),
    "lstm": (SmallLSTM, {"input_data": torch.randint(0, 50, (2, 7))}),
    "reused": (Reused, {"input_size": (3, 8)}),
    "dict": (
        DictModel,
        {"input_data": ({"image": torch.randn(2, 12), "tokens": torch.randint(0, 20, (2, 5))},)},
    ),
}


TRANSFORMERS = {"gpt2", "llama", "bert", "t5"}


@pytest.mark.parametrize("mode", ["inference", "training"])
@pytest.mark.parametrize("name", sorted(CORPUS))
def test_the_corpus_records_the_same_with_and_without_the_cache(name: str, mode: str) -> None:
    build, inputs = CORPUS[name]
    # two decoder layers: the second one's ops are hits; the small models may repeat nothing
    a = assert_same(build, min_hits=10 if name in TRANSFORMERS else 0, mode=mode, **inputs)
    assert a.error is None, a.error


@pytest.mark.parametrize("how", ["item", "nonzero", "cpu", "shape"])
def test_failures_and_assumptions_are_the_same(how: str) -> None:
    a = assert_same(lambda: Failing(how), min_hits=0, input_size=(3, 4))
    fast, slow = (
        mw.analyze(Failing(how), input_size=(3, 4), strict=True, fast=on) for on in (True, False)
    )
    assert snapshot(fast) == snapshot(slow)
    assert fast.error is not None or a.assumptions


def test_autocast_micro_batches_and_low_precision_are_the_same() -> None:
    llama = from_config(llama_config())
    for device in ("cuda", "cpu"):
        assert_same(
            llama, mode="training", autocast="bfloat16", device=device, input_data=ids(2, 12)
        )
    assert_same(llama, mode="training", micro_batches=2, input_data=ids(2, 12))
    assert_same(llama, mode="training", param_dtype="bfloat16", input_data=ids(2, 12))


@pytest.mark.parametrize(
    "parallel",
    [{"fsdp": 2}, {"tp": 2, "tp_plan": {"layers.*.0": "colwise", "layers.*.2": "rowwise"}}],
)
def test_one_rank_of_fsdp2_and_tensor_parallelism_is_the_same(parallel: dict[str, Any]) -> None:
    from parallel_truth import DeepMLP

    # DTensors are run, not cached: what this checks is that nothing changes
    a = assert_same(
        DeepMLP,
        min_hits=0,
        raw=False,
        mode="training",
        device="cpu",
        input_size=(8, 256),
        parallel=parallel,
    )
    assert a.error is None, a.error


def test_activation_checkpointing_and_devices_are_the_same() -> None:
    for device in ("cuda", "cpu", "math"):
        assert_same(
            from_config(llama_config()),
            mode="training",
            activation_checkpointing=True,
            device=device,
            input_data=ids(2, 12),
        )


# -- models built to break a cache --------------------------------------------------------------


class Block(nn.Module):
    """A block whose work depends on a Python attribute set from its layer index (sliding
    window attention every other layer, as Gemma and Mistral variants do)."""

    def __init__(self, index: int, width: int = 16, window: int = 4) -> None:
        super().__init__()
        self.is_sliding = index % 2 == 1
        self.window = window
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)  # views of one storage
        if self.is_sliding:
            k, v = k[:, -self.window :], v[:, -self.window :]
        scores = q @ k.transpose(-1, -2)
        attn = torch.softmax(scores, dim=-1)
        return x + self.out(attn @ v)


class Stack(nn.Module):
    def __init__(self, n: int = 6) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Block(i) for i in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class SharedShapes(nn.Module):
    """One Linear fed inputs of different shapes (and strides) in turn."""

    def __init__(self) -> None:
        super().__init__()
        self.shared = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.shared(x)  # (4, 8)
        b = self.shared(x.unsqueeze(1).expand(4, 3, 8))  # (4, 3, 8), a stride-0 input
        c = self.shared(b.transpose(0, 1))  # (3, 4, 8), not contiguous
        d = self.shared(a)
        return a.sum() + b.sum() + c.sum() + d.sum()


class Aliasing(nn.Module):
    """Views, hidden views, outputs that are their inputs, in-place and ``out=`` ops, scalars
    of every type, CPU tensors mixed in: each twice, so the second run is a hit."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.register_buffer("scratch", torch.zeros(2))

    def forward(self, x: torch.Tensor) -> Any:
        outs = []
        for _ in range(2):
            y = self.lin(x)
            t = y.t()  # a view
            r = t.reshape(-1)  # a copy of a non-contiguous view (``_unsafe_view`` inside)
            parts = y.split(3, dim=1)  # several views
            z = y.clone()
            z.add_(1)  # in-place: returns its input
            z.mul_(2.0).relu_()
            z[:, :2].fill_(0.5)  # in-place on a view
            w = torch.empty(0, device=x.device)
            torch.add(y.detach(), 1, out=w)  # out=: resized
            ints = (y > 0).long()
            mixed = ints * 2, ints * 2.0, ints * True  # long, float, long
            cpu = y * torch.tensor(3.0, device="cpu")  # a CPU scalar tensor
            sliced = y[1:]  # a storage offset
            odd = sliced + 1
            square = y[:, :4]
            # one shape, two layouts: the outputs keep their input's strides
            layouts = (square * 3).view(16), (square.t() * 3).t().reshape(16)
            outs.append((t, r, parts[0], z, w, *mixed, cpu, odd, y.diagonal(), *layouts))
        return outs


class Random(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.drop = nn.Dropout(0.5)
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x
        for _ in range(3):
            noise = torch.randn_like(out) + torch.rand(out.shape, device=out.device)
            keep = torch.empty_like(out).bernoulli_(0.9)
            out = self.drop(self.lin(out)) * keep + noise.normal_()
        return out


class ReadsValues(nn.Module):
    """Ops that read values: the assumption policy answers them, on every repetition."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(3):
            x = self.lin(x)
            if (x > 0).any():
                x = x + x[x > 0].sum()
            x = x + torch.nonzero(x).shape[0] + x.masked_select(x > 1).sum()
        return x


class GroupedAttention(nn.Module):
    """Grouped-query attention in fp32 (CUDA runs the math path: ~30 aten ops a call, replayed
    when called again on the same metadata), with what a replay must tell apart: a causal mask
    every other layer, a float mask, a bool mask, another sequence length, a contiguous and a
    transposed key, dropout in training."""

    def __init__(self, n: int = 8) -> None:
        super().__init__()
        self.qkv = nn.ModuleList(nn.Linear(16, 32) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        bias = torch.zeros(t, t)
        keep = torch.ones(t, t, dtype=torch.bool).tril()
        for i, proj in enumerate(self.qkv):
            qkv = proj(x if i % 3 else x[:, : t - 1])
            q = qkv[..., :16].unflatten(-1, (4, 4)).transpose(1, 2)
            k, v = (qkv[..., s : s + 8].unflatten(-1, (2, 4)).transpose(1, 2) for s in (16, 24))
            if i % 4 == 1:
                k = k.contiguous()
            mask = (None, bias, keep, None)[i % 4] if i % 3 else None
            y = F.scaled_dot_product_attention(
                q,
                k,
                v,
                attn_mask=mask,
                is_causal=mask is None and i % 2 == 0,
                dropout_p=0.1 if self.training else 0.0,
                enable_gqa=True,
            )
            x = x + y.transpose(1, 2).flatten(2).sum() if i % 3 else x
        return x


class TapedInPlace(nn.Module):
    """Taped functions whose outputs are not theirs to replay: an ``out=`` buffer, an in-place
    activation; beside the same calls made plainly."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        buf = torch.empty(4, 4)
        x = self.lin(x)
        for _ in range(3):
            torch.matmul(x.detach(), x.detach().t(), out=buf)  # out= takes no gradient
            y = F.relu(torch.matmul(x, x.t()))
            F.relu(y, inplace=True)
            x = x + buf.sum() + F.linear(y, x)
        return x


BROKEN: dict[str, tuple[Callable[[], nn.Module], dict[str, Any]]] = {
    "taped functions with out= and in place": (TapedInPlace, {"input_size": (4, 4)}),
    "grouped-query attention": (GroupedAttention, {"input_size": (2, 6, 16)}),
    "sliding every other layer": (Stack, {"input_size": (2, 10, 16)}),
    "shared weights, different shapes": (SharedShapes, {"input_size": (4, 8)}),
    "views, in-place, out=, scalars": (Aliasing, {"input_size": (4, 8)}),
    "random ops": (Random, {"input_size": (4, 8)}),
    "ops that read values": (ReadsValues, {"input_size": (4, 8)}),
    "fused encoder layers": (
        lambda: nn.TransformerEncoder(
            nn.TransformerEncoderLayer(16, 2, 32, batch_first=True), 3, enable_nested_tensor=False
        ),
        {"input_size": (2, 5, 16)},
    ),
}


@pytest.mark.parametrize("mode", ["inference", "training"])
@pytest.mark.parametrize("name", sorted(BROKEN))
def test_models_built_to_break_the_cache_record_the_same(name: str, mode: str) -> None:
    build, inputs = BROKEN[name]
    a = assert_same(build, mode=mode, **inputs)
    assert a.error is None, a.error
    stats = a.fast_path
    assert stats is not None and stats.ops == stats.hits + stats.misses + stats.replayed + sum(
        stats.bypassed.values()
    )


def test_attention_calls_on_the_same_metadata_are_replayed() -> None:
    """Inference: later attention calls on a key seen before are replayed (the records the same,
    as the test above shows); training runs each one (a backward needs its autograd graph)."""
    stats = mw.analyze(GroupedAttention(), input_size=(2, 6, 16)).fast_path
    assert stats is not None and stats.replayed >= 30, stats
    stats = mw.analyze(GroupedAttention(), input_size=(2, 6, 16), mode="training").fast_path
    assert stats is not None and stats.replayed == 0, stats


def test_bypass_reasons_are_counted() -> None:
    a = mw.analyze(Aliasing(), input_size=(4, 8))
    reasons = a.fast_path.bypassed  # type: ignore[union-attr]
    assert {"view", "out= or metadata-changing", "not meta"} <= set(reasons), reasons
    values = mw.analyze(ReadsValues(), input_size=(4, 8)).fast_path
    assert values is not None and values.bypassed["data-dependent"] >= 6, values
    # a model's second block of the same shapes skips every kernel (views aside): its linear
    # calls are replayed whole
    stack = mw.analyze(nn.Sequential(*(nn.Linear(8, 8) for _ in range(10))), input_size=(2, 8))
    assert stack.fast_path is not None and stack.fast_path.replayed >= 9, stack.fast_path
    assert 0 < stack.fast_path.hit_rate <= 1


def test_the_switch_is_validated() -> None:
    with pytest.raises(OptionTypeError, match="fast must be True"):
        mw.analyze(nn.Linear(2, 2), input_size=(1, 2), fast="yes")
    a = mw.analyze(nn.Linear(2, 2), input_size=(1, 2), fast=False)
    assert a.fast_path is None
    assert a.rerun(fast=True).fast_path is not None


def test_a_second_analysis_runs_no_kernel_the_first_ran() -> None:
    """The op cache is the process's: a re-analysis (the widget's switches, a sweep) misses
    nothing the first analysis ran, and records the same as a run without the cache."""
    build, kwargs = CORPUS["gpt2"]
    model = build()
    first = mw.analyze(model, **kwargs)
    again = mw.analyze(model, **kwargs)
    assert again.fast_path is not None and again.fast_path.misses == 0, again.fast_path
    assert again.fast_path.hits > 0
    slow = snapshot(mw.analyze(model, fast=False, **kwargs))
    assert snapshot(first) == slow
    assert snapshot(again) == slow


def test_cache_info_and_cache_clear_tell_and_empty_the_process_cache() -> None:
    """cache_info() counts what the analyses put in; cache_clear() empties it, and the next
    analysis runs its kernels again (misses), recording the same as before."""
    from meta_widget.trace.opcache import OpCache

    build, kwargs = CORPUS["gpt2"]
    model = build()
    OpCache.cache_clear()
    assert OpCache.cache_info().entries == 0 and OpCache.cache_info().bytes == 0
    first = mw.analyze(model, **kwargs)
    info = OpCache.cache_info()
    assert first.fast_path is not None
    assert info.entries == first.fast_path.misses > 0  # each miss is filled once
    assert info.bytes > 200 * info.entries
    OpCache.cache_clear()
    again = mw.analyze(model, **kwargs)
    assert again.fast_path is not None and again.fast_path.misses == first.fast_path.misses
    assert snapshot(again) == snapshot(first)


def test_the_op_cache_is_emptied_past_its_bytes_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    from meta_widget.trace.opcache import OpCache

    build, kwargs = CORPUS["gpt2"]
    OpCache.cache_clear()
    monkeypatch.setattr(OpCache, "max_bytes", 4_000)
    clears = OpCache.cache_info().clears
    a = mw.analyze(build(), **kwargs)
    info = OpCache.cache_info()
    assert info.clears > clears and info.bytes <= 4_000
    assert a.error is None


def test_fake_ops_rebuilt_from_the_cache_are_the_fake_modes_own() -> None:
    """Under ``parallel=`` the op cache rebuilds ops on fake tensors (``FakeOpCache``): views
    on their input's storage at its offset, new tensors of the running fake mode. A first run
    (filled) and a second (rebuilt) give what ``FakeTensorMode`` alone gives: type, shape,
    strides, offset, dtype, device, and the storage a view shares."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    from meta_widget.trace.opcache import FakeOpCache

    def ops(t: torch.Tensor) -> list[torch.Tensor]:
        return [t[1:3], t.t(), t.view(24), t.narrow(1, 2, 3), t * 2, *t.split(2), t.sum(0)]

    def seen(outs: list[torch.Tensor], base: torch.Tensor) -> list[tuple[Any, ...]]:
        key = base.untyped_storage()._cdata
        return [
            (type(o), o.shape, o.stride(), o.storage_offset(), o.dtype, o.device,
             o.untyped_storage()._cdata == key)
            for o in outs
        ]  # fmt: skip

    with FakeTensorMode():
        x = torch.empty(4, 6)
        truth = seen(ops(x), x)
        cache = FakeOpCache()
        with cache:
            first = seen(ops(x), x)
            again = seen(ops(x), x)
    assert all(t[0] is FakeTensor for t in truth)
    assert first == truth and again == truth
    assert cache.cache.stats.hits >= len(truth) - 1  # the second run was rebuilt


def test_fake_tensors_the_cache_makes_are_the_constructors_own(monkeypatch: Any) -> None:
    """The op cache makes its fake tensors without ``FakeTensor``'s constructor
    (``meta_widget.trace.fake_tensors.new_fake``): each has the attributes, dispatch keys,
    device and behaviour of one the constructor makes, for a CPU and a CUDA fake device, a
    fresh tensor and a view; under ``FakeTensorConfig.debug`` the constructor itself is used."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorConfig, FakeTensorMode

    from meta_widget.trace.fake_tensors import new_fake

    def meta(view: bool) -> torch.Tensor:
        with torch._C._DisableTorchDispatch():
            t = torch.empty_strided((4, 6), (6, 1), device="meta")
            return t[1:3] if view else t

    def seen(t: FakeTensor) -> tuple[Any, ...]:
        d = {k: v for k, v in vars(t).items() if k != "fake_mode"}
        with t.fake_mode:
            out = (t * 2).sum(0)
        try:  # a fake tensor has no data: its mode says whether asking for it raises
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                pointer: Any = t.data_ptr()
        except RuntimeError as e:
            pointer = str(e)
        keys = str(torch._C._dispatch_keys(t))
        return (type(t), d, t.fake_mode, keys, t.device, pointer, t.shape, t.stride(),
                t.storage_offset(), type(out), out.shape, out.device)  # fmt: skip

    strict = FakeTensorMode()
    strict._allow_unsafe_data_ptr_access = False
    for mode in (FakeTensorMode(), strict):
        for device in (torch.device("cpu"), torch.device("cuda", 0)):
            for view in (False, True):
                assert seen(new_fake(mode, meta(view), device)) == seen(
                    FakeTensor(mode, meta(view), device)
                )
    made: list[Any] = []
    monkeypatch.setattr(FakeTensorConfig, "debug", True)
    monkeypatch.setattr(FakeTensor, "__new__", lambda *a, **k: made.append(a) or object())
    new_fake(strict, meta(False), torch.device("cpu"))
    assert len(made) == 1


def test_a_tensor_autograd_saves_is_detached_as_the_op_detaches_it() -> None:
    """The pack hook's ``detached`` (past every mode): for a fake tensor (fresh, a view, one
    that requires grad, one with autograd history) and a plain meta tensor, what ``detach()``
    gives under the mode, but for the op's trip through it; a fake tensor holding a constant
    and a tensor of another kind are ``detach()``-ed as they are."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from meta_widget.trace.fake_tensors import detached

    def seen(t: torch.Tensor) -> tuple[Any, ...]:
        state = {k: v for k, v in vars(t).items()}
        return (type(t), state, str(torch._C._dispatch_keys(t)), t.device, t.shape, t.stride(),
                t.storage_offset(), t.untyped_storage()._cdata, t.dtype, t.requires_grad,
                t.grad_fn, t._is_view(), t.is_leaf)  # fmt: skip

    with FakeTensorMode() as mode:
        base = torch.empty(4, 6, dtype=torch.bfloat16)
        leaf = torch.empty(6, 3, requires_grad=True)
        made = [base, base[1:3].t(), leaf, leaf * 2]
        for t in made:
            mine = detached(t)
            assert mine.fake_mode is mode and seen(mine) == seen(t.detach())
        constant = torch.tensor(2.0)
        assert detached(constant).constant is not None  # the mode's own detach keeps it
    plain = torch.empty(5, 2, device="meta", requires_grad=True) * 3
    assert seen(detached(plain)) == seen(plain.detach())
