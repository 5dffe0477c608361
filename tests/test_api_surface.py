"""Every public option and method no other test calls, each against an independent truth.

Truths: parameter counts from ``sum(p.numel())``, optimizer state from a real CPU optimizer step,
FLOPs from ``FlopCounterMode`` on a real CPU run, peaks from ``MemTracker``, the HTML as Python's
own HTML parser reads it.
"""

from __future__ import annotations

import copy
import importlib
import json
from collections.abc import Callable
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.distributed._tools.mem_tracker import MemTracker
from torch.utils.flop_counter import FlopCounterMode

import meta_widget as mw

CPU = torch.device("cpu")


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 128), nn.Linear(128, 4))


def numel(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def nbytes(tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


# ---------------------------------------------------------------------------------------------
# to_html / to_json


class Page(HTMLParser):
    """What a browser's tokenizer sees, near enough: the title text and each script's text."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.title: list[str] = []
        self.scripts: list[tuple[dict[str, str | None], str]] = []
        self.urls: list[str] = []
        self._in: str | None = None
        self._attrs: dict[str, str | None] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._in, self._attrs = tag, dict(attrs)
        if tag == "script":
            self.scripts.append((self._attrs, ""))
        self.urls += [v for k, v in attrs if k in ("src", "href") and v]

    def handle_endtag(self, tag: str) -> None:
        self._in = None

    def handle_data(self, data: str) -> None:
        if self._in == "title":
            self.title.append(data)
        elif self._in == "script":
            attrs, text = self.scripts[-1]
            self.scripts[-1] = (attrs, text + data)


def parse(html: str) -> Page:
    page = Page()
    page.feed(html)
    page.close()
    return page


def data_block(page: Page) -> str:
    blocks = [text for attrs, text in page.scripts if attrs.get("id") == "meta-widget-data"]
    assert len(blocks) == 1, [a for a, _ in page.scripts]
    return blocks[0]


def test_to_html_writes_a_page_whose_data_is_the_analysis(tmp_path: Path) -> None:
    model = mlp()
    a = mw.analyze(model, input_size=(16, 32))
    path = tmp_path / "mlp.html"
    html = a.to_html(str(path))
    assert path.read_text(encoding="utf-8") == html
    page = parse(html)
    assert "".join(page.title) == "meta_widget · Sequential"
    assert len(page.scripts) == 3  # the data, the bundle, the call that renders
    assert page.urls == []  # standalone: nothing fetched
    data = json.loads(data_block(page))
    assert data == json.loads(a.to_json())
    assert data["totals"]["params"] == numel(model)
    strings = data["strings"]
    assert [strings[i] for i in data["modules"]["type"]] == [
        type(m).__name__ for m in model.modules()
    ]


#: each would end the data script early, swallow the rest of the page, or end the title early
HOSTILE = {
    "class": "</script><script>window.__pwned=1</script>",
    "title": "</title><script>window.__pwned=2</script>",
    "comment": "<!--<script>",
    "module": "</SCRIPT ><script>window['__pwned']=3</script>",
}


def hostile_model() -> nn.Module:
    child = type(HOSTILE["class"], (nn.Linear,), {})

    def init(self: Any) -> None:
        nn.Module.__init__(self)
        self.add_module(HOSTILE["comment"], child(4, 4))
        self.add_module(HOSTILE["module"], nn.ReLU())

    def forward(self: Any, x: Any) -> Any:
        return getattr(self, HOSTILE["module"])(getattr(self, HOSTILE["comment"])(x))

    return type(HOSTILE["title"], (nn.Module,), {"__init__": init, "forward": forward})()


def test_hostile_names_stay_inside_the_data_script_and_the_title() -> None:
    """The HTML spec: a script's text ends at ``</script`` (any case), and ``<!--`` in it starts
    an escape in which a ``<script>`` makes the next ``</script>`` no end; a title ends at
    ``</title``. The page must hold none of them where a name goes."""
    a = mw.analyze(hostile_model(), input_size=(2, 4))
    assert a.error is None, a.error
    html = a.to_html()
    page = parse(html)
    assert "".join(page.title) == f"meta_widget · {HOSTILE['title']}"
    assert len(page.scripts) == 3, [text[:80] for _, text in page.scripts]
    data = data_block(page)
    assert "</script" not in data.lower()
    assert "<!--" not in data
    payload = json.loads(data)  # the whole payload, not a prefix of it
    strings = payload["strings"]
    names = [strings[i] for i in payload["modules"]["name"]]
    types = [strings[i] for i in payload["modules"]["type"]]
    assert names == ["", HOSTILE["comment"], HOSTILE["module"]]
    assert types == [HOSTILE["title"], HOSTILE["class"], "ReLU"]


def test_to_json_round_trips_and_counts_what_torch_counts() -> None:
    model = mlp()
    x = torch.randn(16, 32)
    a = mw.analyze(model, input_data=x)
    payload = json.loads(a.to_json())
    assert payload == json.loads(json.dumps(a.to_payload()))
    assert json.loads(json.dumps(payload)) == payload
    with torch.no_grad(), FlopCounterMode(display=False) as fc:
        out = model(x)
    assert payload["totals"]["params"] == numel(model)
    assert payload["totals"]["param_bytes"] == nbytes(model.parameters())
    assert payload["totals"]["flops"] == fc.get_total_flops()
    assert payload["shapes"][payload["tensors"][-1][0]] == list(out.shape)


# ---------------------------------------------------------------------------------------------
# what_if / distributed


def test_what_if_scales_each_category_to_the_precision() -> None:
    model = mlp()
    n = numel(model)
    a = mw.analyze(model, input_size=(16, 32), mode="training", optimizer="adamw")
    table = a.what_if()
    assert list(table.index) == [
        "float32",
        "bfloat16",
        "float16",
        "mixed bfloat16",
        "mixed float16",
    ]
    f32 = table.loc["float32"]
    assert f32["parameters"] == f32["gradients"] == 4 * n
    assert f32["optimizer state"] == 2 * 4 * n  # AdamW: two fp32 moments
    assert f32["total"] == a.peak_bytes
    for dtype in ("bfloat16", "float16"):
        row = table.loc[dtype]
        assert row["parameters"] == row["gradients"] == 2 * n
        assert row["optimizer state"] == 2 * 2 * n
        # mixed precision: 16-bit weights and gradients, fp32 master weights and two moments
        mixed = table.loc[f"mixed {dtype}"]
        assert mixed["parameters"] == mixed["gradients"] == 2 * n
        assert mixed["optimizer state"] == 3 * 4 * n
    # against a trace of the model really in bfloat16 (the input left as traced: float32)
    bf16 = mw.analyze(
        mlp().to(torch.bfloat16),
        input_data=torch.randn(16, 32, dtype=torch.bfloat16),
        mode="training",
    )
    for cat in ("parameters", "gradients", "optimizer state", "activations", "temporaries"):
        assert table.loc["bfloat16"][cat] == bf16.memory.categories[cat], cat
    inference = mw.analyze(model, input_size=(16, 32)).what_if()
    assert inference.loc["int8 weights"]["parameters"] == n
    assert inference.loc["int4 weights"]["parameters"] == n // 2
    assert inference.loc["float32"]["gradients"] == 0


def test_distributed_shards_what_each_strategy_shards() -> None:
    model = mlp()
    n = numel(model)
    a = mw.analyze(model, input_size=(16, 32), mode="training", optimizer="adamw")
    table = a.distributed(sizes=(1, 2, 8))
    assert set(table["strategy"]) == {"ddp", "zero1", "zero2", "zero3", "tp"}
    assert len(table) == 5 * 3

    def row(strategy: str, devices: int) -> Any:
        rows = table[(table["strategy"] == strategy) & (table["devices"] == devices)]
        assert len(rows) == 1
        return rows.iloc[0]

    for devices in (1, 2, 8):
        ddp = row("ddp", devices)  # every device holds everything
        assert ddp["parameters"] == ddp["gradients"] == 4 * n
        assert ddp["optimizer state"] == 2 * 4 * n
        assert ddp["total"] == a.peak_bytes
        zero1 = row("zero1", devices)  # optimizer state sharded
        assert zero1["optimizer state"] == 2 * 4 * n // devices
        assert zero1["gradients"] == 4 * n
        zero2 = row("zero2", devices)  # and gradients
        assert zero2["gradients"] == 4 * n // devices
        assert zero2["optimizer state"] == 2 * 4 * n // devices
    # ZeRO-3 shards the parameters too: 8 devices hold less than 2, which hold less than 1
    assert row("zero3", 8)["parameters"] < row("zero3", 2)["parameters"]
    assert row("zero3", 8)["parameters"] < 4 * n


# ---------------------------------------------------------------------------------------------
# loss=, optimizer="adam"


class TwoHeads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.trunk, self.a, self.b = nn.Linear(16, 32), nn.Linear(32, 8), nn.Linear(32, 64)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.relu(self.trunk(x))
        return self.a(h), self.b(h)


def real_step(
    model: nn.Module, x: torch.Tensor, loss: Callable[[Any], torch.Tensor]
) -> tuple[nn.Module, int]:
    """A real CPU forward + loss + backward; the trained copy and FlopCounterMode's count."""
    model = copy.deepcopy(model).train()
    with FlopCounterMode(display=False) as fc:
        loss(model(x)).backward()
    return model, int(fc.get_total_flops())


def test_a_custom_loss_changes_the_backward_as_it_does_for_real() -> None:
    model, x = TwoHeads(), torch.randn(4, 16)

    def only_a(out: Any) -> torch.Tensor:  # head b gets no gradient
        return out[0].square().sum()

    def both(out: Any) -> torch.Tensor:  # what the default loss sums
        return out[0].sum() + out[1].sum()

    for loss, kwargs in ((only_a, {"loss": only_a}), (both, {})):
        a = mw.analyze(model, input_data=x, mode="training", optimizer=None, **kwargs)
        assert a.error is None, a.error
        trained, flops = real_step(model, x, loss)
        grads = [p.grad for p in trained.parameters() if p.grad is not None]
        assert a.memory.gradient_bytes == nbytes(grads)
        assert a.total_flops == flops
    # head b: no gradient and no backward FLOPs with the custom loss
    a = mw.analyze(model, input_data=x, mode="training", optimizer=None, loss=only_a)
    assert a["b"].backward_flops == 0 < a["a"].backward_flops
    assert a.memory.gradient_bytes == nbytes([*model.trunk.parameters(), *model.a.parameters()])


def test_adam_state_is_what_a_real_adam_step_keeps() -> None:
    model, x = mlp(), torch.randn(16, 32)
    model[0].bias.requires_grad_(False)  # frozen: no state
    a = mw.analyze(model, input_data=x, mode="training", optimizer="adam")
    assert a.error is None, a.error
    real = copy.deepcopy(model)
    trainable = [p for p in real.parameters() if p.requires_grad]
    opt = torch.optim.Adam(trainable)
    real(x).sum().backward()
    opt.step()
    state = [(k, v) for s in opt.state.values() for k, v in s.items()]
    assert {k for k, _ in state} == {"step", "exp_avg", "exp_avg_sq"}
    moments = nbytes(v for k, v in state if k != "step")
    assert moments == 2 * nbytes(trainable)
    assert a.memory.optimizer_state_bytes == moments
    # the step counters: a float32 scalar per trainable tensor, on the host
    assert (
        a.memory.optimizer_host_bytes
        == nbytes(v for k, v in state if k == "step")
        == 4 * len(trainable)
    )
    assert a.memory.gradient_bytes == nbytes(p.grad for p in trainable)


# ---------------------------------------------------------------------------------------------
# depth=, activation_checkpointing=[paths]


def test_depth_sets_where_the_summary_and_the_widget_open() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Sequential(nn.Sequential(nn.Linear(4, 4), nn.ReLU())), nn.Linear(4, 2))
    a = mw.analyze(model, input_size=(2, 4), depth=1)
    text = a.summary()
    # depth 1: the root and its children "0" and "1"; nothing of "0.0" and below (no nested row)
    assert "ReLU" not in text and "│" not in text, text
    assert a.widget().depth == 1


class Blocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)) for _ in range(3)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + block(x)
        return x


