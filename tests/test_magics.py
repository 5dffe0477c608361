"""The IPython extension, driven through a real InteractiveShell."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output
from models import SmallCNN, llama_config
from safetensors.torch import save_file

import meta_widget as mw
from meta_widget.checkpoints import CheckpointInfo
from meta_widget.magics import parse_magic_line

WIDGET = "application/vnd.jupyter.widget-view+json"


@pytest.fixture
def ip() -> Iterator[InteractiveShell]:
    shell = InteractiveShell.instance()
    shell.run_line_magic("colors", "nocolor")
    before = (shell.custom_exceptions, shell.CustomTB)
    shell.run_line_magic("load_ext", "meta_widget")
    shell.user_ns.update(torch=torch, nn=torch.nn, SmallCNN=SmallCNN, llama_config=llama_config)
    yield shell
    shell.run_line_magic("unload_ext", "meta_widget")
    assert (shell.custom_exceptions, shell.CustomTB) == before


def run(ip: InteractiveShell, cell: str) -> tuple[Any, Any]:
    with capture_output() as cap:
        result = ip.run_cell(cell)
    return result, cap


def test_meta_line_magic_on_a_module(ip: InteractiveShell) -> None:
    net = SmallCNN()
    ip.user_ns["net"] = net
    result, _ = run(ip, "a = %meta net --input 2,3,32,32")
    assert result.success
    a = ip.user_ns["a"]
    assert isinstance(a, mw.Analysis)
    assert a.total_params == sum(p.numel() for p in net.parameters())
    with torch.no_grad():
        out = net(torch.randn(2, 3, 32, 32))
    assert a.calls[0].path == "" and a.calls[0].outputs[0][1].shape == tuple(out.shape)
    assert all(not p.is_meta for p in net.parameters())  # the user's module stays real
    # as the cell's last line, the analysis is the cell's result (displayed as the widget)
    result, _ = run(ip, "%meta net --input 1,3,32,32 --mode training")
    assert isinstance(result.result, mw.Analysis) and result.result.mode == "training"
    assert result.result.calls[0].inputs[0][1].shape == (1, 3, 32, 32)


def test_meta_on_a_class_a_factory_a_config_and_dtypes(ip: InteractiveShell) -> None:
    result, _ = run(ip, "%meta SmallCNN --input 1,3,32,32")
    assert result.result.total_params == sum(p.numel() for p in SmallCNN().parameters())
    result, _ = run(ip, "%meta lambda: nn.Linear(8, 4) --input 3,8")
    assert result.result.calls[0].outputs[0][1].shape == (3, 4)
    result, _ = run(ip, "%meta llama_config() --input 1,5 --dtype long")
    a = result.result
    assert a.error is None and a.title == "LlamaForCausalLM"
    assert a.calls[0].inputs[0][1].dtype == "int64"
    args = parse_magic_line(
        "model(3, x=1) --input 1,2 --input 3x4 --dtype long --dtype half --depth 2"
    )
    assert args.expr == "model(3, x=1)" and args.input_size == [(1, 2), (3, 4)]
    assert args.dtypes == [torch.int64, torch.float16] and args.depth == 2


def test_meta_on_a_checkpoint_path(ip: InteractiveShell, tmp_path: pathlib.Path) -> None:
    path = tmp_path / "w.safetensors"
    save_file({"a.weight": torch.zeros(3, 4), "a.bias": torch.zeros(3)}, str(path))
    ip.user_ns["ckpt"] = str(path)
    for line in ("%meta ckpt", f"%meta '{path}'", f"%meta {path}"):
        result, _ = run(ip, line)
        info = result.result
        assert isinstance(info, CheckpointInfo), line
        assert {t.name: t.shape for t in info} == {"a.weight": (3, 4), "a.bias": (3,)}


def test_cell_magic_builds_on_meta_and_shows_every_new_module(ip: InteractiveShell) -> None:
    keep = torch.nn.Linear(2, 2)
    ip.user_ns.update(keep=keep, net=torch.nn.Linear(2, 2))
    cell = (
        "%%meta --input 1,100000\n"
        "big = nn.Linear(100_000, 100_000)  # 40 GB if it were real\n"
        "small = nn.Linear(100_000, 3)\n"
        "net = nn.Sequential(nn.Linear(100_000, 4))  # a name bound again\n"
        "count = 5\n"
    )
    result, cap = run(ip, cell)
    assert result.success, result.error_in_exec
    assert ip.user_ns["big"].weight.is_meta and ip.user_ns["keep"] is keep
    shown = [line.split(":")[0] for line in cap.stdout.splitlines() if ":" in line]
    assert shown == ["net", "big", "small"]  # the namespace's order; `keep` and `count` not shown
    # each analysis is two outputs: the widget, then its static view with the summary text
    assert len(cap.outputs) == 6
    assert [WIDGET in o.data for o in cap.outputs] == [True, False] * 3
    texts = [o.data["text/plain"] for o in cap.outputs[1::2]]
    assert "10.0 B" in texts[1]  # 100,000 x 100,000 + 100,000 parameters
    # the modules are analyzed with the inputs: the Linear's output shape is there
    assert "[1, 3]" in texts[2]
    result, cap = run(ip, "%%meta\nn = 3")
    assert result.success and "bound no nn.Module" in cap.stdout


@pytest.mark.parametrize(
    ("cell", "message"),
    [
        ("%meta net --bogus 3", "unrecognized arguments: --bogus"),
        ("%meta net --input 1,a", "cannot read the shape '1,a'"),
        ("%meta net --input 1,2 --dtype float32 --dtype long", "give one dtype per input"),
        ("%meta net --input 1,,8", "cannot read the shape '1,,8': a dimension is missing"),
        ("%meta net --input 1,8,", "cannot read the shape '1,8,': a dimension is missing"),
        ("%meta net --depth -1", "depth must be 0 or more"),
        ("%meta NeedsArgs --input 1,8", "the class NeedsArgs needs arguments to build the model"),
        ("%meta net --input 9999999999,9999999999", "more than a tensor can hold"),
        ("%meta net --dtype quarter", "unknown dtype 'quarter'"),
        ("%meta net --mode fast", "invalid choice: 'fast'"),
        ("%meta net --depth x", "invalid int value: 'x'"),
        ("%meta count", "'count' evaluates to int, not a model"),
        ("%meta nothing_here", "cannot evaluate 'nothing_here' (NameError"),
        ("%meta", "%meta needs a model"),
        ("%%meta net\nx = 1", "%%meta takes only options on its line"),
        ("%meta ckpt --input 1,2", "--input do(es) not apply to a checkpoint"),
        ("%meta bad_path", "neither a safetensors file nor a torch.save file"),
    ],
)
def test_bad_arguments_give_one_line_usage_errors(
    ip: InteractiveShell, tmp_path: pathlib.Path, cell: str, message: str
) -> None:
    ckpt = tmp_path / "c.safetensors"
    save_file({"w": torch.zeros(2)}, str(ckpt))
    bad = tmp_path / "bad.bin"
    bad.write_text("not a checkpoint")

    class NeedsArgs(torch.nn.Module):
        def __init__(self, width: int) -> None:
            super().__init__()

    ip.user_ns.update(
        net=SmallCNN(), count=3, ckpt=str(ckpt), bad_path=str(bad), NeedsArgs=NeedsArgs
    )
    result, cap = run(ip, cell)
    err = result.error_in_exec
    assert isinstance(err, UsageError), err
    assert message in str(err) and "\n" not in str(err)
    assert "UsageError" in cap.stderr + cap.stdout and "Traceback" not in cap.stdout


def test_meta_errors_in_other_cells_are_explained_below_the_traceback(
    ip: InteractiveShell,
) -> None:
    result, cap = run(ip, "x = torch.ones(2, device='meta')\nvalues = x.tolist()")
    assert isinstance(result.error_in_exec, NotImplementedError)
    out = cap.stdout
    trace = out.index("NotImplementedError")
    assert "values = x.tolist()" in out  # the usual traceback, with the cell's line
    explained = out.index("meta_widget explains: Data was read from a meta tensor")
    assert trace < explained and "Fix: Keep the computation on tensors" in out
    result, cap = run(ip, "lin = nn.Linear(2, 2, device='meta')\nlin.to('cpu')")
    assert "Please use torch.nn.Module.to_empty()" in cap.stdout
    assert "Fix: Please use torch.nn.Module.to_empty(device=...)" in cap.stdout
    # other errors: the usual traceback only
    result, cap = run(ip, "1 / 0")
    assert isinstance(result.error_in_exec, ZeroDivisionError)
    assert "ZeroDivisionError" in cap.stdout and "meta_widget explains" not in cap.stdout
    result, cap = run(ip, "nn.Linear(2, 3)(torch.ones(4, 5))")
    assert "mat1 and mat2 shapes cannot be multiplied" in cap.stdout
    assert "meta_widget explains" not in cap.stdout


def test_a_shape_mismatch_on_meta_is_explained_and_named_by_its_cell(ip: InteractiveShell) -> None:
    """Issue 40, item 5: the explanation names the cell as IPython's traceback does (``Cell
    In[N], line M``, not the kernel's temp file), and a plain shape mismatch on meta (whose words
    differ from CPU's) is explained like the meta errors."""
    cell = "lin = nn.Linear(4, 5, device='meta')\nx = torch.ones(2, 6, device='meta')\nlin(x)"
    result, cap = run(ip, cell)
    assert isinstance(result.error_in_exec, RuntimeError)
    number = result.execution_count
    out = cap.stdout
    assert f"Cell In[{number}], line 3" in out  # IPython's own traceback names it so
    explained = out[out.index("meta_widget explains:") :]
    assert "same reduction dim" in explained
    assert "Fix: Make the layer's in_features equal the input's last dimension" in explained
    assert f"at Cell In[{number}], line 3\n    lin(x)" in explained
    # the Explanation names the cell too; a file outside a cell keeps its path
    e = mw.explain(result.error_in_exec)
    assert (e.file, e.line, e.code) == (f"Cell In[{number}]", 3, "lin(x)")
    # an elementwise mismatch on meta (PyTorch's reference implementation raises it)
    result, cap = run(ip, "torch.ones(2, 6, device='meta') + torch.ones(2, 5, device='meta')")
    assert "meta_widget explains: The input's shape does not fit this layer" in cap.stdout


