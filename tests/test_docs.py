"""The documentation site covers the public interface, and the README stays the front door.

The site itself is built with ``mkdocs build --strict`` by scripts/test.sh (a broken link or an
API entry that does not resolve fails it); these tests check what a build cannot see: a public
name with no entry in the API reference, or with no docstring.
"""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import griffe
import pytest
import yaml

import meta_widget

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
REFERENCE = DOCS / "reference"
#: ``::: meta_widget.NAME``: one mkdocstrings entry, by the public path
ENTRY = re.compile(r"^:::\s+meta_widget\.(\w+)\s*$", re.M)


def _entries() -> dict[str, list[str]]:
    """Each name documented in the API reference -> the pages that document it."""
    found: dict[str, list[str]] = {}
    for page in sorted(REFERENCE.glob("*.md")):
        for name in ENTRY.findall(page.read_text(encoding="utf-8")):
            found.setdefault(name, []).append(page.name)
    return found


def test_every_public_name_has_one_entry_in_the_api_reference() -> None:
    entries = _entries()
    public = set(meta_widget.__all__)
    missing = sorted(public - set(entries))
    assert not missing, f"add `::: meta_widget.NAME` to a page of docs/reference/ for {missing}"
    stale = sorted(set(entries) - public)
    assert not stale, f"docs/reference/ documents names not in meta_widget.__all__: {stale}"
    twice = {name: pages for name, pages in entries.items() if len(pages) > 1}
    assert not twice, f"documented on more than one page: {twice}"


def test_the_reference_uses_public_paths_only() -> None:
    # ``::: meta_widget.analysis.Analysis`` would break when the modules move
    for page in sorted(REFERENCE.glob("*.md")):
        for line in page.read_text(encoding="utf-8").splitlines():
            if line.startswith(":::"):
                assert ENTRY.match(line), f"{page.name}: {line!r} is not `::: meta_widget.NAME`"


@pytest.mark.parametrize("name", sorted(meta_widget.__all__))
def test_every_public_name_has_a_docstring(name: str) -> None:
    obj = getattr(meta_widget, name)
    doc = obj.__doc__  # not inspect.getdoc: a class would inherit its base's docstring
    assert doc is not None and doc.strip(), f"meta_widget.{name} has no docstring"


def test_no_public_name_is_a_submodules_name() -> None:
    # Python binds an imported submodule to the package's attribute of its name: mw.materialize
    # was the module meta_widget.materialize, not the function, once mw.analyze had loaded it
    package = ROOT / "meta_widget"
    submodules = {p.stem for p in package.glob("*.py")} | {
        p.parent.name for p in package.glob("*/__init__.py")
    }
    assert not sorted(submodules & set(meta_widget.__all__))
    code = "import meta_widget as mw; mw.analyze; print(callable(mw.materialize))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "True"


def _griffe_package() -> griffe.Module:
    sys.path.insert(0, str(DOCS / "hooks"))
    try:
        from griffe_public import PlainRoles
    finally:
        sys.path.remove(str(DOCS / "hooks"))
    return griffe.load(
        "meta_widget",
        search_paths=[str(ROOT)],
        docstring_parser="numpy",
        resolve_aliases=True,
        resolve_external=False,
        extensions=griffe.load_extensions(PlainRoles()),
    )


def test_the_reference_renders_each_name_as_what_it_is_at_run_time() -> None:
    # what mkdocstrings renders for `::: meta_widget.NAME`: the object itself (not a submodule
    # of the same name), with its own docstring
    package = _griffe_package()
    wrong = {}
    for name in meta_widget.__all__:
        obj = package[name]
        runtime = getattr(meta_widget, name)
        kind = "class" if isinstance(runtime, type) else "function"
        docstring = obj.docstring.value.strip() if obj.docstring else ""
        if obj.kind.value != kind or not docstring:
            wrong[name] = (obj.kind.value, len(docstring))
    assert not wrong, f"rendered as (kind, docstring length): {wrong}"


def test_every_tutorial_notebook_is_in_the_site() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    nav = yaml.safe_dump(config["nav"])
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        assert f"notebooks/{path.name}" in nav, f"add {path.name} to the Tutorials of mkdocs.yml"


def test_the_site_builds_offline_and_strict() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    assert config["theme"]["font"] is False  # material would fetch Google Fonts
    plugins = [p if isinstance(p, str) else next(iter(p)) for p in config["plugins"]]
    for needs_network in ("social", "privacy", "material/social", "material/privacy"):
        assert needs_network not in plugins
    jupyter = next(p for p in config["plugins"] if isinstance(p, dict) and "mkdocs-jupyter" in p)
    assert jupyter["mkdocs-jupyter"]["execute"] is False  # tests/test_notebooks.py runs them
    test_sh = (ROOT / "scripts" / "test.sh").read_text(encoding="utf-8")
    assert re.search(r"^[^#\n]*mkdocs build --strict", test_sh, re.M)


def test_the_readme_is_the_front_door() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 300
    for command in ("make demo", "make test"):
        assert f"`{command}`" in readme
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
    local = [t for t in targets if not re.match(r"[a-z]+://", t)]
    assert any(t.startswith("docs/") for t in local)
    for target in local:
        assert (ROOT / target).exists(), f"README.md links to {target}, which does not exist"
    image = re.search(r"!\[[^\]]*\]\(([^)]+\.png)\)", readme)
    assert image is not None, "README.md shows a picture of the widget"
    assert (ROOT / image.group(1)).stat().st_size < 300 * 1024


def _block_after(path: pathlib.Path, heading: str) -> str:
    """The first python block after the Markdown heading ``heading`` in ``path``."""
    text = path.read_text(encoding="utf-8")
    after = text[text.index(heading) :]
    start = after.index("```python\n") + len("```python\n")
    return after[start : after.index("\n```", start)]


def test_getting_started_runs_the_readme_snippet_that_is_checked() -> None:
    """docs/getting-started.md's "In 30 seconds" is the README's, line for line: the README's is
    run and its printed numbers checked (tests/test_widget_readme.py), so the page's numbers are
    the code's (issue 40: the page printed 70553706496 where the code gives 69503033344)."""
    readme = _block_after(ROOT / "README.md", "## In 30 seconds")
    page = _block_after(DOCS / "getting-started.md", "## In 30 seconds")
    assert page == readme