def real_checkpointed_step(model: nn.Module, x: torch.Tensor, paths: set[str]) -> tuple[int, int]:
    """Peak (MemTracker) and FLOPs of a real CPU forward + backward, ``paths`` checkpointed."""
    from torch.utils.checkpoint import checkpoint

    model = copy.deepcopy(model).train()
    for path in paths:
        block = model.get_submodule(path)
        forward = block.forward
        block.forward = lambda *a, _f=forward: checkpoint(_f, *a, use_reentrant=False)
    # two runs: FlopCounterMode around MemTracker would make it see more than the step holds
    with FlopCounterMode(display=False) as fc:
        model(x).sum().backward()
    model.zero_grad(set_to_none=True)
    tracker = MemTracker()
    tracker.track_external(model, x)
    with tracker:
        out = model(x)
        loss = out.sum()
        loss.backward()
        del loss
        peak = int(tracker.get_tracker_snapshot("peak")[CPU]["Total"])
    del out
    return peak, int(fc.get_total_flops())


def test_activation_checkpointing_of_chosen_paths_is_a_real_checkpointed_step() -> None:
    model, x = Blocks(), torch.randn(32, 64)
    for paths in (set(), {"blocks.1"}, {"blocks.0", "blocks.2"}):
        a = mw.analyze(
            model,
            input_data=x,
            mode="training",
            optimizer=None,
            device="cpu",
            activation_checkpointing=sorted(paths),
        )
        assert a.error is None, a.error
        peak, flops = real_checkpointed_step(model, x, paths)
        assert (a.peak_bytes, a.total_flops) == (peak, flops), sorted(paths)
    # the user's module keeps its own forward (no instance attribute left behind)
    assert all("forward" not in vars(m) for m in model.modules())


