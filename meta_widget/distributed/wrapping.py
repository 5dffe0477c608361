"""A model the user already wrapped with FSDP2 / tensor parallelism: its wrapping, read.

The planning flow of PyTorch's FSDP2 docs builds the model on ``meta``, wraps it with
``fully_shard`` (each block, then the root) and/or ``parallelize_module`` under a process group
(a fake one, ``dist.init_process_group("fake", ...)``, to plan without a cluster), and never
materializes it. ``mw.analyze(model, ...)`` traces rank ``dist.get_rank()`` of *that* wrapping
(``meta_widget.distributed.wrapped``), with per-rank memory and ``a.comms`` as ``parallel=`` gives
them.

Here, without touching the user's objects: :func:`read_wrapping` reads the wrapping (each
``fully_shard`` call: its modules, mesh, ``reshard_after_forward``, ``mp_policy``,
``offload_policy``, shard placements and the settings made after it; the ``DTensor`` placements
tensor parallelism gave each parameter), and :func:`unwrapped_meta` builds a plain meta stand-in
of the model (the original classes, full-size meta parameters, the user's and tensor
parallelism's hooks, none of FSDP2's) to make that wrapping again on. No tensor data is read or
copied (a stand-in has a shape, never bytes); the user's module, its parameters, FSDP2 state,
hooks and the process group are only read.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, OffloadPolicy
from torch.distributed.fsdp._fully_shard._fsdp_collectives import (
    DefaultAllGather,
    DefaultReduceScatter,
)
from torch.distributed.tensor import DTensor, Placement, Shard
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from ..data.walk import modules
from ..sources.models import MetaModel, SourceError, copied_data, reachable, stand_ins
from .parallel import ParallelError

__all__ = [
    "DTensorSpec",
    "ShardCall",
    "Wrapping",
    "is_wrapped",
    "param_groups",
    "read_wrapping",
    "unwrapped_meta",
]

#: FSDPParamGroup settings the ``FSDPModule.set_...`` methods change after ``fully_shard``
#: (read from the user's groups, written on the stand-in's; those a PyTorch lacks are skipped)
GROUP_SETTINGS = (
    "reduce_grads",
    "all_reduce_grads",
    "reshard_after_backward",
    "unshard_in_backward",
    "reduce_scatter_unused_params",
    "reduce_scatter_max_input_buffers",
    "gradient_divide_factor",
    "force_sum_reduction_for_comms",
)
#: what FSDP2 leaves in a wrapped module's ``__dict__`` (besides its hooks), not copied
_FSDP_ATTRIBUTES = ("_is_fsdp_managed_module", "_fsdp_use_orig_params")
_STATE_KEY_PREFIX = "__composable_api_state_key"
_HOOK_DICTS = (
    "_forward_pre_hooks",
    "_forward_hooks",
    "_backward_pre_hooks",
    "_backward_hooks",
    "_state_dict_pre_hooks",
    "_state_dict_hooks",
    "_load_state_dict_pre_hooks",
    "_load_state_dict_post_hooks",
)


@dataclass(frozen=True)
class ShardCall:
    """One ``fully_shard`` call of the user's, as made again on the stand-in.

    ``modules``: the paths of the modules it wrapped (several for ``fully_shard([a, b])``);
    ``placements``: FSDP2's placement of each parameter (by path) not sharded on dim 0;
    ``settings``: :data:`GROUP_SETTINGS` values; ``forward_prefetch``/``backward_prefetch``:
    the module paths ``set_modules_to_*_prefetch`` named.
    """

    modules: tuple[str, ...]
    mesh: DeviceMesh | None
    reshard_after_forward: bool | int | None
    mp_policy: MixedPrecisionPolicy
    offload_policy: OffloadPolicy
    placements: dict[str, Placement] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    forward_prefetch: tuple[str, ...] = ()
    backward_prefetch: tuple[str, ...] = ()


@dataclass(frozen=True)
class DTensorSpec:
    """A parameter as tensor parallelism left it (before ``fully_shard``): a DTensor of
    ``shape`` on ``mesh`` with ``placements``, whose local tensor on this rank is ``local``."""

    mesh: DeviceMesh
    placements: tuple[Placement, ...]
    shape: tuple[int, ...]
    local: tuple[int, ...]


@dataclass(frozen=True)
class Wrapping:
    """The user's wrapping, read by :func:`read_wrapping`: ``calls`` in an order that wraps
    every module after the modules inside it; ``dtensors`` the tensor-parallel parameters by
    path; ``backends`` process-group names -> (mesh dimension, size, backend)."""

    rank: int
    world_size: int
    device: str
    calls: tuple[ShardCall, ...]
    dtensors: dict[str, DTensorSpec]
    backends: dict[str, tuple[str, int, str]]

    def note(self) -> str:
        """One line for the analysis notes: what was traced."""
        what = []
        if self.calls:
            what.append(f"fully_shard on {len(self.calls)} module(s)")
        if self.dtensors:
            what.append(f"{len(self.dtensors)} tensor-parallel parameter(s)")
        return (
            f"Traced rank {self.rank} of {self.world_size} of the model's own wrapping "
            f"({', '.join(what)}), on its own fake process group."
        )


# ---------------------------------------------------------------------------------------------
# reading the wrapping


def is_wrapped(module: nn.Module) -> bool:
    """True when ``module`` (or one inside it) is an FSDP2 module or has a DTensor parameter."""
    for m in modules(module):  # one walk: this runs before every analysis once DTensor loads
        if isinstance(m, FSDPModule):
            return True
        for p in m._parameters.values():
            if isinstance(p, DTensor):
                return True
    return False


def read_wrapping(module: nn.Module) -> Wrapping:
    """The wrapping of ``module`` (only read). Raises :class:`ParallelError` where the process
    group is gone or real, or the wrapping uses what meta_widget does not reproduce."""
    paths = {id(m): p for p, m in module.named_modules(remove_duplicate=False)}
    calls: list[ShardCall] = []
    dtensors: dict[str, DTensorSpec] = {}
    managed: set[str] = set()
    meshes: list[tuple[DeviceMesh, str]] = []
    seen: set[int] = set()
    for path, m in reversed(list(module.named_modules())):  # inner modules first
        state = m._get_fsdp_state() if isinstance(m, FSDPModule) else None
        if state is None or id(state) in seen:
            continue
        seen.add(id(state))
        call = _read_call(state, paths, path, dtensors, managed)
        calls.append(call)
        if call.mesh is not None:
            meshes.append((call.mesh, "fsdp"))
    for name, p in module.named_parameters():
        if name not in managed and isinstance(p, DTensor):
            local = p.to_local()
            dtensors[name] = DTensorSpec(
                p.device_mesh, tuple(p.placements), tuple(p.shape), tuple(local.shape)
            )
    meshes.extend((s.mesh, "tp") for s in dtensors.values())
    if not meshes:
        raise ParallelError(
            f"{type(module).__name__} is wrapped by fully_shard but holds no sharded parameter: "
            "there is nothing per rank to trace. Analyze it without the wrapping."
        )
    calls = [_with_mesh(c, meshes[0][0]) for c in calls]
    groups = _groups(module, meshes)
    device = meshes[0][0].device_type
    return Wrapping(dist.get_rank(), dist.get_world_size(), device, tuple(calls), dtensors, groups)


def _read_call(
    state: Any,
    paths: dict[int, str],
    where: str,
    dtensors: dict[str, DTensorSpec],
    managed: set[str],
) -> ShardCall:
    """One ``fully_shard`` call from its FSDP2 state; its parameters' pre-FSDP2 DTensors (tensor
    parallelism) go into ``dtensors`` and their paths into ``managed``."""
    groups = param_groups(state)
    label = where or "the root module"
    if len(groups) > 1:
        _not_reproduced(label, "parameters on several meshes (shard_placement_fn)")
    group = groups[0] if groups else None
    mesh = None
    reshard: bool | int | None = None
    placements: dict[str, Placement] = {}
    settings: dict[str, Any] = {}
    offload = OffloadPolicy()
    if group is not None:
        info = group.mesh_info
        if getattr(info, "dp_mesh_dims", None) is not None or not hasattr(info, "shard_mesh_size"):
            _not_reproduced(label, "dp_mesh_dims / replicate-only (DDP-style) meshes")
        if not isinstance(group._all_gather_comm, DefaultAllGather) or not isinstance(
            group._reduce_scatter_comm, DefaultReduceScatter
        ):
            _not_reproduced(label, "custom all-gather or reduce-scatter communication")
        mesh = info.mesh
        offload = group.offload_policy
        if not state._auto_reshard_after_forward:
            after = group.post_forward_mesh_info
            reshard = (
                False
                if after is None
                else True
                if after.shard_mesh_size == info.shard_mesh_size
                else int(after.shard_mesh_size)
            )
        settings = {k: getattr(group, k) for k in GROUP_SETTINGS if hasattr(group, k)}
        for fp in group.fsdp_params:
            owner = fp._module_info
            name = _join(paths[id(owner.module)], owner.param_name)
            managed.add(name)
            if fp.fsdp_placement != Shard(0):
                placements[name] = fp.fsdp_placement
            spec = getattr(fp, "_unsharded_dtensor_spec", None) or getattr(fp, "_tp_spec", None)
            if spec is not None:
                shape = tuple(spec.shape)
                local, _ = compute_local_shape_and_global_offset(
                    spec.shape, spec.mesh, spec.placements
                )
                dtensors[name] = DTensorSpec(spec.mesh, tuple(spec.placements), shape, local)
    return ShardCall(
        modules=tuple(paths[id(m)] for m in state._modules),
        mesh=mesh,
        reshard_after_forward=reshard,
        mp_policy=state._mp_policy,
        offload_policy=offload,
        placements=placements,
        settings=settings,
        forward_prefetch=_prefetch(state._states_to_forward_prefetch, paths),
        backward_prefetch=_prefetch(state._states_to_backward_prefetch, paths),
    )


def param_groups(state: Any) -> list[Any]:
    """An FSDP2 state's parameter groups (a list in torch 2.13, one or None in older ones)."""
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is not None:
        return list(groups)
    group = state._fsdp_param_group
    return [group] if group is not None else []


