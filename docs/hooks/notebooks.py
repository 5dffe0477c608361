"""An MkDocs hook: the tutorials in ``notebooks/`` become pages of the site, at ``notebooks/``.

The notebooks stay where the test suite runs them (``tests/test_notebooks.py``); this adds each
one to the site's files before mkdocs-jupyter turns ``.ipynb`` files into pages. They are saved
without outputs and are not executed at build time.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]


@event_priority(100)  # before mkdocs-jupyter's on_files (default priority 0) looks for notebooks
def on_files(files: Files, config: MkDocsConfig) -> Files:
    # a file of the repository root (src_uri "notebooks/NAME.ipynb"), not a generated one:
    # mkdocs-jupyter's page wrapper reads a file's path through its src_dir
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        uri = path.relative_to(ROOT).as_posix()
        files.append(File(uri, str(ROOT), config.site_dir, config.use_directory_urls))
    return files