# ---------------------------------------------------------------------------------------------
# register_source, register_explanation


class MLPSpec:
    """A user's own model description: layer widths."""

    def __init__(self, *widths: int) -> None:
        self.widths = widths

    def build(self) -> nn.Module:
        pairs = zip(self.widths, self.widths[1:], strict=False)
        return nn.Sequential(*(nn.Linear(i, o) for i, o in pairs))


def test_register_source_analyzes_a_new_kind_of_object() -> None:
    from meta_widget.sources import models as sources

    spec = MLPSpec(8, 16, 4)
    with pytest.raises(sources.SourceError, match="cannot analyze an object of type 'MLPSpec'"):
        mw.analyze(spec, input_size=(2, 8))
    with sources.SOURCES.scoped():  # the registry is global: left as it was

        @sources.register_source("mlp-spec", lambda obj: isinstance(obj, MLPSpec))
        def from_spec(obj: MLPSpec) -> sources.MetaModel:
            with torch.device("meta"):
                module = obj.build()
            return sources.MetaModel(module, source="mlp-spec", owned=True, rebuild=None)

        a = mw.analyze(spec, input_size=(2, 8))
        assert a.error is None and a.source == "mlp-spec"
        real = spec.build()
        assert a.total_params == numel(real)
        with torch.no_grad(), FlopCounterMode(display=False) as fc:
            real(torch.randn(2, 8))
        assert a.total_flops == fc.get_total_flops()
    assert "mlp-spec" not in sources.SOURCES
    with pytest.raises(sources.SourceError, match="cannot analyze an object of type 'MLPSpec'"):
        mw.analyze(spec, input_size=(2, 8))


