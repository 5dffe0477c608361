"""Every widget output is followed by a static ``text/html`` view; nbconvert shows it, offline.

Also: re-runs from the widget's switches reach Python (``a.widget().analysis``) with the source,
the notes and the options of the first analysis, and a config says which class it built.
"""

from __future__ import annotations

import html
import os
import pathlib
import re
import runpy

import nbformat
import pytest
import torch
import transformers
from nbclient import NotebookClient
from nbconvert import HTMLExporter
from traitlets.config import Config

import meta_widget as mw
from meta_widget.units import format_count

ROOT = pathlib.Path(__file__).resolve().parents[1]
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


def tiny_gpt2() -> transformers.GPT2Config:
    return transformers.GPT2Config(n_layer=3, n_embd=64, n_head=4, vocab_size=128, n_positions=32)


def bundle(a: mw.Analysis) -> dict[str, str]:
    """The widget's bundle, with the static view's ``text/html`` (its own output) beside it."""
    from meta_widget.views.widget import static_bundle

    data, _meta = a._repr_mimebundle_()
    return {**data, "text/html": static_bundle(a)["text/html"]}


def visible_text(fragment: str) -> str:
    """What a reader sees of an HTML fragment: tags dropped, entities read."""
    return html.unescape(re.sub(r"<[^>]+>", "\n", fragment))


def test_every_output_carries_a_static_view_of_the_analysis() -> None:
    a = mw.analyze(tiny_gpt2(), input_size=(1, 16))
    data = bundle(a)
    assert WIDGET_MIME in data and "text/plain" in data
    page = data["text/html"]
    text = visible_text(page)
    # the header totals, as the model itself has them (an independent count)
    model = transformers.GPT2Model(tiny_gpt2())
    assert a.total_params == sum(p.numel() for p in model.parameters())
    assert format_count(a.total_params) in text
    assert "GPT2Model (config) · inference" in text
    assert "0–2 · 3 × GPT2Block" in text  # the three blocks folded into one row
    assert "peak" in text and "Peak (forward) = parameters" in text
    assert "Built GPT2Model from the GPT2Config" in text
    # self-contained: no script, no external resource
    assert "<script" not in page and "src=" not in page and "href=" not in page


def test_user_strings_are_text_in_the_static_view() -> None:
    evil = type("<img src=x onerror=alert(1)>", (torch.nn.Module,), {})

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.add_module("x", evil())
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x)

    page = bundle(mw.analyze(Net(), input_size=(2, 4)))["text/html"]
    assert "<img" not in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page


def test_the_70b_static_view_stays_small() -> None:
    config = runpy.run_path(str(ROOT / "examples" / "llama_70b.py"))["config"]
    a = mw.analyze(config, input_size=(1, 4096))
    page = bundle(a)["text/html"]
    assert len(page.encode()) <= 50_000, len(page.encode())
    text = visible_text(page)
    assert "80 × LlamaDecoderLayer" in text
    assert "LlamaForCausalLM (config)" in text