def test_unload_removes_everything_and_restores_the_previous_handler() -> None:
    shell = InteractiveShell.instance()
    shell.run_line_magic("colors", "nocolor")
    seen: list[str] = []

    def mine(self: Any, etype: Any, value: Any, tb: Any, tb_offset: Any = None) -> list[str]:
        seen.append(str(value))
        return ["handled by mine"]

    shell.set_custom_exc((ValueError,), mine)
    previous = shell.CustomTB
    try:
        shell.run_line_magic("load_ext", "meta_widget")
        assert shell.CustomTB is not previous
        assert "meta" in shell.magics_manager.magics["line"]
        assert "meta" in shell.magics_manager.magics["cell"]
        run(shell, "raise ValueError('for mine')")
        assert seen == ["for mine"]  # the handler that was there still gets its exceptions
        shell.run_line_magic("unload_ext", "meta_widget")
        assert shell.CustomTB is previous and shell.custom_exceptions == (ValueError,)
        assert "meta" not in shell.magics_manager.magics["line"]
        assert "meta" not in shell.magics_manager.magics["cell"]
        _, cap = run(shell, "import torch\ntorch.ones(2, device='meta').tolist()")
        assert "Cannot copy out of meta tensor" in cap.stdout
        assert "meta_widget explains" not in cap.stdout
        result, _ = run(shell, "%meta x")
        assert not result.success and "meta" in str(result.error_in_exec)  # no such magic
    finally:
        shell.set_custom_exc((), None)
        shell.custom_exceptions = ()


