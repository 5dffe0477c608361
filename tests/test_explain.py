"""Every error of META-FACTS.md's table, raised for real on meta tensors, explained with its fix."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import meta_widget as mw
from meta_widget.trace.explain import explanation_name, is_meta_error

X = torch.randn(4, 3, device="meta")
MASK = torch.ones(4, 3, dtype=torch.bool, device="meta")


# one function per row; the raising statement is the line after the def
def item() -> None:
    X.sum().item()


def truth() -> None:
    if X.sum() > 0:
        pass


def nonzero() -> None:
    torch.nonzero(X)


def boolean_mask() -> None:
    X[MASK]


def cpu() -> None:
    X.cpu()


def tolist() -> None:
    X.tolist()


def numpy() -> None:
    X.numpy()


def module_to() -> None:
    nn.Linear(3, 2, device="meta").to("cpu")


def masked_select() -> None:
    torch.masked_select(X, MASK)


def unique() -> None:
    torch.unique(X)


def one_hot() -> None:
    F.one_hot(torch.zeros(5, dtype=torch.long, device="meta"))


def device_mix() -> None:
    X + torch.ones(4, 3)


def repeat_interleave() -> None:
    torch.repeat_interleave(torch.tensor([1, 2], device="meta"))


def load_state_dict_into_meta() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        nn.Linear(3, 2, device="meta").load_state_dict(nn.Linear(3, 2).state_dict())


# (raiser, exception type, the exact PyTorch message (part), registry entry, the fix must say)
ROWS: list[tuple[Callable[[], None], type[BaseException], str, str, list[str]]] = [
    (item, RuntimeError, "Tensor.item() cannot be called on meta tensors", "item", ["assume="]),
    (truth, RuntimeError, "Tensor.item() cannot be called on meta tensors", "item", ["assume="]),
    (
        nonzero,
        NotImplementedError,
        "a correct data-independent implementation does not exist",
        "nonzero",
        ["assume_nonzero=True", "torch.where"],
    ),
    (
        boolean_mask,
        NotImplementedError,
        "meta_nonzero_assume_all_nonzero",
        "nonzero",
        ["assume_nonzero=True"],
    ),
    (cpu, NotImplementedError, "Cannot copy out of meta tensor; no data!", "copy_out", ["is_meta"]),
    (
        tolist,
        NotImplementedError,
        "Cannot copy out of meta tensor; no data!",
        "copy_out",
        [".tolist"],
    ),
    (numpy, TypeError, "can't convert meta device type tensor to numpy", "numpy", ["is_meta"]),
    (
        module_to,
        NotImplementedError,
        "Please use torch.nn.Module.to_empty() instead",
        "module_move",
        ["to_empty(device=", "reset_parameters()", "assign=True"],
    ),
    (
        masked_select,
        NotImplementedError,
        "no fake impl or Meta kernel registered",
        "masked_select",
        ["torch.where(mask, x, 0)"],
    ),
    (
        unique,
        NotImplementedError,
        "no fake impl or Meta kernel registered",
        "unique",
        ["upper bound", "is_meta"],
    ),
    (
        one_hot,
        RuntimeError,
        "Tensor.item() cannot be called on meta tensors",
        "one_hot",
        ["num_classes=N"],
    ),
    (
        device_mix,
        RuntimeError,
        "Tensor on device cpu is not on the expected device meta!",
        "device_mix",
        ["device=x.device", "register_buffer"],
    ),
    (
        repeat_interleave,
        RuntimeError,
        "cannot repeat_interleave a meta tensor without output_size",
        "repeat_interleave",
        ["output_size="],
    ),
    (
        load_state_dict_into_meta,
        UserWarning,
        "copying from a non-meta parameter in the checkpoint to a meta parameter",
        "load_state_dict_noop",
        ["assign=True"],
    ),
]


@pytest.mark.parametrize(
    ("raiser", "kind", "message", "entry", "fix"), ROWS, ids=[r[0].__name__ for r in ROWS]
)
def test_each_meta_error_is_explained_with_its_fix(
    raiser: Callable[[], None], kind: type[BaseException], message: str, entry: str, fix: list[str]
) -> None:
    with pytest.raises(kind) as info:
        raiser()
    exc = info.value
    assert message in str(exc)  # the error PyTorch raises today, as META-FACTS.md records it
    assert explanation_name(exc) == entry
    explained = mw.explain(exc)
    for words in fix:
        assert words in explained.fix, (words, explained.fix)
    assert is_meta_error(exc)
    assert explained.title != "The forward pass raised an error"
    # the source line is this file's raising statement, not PyTorch's
    assert explained.file is not None and explained.file.endswith("test_explain.py")
    if raiser is not load_state_dict_into_meta:
        assert explained.line == raiser.__code__.co_firstlineno + 1
    assert explained.fix in str(explained)


def test_a_zero_dim_cpu_scalar_mixes_fine_and_real_errors_are_not_meta_errors() -> None:
    assert (X + torch.tensor(2.0)).is_meta  # META-FACTS: 0-dim CPU scalars are allowed
    with pytest.raises(RuntimeError) as shape_error:
        nn.Linear(3, 2)(torch.ones(4, 5))
    assert not is_meta_error(shape_error.value)
    assert "in_features" in mw.explain(shape_error.value).fix
    with pytest.raises(RuntimeError) as meta_shape_error:
        nn.Linear(3, 2, device="meta")(torch.ones(4, 5, device="meta"))
    assert "same reduction dim" in str(meta_shape_error.value)
    assert explanation_name(meta_shape_error.value) == "matmul_shape"
    assert not is_meta_error(meta_shape_error.value)  # a real bug: it fails on CPU too
    with pytest.raises(ZeroDivisionError) as zero:
        _ = 1 / 0
    assert explanation_name(zero.value) is None and not is_meta_error(zero.value)
    with pytest.raises(RuntimeError) as cuda_mix:
        raise RuntimeError(
            "Expected all tensors to be on the same device, but found at least two devices, "
            "cuda:0 and cpu!"
        )
    assert not is_meta_error(cuda_mix.value)  # a device mix without meta is not ours


class Inner(nn.Module):
    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.proj(x)
        if self.how == "numpy":
            return torch.as_tensor(x.numpy())
        if self.how == "tolist":
            return torch.tensor(x.tolist())
        if self.how == "device_mix":  # an explicit CPU tensor (a device-less one lands on meta)
            return x + torch.ones(x.shape, device="cpu")
        return torch.bincount(x.long().flatten())


class Outer(nn.Module):
    def __init__(self, how: str) -> None:
        super().__init__()
        self.pre = nn.Linear(4, 4)
        self.block = Inner(how)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(self.pre(x))


def _line_of(text: str) -> int:
    import inspect

    lines, start = inspect.getsourcelines(Inner.forward)
    return start + next(i for i, line in enumerate(lines) if text in line)


@pytest.mark.parametrize(
    ("how", "entry", "code"),
    [
        ("numpy", "numpy", "x.numpy()"),
        ("tolist", "copy_out", "x.tolist()"),
        ("device_mix", "device_mix", 'torch.ones(x.shape, device="cpu")'),
        ("bincount", "bincount", "torch.bincount(x.long().flatten())"),
    ],
)
def test_in_a_model_the_error_points_to_the_module_and_the_line(
    how: str, entry: str, code: str
) -> None:
    a = mw.analyze(Outer(how), input_size=(2, 4))
    assert a.error is not None
    assert a.error.module == "block"
    assert a.error.file is not None and a.error.file.endswith("test_explain.py")
    assert a.error.line == _line_of(code)
    fixes = {
        "numpy": "is_meta",
        "copy_out": "is_meta",
        "device_mix": "device=x.device",
        "bincount": "minlength=N",
    }
    assert fixes[entry] in a.error.fix
