"""Ctrl-C anywhere in ``analyze`` leaves nothing behind (issue 10.4).

Deterministic: an interrupt (``KeyboardInterrupt``) is injected at every step of the setup and
cleanup code, one run per step: every ``call``, ``line`` and ``return`` event of the functions
that change or restore state (meta_widget's and the torch functions they call), counted by a
``sys.settrace`` tracer that raises at the N-th event; N = 1, 2, ... until a run completes with
no injection. After every run, the state is compared with the state before: the gc switch, hooks
(per module and global), ``training`` flags, instance ``forward`` attributes, ``.grad`` and
``requires_grad``, grad mode, dispatch and function mode stacks, saved-tensors hooks, the default
device, and the trace's own registries. Then a soak: real interrupts (``_thread.interrupt_main``)
at random moments of whole analyses.

One interrupt cannot be handed on: one arriving as a weak reference's callback (the recorder's
note of a freed storage) starts, before its first line, is printed and dropped by Python itself
("Exception ignored in ... Recorder._free"); the analysis then completes, with nothing left.
"""

from __future__ import annotations

import _thread
import gc
import itertools
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from types import CodeType, FrameType
from typing import Any

import pytest
import torch
import torch.utils._python_dispatch as python_dispatch
from torch.nn.modules import module as torch_module

import meta_widget as mw
from meta_widget.trace import passes

_CHILD = "META_WIDGET_INTERRUPT_TEST_CHILD"