class QuotaError(RuntimeError):
    """An error of the user's own code that meta_widget knows nothing about."""


class OverQuota(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise QuotaError("quota of 3 widgets exceeded")


def test_register_explanation_explains_a_new_error() -> None:
    # the registry of explanations (meta_widget.explain is the function that uses it)
    explain_module = importlib.import_module("meta_widget.trace.known_errors")

    plain = mw.analyze(OverQuota(), input_size=(2, 4)).error
    assert plain is not None and plain.type == "QuotaError"
    title = "Over the widget quota"
    with explain_module.EXPLANATIONS.scoped():
        explain_module.register_explanation(
            "quota",
            r"quota of \d+ widgets",
            title=title,
            explanation="The model counts widgets.",
            fix="Ask for more widgets.",
        )
        error = mw.analyze(OverQuota(), input_size=(2, 4)).error
        assert error is not None
        assert (error.title, error.explanation, error.fix) == (
            title,
            "The model counts widgets.",
            "Ask for more widgets.",
        )
        assert error.module == "" and error.type == "QuotaError"
        assert mw.explain(QuotaError("quota of 7 widgets exceeded")).title == title
        assert mw.explain(QuotaError("something else")).title != title
        assert plain.title != title
    assert mw.explain(QuotaError("quota of 7 widgets exceeded")).title != title
