"""``Graph.to_dot()`` of models whose module and class names are built to break out of DOT.

A module named ``a\\"]; evil [URL=<javascript:alert(1)>, label=<pwn>]; //`` once injected a node
with a ``javascript:`` link into the SVG ``dot`` renders, and a class name ending in ``\\`` broke
the file. The truth here is a DOT lexer written from Graphviz's grammar
(https://graphviz.org/doc/info/lang.html; its scanner, ``lib/cgraph/scan.l``, reads ``\\"`` and
``\\\\`` inside a quoted string as pairs) and a parser of the statements ``to_dot`` writes: the
file must parse as exactly one node statement per node and one edge statement per edge, each
name one quoted string that reads back as the module's own name, and no attribute but those
``to_dot`` writes (no ``URL``, ``href``).
"""

from __future__ import annotations

import re

import torch
from torch import nn

import meta_widget as mw

EVIL = 'a\\"]; evil [URL=<javascript:alert(1)>, label=<pwn>]; //'
#: the attributes to_dot writes; anything else came from a name
ALLOWED = {"label", "style", "shape", "fontname", "rankdir"}

_TOKEN = re.compile(
    r'\s+|//[^\n]*|"(?:\\.|[^"\\])*"|->|[{}\[\];,=]|[A-Za-z_\u0080-\uffff][\w\u0080-\uffff]*'
    r"|-?(?:\.\d+|\d+(?:\.\d*)?)",
    re.S,
)


def tokens(dot: str) -> list[str]:
    """DOT's tokens (spaces and comments dropped); an unlexable character fails the test."""
    out, at = [], 0
    while at < len(dot):
        m = _TOKEN.match(dot, at)
        assert m is not None, f"not DOT at {at}: {dot[at : at + 40]!r}"
        at = m.end()
        if not m.group().isspace() and not m.group().startswith("//"):
            out.append(m.group())
    return out


def unquote(token: str) -> str:
    """A quoted DOT string's text: the lexer's pairs (``\\"``, ``\\\\``) as they read."""
    assert token.startswith('"') and token.endswith('"'), token
    return re.sub(r"\\(.)", lambda m: m.group(1), token[1:-1], flags=re.S)


def label_text(token: str) -> str:
    """A quoted label as Graphviz shows it (escString): ``\\n`` a line break, ``\\\\`` one
    backslash."""
    body = token[1:-1]
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), body, flags=re.S)


def shown(text: str) -> str:
    """A name as the file shows it: characters that are not printable (a line break) spelled
    out as ``\\uNNNN``, so that every statement stays on one line."""
    return "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in text)


def statements(dot: str) -> list[tuple[list[str], dict[str, str]]]:
    """The statements inside ``digraph model { ... }``: (node ids, attributes) each."""
    toks = tokens(dot)
    assert toks[:3] == ["digraph", "model", "{"] and toks[-1] == "}", toks[:4]
    body, out, k = toks[3:-1], [], 0
    while k < len(body):
        ids: list[str] = []
        if body[k] in ("node", "rankdir"):  # the header lines
            ids.append(body[k])
            k += 1
            if body[k] == "=":
                out.append((ids, {"rankdir": body[k + 1]}))
                k += 3
                continue
        else:
            ids.append(body[k])
            k += 1
            while body[k] == "->":
                ids.append(body[k + 1])
                k += 2
        attrs: dict[str, str] = {}
        assert body[k] == "[", body[k : k + 4]
        k += 1
        while body[k] != "]":
            key, eq, value = body[k : k + 3]
            assert eq == "=", body[k : k + 3]
            attrs[key] = value
            k += 3
            if body[k] == ",":
                k += 1
        assert body[k + 1] == ";", body[k : k + 2]
        out.append((ids, attrs))
        k += 2
    return out


class Backslash(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


Backslash.__name__ = Backslash.__qualname__ = "Ends\\"


class Hostile(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.add_module(EVIL, nn.Linear(4, 4))
        self.add_module("line\nbreak \\N", Backslash())
        self.tail = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = getattr(self, EVIL)(x)
        return self.tail(getattr(self, "line\nbreak \\N")(h))


def test_names_built_to_inject_stay_quoted_text() -> None:
    g = mw.analyze(Hostile(), input_size=(2, 4)).graph(depth=1)
    assert EVIL in set(g.nodes.module)
    dot = g.to_dot()
    parsed = statements(dot)
    nodes = [(ids, a) for ids, a in parsed if len(ids) == 1 and ids[0] not in ("node", "rankdir")]
    edges = [(ids, a) for ids, a in parsed if len(ids) == 2]
    assert len(nodes) == len(g.nodes) and len(edges) == len(g.edges)
    assert len(parsed) == len(nodes) + len(edges) + 2  # rankdir and node defaults
    for _, attrs in parsed:
        assert set(attrs) <= ALLOWED, attrs
    assert "URL" not in tokens(dot) and "href" not in tokens(dot)
    # each node is one quoted string that reads back as its module's name, labelled by its
    # name and its type as Graphviz shows them
    types = dict(zip(g.nodes.module, g.nodes.type, strict=True))
    assert [unquote(ids[0]) for ids, _ in nodes] == [shown(m) for m in g.nodes.module]
    for (_, attrs), module in zip(nodes, g.nodes.module, strict=True):
        assert label_text(attrs["label"]) == f"{shown(module)}\n{shown(types[module])}"
    assert types["line\nbreak \\N"] == "Ends\\"
    want = set(zip(g.edges.src, g.edges.dst, strict=True))
    assert {(unquote(a), unquote(b)) for (a, b), _ in edges} == {
        (shown(a), shown(b)) for a, b in want
    }
    assert (EVIL, "line\nbreak \\N") in want
    assert "\n" not in "".join(t for t in tokens(dot) if t.startswith('"'))  # one line each


def test_a_plain_graph_reads_as_before() -> None:
    class Two(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.left = nn.Linear(8, 8)
            self.head = nn.Linear(8, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.left(x) + x)

    dot = mw.analyze(Two(), input_size=(2, 8)).graph().to_dot()
    # head(left(x) + x): the add of the stream x and its branch left(x) is a node
    assert '"<input>" -> "<residual>" [label="2×8", style=bold];' in dot
    assert '"left" -> "<residual>" [label="2×8"];' in dot
    assert '"<residual>" -> "head" [label="2×8"];' in dot
    assert '"<residual>" [label="<residual>\\nresidual add", shape=ellipse];' in dot
    assert '"head" [label="head\\nLinear"];' in dot