def _ran_in_own_process(request: pytest.FixtureRequest) -> bool:
    """Run the calling test in a process of its own; True in this (the parent) process, where
    the test then returns: the child ran it, and it passed.

    An interrupt raised from a trace function at every line of torch's checkpoint code leaves a
    stale ``sys.exc_info()`` in CPython's exception state (a handled
    ``torch.utils.checkpoint._StopRecomputationError``), which would leak into every later test
    of the session (``%tb`` then shows it). The child runs the test itself.
    """
    if os.environ.get(_CHILD):
        return False
    node = request.node.nodeid
    done = subprocess.run(
        [sys.executable, "-m", "pytest", node, "-q", "-p", "no:cacheprovider", "-x"],
        env={**os.environ, _CHILD: "1"},
        cwd=str(request.config.rootpath),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert " passed" in done.stdout, done.stdout[-3000:]
    return True


# (file suffix, function qualname prefix): the code whose every step gets an interrupt
_WATCHED = (
    ("meta_widget/trace/passes.py", ""),
    ("meta_widget/trace/trace_changes.py", ""),
    ("meta_widget/undo.py", ""),
    ("meta_widget/trace/checkpointing.py", ""),
    ("meta_widget/sources/models.py", "_from_factory"),
    ("meta_widget/trace/recorder.py", "Recorder.__init__"),
    ("meta_widget/trace/recorder.py", "Recorder.open"),
    ("meta_widget/trace/recorder.py", "Recorder.close"),
    ("meta_widget/trace/recorder.py", "Recorder._remove_hooks"),
    ("meta_widget/trace/callstack.py", "CallStack.__init__"),
    ("meta_widget/trace/storage.py", "StorageTracker.__init__"),
    ("meta_widget/trace/assume.py", "Assumptions.__init__"),
    ("meta_widget/trace/kernels.py", "AttentionKernels.__init__"),
    ("torch/overrides.py", "TorchFunctionMode."),
    ("torch/overrides.py", "_push_mode"),
    ("torch/overrides.py", "_pop_mode"),
    ("torch/utils/_python_dispatch.py", "TorchDispatchMode.__init__"),
    ("torch/utils/_python_dispatch.py", "TorchDispatchMode.__enter__"),
    ("torch/utils/_python_dispatch.py", "TorchDispatchMode._lazy_init"),
    ("torch/utils/_python_dispatch.py", "_push_mode"),
    ("torch/utils/_device.py", ""),
    ("torch/utils/hooks.py", "RemovableHandle."),
    ("torch/nn/modules/module.py", "Module.register_forward"),
    ("torch/nn/modules/module.py", "register_module_forward_hook"),
)
_watched: dict[tuple[int, CodeType], bool] = {}


def _is_watched(code: CodeType, watched: Sequence[tuple[str, str]] = _WATCHED) -> bool:
    known = _watched.get((id(watched), code))
    if known is None:
        file = code.co_filename.replace("\\", "/")
        known = _watched[id(watched), code] = any(
            file.endswith(suffix) and code.co_qualname.startswith(name) for suffix, name in watched
        )
    return known


class Injector:
    """Raises ``KeyboardInterrupt`` at the ``at``-th watched event (0: never; just counts)."""

    def __init__(self, at: int, watched: Sequence[tuple[str, str]] = _WATCHED) -> None:
        self.at = at
        self.watched = watched
        self.events = 0
        self.where = ""
        #: (file, qualname) of the code the interrupt was raised in
        self.code: tuple[str, str] = ("", "")

    def _local(self, frame: FrameType, event: str, arg: Any) -> Any:
        self.events += 1
        if self.events == self.at:
            self.where = f"{frame.f_code.co_qualname}:{frame.f_lineno} ({event})"
            self.code = (frame.f_code.co_filename.replace("\\", "/"), frame.f_code.co_qualname)
            raise KeyboardInterrupt(f"injected at {self.where}")
        return self._local

    def _global(self, frame: FrameType, event: str, arg: Any) -> Any:
        if not _is_watched(frame.f_code, self.watched):
            return None
        return self._local(frame, event, arg)

    def run(self, work: Callable[[], Any]) -> BaseException | None:
        """Run ``work`` under the injector; return the KeyboardInterrupt it raised, if any."""
        sys.settrace(self._global)
        try:
            work()
        except KeyboardInterrupt as exc:
            return exc
        finally:
            sys.settrace(None)
        return None


# -- the user's objects and the process state, as an independent record ---------------------


def _state(model: torch.nn.Module) -> dict[str, Any]:
    """Everything an analysis may change, read with torch's own accessors."""
    modules = {
        name: (
            m.training,
            dict(m._forward_hooks),
            dict(m._forward_pre_hooks),
            dict(m._forward_hooks_with_kwargs),
            dict(m._forward_hooks_always_called),
            dict(m._forward_pre_hooks_with_kwargs),
            "forward" in vars(m),
            vars(m).get("forward"),
            dict(m._backward_hooks),
        )
        for name, m in model.named_modules()
    }
    params = {
        name: (p, p.requires_grad, p.grad, p.is_meta)
        for name, p in model.named_parameters(remove_duplicate=False)
    }
    return {
        "gc enabled": gc.isenabled(),
        "grad enabled": torch.is_grad_enabled(),
        "default device": torch.get_default_device(),
        "function modes": torch.overrides._get_current_function_mode_stack(),
        "dispatch modes": python_dispatch._get_current_dispatch_mode_stack(),
        "dispatch flags": (
            python_dispatch._is_in_torch_dispatch_mode,
            python_dispatch._is_in_non_infra_torch_dispatch_mode,
            python_dispatch._is_in_any_mode_without_ignore_compile_internals,
        ),
        "saved tensors hooks": torch._C._autograd._top_saved_tensors_default_hooks(True),
        "global hooks": [
            dict(torch_module._global_forward_hooks),
            dict(torch_module._global_forward_pre_hooks),
            dict(torch_module._global_backward_hooks),
            dict(torch_module._global_backward_pre_hooks),
        ],
        "modules": modules,
        "parameters": params,
        "trace claims": dict(passes._claims),
        "gc pauses": set(passes._GcPause.holders),
        "profiler on": (
            torch._C._autograd._profiler_enabled(),
            torch.autograd.profiler._is_profiler_enabled,
        ),
    }


_MODULE_FIELDS = (
    "training",
    "forward hooks",
    "forward pre-hooks",
    "hooks with kwargs",
    "hooks always called",
    "pre-hooks with kwargs",
    "has an instance forward",
    "instance forward",
    "backward hooks",
)


def _diff(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    out = []
    for key, value in before.items():
        now = after[key]
        if key == "parameters":
            for name, (p, rg, grad, meta) in value.items():
                q, rg2, grad2, meta2 = now[name]
                if q is not p or rg2 != rg or grad2 is not grad or meta2 != meta:
                    out.append(f"parameter {name}: {(rg, grad, meta)} -> {(rg2, grad2, meta2)}")
        elif key == "modules":
            for name, fields in value.items():
                for field, was, now_ in zip(_MODULE_FIELDS, fields, now[name], strict=True):
                    if now_ != was:
                        out.append(f"module {name!r} {field}: {was} -> {now_}")
        elif key in ("function modes", "dispatch modes"):
            if [id(m) for m in now] != [id(m) for m in value]:
                out.append(f"{key}: {value} -> {now}")
        elif now != value:
            out.append(f"{key}: {value} -> {now}")
    return out


# -- the models ---------------------------------------------------------------------------


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)])
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x).relu()
        return self.head(x)


