"""materialize refuses what it cannot do with meta_widget's own errors, never a raw torch error:
a checkpoint whose dtypes or names the diff flags, a device this build lacks or torch does not
know, an available_bytes that is not a number."""

from __future__ import annotations

import pathlib

import pytest
import torch

import meta_widget as mw
from meta_widget.checkpoints import checkpoint_diff, inspect_checkpoint
from meta_widget.materialization import MaterializeError, materialize
from meta_widget.options import OptionError, OptionTypeError


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)
        self.out = torch.nn.Linear(3, 2)


def _int8_state() -> dict[str, torch.Tensor]:
    return {k: torch.zeros_like(v, dtype=torch.int8) for k, v in Net().state_dict().items()}


@pytest.mark.parametrize("as_file", [True, False])
def test_an_int8_checkpoint_onto_float_parameters_is_refused_in_the_diffs_words(
    tmp_path: pathlib.Path, as_file: bool
) -> None:
    state = _int8_state()
    with pytest.raises(RuntimeError):  # the truth: torch cannot load it either
        Net().load_state_dict(state, assign=True)
    path = tmp_path / "int8.pt"
    torch.save(state, path)
    diff_line = next(
        line
        for line in str(checkpoint_diff(Net(), inspect_checkpoint(path))).splitlines()
        if line.startswith("dtype differs")
    )
    with pytest.raises(MaterializeError) as info:
        materialize(Net, checkpoint=path if as_file else state)
    assert diff_line in str(info.value)  # "dtype differs for 4 key(s), e.g. fc.weight: ..."
    assert "int8" in diff_line and "float32" in diff_line


def test_a_float16_checkpoint_still_loads_as_stored(tmp_path: pathlib.Path) -> None:
    state = {k: v.half() for k, v in Net().state_dict().items()}
    model, report = materialize(Net, checkpoint=state)
    assert model.fc.weight.dtype == torch.float16 and report.ok  # assign=True keeps it


def test_a_name_given_twice_is_refused(tmp_path: pathlib.Path) -> None:
    state: dict[str, object] = dict(Net().state_dict())
    state["fc"] = {"weight": torch.zeros(5, 4)}
    path = tmp_path / "twice.pt"
    torch.save(state, path)
    loaded = torch.load(path, weights_only=True)  # the truth: two tensors behind one name
    assert loaded["fc.weight"].shape != loaded["fc"]["weight"].shape
    with pytest.raises(MaterializeError, match=r"given twice in the checkpoint: fc\.weight"):
        materialize(Net, checkpoint=path)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a PyTorch build without CUDA")
def test_cuda_on_a_cpu_build_is_a_materialize_error() -> None:
    with pytest.raises(AssertionError):  # the truth: torch's own error
        torch.empty(0, device="cuda")
    with pytest.raises(MaterializeError, match=r"cannot allocate on cuda") as info:
        materialize(Net, device="cuda")
    assert "Nothing was allocated" in str(info.value)


def test_an_unknown_device_is_an_option_error() -> None:
    with pytest.raises(RuntimeError):  # the truth: torch does not know it
        torch.device("tpu:0")
    with pytest.raises(OptionError, match=r"device='tpu:0'\): torch knows no such device"):
        materialize(Net, device="tpu:0")
    with pytest.raises(OptionTypeError, match="not a int"):
        materialize(Net, device=3)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["lots", 1.5, True, [1]])
def test_available_bytes_must_be_a_number_of_bytes(value: object) -> None:
    with pytest.raises(OptionTypeError, match="available_bytes") as info:
        materialize(Net, available_bytes=value)  # type: ignore[arg-type]
    assert isinstance(info.value, mw.MetaWidgetError) and isinstance(info.value, TypeError)
    with pytest.raises(OptionError, match=">= 0"):
        materialize(Net, available_bytes=-1)