def _prefetch(states: list[Any], paths: dict[int, str]) -> tuple[str, ...]:
    return tuple(paths[id(s._modules[0])] for s in states)


def _with_mesh(call: ShardCall, mesh: DeviceMesh) -> ShardCall:
    """A call without parameters (a root holding none) gets any mesh of the wrapping: it
    shards nothing, and ``fully_shard`` without one would make a mesh of its own."""
    if call.mesh is not None:
        return call
    return replace(call, mesh=mesh)


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _not_reproduced(where: str, what: str) -> None:
    raise ParallelError(
        f"the FSDP2 wrapping of {where} uses {what}, which meta_widget does not reproduce. "
        "Analyze the unwrapped model with parallel=... (e.g. parallel={'fsdp': 8}), or wrap "
        "it with plain fully_shard(module, mesh=..., reshard_after_forward=..., mp_policy=...)."
    )


def _groups(module: nn.Module, meshes: list[tuple[DeviceMesh, str]]) -> dict[str, Any]:
    """The process groups the wrapping runs on: name -> (mesh dimension, size, backend)."""
    if not (dist.is_available() and dist.is_initialized()):
        raise ParallelError(
            f"{type(module).__name__} is wrapped (FSDP2 / tensor parallelism) but no process "
            "group exists any more (destroy_process_group ran): its wrapping cannot run. "
            "Analyze it before destroying the group, or the unwrapped model with parallel=..."
        )
    groups: dict[str, Any] = {}
    for mesh, kind in meshes:
        names = mesh.mesh_dim_names or (kind,) * mesh.ndim
        for dim in range(mesh.ndim):
            group = mesh.get_group(dim)
            backend = str(dist.get_backend(group))
            groups[str(group.group_name)] = (str(names[dim]), int(mesh.size(dim)), backend)
    return groups


