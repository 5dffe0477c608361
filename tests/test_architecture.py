"""The package's shape, guarded: imports run one way (no cycles), only ``heavy.py`` imports
inside functions, and every error meta_widget raises on purpose derives from ``MetaWidgetError``
and is exported from ``meta_widget``.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import meta_widget
from meta_widget.errors import MetaWidgetError

PACKAGE = Path(meta_widget.__file__).parent
#: the one module allowed to import inside functions (pandas, plotly, IPython on first use)
LAZY = {"heavy"}


def _modules() -> dict[str, ast.Module]:
    """Every module of the package by dotted name (``checkpoints.view``; ``""`` the package)."""
    out = {}
    for f in sorted(PACKAGE.rglob("*.py")):
        parts = list(f.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = ast.parse(f.read_text(encoding="utf-8"))
    return out


def _runtime_imports(name: str, tree: ast.Module, names: set[str]) -> set[str]:
    """Package modules ``name`` imports at module level, outside ``if TYPE_CHECKING:``."""
    package = name.split(".") if name in names and _is_package(name) else name.split(".")[:-1]
    package = [p for p in package if p]
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level >= 1:
            base = package[: len(package) - (node.level - 1)]
            targets = (
                [".".join([*base, node.module])]
                if node.module
                else [".".join([*base, a.name]) for a in node.names]
            )
            found.update(t for t in targets if t in names)
    return found


def _is_package(name: str) -> bool:
    return (PACKAGE.joinpath(*name.split(".")) / "__init__.py").exists() if name else True


def _imports_in_functions(tree: ast.Module) -> list[str]:
    out = []
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    out.append(f"{fn.name}:{node.lineno}: {ast.unparse(node)}")
    return out


def test_imports_have_no_cycles() -> None:
    modules = _modules()
    names = set(modules)
    graph = {name: _runtime_imports(name, tree, names) for name, tree in modules.items()}
    # a package's __init__ importing its own modules is no cycle: it only re-exports them
    graph = {
        n: {d for d in deps if not d.startswith(f"{n}.") or n == ""} for n, deps in graph.items()
    }
    graph[""] = set()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[list[str]] = []

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for dep in sorted(graph.get(name, ())):
            if state.get(dep) == 1:
                cycles.append([*path[path.index(dep) :], dep])
            elif dep not in state:
                visit(dep, [*path, dep])
        state[name] = 2

    for name in graph:
        if name not in state:
            visit(name, [name])
    assert not cycles, f"import cycles: {cycles}"


def test_only_heavy_imports_inside_functions() -> None:
    found = {
        name: hits
        for name, tree in _modules().items()
        if name not in LAZY and (hits := _imports_in_functions(tree))
    }
    assert not found, f"imports inside functions (move them to the top, or to heavy.py): {found}"


def test_every_error_derives_from_the_base_and_is_exported() -> None:
    import importlib

    errors = []
    for name in _modules():
        module = importlib.import_module(f"meta_widget.{name}" if name else "meta_widget")
        for obj in vars(module).values():
            if (
                inspect.isclass(obj)
                and issubclass(obj, BaseException)
                and obj.__module__.startswith("meta_widget")
            ):
                errors.append(obj)
    assert errors
    for cls in set(errors):
        assert issubclass(cls, MetaWidgetError), cls
        assert getattr(meta_widget, cls.__name__) is cls, f"{cls.__name__} is not exported"
        assert cls.__name__ in meta_widget.__all__