def test_tb_and_debug_see_the_last_error_also_when_it_is_explained(
    ip: InteractiveShell, monkeypatch: pytest.MonkeyPatch
) -> None:
    import io
    import sys

    run(ip, "1 / 0")  # an earlier, different error: what %tb showed before the fix
    assert isinstance(sys.last_value, ZeroDivisionError)
    result, cap = run(ip, "x = torch.ones(2, device='meta')\nvalues = x.tolist()")
    err = result.error_in_exec
    assert isinstance(err, NotImplementedError) and "meta_widget explains" in cap.stdout
    assert sys.last_value is err and sys.last_type is NotImplementedError
    assert sys.last_traceback is err.__traceback__
    if sys.version_info >= (3, 12):
        assert sys.last_exc is err  # type: ignore[attr-defined]
    _, cap = run(ip, "%tb")
    assert "Cannot copy out of meta tensor" in cap.stdout and "values = x.tolist()" in cap.stdout
    assert "ZeroDivisionError" not in cap.stdout
    # %debug opens the debugger on that traceback: its innermost user frame is the cell's line
    monkeypatch.setattr(sys, "stdin", io.StringIO("p x.device\nquit\n"))
    _, cap = run(ip, "%debug")
    assert "device(type='meta')" in cap.stdout, cap.stdout
    # an error a previously installed handler takes is recorded too
    ip.run_line_magic("unload_ext", "meta_widget")
    original = (ip.custom_exceptions, ip.CustomTB)
    ip.set_custom_exc((KeyError,), lambda self, et, ev, tb, tb_offset=None: ["mine"])
    try:
        ip.run_line_magic("load_ext", "meta_widget")
        result, _ = run(ip, "{}['missing']")
        assert isinstance(result.error_in_exec, KeyError)
        assert sys.last_value is result.error_in_exec
    finally:
        ip.run_line_magic("unload_ext", "meta_widget")
        ip.custom_exceptions, ip.CustomTB = original
        ip.run_line_magic("load_ext", "meta_widget")
