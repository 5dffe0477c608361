"""``Analysis.graph``: edges from tensor identity, against the data flow each model is written with.

Each model's expected edges come from its own ``forward`` (which module reads which module's
output), the fold counts from its config (``num_hidden_layers``), never from the graph code.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import meta_widget as mw
from meta_widget import heavy
from tests.models import Reused, llama_config
from tests.test_assumptions import mixtral_config


def pairs(g: mw.Graph, kind: str = "data") -> set[tuple[str, str]]:
    e = g.edges[g.edges.kind == kind]
    return set(zip(e.src, e.dst, strict=True))


class Fork(nn.Module):
    """stem -> two branches -> a head that reads their sum."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(8, 8)
        self.left = nn.Linear(8, 8)
        self.right = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        return self.head(self.left(h) + self.right(h))


def test_fork_edges_are_exactly_the_branches() -> None:
    g = mw.analyze(Fork(), input_size=(2, 8)).graph(depth=1)
    assert pairs(g) == {
        ("<input>", "stem"),
        ("stem", "left"),
        ("stem", "right"),
        ("left", "head"),
        ("right", "head"),
        ("head", "<output>"),
    }
    joined = g.edges[g.edges.dst == "head"]
    assert all(ops == ("add",) for ops in joined.ops)
    assert list(joined["shape"]) == [(2, 8), (2, 8)]
    assert list(joined.bytes) == [2 * 8 * 4] * 2
    assert set(g.nodes.module) == {"<input>", "stem", "left", "right", "head", "<output>"}


def test_deeper_depth_opens_the_branch() -> None:
    g = mw.analyze(Fork(), input_size=(2, 8)).graph(depth=2)
    assert {("stem", "right.0"), ("right.0", "right.1"), ("right.1", "head")} <= pairs(g)
    assert "right" not in set(g.nodes.module)