def user_meta_model() -> torch.nn.Module:
    """A user's own meta module with every kind of state an analysis touches (small: each of
    its modules multiplies the steps of hook setup and removal)."""
    with torch.device("meta"):
        net = Net()
    net.train()
    net.blocks[0].eval()  # mixed training flags
    net.head.weight.grad = torch.zeros_like(net.head.weight)  # a meta grad the user set
    net.blocks[0].bias.requires_grad_(False)
    net.head.register_forward_hook(lambda m, a, o: None)  # the user's hooks stay
    net.blocks[1].register_forward_pre_hook(lambda m, a: None)
    block = net.blocks[1]

    def wrapped(x: torch.Tensor) -> torch.Tensor:  # an instance forward the user set
        return torch.nn.Linear.forward(block, x)

    block.forward = wrapped  # type: ignore[method-assign]
    return net


def _training(net: torch.nn.Module) -> Callable[[], Any]:
    return lambda: mw.analyze(
        net, input_size=(2, 8), mode="training", optimizer="sgd", activation_checkpointing=True
    )


def _factory() -> Callable[[], Any]:
    return lambda: mw.analyze(Net, input_size=(2, 8), mode="training", optimizer="sgd")


#: watched code only building a model from a factory runs (not a trace of a built module)
_BUILDING = (("meta_widget/sources/models.py", "_from_factory"), ("torch/utils/_device.py", ""))


def _unreached(codes: set[tuple[str, str]], watched: Sequence[tuple[str, str]]) -> list[Any]:
    """The watched entries no interrupt landed in."""
    return [
        (suffix, name)
        for suffix, name in watched
        if not any(f.endswith(suffix) and q.startswith(name) for f, q in codes)
    ]


def _inject_everywhere(
    work: Callable[[], Any],
    model: torch.nn.Module,
    codes: set[tuple[str, str]] | None = None,
    watched: Sequence[tuple[str, str]] = _WATCHED,
) -> list[str]:
    """Inject an interrupt at every watched event of ``work``, one run each, until a run
    ends before its N-th event; return where each interrupt landed (and add the code each
    landed in to ``codes``)."""
    work()  # the first run of a process imports and caches: not a run like the others
    before = _state(model)
    sites = []
    for at in itertools.count(1):
        inj = Injector(at, watched)
        raised = inj.run(work)
        if not inj.where:  # fewer than `at` events: every step had its interrupt
            assert raised is None
            break
        assert raised is not None, f"the interrupt at {inj.where} was swallowed"
        left = _diff(before, _state(model))
        assert not left, f"interrupt at {inj.where} left: {left}"
        sites.append(inj.where)
        if codes is not None:
            codes.add(inj.code)
    return sites


def test_an_interrupt_at_every_step_of_a_training_analysis_leaves_nothing(
    request: pytest.FixtureRequest,
) -> None:
    if _ran_in_own_process(request):
        return
    net = user_meta_model()
    codes: set[tuple[str, str]] = set()
    sites = _inject_everywhere(_training(net), net, codes)
    # every watched piece of code got its interrupts
    assert _unreached(codes, [w for w in _WATCHED if w not in _BUILDING]) == []
    # the injections covered setup and cleanup of every kind of change
    for name in (
        "trace",
        "Undo.run",
        "Recorder.open",
        "Recorder._remove_hooks",
        "DispatchModes.restore",
        "FunctionModes.restore",
        "_GcPause.resume",
        "patch_forwards",
        "_keep_state",
        "_SavedTensorsHooks.restore",
        "Module.register_forward_hook",
        "TorchDispatchMode.__enter__",
        "RemovableHandle",
    ):
        assert any(s.startswith(name) for s in sites), name
    assert len(sites) > 1000


