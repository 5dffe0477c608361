"""What PyTorch made of a module, analyzed as the module: a ``torch.export`` program (through its
``.module()``) and a ``torch.compile``d module (its ``_orig_mod``) give the plain module's
parameters, FLOPs and peak exactly, and print no warning; TorchScript is refused in one line."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from models import SmallCNN

import meta_widget as mw


def numbers(a: mw.Analysis) -> tuple[int, int, int, int]:
    assert a.error is None, a.error
    return a.total_params, a.trainable_params, a.total_flops, a.peak_bytes


@pytest.fixture(scope="module")
def net() -> torch.nn.Module:
    torch.manual_seed(0)
    return SmallCNN().eval()


X = torch.randn(2, 3, 32, 32)


@pytest.mark.parametrize("mode", ["inference", "training"])
def test_exported_program_gives_the_plain_modules_numbers(
    net: torch.nn.Module, mode: str, capfd: pytest.CaptureFixture[str]
) -> None:
    # a program is fixed when exported: BatchNorm's batch statistics (training) or running
    # ones (inference) are in its graph, so it is exported in the mode it is analyzed in
    module = copy.deepcopy(net).train(mode == "training")
    program = torch.export.export(module, (X,))
    plain = mw.analyze(net, input_data=X, mode=mode)
    capfd.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exported = mw.analyze(program, input_data=X, mode=mode)
    assert [str(w.message) for w in caught] == []
    assert capfd.readouterr() == ("", "")
    assert numbers(exported) == numbers(plain)
    assert exported.source == "exported program"
    assert any("ExportedProgram" in n for n in exported.notes)


@pytest.mark.parametrize("mode", ["inference", "training"])
def test_compiled_module_gives_the_plain_modules_numbers_and_no_warning(
    net: torch.nn.Module, mode: str, capfd: pytest.CaptureFixture[str]
) -> None:
    compiled = torch.compile(net)
    plain = mw.analyze(net, input_data=X, mode=mode)
    capfd.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        a = mw.analyze(compiled, input_data=X, mode=mode)
    assert [str(w.message) for w in caught] == []
    assert capfd.readouterr() == ("", "")
    assert numbers(a) == numbers(plain)
    assert a.title == "SmallCNN" and a.source == "compiled module"
    # the tree is the module's own, call by call
    assert [n.path for n in a.modules] == [n.path for n in plain.modules]
    assert [n.flops for n in a.modules] == [n.flops for n in plain.modules]


@pytest.mark.parametrize("script", [torch.jit.script, lambda m: torch.jit.trace(m, X)])
def test_torchscript_is_refused_in_one_line(net: torch.nn.Module, script) -> None:  # type: ignore[no-untyped-def]
    with warnings.catch_warnings():  # torch deprecates TorchScript: not what is tested
        warnings.simplefilter("ignore", DeprecationWarning)
        scripted = script(net)
    with pytest.raises(mw.SourceError) as info:
        mw.analyze(scripted, input_data=X)
    message = str(info.value)
    assert "\n" not in message and "TorchScript" in message
    assert "torch.export.export" in message and "SmallCNN" in message
