"""The package's shape, guarded.

- **Layers.** The package reads in the order data flows (DESIGN.md); every import points to its
  own layer or one below: module-level imports, ``if TYPE_CHECKING:`` imports, and lazy loads
  (an import inside a function, ``importlib.import_module`` of a package module, the public
  names ``meta_widget/__init__.py`` loads on first use).
- **No cycles**, lazy loads included: a module that imports another on first use depends on it
  as much as one that imports it at the top.
- **heavy.py loads third-party libraries only**; every other import inside a function is a lazy
  load of the package's own modules, down the layers.
- Every error meta_widget raises on purpose derives from ``MetaWidgetError`` and is exported.
- No source file over 600 lines: the package, tests, benchmarks and the front end.
"""

from __future__ import annotations

import ast
import inspect
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import meta_widget
from meta_widget.errors import MetaWidgetError

PACKAGE = Path(meta_widget.__file__).parent

#: the layers, bottom first: a module belongs to the first layer one of whose names is the
#: module or a package above it ("" is the package's ``__init__``)
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "base: errors, units, fixed sets, registries, undo, third-party loading",
        ("errors", "units", "choices", "registry", "undo", "heavy", "warm"),
    ),
    ("the checked options", ("options",)),
    ("plain data: the module tree, records, tensor summaries", ("data",)),
    ("sources: user objects and inputs to meta", ("sources",)),
    ("the trace", ("trace",)),
    ("the memory model", ("memory",)),
    ("the time model", ("timing",)),
    ("past one device", ("distributed",)),
    ("the result of an analysis, as plain data", ("result",)),
    ("views", ("views",)),
    ("checkpoints: reading, and a checkpoint's views", ("checkpoints",)),
    ("the pipeline: check, build, trace, assemble", ("pipeline", "materialization")),
    ("the Analysis and analyze()", ("analysis",)),
    ("exploration over many analyses", ("explore",)),
    ("entry points", ("magics", "cli", "warmstart", "")),
]


def layer_of(module: str) -> int:
    for index, (_, names) in enumerate(LAYERS):
        for name in names:
            if module == name or (name and module.startswith(f"{name}.")):
                return index
    raise AssertionError(f"meta_widget.{module} is in no layer: add it to LAYERS")


@dataclass
class Imports:
    """The package modules one module imports, by kind."""

    runtime: set[str] = field(default_factory=set)
    typing: set[str] = field(default_factory=set)
    lazy: set[str] = field(default_factory=set)
    #: imports inside functions that are not of the package (only heavy.py may have them)
    foreign_in_functions: list[str] = field(default_factory=list)


