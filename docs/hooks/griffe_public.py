"""A griffe extension: Sphinx roles in ``meta_widget``'s docstrings shown as code.

The docstrings are numpy-style with Sphinx roles (``:func:`compare```); Markdown has no roles, so
they are shown as code.

(No public name of ``meta_widget`` is also the name of one of its submodules:
``tests/test_docs.py`` checks it. Python binds a submodule to its package's attribute of the same
name once it is imported, over a name loaded on first use, and griffe, which reads the source,
would render the module.)
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


class PlainRoles(griffe.Extension):
    """Show the Sphinx roles of ``meta_widget``'s docstrings as code."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        if pkg.name == "meta_widget":
            _plain_roles(pkg)
