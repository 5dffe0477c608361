"""A model the user already wrapped with FSDP2 / tensor parallelism, traced as it stands.

:class:`AsWrapped` is the world of such a trace (``parallel.trace_rank`` runs it as it runs
``parallel=``'s :class:`~meta_widget.distributed.parallel.World`): it copies the plain meta
stand-in of
``meta_widget.distributed.wrapping`` onto fake tensors, gives it the same ``DTensor`` parameters on
the
user's own device meshes and makes the user's ``fully_shard`` calls again on it, so the trace
runs PyTorch's FSDP2 exactly as the user's wrapping would run it on that rank, on the user's own
process group, which it leaves as it was.

To trace, the process group must be the fake one (backend ``"fake"``: its collectives move no
data). Under a real one (``nccl``, ``gloo``) the trace's collectives would reach the network and
wait for ranks that never join, so meta_widget refuses to trace
(:class:`~meta_widget.distributed.parallel.ParallelError`, saying what to do instead); a structural
analysis
(no inputs) runs no collective and is made.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.tensor._random as dtensor_random
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor
from torch.utils._pytree import tree_map_only

from ..options import Parallel
from ..trace.recorder import Recorder
from ..undo import Undo
from .comms import CommRecord, CommWatcher
from .fake_copies import fake_like, on_fake
from .parallel import ParallelError, World
from .wrapping import Wrapping, param_groups

__all__ = ["AsWrapped", "world_for"]


def _check_fake(wrapping: Wrapping) -> None:
    """Refuse to trace where a collective would run for real, or where the group is gone."""
    real = sorted({b for _, _, b in wrapping.backends.values() if b != "fake"})
    if real:
        raise ParallelError(
            f"the model is wrapped under a real process group (backend {real[0]!r}, world size "
            f"{wrapping.world_size}): tracing it would run its collectives on the network, "
            "waiting for ranks that never join, so meta_widget will not. Analyze it in a "
            'process under the fake process group (dist.init_process_group("fake", '
            "store=FakeStore(), rank=r, world_size=n), FakeStore from "
            "torch.testing._internal.distributed.fake_pg), or analyze the unwrapped model "
            'with parallel={"fsdp": N, "tp": M} in a process without a group.'
        )
    if not dist.is_initialized() or dist.get_backend() != "fake":
        raise ParallelError(
            "the fake process group the model was wrapped under is gone (destroy_process_"
            "group ran since, or another group replaced it): analyze the model while the "
            "group it was wrapped under exists."
        )


class AsWrapped:
    """The world of one trace of a user's wrapping, with
    :class:`~meta_widget.distributed.parallel.World`'s
    interface (``prepare``, ``tracing``, ``attach``, ``comms``, ``device``): it runs on the
    user's own (fake) process group and device meshes, and leaves them as they were."""

    def __init__(self, wrapping: Wrapping) -> None:
        self.wrapping = wrapping
        self.device = wrapping.device
        self.fake = FakeTensorMode()
        self.watcher: CommWatcher | None = None
        self._rng: Any = None

    def __enter__(self) -> AsWrapped:
        _check_fake(self.wrapping)
        groups = {name: (dim, size) for name, (dim, size, _) in self.wrapping.backends.items()}
        self.watcher = CommWatcher(groups)
        # DTensor's random ops make a global RNG tracker the first time: the user's to keep
        self._rng = dtensor_random._rng_tracker
        return self

    def __exit__(self, *exc: Any) -> None:
        dtensor_random._rng_tracker = self._rng

    def tracing(self) -> FakeTensorMode:
        """The mode the trace runs under (fake tensors on the meshes' device)."""
        return self.fake

    def prepare(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[nn.Module, tuple[Any, ...], dict[str, Any]]:
        """A copy of the stand-in ``module`` on fake tensors, wrapped as the user's model is,
        and the inputs on fake tensors of the same device."""
        copied = copy.deepcopy(module)
        with self.fake:
            on_fake(copied, self.device)
            memo: dict[int, torch.Tensor] = {}
            args, kwargs = tree_map_only(
                torch.Tensor, lambda t: fake_like(t, memo, self.device), (args, kwargs)
            )
            locals_ = {
                path: torch.empty(spec.local, dtype=_param(copied, path).dtype, device=self.device)
                for path, spec in self.wrapping.dtensors.items()
            }
        self._distribute(copied, locals_)
        self._shard(copied)
        return copied, args, kwargs

    def _distribute(self, copied: nn.Module, locals_: dict[str, torch.Tensor]) -> None:
        """The tensor-parallel parameters: DTensors on the user's meshes (ties kept)."""
        made: dict[int, nn.Parameter] = {}
        for path, spec in self.wrapping.dtensors.items():
            owner, name = _owner(copied, path)
            old = owner._parameters[name]
            assert old is not None
            new = made.get(id(old))
            if new is None:
                dt = DTensor.from_local(
                    locals_[path],
                    spec.mesh,
                    spec.placements,
                    run_check=False,
                    shape=torch.Size(spec.shape),
                    stride=old.stride(),
                )
                new = made[id(old)] = nn.Parameter(dt, requires_grad=old.requires_grad)
            owner._parameters[name] = new

    def _shard(self, copied: nn.Module) -> None:
        """The user's ``fully_shard`` calls, in order, then the settings made after them."""
        modules = {p: m for p, m in copied.named_modules(remove_duplicate=False)}
        for call in self.wrapping.calls:
            targets = [modules[p] for p in call.modules]
            placed = {id(_param(copied, p)): pl for p, pl in call.placements.items()}
            fully_shard(
                targets if len(targets) > 1 else targets[0],
                mesh=call.mesh,
                reshard_after_forward=call.reshard_after_forward,
                shard_placement_fn=(lambda p, placed=placed: placed.get(id(p))) if placed else None,
                mp_policy=call.mp_policy,
                offload_policy=call.offload_policy,
            )
            first = targets[0]
            assert isinstance(first, FSDPModule)
            for group in param_groups(first._get_fsdp_state()):
                for key, value in call.settings.items():
                    setattr(group, key, value)
        for call in self.wrapping.calls:
            first = modules[call.modules[0]]
            assert isinstance(first, FSDPModule)
            if call.forward_prefetch:
                first.set_modules_to_forward_prefetch(
                    [modules[p] for p in call.forward_prefetch]  # type: ignore[misc]
                )
            if call.backward_prefetch:
                first.set_modules_to_backward_prefetch(
                    [modules[p] for p in call.backward_prefetch]  # type: ignore[misc]
                )

    def attach(self, recorder: Recorder, undo: Undo) -> None:
        """Give ``recorder`` what a parallel trace adds (see ``passes.trace``'s ``attach``)."""
        assert self.watcher is not None, "attach() runs inside `with AsWrapped(...)`"
        self.watcher.attach(recorder, undo)

    @property
    def comms(self) -> list[CommRecord]:
        """The collectives of the trace, in order."""
        return self.watcher.records if self.watcher is not None else []


def _owner(root: nn.Module, path: str) -> tuple[nn.Module, str]:
    prefix, _, name = path.rpartition(".")
    return root.get_submodule(prefix), name


def _param(root: nn.Module, path: str) -> torch.Tensor:
    owner, name = _owner(root, path)
    p = owner._parameters[name]
    assert p is not None
    return p


def world_for(plan: Parallel | None, wrapping: Wrapping | None) -> World | AsWrapped:
    """The world of a parallel trace: the user's own wrapping, or ``plan``'s fake world."""
    if wrapping is None:
        assert plan is not None, "a parallel trace needs parallel= or a wrapped model"
        return World(plan)
    if plan is not None:
        raise ParallelError(
            "the model is already wrapped (FSDP2 / tensor parallelism), and parallel= would wrap "
            "it again: leave parallel= out to trace your own wrapping as it stands, or pass the "
            "unwrapped model with parallel=..."
        )
    return AsWrapped(wrapping)
