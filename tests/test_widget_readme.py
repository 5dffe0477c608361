"""The README's "In 30 seconds" snippet, run as written: each ``print(...)  # comment`` prints
what its comment says (issue 28: the comment had 70553706496 / 613338509737984, the snippet gives
69503033344 / 604731395276800: the config has no ``architectures``, so the base model is built),
and the parameter count is the model's own, built by transformers on the meta device."""

from __future__ import annotations

import contextlib
import io
import pathlib
import re

import torch
import transformers

ROOT = pathlib.Path(__file__).resolve().parents[1]
#: what a notebook shows but a script need not run (the widget, a DataFrame's display)
NOTEBOOK_ONLY = re.compile(r"^(a|a\.to_dataframe\(\))\s*(#.*)?$")


def snippet(title: str) -> str:
    """The first python block after the README heading ``title``."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    after = text[text.index(f"## {title}") :]
    start = after.index("```python\n") + len("```python\n")
    return after[start : after.index("\n```", start)]


def _complete(code: str) -> bool:
    import codeop

    try:
        return codeop.compile_command(code, symbol="exec") is not None
    except SyntaxError:
        return False


def test_in_30_seconds_prints_what_its_comments_say() -> None:
    code = snippet("In 30 seconds")
    namespace: dict[str, object] = {}
    checked = 0
    pending = ""  # a statement over several lines, until it compiles
    for line in code.splitlines():
        if NOTEBOOK_ONLY.match(line.strip()):
            continue
        statement, _, comment = line.partition("  #")
        if pending or not _complete(statement):
            pending += line + "\n"
            if _complete(pending):
                exec(pending, namespace)
                pending = ""
            continue
        if statement.startswith("print(") and comment.strip():
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                exec(statement, namespace)
            printed = out.getvalue().split()
            said = comment.split()
            if re.fullmatch(r"[\d\s.]+", comment.strip()):  # numbers: every one of them
                assert printed == said, (statement, printed, said)
                checked += 1
        else:
            exec(line, namespace)
    assert checked >= 1
    a = namespace["a"]
    config = namespace["config"]
    with torch.device("meta"):
        model = transformers.LlamaModel(config)  # type: ignore[arg-type]
    assert a.total_params == sum(p.numel() for p in model.parameters())  # type: ignore[attr-defined]
