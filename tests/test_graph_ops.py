"""``Analysis.graph``'s nodes that are no module: the residual stream, attention, the KV cache.

A transformer's graph must show its residual stream as the path through each layer's adds (not
only as ``add`` in tooltips), its attention as a node at every depth where the attention's body
is drawn (not an edge labelled ``bmm, softmax``), and the KV cache it returns as a node of its
own (not ``k_proj -> <output>`` edges). Expected structure and numbers come from the models'
own ``forward`` and configs (a tiny Llama: 4 layers, 4 heads of 8, 2 KV heads).
"""

from __future__ import annotations

from typing import Any

import pytest

import meta_widget as mw
from meta_widget.views.graph_frame import encode_graph
from tests.models import gpt2_config, llama_config
from tests.test_assumptions import mixtral_config
from tests.test_graph import Fork

LAYERS, HEADS, HEAD_DIM, KV_HEADS, SEQ = 4, 4, 8, 2, 16
GROUP = f"model.layers.0–{LAYERS - 1}"
#: the ops of an attention's own body: never on an edge once attention is a node
ATTENTION_OPS = {"bmm", "matmul", "softmax", "safe_softmax", "scaled_dot_product_attention"}


def _config(**kw: Any) -> Any:
    config = llama_config()
    config.num_hidden_layers = LAYERS
    for k, v in kw.items():
        setattr(config, k, v)
    return config


@pytest.fixture(scope="module")
def llama() -> Any:
    return mw.analyze(_config(), input_size=(1, SEQ))


def edges(g: mw.Graph) -> Any:
    return g.edges.set_index(["src", "dst"])


def spine(g: mw.Graph) -> list[tuple[str, str]]:
    e = g.edges[g.edges.kind == "residual"]
    return list(zip(e.src, e.dst, strict=True))


@pytest.mark.parametrize("depth", [4, 5])
def test_the_residual_stream_runs_through_each_layers_adds(llama: Any, depth: int) -> None:
    g = llama.graph(depth=depth)
    first, second = f"{GROUP}.<residual 1>", f"{GROUP}.<residual 2>"
    nodes = g.nodes.set_index("module")
    for add in (first, second):
        assert nodes.loc[add, "kind"] == "residual" and nodes.loc[add, "type"] == "residual add"
        assert nodes.loc[add, "repeats"] == LAYERS and nodes.loc[add, "calls"] == LAYERS
    # the stream: embeddings -> the attention's add -> the MLP's add (-> next layer, folded)
    assert spine(g) == [("model.embed_tokens", first), (first, second)]
    e = edges(g)
    attn_out = f"{GROUP}.self_attn" + (".o_proj" if depth == 5 else "")
    mlp_out = f"{GROUP}.mlp" + (".down_proj" if depth == 5 else "")
    assert e.loc[(attn_out, first), "kind"] == "data"  # the branches join the stream
    assert e.loc[(mlp_out, second), "kind"] == "data"
    assert (first, f"{GROUP}.post_attention_layernorm") in e.index  # and leave it
    assert (second, "model.norm") in e.index
    assert e.loc[(first, second), "shape"] == (1, SEQ, 32)
    # no residual hidden in a tooltip (the rotary embedding's add on q and k stays an op)
    rope = [r for r in g.edges.itertuples() if "attention" in r.dst or r.kind == "cache"]
    assert not any("add" in r.ops for r in g.edges.itertuples() if r not in rope)


def test_unfolded_the_stream_chains_every_layer(llama: Any) -> None:
    g = llama.graph(depth=4, fold=False)
    adds = [f"model.layers.{i}.<residual {k}>" for i in range(LAYERS) for k in (1, 2)]
    assert spine(g) == list(zip(["model.embed_tokens", *adds[:-1]], adds, strict=True))


def test_side_by_side_branches_stay_an_edges_add() -> None:
    # left(h) + right(h): neither is the other's input, no stream
    g = mw.analyze(Fork(), input_size=(2, 8)).graph()
    assert set(g.nodes.kind) == {"input", "module", "output"}
    assert set(g.edges.kind) == {"data"}


def test_attention_is_a_node_whenever_its_body_is_drawn(llama: Any) -> None:
    attn = f"{GROUP}.self_attn"
    for depth in range(1, 7):
        g = llama.graph(depth=depth)
        names = set(g.nodes.module)
        for ops in g.edges.ops:
            assert not ATTENTION_OPS & set(ops), (depth, ops)
        if depth < 4:
            assert not any("attention" in n or "self_attn" in n for n in names)
        elif depth == 4:
            assert attn in names  # the module itself
        else:
            assert attn not in names and f"{attn}.<attention>" in names
    g = llama.graph(depth=5)
    node = g.nodes.set_index("module").loc[f"{attn}.<attention>"]
    assert node["kind"] == "attention" and node["type"] == "attention"
    assert node["repeats"] == LAYERS
    # q·kᵀ and weights·v: 2 × (2 · heads · seq² · head_dim) per layer
    assert node["flops"] == LAYERS * 2 * 2 * HEADS * SEQ * SEQ * HEAD_DIM
    e = edges(g)
    for proj in ("q_proj", "k_proj", "v_proj"):
        assert (f"{attn}.{proj}", f"{attn}.<attention>") in e.index
    assert e.loc[(f"{attn}.q_proj", f"{attn}.<attention>"), "ops"][:4] == (
        "mul",
        "add",
        "neg",
        "cat",
    )  # the rotary embedding on the way
    assert (f"{attn}.<attention>", f"{attn}.o_proj") in e.index
    assert not [k for k in e.index if k[1] == f"{attn}.o_proj" and k[0] != f"{attn}.<attention>"]