def test_an_interrupt_at_every_step_of_building_a_model_leaves_nothing(
    request: pytest.FixtureRequest,
) -> None:
    if _ran_in_own_process(request):
        return
    net = Net()  # only to read the global state; the analysis builds its own
    codes: set[tuple[str, str]] = set()
    sites = _inject_everywhere(_factory(), net, codes)
    assert _unreached(codes, _BUILDING) == []
    assert any(s.startswith("DeviceContext.__torch_function__") for s in sites)
    assert any(s.startswith("_DeviceState.restore") for s in sites)


#: the plain run ``mw.measure`` times its modules with: its own steps and grad mode's switches
_MEASURING = (
    ("meta_widget/explore/measure.py", "_wall_times"),
    ("meta_widget/undo.py", "set_grad_enabled"),
    ("meta_widget/undo.py", "Undo."),
    ("torch/autograd/grad_mode.py", ""),
    ("torch/nn/modules/module.py", "Module.register_forward"),
    ("meta_widget/explore/measure.py", "_measured_run"),
    ("torch/profiler/profiler.py", ""),
    ("torch/autograd/profiler.py", ""),
    ("meta_widget/materialization.py", "_initialize"),
    ("meta_widget/undo.py", "without_grad"),
    ("meta_widget/undo.py", "undoing"),
)


@pytest.mark.parametrize(
    ("given", "own_sites"),
    [
        ("module", ()),  # the user's module, run as it is
        ("class", ("without_grad",)),  # built for real, initialized without grad
    ],
    ids=["module", "class"],
)
def test_an_interrupt_at_every_step_of_measures_plain_run_leaves_nothing(
    request: pytest.FixtureRequest, given: str, own_sites: tuple[str, ...]
) -> None:
    """Grad mode included: ``with torch.no_grad():`` here once left gradients off for the
    session when an interrupt landed inside its ``__enter__`` (a CI run's random soak). The two
    ways to give the model, each its own test: every run of the injection repeats the steps
    before its interrupt, so one test of both took four times as long as each."""
    if _ran_in_own_process(request):
        return
    torch.manual_seed(0)
    net = Net()
    model = net if given == "module" else Net

    def work() -> None:
        mw.measure(model, input_size=(4, 8))

    sites = _inject_everywhere(work, net, None, _MEASURING)
    for name in ("_wall_times", "set_grad_enabled", "profile._start_trace", *own_sites):
        assert any(s.startswith(name) for s in sites), name


