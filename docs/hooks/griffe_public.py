"""A griffe extension: a public name of ``meta_widget`` is documented as what it is at run time.

``meta_widget/__init__.py`` re-exports some functions under the name of the submodule that
defines them (``from .explain import explain``; ``materialize`` loaded on first use). Python then
binds ``meta_widget.explain`` to the function, but griffe, which reads the source without running
it, keeps the submodule there, so ``::: meta_widget.explain`` would render the module. This
extension points every such name in ``__all__`` at the object of the same name inside the
submodule, so the API reference can use the public path whatever folder the code lives in.

The docstrings are numpy-style with Sphinx roles (``:func:`compare```); Markdown has no roles, so
they are shown as code.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:func|class|meth|attr|mod|data|exc|obj):`~?([^`]+)`")


def _plain_roles(obj: griffe.Object) -> None:
    if obj.docstring is not None:
        obj.docstring.value = ROLE.sub(r"``\1``", obj.docstring.value)
    for member in obj.members.values():
        if not member.is_alias:
            _plain_roles(member)  # type: ignore[arg-type]


class PublicNames(griffe.Extension):
    """Make each name of ``meta_widget.__all__`` that griffe sees as a submodule its namesake."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        if pkg.name != "meta_widget":
            return
        _plain_roles(pkg)
        for export in pkg.exports or ():
            name = str(export)
            member = pkg.members.get(name)
            if member is None or not member.is_module or name not in member.members:
                continue
            inner = member.members[name]
            pkg.del_member(name)
            pkg.set_member(name, griffe.Alias(name, target=inner, parent=pkg))