# ---------------------------------------------------------------------------------------------
# the meta stand-in


def unwrapped_meta(module: nn.Module) -> MetaModel:
    """The source of a wrapped module: a plain meta stand-in (the original classes, full-size
    meta parameters of the original dtypes, every hook but FSDP2's) and the wrapping to make
    again at trace time. Reads the user's module only; copies no tensor data."""
    wrapping = read_wrapping(module)
    memo: dict[int, Any] = {}
    shells = {}
    for m in module.modules():
        cls: Any = _original_class(m)
        shells[id(m)] = memo[id(m)] = cls.__new__(cls)
    for _, p in module.named_parameters(remove_duplicate=False):
        if id(p) not in memo:
            full = torch.empty(p.shape, dtype=p.dtype, device="meta")
            memo[id(p)] = nn.Parameter(full, requires_grad=p.requires_grad)
    states = {id(m): _own_state(m) for m in module.modules()}
    # as sources.meta_copy: stand-ins for real tensors and storages, other data shared as it is
    # (the parameters have theirs already: full-size, not this rank's shards)
    found = reachable(list(states.values()))
    found.tensors = [(path, t) for path, t in found.tensors if id(t) not in memo]
    memo.update(stand_ins(found, {}))
    originals = set(memo)
    for m in module.modules():
        shells[id(m)].__dict__.update(copy.deepcopy(states[id(m)], memo))
    root = shells[id(module)]
    # real data the search could not see was copied: refuse it
    real = copied_data(root, originals)
    if real is not None:
        raise SourceError(
            f"meta_widget would have copied the data of a real tensor of "
            f"{type(module).__name__} (at {real}): it is held where the search for tensors "
            "cannot look. Build the model on meta (with torch.device('meta'): ...) before "
            "wrapping it, or analyze the unwrapped model with parallel=..."
        )
    meta = MetaModel(root, "wrapped module", owned=True, wrapping=wrapping)
    meta.notes.append(wrapping.note())
    return meta


def _original_class(m: nn.Module) -> type:
    """The class ``fully_shard`` replaced by its ``FSDP<class>`` subclass, or the class."""
    cls = type(m)
    if isinstance(m, FSDPModule):
        return next(c for c in cls.__mro__[1:] if not issubclass(c, FSDPModule))
    return cls


def _own_state(m: nn.Module) -> dict[str, Any]:
    """``m.__dict__`` without FSDP2's state and hooks (a shallow copy; nothing is changed)."""
    state = {
        k: v
        for k, v in m.__dict__.items()
        if not k.startswith(_STATE_KEY_PREFIX) and k not in _FSDP_ATTRIBUTES
    }
    for name in _HOOK_DICTS:
        hooks = state.get(name)
        if hooks:
            state[name] = type(hooks)((k, h) for k, h in hooks.items() if not _is_fsdp(h))
    return state


def _is_fsdp(hook: Callable[..., Any]) -> bool:
    """A hook FSDP2 registered (a method of its state or param group, or a function of its)."""
    owner = getattr(hook, "__self__", None)
    where = type(owner).__module__ if owner is not None else getattr(hook, "__module__", "")
    return str(where).startswith("torch.distributed.fsdp")
