"""The graph's tied-weight owner among same-shape tensors, and folded edge counts, against truth
written down from each model's own code.

- **Tie owner**: two embeddings of one shape and a head tied to one of them. The truth is
  identity (``model.head.weight is model.dec.weight``), which the graph's tied edge must name;
  the old rule took the first earlier module with a parameter of that shape and dtype.
- **Folded counts**: a stem whose output's two halves every one of four identical blocks reads
  (``h = block(h, s1, s2)``). From ``forward``, counted by hand: each block call reads two
  tensors of the stem's, so folding the blocks into one node must carry 8 tensors from the
  stem to it (the sum of the unfolded edges' counts, 2 each), not 1 or 5.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import meta_widget as mw


class TwoTables(nn.Module):
    """Two same-shape embeddings; the head shares the weight of the one ``tie`` names."""

    def __init__(self, tie: str) -> None:
        super().__init__()
        self.enc = nn.Embedding(50, 8)
        self.dec = nn.Embedding(50, 8)
        self.mid = nn.Linear(8, 8)
        self.head = nn.Linear(8, 50, bias=False)
        self.head.weight = getattr(self, tie).weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.mid(self.enc(ids) + self.dec(ids)))


def tied(g: mw.Graph) -> set[tuple[str, str]]:
    e = g.edges[g.edges.kind == "tied"]
    return set(zip(e.src, e.dst, strict=True))


@pytest.mark.parametrize("tie", ["enc", "dec"])
def test_the_tied_edge_names_the_module_whose_weight_it_is(tie: str) -> None:
    model = TwoTables(tie)
    owner = next(
        n
        for n, m in model.named_modules()
        if m is not model.head and getattr(m, "weight", None) is model.head.weight
    )
    assert owner == tie  # the truth: identity, from the model itself
    a = mw.analyze(model, input_data=torch.zeros(2, 3, dtype=torch.long))
    assert tied(a.graph(depth=1)) == {(tie, "head")}
    assert tied(a.graph(depth=1, fold=False)) == {(tie, "head")}
    assert a.total_params == sum(p.numel() for p in model.parameters())


def test_same_shape_untied_tables_make_no_tied_edge() -> None:
    model = TwoTables("enc")
    model.head.weight = nn.Parameter(torch.zeros(50, 8))  # untied again, same shape
    a = mw.analyze(model, input_data=torch.zeros(2, 3, dtype=torch.long))
    assert tied(a.graph(depth=1)) == set()


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, h: torch.Tensor, s1: torch.Tensor, s2: torch.Tensor) -> torch.Tensor:
        return self.lin(h) * s1 + s2


class SharedStem(nn.Module):
    """Every block reads the two halves of the stem's output (two tensors per call)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(8, 16)
        self.blocks = nn.ModuleList(Block() for _ in range(4))
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s1, s2 = self.stem(x).chunk(2, dim=-1)
        h = x
        for block in self.blocks:
            h = block(h, s1, s2)
        return self.head(h)


def counts(g: mw.Graph) -> dict[tuple[str, str], int]:
    e = g.edges[g.edges.kind == "data"]
    return dict(zip(zip(e.src, e.dst, strict=True), e["count"], strict=True))


def test_folded_edge_counts_are_the_tensors_carried() -> None:
    a = mw.analyze(SharedStem(), input_size=(2, 8))
    flat = counts(a.graph(depth=2, fold=False))
    # by hand from forward: each block call reads s1 and s2 (2 tensors from the stem), and
    # blocks.k (k > 0) the previous block's output; blocks.0 reads x
    assert flat[("<input>", "blocks.0")] == 1 and flat[("<input>", "stem")] == 1
    for k in range(4):
        assert flat[("stem", f"blocks.{k}")] == 2
    for k in (1, 2, 3):
        assert flat[(f"blocks.{k - 1}", f"blocks.{k}")] == 1
    assert flat[("blocks.3", "head")] == 1 and ("stem", "head") not in flat
    folded = counts(a.graph(depth=2))
    group = "blocks.0–3"
    assert folded[("stem", group)] == 8  # s1 and s2, read by each of the four block calls
    assert folded[("stem", group)] == sum(flat[("stem", f"blocks.{k}")] for k in range(4))
    assert folded[(group, "head")] == 1  # only the last block's output reaches the head
    assert folded[("<input>", group)] == 1 and folded[("<input>", "stem")] == 1
    assert (group, group) not in folded  # one block to the next: the repeat itself
    nodes = a.graph(depth=2).nodes.set_index("module")
    assert nodes.loc[group, "repeats"] == 4 and nodes.loc[group, "calls"] == 4