def modules(root: Path = PACKAGE) -> dict[str, tuple[Path, ast.Module]]:
    """Every module of the package by dotted name (``checkpoints.reading``; ``""`` the package)."""
    out = {}
    for f in sorted(root.rglob("*.py")):
        parts = list(f.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = (f, ast.parse(f.read_text(encoding="utf-8")))
    return out


def _targets(node: ast.ImportFrom, package: list[str], names: set[str]) -> set[str]:
    base = package[: len(package) - (node.level - 1)]
    if node.module:
        module = ".".join([*base, node.module])
        # ``from .trace import passes``: the module trace.passes, else the package trace
        candidates = [
            f"{module}.{a.name}" if f"{module}.{a.name}" in names else module for a in node.names
        ]
    else:
        candidates = [".".join([*base, a.name]) for a in node.names]
        candidates = [c if c in names else ".".join(base) for c in candidates]
    return {c for c in candidates if c in names}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _absolute(module_name: str, names: set[str]) -> str | None:
    """``meta_widget.x.y`` -> ``x.y`` when that is a package module."""
    if module_name == "meta_widget":
        return ""
    if module_name.startswith("meta_widget."):
        rest = module_name[len("meta_widget.") :]
        return rest if rest in names else None
    return None


def imports_of(name: str, path: Path, tree: ast.Module, names: set[str]) -> Imports:
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    package = [p for p in package if p]
    found = Imports()
    for node in tree.body:  # module level, TYPE_CHECKING blocks apart
        if isinstance(node, ast.ImportFrom) and node.level >= 1:
            found.runtime |= _targets(node, package, names)
        elif isinstance(node, ast.If) and _is_type_checking(node):
            for sub in ast.walk(node):
                if isinstance(sub, ast.ImportFrom) and sub.level >= 1:
                    found.typing |= _targets(sub, package, names)
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.ImportFrom) and node.level >= 1:
                found.lazy |= _targets(node, package, names)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                found.foreign_in_functions.append(f"{fn.name}:{node.lineno}: {ast.unparse(node)}")
    for node in ast.walk(tree):  # importlib.import_module("meta_widget.x") / (".x", __name__)
        if (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            target = _absolute(node.args[0].value, names)
            if target is not None:
                found.lazy.add(target)
    return found


def _where_table(tree: ast.Module, names: set[str]) -> set[str]:
    """The modules ``meta_widget/__init__.py``'s ``_WHERE`` loads public names from."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "_WHERE" for t in node.targets
        ):
            table = ast.literal_eval(node.value)
            missing = sorted(set(table.values()) - names)
            assert not missing, f"_WHERE names modules that do not exist: {missing}"
            return set(table.values())
    raise AssertionError("meta_widget/__init__.py has no _WHERE table")


def graph(root: Path = PACKAGE) -> dict[str, Imports]:
    found = modules(root)
    names = set(found)
    out = {name: imports_of(name, path, tree, names) for name, (path, tree) in found.items()}
    out[""].lazy |= _where_table(found[""][1], names)
    for name, imports in out.items():  # a package's __init__ re-exporting its modules: no cycle
        for kind in (imports.runtime, imports.lazy):
            kind -= {d for d in kind if name and d.startswith(f"{name}.")}
            kind.discard(name)
    return out


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    found: list[list[str]] = []

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for dep in sorted(edges.get(name, ())):
            if state.get(dep) == 1:
                found.append([*path[path.index(dep) :], dep])
            elif dep not in state:
                visit(dep, [*path, dep])
        state[name] = 2

    for name in sorted(edges):
        if name not in state:
            visit(name, [name])
    return found


def upward(imports: dict[str, Imports]) -> list[str]:
    """Every import, of any kind, that points to a higher layer."""
    bad = []
    for name, found in imports.items():
        for kind, targets in (
            ("imports", found.runtime),
            ("imports for typing", found.typing),
            ("loads lazily", found.lazy),
        ):
            for target in sorted(targets):
                if layer_of(target) > layer_of(name):
                    bad.append(
                        f"meta_widget.{name or '__init__'} ({LAYERS[layer_of(name)][0]}) {kind} "
                        f"meta_widget.{target} ({LAYERS[layer_of(target)][0]})"
                    )
    return bad


def check(root: Path = PACKAGE) -> list[str]:
    """Every rule broken in the package at ``root``, as sentences."""
    imports = graph(root)
    problems = upward(imports)
    edges = {name: found.runtime | found.lazy for name, found in imports.items()}
    problems += [f"import cycle: {' -> '.join(c)}" for c in cycles(edges)]
    problems += [f"heavy.py loads a package module: {t}" for t in sorted(imports["heavy"].runtime)]
    problems += [
        f"heavy.py loads a package module lazily: {t}" for t in sorted(imports["heavy"].lazy)
    ]
    for name, found in imports.items():
        if name != "heavy" and found.foreign_in_functions:
            problems.append(
                f"meta_widget.{name} imports a library inside a function (go through heavy.py): "
                f"{found.foreign_in_functions}"
            )
    return problems


def test_the_package_keeps_its_layers_and_has_no_cycles() -> None:
    assert check() == []


def copied_package(where: Path) -> Path:
    """A copy of the package's sources in ``where``, to plant a fault in."""
    copy = where / "meta_widget"
    for f in PACKAGE.rglob("*.py"):
        dest = copy / f.relative_to(PACKAGE)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(f.read_text(encoding="utf-8"), encoding="utf-8")
    return copy


def test_the_check_fails_on_a_cycle_through_a_lazy_load(tmp_path: Path) -> None:
    """A planted lazy load from the bottom layer back up to the trace: an upward import and a
    cycle (trace.passes imports errors at the top)."""
    copy = copied_package(tmp_path)
    errors = copy / "errors.py"
    errors.write_text(
        errors.read_text(encoding="utf-8")
        + "\n\ndef _planted() -> None:\n    from .trace import passes  # noqa: F401\n",
        encoding="utf-8",
    )
    problems = check(copy)
    assert any(
        "errors (base" in p and "loads lazily meta_widget.trace.passes" in p for p in problems
    )
    assert any(
        p.startswith("import cycle:") and "errors" in p and "trace.passes" in p for p in problems
    )


def test_the_check_fails_on_a_package_module_loaded_by_heavy(tmp_path: Path) -> None:
    copy = copied_package(tmp_path)
    heavy = copy / "heavy.py"
    heavy.write_text(
        heavy.read_text(encoding="utf-8")
        + "\n\ndef analysis():\n    from . import analysis as module\n\n    return module\n",
        encoding="utf-8",
    )
    assert any("heavy.py loads a package module lazily: analysis" in p for p in check(copy))


ROOT = PACKAGE.parent
#: every source file of the project: the package, its tests and benchmarks, the front end
SOURCES = sorted(
    [
        *PACKAGE.rglob("*.py"),
        *(ROOT / "tests").rglob("*.py"),
        *(ROOT / "benchmarks").glob("*.py"),
        *(ROOT / "js").glob("*.ts"),
    ]
)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_source_file_is_over_600_lines(path: Path) -> None:
    lines = path.read_text(encoding="utf-8").count("\n")
    assert lines <= 600, f"{path.relative_to(ROOT)} has {lines} lines: split it by concern"


def test_every_error_derives_from_the_base_and_is_exported() -> None:
    import importlib

    errors = []
    for name in modules():
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