class ResBlock(nn.Module):
    """conv -> relu -> conv, plus the block's input, then relu: a ResNet basic block."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(4, 4, 3, padding=1)
        self.conv2 = nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.conv2(self.conv1(x).relu()) + x).relu()


def test_resnet_block_skip_is_a_residual_node() -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 1), ResBlock(), ResBlock(), nn.Conv2d(4, 2, 1))
    a = mw.analyze(model, input_size=(1, 3, 8, 8))
    g = a.graph(depth=2, fold=False)
    edges = g.edges.set_index(["src", "dst"])
    # each block's conv2(...) + x is a node: the stream x and the branch conv2 meet there
    assert edges.loc[("0", "1.<residual>")]["kind"] == "residual"
    assert edges.loc[("1.conv2", "1.<residual>")]["kind"] == "data"
    # the stream runs from one block's add to the next's through the relu, and on to the head
    assert edges.loc[("1.<residual>", "2.<residual>")]["ops"] == ("relu",)
    assert edges.loc[("1.<residual>", "2.<residual>")]["kind"] == "residual"
    assert edges.loc[("1.<residual>", "2.conv1")]["ops"] == ("relu",)
    assert edges.loc[("2.<residual>", "3")]["ops"] == ("relu",)
    assert ("0", "3") not in edges.index and ("0", "2.conv1") not in edges.index
    folded = a.graph(depth=2).nodes.set_index("module")  # the two blocks fold, their adds too
    assert folded.loc["1–2.conv1", "repeats"] == 2
    assert folded.loc["1–2.<residual>", "repeats"] == 2
    assert folded.loc["1–2.<residual>", "kind"] == "residual"
    block = [m.path for m in a.modules].index("1")
    assert folded.loc["1–2.<residual>", "row"] == block  # the module whose body adds


def _block(cin: int, cout: int) -> nn.Module:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU())


class UNet(nn.Module):
    """Two levels down, two up; each decoder block reads the encoder block of its level."""

    def __init__(self) -> None:
        super().__init__()
        self.enc1, self.enc2, self.mid = _block(3, 8), _block(8, 16), _block(16, 16)
        self.up2 = nn.ConvTranspose2d(16, 16, 2, stride=2)
        self.dec2 = _block(32, 8)
        self.up1 = nn.ConvTranspose2d(8, 8, 2, stride=2)
        self.dec1 = _block(16, 8)
        self.out = nn.Conv2d(8, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e1 = self.enc1(x)
        e2 = self.enc2(F.max_pool2d(e1, 2))
        m = self.mid(F.max_pool2d(e2, 2))
        d2 = self.dec2(torch.cat([self.up2(m), e2], 1))
        d1 = self.dec1(torch.cat([self.up1(d2), e1], 1))
        return self.out(d1)


def test_unet_skip_edges() -> None:
    g = mw.analyze(UNet(), input_size=(1, 3, 32, 32)).graph()
    edges = g.edges.set_index(["src", "dst"])
    for enc, dec, channels, side in (("enc1", "dec1", 16, 32), ("enc2", "dec2", 32, 16)):
        skip = edges.loc[(enc, dec)]
        assert skip["ops"] == ("cat",)
        assert skip["shape"] == (1, channels, side, side)  # what the decoder reads: the cat
    (pool,) = edges.loc[("enc1", "enc2")]["ops"]
    assert pool.startswith("max_pool2d")  # aten's max_pool2d_with_indices
    assert ("enc1", "dec2") not in edges.index and ("mid", "dec2") not in edges.index


def test_mixtral_router_and_expert_edges() -> None:
    config = mixtral_config()
    g = mw.analyze(config, input_size=(1, 10)).graph(depth=5)
    moe = "model.layers.0–1.mlp"
    p = pairs(g)
    assert (f"{moe}.gate", f"{moe}.experts") in p  # the router's choice reaches the experts
    assert ("model.layers.0–1.post_attention_layernorm", f"{moe}.gate") in p
    assert ("model.layers.0–1.post_attention_layernorm", f"{moe}.experts") in p
    routed = g.edges.set_index(["src", "dst"]).loc[(f"{moe}.gate", f"{moe}.experts")]
    assert routed["shape"] == (10, config.num_experts_per_tok)  # top-k per token


class HandMoE(nn.Module):
    """A router whose top choice masks each expert's tokens, the experts' sum to a head."""

    def __init__(self, experts: int = 4) -> None:
        super().__init__()
        self.stem = nn.Linear(8, 8)
        self.router = nn.Linear(8, experts)
        self.experts = nn.ModuleList(nn.Linear(8, 8) for _ in range(experts))
        self.head = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        top = self.router(h).argmax(-1, keepdim=True)
        out = torch.zeros_like(h)
        for i, expert in enumerate(self.experts):
            out = out + expert(h * (top == i))
        return self.head(out)


def test_hand_moe_router_feeds_every_expert() -> None:
    a = mw.analyze(HandMoE(), input_size=(4, 8))
    flat = pairs(a.graph(fold=False))
    for i in range(4):
        assert ("router", f"experts.{i}") in flat
        assert ("stem", f"experts.{i}") in flat
        assert (f"experts.{i}", "head") in flat
    folded = a.graph()
    assert {("router", "experts.0–3"), ("experts.0–3", "head")} <= pairs(folded)
    assert folded.nodes.set_index("module").loc["experts.0–3", "repeats"] == 4


@pytest.fixture(scope="module")
def llama12() -> Any:
    config = llama_config()
    config.num_hidden_layers = 12
    config.tie_word_embeddings = True
    return config, mw.analyze(config, input_size=(1, 16))


def test_decoder_layers_fold_into_one_group(llama12: Any) -> None:
    config, a = llama12
    layers = config.num_hidden_layers
    g = a.graph(depth=3)
    group = g.nodes[g.nodes.type == "LlamaDecoderLayer"]
    assert len(group) == 1 and int(group.repeats.iloc[0]) == layers
    assert int(group.calls.iloc[0]) == layers
    assert group.module.iloc[0] == f"model.layers.0–{layers - 1}"
    p = pairs(g)
    assert ("model.embed_tokens", group.module.iloc[0]) in p
    assert (group.module.iloc[0], "model.norm") in p
    flat = a.graph(depth=3, fold=False)
    members = flat.nodes[flat.nodes.type == "LlamaDecoderLayer"]
    assert len(members) == layers and set(members.repeats) == {1}
    chain = pairs(flat)
    for i in range(layers - 1):
        assert (f"model.layers.{i}", f"model.layers.{i + 1}") in chain
    # the folded node's numbers are its members' sums
    assert int(group.params.iloc[0]) == int(members.params.sum())
    assert int(group.flops.iloc[0]) == int(members.flops.sum())


def test_inside_the_layers_the_residual_stream_is_a_chain_of_adds(llama12: Any) -> None:
    config, a = llama12
    g = a.graph(depth=4, fold=False)
    edges = g.edges.set_index(["src", "dst"])
    # h = x + attn(norm(x)); out = h + mlp(norm(h)); the next layer reads out
    layer = "model.layers.{}.".format
    for i in range(config.num_hidden_layers - 1):
        assert edges.loc[(layer(i) + "<residual 2>", layer(i + 1) + "<residual 1>")]["kind"] == (
            "residual"
        )
        assert (layer(i) + "<residual 2>", layer(i + 1) + "input_layernorm") in edges.index
    assert edges.loc[(layer(0) + "<residual 1>", layer(0) + "<residual 2>")]["kind"] == "residual"
    assert edges.loc[(layer(0) + "self_attn", layer(0) + "<residual 1>")]["kind"] == "data"
    assert edges.loc[(layer(0) + "mlp", layer(0) + "<residual 2>")]["kind"] == "data"
    assert ("model.embed_tokens", layer(1) + "input_layernorm") not in edges.index
    folded = a.graph(depth=4)
    assert set(folded.nodes.repeats) == {1, config.num_hidden_layers}
    # folding leaves out the edges from one layer to the next
    assert len(folded.edges) < len(g.edges)


def test_tied_weights_are_an_edge(llama12: Any) -> None:
    _, a = llama12
    assert pairs(a.graph(depth=2), "tied") == {("model.embed_tokens", "lm_head")}
    config = llama_config()
    config.tie_word_embeddings = False
    assert pairs(mw.analyze(config, input_size=(1, 16)).graph(depth=2), "tied") == set()


def test_a_module_called_three_times_is_one_node() -> None:
    g = mw.analyze(Reused(), input_size=(2, 8)).graph()
    shared = g.nodes.set_index("module").loc["shared"]
    assert shared["calls"] == 3
    loop = g.edges.set_index(["src", "dst"]).loc[("shared", "shared")]
    assert loop["ops"] == ("cat",) and loop["count"] == 2


def test_training_edges_carry_gradient_bytes() -> None:
    g = mw.analyze(Fork(), input_size=(2, 8), mode="training").graph()
    edges = g.edges.set_index(["src", "dst"])
    assert edges.loc[("stem", "left")]["grad_bytes"] == 2 * 8 * 4
    assert edges.loc[("<input>", "stem")]["grad_bytes"] == 0  # the input needs no gradient
    inference = mw.analyze(Fork(), input_size=(2, 8)).graph()
    assert set(inference.edges.grad_bytes) == {0}


def test_exports(monkeypatch: pytest.MonkeyPatch) -> None:
    g = mw.analyze(Fork(), input_size=(2, 8)).graph()
    nx = g.to_networkx()
    assert nx.number_of_nodes() == len(g.nodes) and nx.number_of_edges() == len(g.edges)
    assert nx.nodes["stem"]["type"] == "Linear"
    dot = g.to_dot()
    assert dot.startswith("digraph") and dot.count(" -> ") == len(g.edges)
    assert '"left" -> "head" [label="2×8\\nadd"]' in dot

    def missing() -> Any:
        raise ImportError("No module named 'networkx'")

    monkeypatch.setattr(heavy, "networkx", missing)
    with pytest.raises(ImportError, match="pip install networkx"):
        g.to_networkx()


@pytest.mark.parametrize("depth", [-1, 1.5, True])
def test_bad_depth(depth: Any) -> None:
    a = mw.analyze(Fork(), input_size=(2, 8))
    with pytest.raises(ValueError, match="depth"):
        a.graph(depth=depth)
