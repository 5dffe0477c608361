"""A world's device sub-meshes, made once each instead of once per parameter.

FSDP2 (torch 2.13, ``_fsdp_param.FSDPParam``) slices its mesh (``mesh["fsdp"]``, the shard
mesh of an HSDP mesh) and, under tensor parallelism, joins its mesh to the parameter's
(``DeviceMesh._concatenate([dp_mesh, tp_mesh])``) for every parameter it shards: each a new
``DeviceMesh`` that recomputes its layout and ranks from the whole mesh. Every spec then holds
its own mesh object, and a mesh compares by value: its ranks, one number per rank of the whole
world. On the 405B's mesh of 16,384 ranks that made the meshes and compared them: 17 % of a
default plan's time (``benchmarks/results/llama3_405b.md``).

:func:`same_submeshes` answers a slice or a join asked again of the same mesh objects with the
mesh it made the first time, as a value that compares equal to what PyTorch would make again
(the same ranks, layout, names and process groups), and the same object: the comparisons that
follow stop at identity. It is on while a parallel trace's world exists (``World.__enter__``)
or a plan keeps one for its next trace (``decisions.keep_world``); :func:`own_submeshes` puts
PyTorch's own methods back and drops what was kept (``World.__exit__``, ``decisions.drop_world``,
on every path).
"""

from __future__ import annotations

from typing import Any

from torch.distributed.device_mesh import DeviceMesh

__all__ = ["own_submeshes", "same_submeshes"]

#: PyTorch's own methods, as the class holds them (``_concatenate`` a static method)
_OWN = {name: vars(DeviceMesh)[name] for name in ("__getitem__", "_concatenate")}
_SLICE = DeviceMesh.__getitem__
_JOIN = DeviceMesh._concatenate
#: what was made, by the ids of the meshes it was made of, with those meshes (kept alive, so
#: that no id is reused while its entry stands)
_made: dict[Any, tuple[Any, DeviceMesh]] = {}


def _slice(self: DeviceMesh, mesh_dim_names: str | tuple[str, ...]) -> DeviceMesh:
    if not isinstance(mesh_dim_names, (str, tuple)):  # PyTorch's answer (or error) as it is
        return _SLICE(self, mesh_dim_names)  # type: ignore[no-any-return]
    key = ("slice", id(self), mesh_dim_names)
    found = _made.get(key)
    if found is None:
        found = _made[key] = (self, _SLICE(self, mesh_dim_names))
    return found[1]


def _join(device_mesh_list: list[DeviceMesh]) -> DeviceMesh:
    meshes = tuple(device_mesh_list)
    key = ("join", *(id(m) for m in meshes))
    found = _made.get(key)
    if found is None:
        found = _made[key] = (meshes, _JOIN(list(meshes)))
    return found[1]


def same_submeshes() -> None:
    """From now on a mesh's slice or join is made once (``World.__enter__``)."""
    _made.clear()
    DeviceMesh.__getitem__ = _slice  # type: ignore[method-assign]
    DeviceMesh._concatenate = staticmethod(_join)  # type: ignore[method-assign,assignment]


def own_submeshes() -> None:
    """PyTorch's own slicing and joining again, nothing kept (``World.__exit__``)."""
    for name, value in _OWN.items():
        setattr(DeviceMesh, name, value)
    _made.clear()
