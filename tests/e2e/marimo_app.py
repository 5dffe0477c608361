"""A marimo app showing analyses the three ways the README gives (served by ``test_marimo.py``):
an ``Analysis`` as a cell's last expression, ``mo.ui.anywidget(a.widget())``, and
``widget=True`` (the widget shown before the trace, the calls streamed in); and a comparison
(``mw.compare``), whose view is a widget of its own."""

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="full")


@app.cell
def _():
    import marimo as mo
    import torch.nn as nn
    import transformers

    import meta_widget as mw

    return mo, mw, nn, transformers


@app.cell
def _(mw, transformers):
    config = transformers.GPT2Config(
        n_layer=2,
        n_embd=32,
        n_head=2,
        vocab_size=100,
        n_positions=64,
        architectures=["GPT2LMHeadModel"],
    )
    a = mw.analyze(config, input_size=(1, 16))
    a  # noqa: B018  (a cell's last expression is its output)
    return


@app.cell
def _(mo, mw, nn):
    mlp = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    b = mw.analyze(mlp, input_size=(32, 64))
    w = mo.ui.anywidget(b.widget())
    w  # noqa: B018
    return


@app.cell
def _(mw, nn):
    small = mw.analyze(nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 4)), input_size=(2, 8))
    wide = mw.analyze(nn.Sequential(nn.Linear(8, 32), nn.Linear(32, 4)), input_size=(2, 8))
    mw.compare(small, wide)
    return


@app.cell
def _(mw, nn):
    convs = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten())
    c = mw.analyze(convs, input_size=(1, 3, 16, 16), widget=True)
    return (c,)


if __name__ == "__main__":
    app.run()