def test_eager_attention_and_a_fused_kernel_are_nodes_too() -> None:
    eager = _config()
    eager._attn_implementation = "eager"
    g = mw.analyze(eager, input_size=(1, SEQ)).graph(depth=5)
    attn = f"{GROUP}.self_attn"
    e = edges(g)
    for proj in ("q_proj", "k_proj", "v_proj"):
        assert (f"{attn}.{proj}", f"{attn}.<attention>") in e.index
    assert [k[0] for k in e.index if k[1] == f"{attn}.o_proj"] == [f"{attn}.<attention>"]
    # GPT-2 runs one scaled_dot_product_attention kernel; its attention is under .attn
    gpt = mw.analyze(gpt2_config(), input_size=(1, 8)).graph(depth=5)
    e = edges(gpt)
    assert ("transformer.h.0–1.attn.c_attn", "transformer.h.0–1.attn.<attention>") in e.index
    assert ("transformer.h.0–1.attn.<attention>", "transformer.h.0–1.attn.c_proj") in e.index


def test_a_routers_softmax_is_no_attention() -> None:
    g = mw.analyze(mixtral_config(), input_size=(1, 10)).graph(depth=5)
    attention = g.nodes[g.nodes.kind == "attention"]
    assert list(attention.module) == ["model.layers.0–1.self_attn.<attention>"]


def test_the_returned_kv_cache_is_its_own_node_at_every_depth(llama: Any) -> None:
    for depth in range(1, 7):
        g = llama.graph(depth=depth)
        into = g.edges[g.edges.dst == "<cache>"]
        assert set(into.kind) == {"cache"}, depth
        assert g.nodes.set_index("module").loc["<cache>", "type"] == "KV cache"
        output = g.edges[g.edges.dst == "<output>"]
        assert list(output.src) == ["lm_head"], depth  # the logits, nothing else
        # keys and values of every layer: (batch, kv heads, seq, head dim)
        assert set(into["shape"]) == {(1, KV_HEADS, SEQ, HEAD_DIM)}
        assert into["count"].sum() >= 2 * LAYERS
    srcs = {d: set(llama.graph(depth=d).edges.query("dst == '<cache>'").src) for d in (2, 4, 5)}
    assert srcs[2] == {GROUP}  # written inside the layers
    assert srcs[4] == {f"{GROUP}.self_attn"}
    assert {f"{GROUP}.self_attn.k_proj", f"{GROUP}.self_attn.v_proj"} <= srcs[5]


def test_the_payload_carries_the_op_nodes_and_edge_kinds(llama: Any) -> None:
    strings: list[str] = []

    def string(s: str) -> int:
        strings.append(s)
        return len(strings) - 1

    levels = encode_graph(llama, lambda info: 0, string)["levels"]
    five = next(level for level in levels if level["depth"] == 5)
    ops = [(row, strings[k], strings[n], strings[d]) for row, k, n, d, _ in five["opnodes"]]
    attn0 = [m.path for m in llama.modules].index("model.layers.0.self_attn")
    layer0 = [m.path for m in llama.modules].index("model.layers.0")
    assert ops[:3] == [
        (attn0, "attention", "<attention>", "safe_softmax"),
        (layer0, "residual", "<residual 1>", "+ self_attn"),
        (layer0, "residual", "<residual 2>", "+ mlp"),
    ]
    assert len(ops) == 3 * LAYERS
    assert all(key in five["nodes"] for key in range(-4, -4 - len(ops), -1))
    kinds = {strings[k] for k in five["kind"]}
    assert kinds == {"data", "residual", "cache"}
    assert -3 in five["nodes"]  # the cache


def test_decode_steps_keep_the_spine() -> None:
    # mode="generate": the prompt's pass, then one token at a time (other shapes, same code)
    steps = 5
    a = mw.analyze(
        _config(num_hidden_layers=2), input_size=(1, 8), mode="generate", new_tokens=steps
    )
    g = a.graph(depth=5)
    group = "model.layers.0–1"
    assert spine(g) == [
        ("model.embed_tokens", f"{group}.<residual 1>"),
        (f"{group}.<residual 1>", f"{group}.<residual 2>"),
    ]
    nodes = g.nodes.set_index("module")
    for name in ("<residual 1>", "<residual 2>", "self_attn.<attention>"):
        assert nodes.loc[f"{group}.{name}", "calls"] == 2 * steps  # 2 layers, every step
    e = edges(g)
    assert e.loc[(f"{group}.<residual 1>", f"{group}.<residual 2>"), "count"] == 2 * steps
    # the decode steps' adds are the residual nodes too: none is left on an edge
    assert not [r for r in g.edges.itertuples() if "add" in r.ops and "residual" in r.dst]
    assert not [r for r in g.edges.itertuples() if r.ops == ("add",)]