def test_the_interrupt_reaches_the_caller(request: pytest.FixtureRequest) -> None:
    """Not swallowed into ``Analysis.error``: a KeyboardInterrupt is no error of the model."""
    if _ran_in_own_process(request):
        return
    net = user_meta_model()

    class Stop(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise KeyboardInterrupt

    net.head = Stop()
    before = _state(net)
    with pytest.raises(KeyboardInterrupt):
        _training(net)()
    assert not _diff(before, _state(net))


def _soak(
    runs: int,
    seed: int,
    net: torch.nn.Module | None = None,
    work: Callable[[], Any] | None = None,
    inside_at_least: int = 0,
) -> tuple[int, int]:
    """``runs`` runs of ``work`` (default: a training analysis of ``user_meta_model()``), each
    interrupted by a real SIGINT-like interrupt at a random moment; ``net`` is the user's model
    whose state must be left as it was. Then more runs, up to ``4 * runs`` in all, until
    ``inside_at_least`` were interrupted inside: the moments are picked from the work's time
    measured before, and a machine that gets faster after (other work ending) sends more of
    them past the end; the count of states reached, not the clock, ends the soak.

    Returns how many were interrupted inside the analysis, and how many interrupts Python
    dropped itself (one landing as a weak reference's callback starts, before any of its code
    runs, is printed and dropped by Python: reported to ``sys.unraisablehook``).
    """
    if net is None or work is None:
        net = user_meta_model()
        work = _training(net)
    before = _state(net)
    work()
    # only picks the moments, never waited on: the fastest of three runs, so that a busy moment
    # while measuring does not send later interrupts past the end of the work
    durations = []
    for _ in range(3):
        begin = time.perf_counter()
        work()
        durations.append(time.perf_counter() - begin)
    duration = min(durations)
    rng = random.Random(seed)
    inside = dropped = 0
    unraisable: list[Any] = []
    hook, sys.unraisablehook = sys.unraisablehook, unraisable.append
    # a command started in the background by a non-interactive shell (nohup ... &) ignores
    # SIGINT, and then interrupt_main() does nothing: Ctrl-C's own handler, for this test
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        done = 0
        while done < runs or (inside < inside_at_least and done < 4 * runs):
            done += 1
            fired = threading.Event()

            def fire(fired: threading.Event = fired) -> None:
                _thread.interrupt_main()
                fired.set()

            timer = threading.Timer(rng.uniform(0, duration * 1.1), fire)
            result = None
            reached = False
            try:
                timer.start()
                result = work()
                fired.wait()  # pending now: raised at the next check of the loop below
                for _ in range(1000):
                    pass
            except KeyboardInterrupt:
                reached = True
                inside += result is None
            timer.join()
            if not reached:  # never raised: it must have been dropped by Python, not by us
                assert result is not None and getattr(result, "error", None) is None
                assert unraisable and issubclass(unraisable[-1].exc_type, KeyboardInterrupt)
                dropped += 1
                unraisable.clear()
            left = _diff(before, _state(net))
            assert not left, f"a random interrupt left: {left}"
    finally:
        sys.unraisablehook = hook
        signal.signal(signal.SIGINT, handler)
    return inside, dropped


def test_random_interrupts_leave_nothing(request: pytest.FixtureRequest) -> None:
    if _ran_in_own_process(request):
        return
    inside, dropped = _soak(300, seed=2, inside_at_least=101)
    assert inside > 100
    # each dropped one is Python's own, checked in _soak (an interrupt landing as a weak
    # reference's callback starts: printed as "Exception ignored in ... _free", the run's result
    # whole, nothing left): how many land there depends on the machine's timing (30 of 300 in
    # a loaded CI run, 2026-12-04), so the bound is on their share, not a count
    assert dropped <= inside // 3


def _tiny_llama_config() -> Any:
    transformers = pytest.importorskip("transformers")
    return transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )


def test_random_interrupts_during_generate_leave_nothing(request: pytest.FixtureRequest) -> None:
    """``mode="generate"`` on the user's own meta model, 64 new tokens (most decode steps
    given by the per-step rule, ``trace.decode_skip``, with the model's forward stubbed)."""
    if _ran_in_own_process(request):
        return
    transformers = pytest.importorskip("transformers")
    with torch.device("meta"):
        net = transformers.LlamaForCausalLM(_tiny_llama_config())
    state = {k: v for k, v in vars(net).items() if not k.startswith("_")}

    def work() -> Any:
        return mw.analyze(net, input_size=(1, 8), mode="generate", new_tokens=64)

    inside, _ = _soak(120, seed=3, net=net, work=work, inside_at_least=41)
    assert inside > 40
    assert {k: v for k, v in vars(net).items() if not k.startswith("_")} == state
    assert type(net).forward is transformers.LlamaForCausalLM.forward  # the stub is gone


def test_random_interrupts_during_measure_leave_nothing(request: pytest.FixtureRequest) -> None:
    """``mw.measure`` runs the user's real model under the recorder: interrupted anywhere, its
    hooks, flags and weights are as they were."""
    if _ran_in_own_process(request):
        return
    torch.manual_seed(0)
    net = Net()
    weights = {k: v.clone() for k, v in net.state_dict().items()}

    def work() -> Any:
        return mw.measure(net, input_size=(4, 8))

    inside, _ = _soak(120, seed=4, net=net, work=work, inside_at_least=41)
    assert inside > 40
    assert all(torch.equal(v, weights[k]) for k, v in net.state_dict().items())