def test_structural_and_failed_analyses_have_a_static_view_too() -> None:
    structural = bundle(mw.analyze(tiny_gpt2()))["text/html"]
    assert "structure only" in visible_text(structural)

    class Broken(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x @ torch.ones(3, 3)  # (2, 4) @ (3, 3): a shape error

    failed = visible_text(bundle(mw.analyze(Broken(), input_size=(2, 4)))["text/html"])
    assert "Error:" in failed


# ---------------------------------------------------------------------------------------------
# nbconvert


def executed_notebook(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> nbformat.NotebookNode:
    """A notebook that displays an analysis, run in a real kernel (widget state stored)."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("TRANSFORMERS_VERBOSITY", "error")
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(
            "import meta_widget as mw, transformers\n"
            "config = transformers.GPT2Config(n_layer=3, n_embd=64, n_head=4, vocab_size=128,"
            " n_positions=32)\n"
            "a = mw.analyze(config, input_size=(1, 16))\n"
            "a"
        )
    ]
    NotebookClient(nb, kernel_name="python3", timeout=180).execute()
    return nb


def to_html(nb: nbformat.NotebookNode, **config: object) -> str:
    c = Config()
    for key, value in config.items():
        section, name = key.split(".")
        c[section][name] = value
    body, _ = HTMLExporter(config=c).from_notebook_node(nb)
    return body


@pytest.mark.slow
def test_nbconvert_shows_the_static_view(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nb = executed_notebook(tmp_path, monkeypatch)
    widget_out, static_out = [o for o in nb.cells[0].outputs if o.output_type != "stream"]
    assert WIDGET_MIME in widget_out.data and "text/html" not in widget_out.data
    assert "text/html" in static_out.data and WIDGET_MIME not in static_out.data
    # saved as JupyterLab saves by default (no widget state): the static view is the output
    plain = nbformat.from_dict(nb)
    plain.metadata.pop("widgets", None)
    page = to_html(plain)
    assert "meta-widget-fallback" in page and "0–2 · 3 × GPT2Block" in html.unescape(page)
    # with the widget state saved, the static view is there too (its own output, which the
    # widget hides once it mounts): offline, or with no widget manager, the reader sees it
    assert "widgets" in nb.metadata
    assert "meta-widget-fallback" in to_html(nb)
    (tmp_path / "page.html").write_text(page, encoding="utf-8")


# ---------------------------------------------------------------------------------------------
# re-runs reach Python


def test_a_rerun_from_the_switches_reaches_python_with_source_notes_and_options() -> None:
    a = mw.analyze(tiny_gpt2(), input_size=(1, 16), depth=2, device="cpu")
    w = a.widget()
    assert a.widget() is w and w.analysis is a  # one widget per analysis: displaying a shows it
    assert a.source == "config"
    dtype_note = next(n for n in a.notes if "dtype torch.long" in n)
    w._on_message(w, {"type": "rerun", "mode": "training", "optimizer": "sgd", "device": "cpu"}, [])
    b = a.widget().analysis
    assert b is not a and a.mode == "inference"  # a is what it was
    assert b.mode == "training" and b.options.optimizer == "sgd"
    assert b.source == "config"  # not "module": the same meta model, traced again
    assert dtype_note in b.notes
    assert any(n.startswith("Built GPT2Model from the GPT2Config") for n in b.notes)
    assert b.depth == 2 and b.options.device == "cpu"
    # the payload the widget now shows is the new analysis, with the same tag and notes
    assert w.payload["mode"] == "training" and w.payload["source"] == "config"
    assert dtype_note in w.payload["notes"]
    # and it is the analysis a real CPU step would give: the same parameters and FLOPs
    assert b.total_params == a.total_params
    again = mw.analyze(
        tiny_gpt2(), input_size=(1, 16), mode="training", optimizer="sgd", device="cpu"
    )
    assert b.total_flops == again.total_flops and b.peak_bytes == again.peak_bytes


def test_a_config_says_which_class_it_built_and_how_to_pick_another() -> None:
    a = mw.analyze(tiny_gpt2())
    note = next(n for n in a.notes if n.startswith("Built "))
    assert "Built GPT2Model from the GPT2Config" in note
    assert "names no architectures" in note
    assert "config.architectures = ['GPT2LMHeadModel']" in note
    # following the note builds the other class
    config = tiny_gpt2()
    config.architectures = ["GPT2LMHeadModel"]
    b = mw.analyze(config)
    assert b.title == "GPT2LMHeadModel"
    assert any("Built GPT2LMHeadModel" in n and "first of its architectures" in n for n in b.notes)


# ---------------------------------------------------------------------------------------------
# the precision switch


@pytest.mark.parametrize("mode", ["inference", "training"])
def test_the_precision_switch_peak_is_what_a_bf16_trace_gives(mode: str) -> None:
    """The switch's bf16 numbers (the payload's ``what_if``) against the model traced in bf16."""
    a = mw.analyze(tiny_gpt2(), input_size=(2, 16), mode=mode, device="cpu")
    real = mw.analyze(
        tiny_gpt2(), input_size=(2, 16), mode=mode, device="cpu", param_dtype="bfloat16"
    )
    switch = a.to_payload()["memory"]["what_if"]
    # training: the switch scales the categories at the fp32 trace's peak, and the steady
    # step's peak moves with the dtype (in bf16 it is elsewhere in backward): 5.6 % here
    tolerance = 0.01 if mode == "inference" else 0.06
    assert switch["bf16"]["total"] == pytest.approx(real.peak_bytes, rel=tolerance)
    assert switch["bf16"]["parameters"] == real.memory.categories["parameters"]
    assert switch["bf16"]["activation_scale"] == 0.5
    if mode == "inference":
        # weight-only int8: parameters at 1 byte each, activations as recorded
        assert switch["int8"]["parameters"] == a.total_params
        assert switch["int8"]["activations"] == a.memory.categories["activations"]
    else:
        assert "int8" not in switch  # weight-only quantization is an inference what-if
