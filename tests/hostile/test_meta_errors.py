"""Every error message the meta device raises in PyTorch 2.13, produced by running the failing op.

Each row runs real code on meta tensors (nothing typed by hand) and checks that the message is
the one PyTorch raises today, that ``is_meta_error`` recognises it, and that ``explain`` gives the
specific explanation (not the generic one) with a fix that names the right remedy. The list was
found by running ~150 ops on meta (data-dependent sizes, value reads, device mixes in both
orders, storages, kernels without meta implementations) and keeping every distinct message.
"""

from __future__ import annotations

import io
import pickle
import warnings
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import meta_widget as mw
from meta_widget.trace.explain import META_ERRORS, explanation_name, is_meta_error

GENERIC = "The forward pass raised an error"
X = torch.randn(4, 3, device="meta")
CPU = torch.randn(4, 3)
MASK = torch.ones(4, 3, dtype=torch.bool, device="meta")
IDS = torch.tensor([1, 2, 0], device="meta")


def _strict_warnings(run: Callable[[], object]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run()


# one raiser per row: (id, raiser, exception type, part of PyTorch's message, entry, fix words)
Row = tuple[str, Callable[[], object], type[BaseException], str, str, list[str]]
ITEM = "Tensor.item() cannot be called on meta tensors"
NONZERO = "a correct data-independent implementation does not exist"
COPY = "Cannot copy out of meta tensor; no data!"
NO_KERNEL = "no fake impl or Meta kernel registered"
ROWS: list[Row] = [
    # values read by Python
    ("item", lambda: X.sum().item(), RuntimeError, ITEM, "item", ["assume="]),
    ("bool", lambda: bool(X.sum()), RuntimeError, ITEM, "item", ["assume="]),
    ("int", lambda: int(X.sum()), RuntimeError, ITEM, "item", ["assume="]),
    ("index_a_list", lambda: [1, 2, 3][IDS[0]], RuntimeError, ITEM, "item", ["assume="]),
    ("size_from_tensor", lambda: X.view(IDS[0], -1), RuntimeError, ITEM, "item", ["assume="]),
    ("allclose", lambda: torch.allclose(X, X), RuntimeError, ITEM, "item", ["assume="]),
    (
        "one_hot",
        lambda: F.one_hot(torch.zeros(5, dtype=torch.long, device="meta")),
        RuntimeError,
        ITEM,
        "one_hot",
        ["num_classes=N"],
    ),
    # data-dependent sizes
    (
        "nonzero",
        lambda: torch.nonzero(X),
        NotImplementedError,
        NONZERO,
        "nonzero",
        ["assume_nonzero=True"],
    ),
    (
        "boolean_mask",
        lambda: X[MASK],
        NotImplementedError,
        NONZERO,
        "nonzero",
        ["assume_nonzero=True"],
    ),
    (
        "where_one_arg",
        lambda: torch.where(MASK),
        NotImplementedError,
        NONZERO,
        "nonzero",
        ["torch.where"],
    ),
    (
        "argwhere",
        lambda: torch.argwhere(X),
        NotImplementedError,
        NONZERO,
        "nonzero",
        ["assume_nonzero=True"],
    ),
    (
        "masked_select",
        lambda: torch.masked_select(X, MASK),
        NotImplementedError,
        NO_KERNEL,
        "masked_select",
        ["torch.where(mask, x, 0)"],
    ),
    ("unique", lambda: torch.unique(X), NotImplementedError, NO_KERNEL, "unique", ["upper bound"]),
    (
        "unique_dim",
        lambda: torch.unique(X, dim=0),
        NotImplementedError,
        NO_KERNEL,
        "unique",
        ["upper bound"],
    ),
    (
        "unique_consecutive",
        lambda: torch.unique_consecutive(X),
        NotImplementedError,
        NO_KERNEL,
        "unique",
        ["upper bound"],
    ),
    (
        "repeat_interleave",
        lambda: torch.repeat_interleave(X, torch.tensor([1, 2, 1, 1], device="meta"), dim=0),
        RuntimeError,
        "cannot repeat_interleave a meta tensor without output_size",
        "repeat_interleave",
        ["output_size="],
    ),
    (
        "bincount",
        lambda: torch.bincount(IDS),
        NotImplementedError,
        NO_KERNEL,
        "bincount",
        ["scatter_add_"],
    ),
    (
        "histogram",
        lambda: torch.histogram(X),
        NotImplementedError,
        NO_KERNEL,
        "histogram",
        ["torch.histc"],
    ),
    (
        "equal",
        lambda: torch.equal(X, X),
        NotImplementedError,
        NO_KERNEL,
        "equal",
        ["a.shape == b.shape"],
    ),
    (
        "lstsq",
        lambda: torch.linalg.lstsq(X[:3], X[:3]),
        NotImplementedError,
        NO_KERNEL,
        "no_meta_kernel",
        ["shape-stable"],
    ),
    (
        "ctc_loss",
        lambda: F.ctc_loss(
            torch.randn(5, 1, 4, device="meta"),
            torch.tensor([[1, 2]], device="meta"),
            torch.tensor([5]),
            torch.tensor([2]),
        ),
        NotImplementedError,
        NO_KERNEL,
        "no_meta_kernel",
        ["shape-stable"],
    ),
    # values copied out
    ("cpu", lambda: X.cpu(), NotImplementedError, COPY, "copy_out", ["is_meta"]),
    ("to_cpu", lambda: X.to("cpu"), NotImplementedError, COPY, "copy_out", ["is_meta"]),
    ("tolist", lambda: X.tolist(), NotImplementedError, COPY, "copy_out", [".tolist"]),
    ("copy_into_cpu", lambda: CPU.copy_(X), NotImplementedError, COPY, "copy_out", ["is_meta"]),
    (
        "pickle_storage",
        lambda: pickle.dumps(X.untyped_storage()),
        NotImplementedError,
        COPY,
        "copy_out",
        ["is_meta"],
    ),
    (
        "numpy",
        lambda: X.numpy(),
        TypeError,
        "can't convert meta device type tensor to numpy",
        "numpy",
        ["is_meta"],
    ),
    (
        "array",
        lambda: X.__array__(),
        TypeError,
        "can't convert meta device type tensor to numpy",
        "numpy",
        ["is_meta"],
    ),
    (
        "storage_bytes",
        lambda: bytes(X.untyped_storage()),
        NotImplementedError,
        "Not available for 'meta' device type",
        "storage_bytes",
        ["nbytes()"],
    ),
    (
        "pin_memory",
        lambda: X.pin_memory(),
        RuntimeError,
        "cannot pin 'MetaFloatType'",
        "pin_memory",
        ["pin_memory=False"],
    ),
    (
        "dlpack",
        lambda: torch.utils.dlpack.to_dlpack(X),
        BufferError,
        "Cannot pack tensors on meta",
        "dlpack",
        ["x.is_meta"],
    ),
    (
        "kernel_reads_memory",
        lambda: _strict_warnings_off(
            lambda: torch.fbgemm_linear_fp16_weight(
                X, torch.randn(3, 2, device="meta"), torch.zeros(2, device="meta")
            )
        ),
        RuntimeError,
        "its data is not allocated yet",
        "unallocated",
        ["register_fake"],
    ),
    # modules and state dicts
    (
        "module_to",
        lambda: nn.Linear(3, 2, device="meta").to("cpu"),
        NotImplementedError,
        "Please use torch.nn.Module.to_empty() instead",
        "module_move",
        ["to_empty(device=", "assign=True"],
    ),
    (
        "module_cpu",
        lambda: nn.Linear(3, 2, device="meta").cpu(),
        NotImplementedError,
        COPY,
        "module_move",
        ["to_empty(device="],
    ),
    (
        "load_meta_state_dict_into_real",
        lambda: nn.Linear(3, 2).load_state_dict(nn.Linear(3, 2, device="meta").state_dict()),
        RuntimeError,
        COPY,
        "load_meta_state_dict",
        ["map_location='cpu'", "checkpoint=path"],
    ),
    (
        "load_real_state_dict_into_meta",
        lambda: _strict_warnings(
            lambda: nn.Linear(3, 2, device="meta").load_state_dict(nn.Linear(3, 2).state_dict())
        ),
        UserWarning,
        "copying from a non-meta parameter in the checkpoint to a meta parameter",
        "load_state_dict_noop",
        ["assign=True"],
    ),
    # a meta tensor and a real one in one op: both orders, and the other wordings
    (
        "meta_then_cpu",
        lambda: X + CPU,
        RuntimeError,
        "Tensor on device cpu is not on the expected device meta!",
        "device_mix",
        ["device=x.device", "register_buffer"],
    ),
    (
        "cpu_then_meta",
        lambda: CPU + X,
        RuntimeError,
        "Tensor on device meta is not on the expected device cpu!",
        "meta_into_real",
        ["device='meta'", "input_data=x"],
    ),
    (
        "meta_model_cpu_input",
        lambda: nn.Linear(3, 2, device="meta")(CPU),
        RuntimeError,
        "Tensor on device meta is not on the expected device cpu!",
        "meta_into_real",
        ["device='meta'", "input_data=x"],
    ),
    (
        "cpu_model_meta_input",
        lambda: nn.LayerNorm(3)(X),
        RuntimeError,
        "Tensor on device cpu is not on the expected device meta!",
        "device_mix",
        ["mw.analyze"],
    ),
    (
        "cross_entropy_cpu_targets",
        lambda: F.cross_entropy(CPU, torch.tensor([0, 1, 2, 0], device="meta")),
        RuntimeError,
        "Tensor on device cpu is not on the expected device meta!",
        "device_mix",
        ["device=x.device"],
    ),
    (
        "rnn_cpu_weights_meta_input",
        lambda: nn.LSTM(4, 4)(torch.randn(3, 2, 4, device="meta")),
        RuntimeError,
        "found input tensor at meta and parameter tensor at cpu",
        "device_mix",
        ["torch.device('meta')"],
    ),
    (
        "sdpa_mix",
        lambda: F.scaled_dot_product_attention(X[None], CPU[None], CPU[None]),
        RuntimeError,
        "query.device: meta key.device: cpu",
        "device_mix",
        ["device=x.device"],
    ),
    (
        "index_add_mix",
        lambda: X.index_add(0, torch.tensor([0]), torch.ones(1, 3)),
        RuntimeError,
        "expected to be in the same device, but got (self) meta, (index) cpu",
        "device_mix",
        ["device=x.device"],
    ),
    (
        "set_storage_mix",
        lambda: torch.empty(0).set_(X.untyped_storage()),
        RuntimeError,
        'to a storage on different device "meta"',
        "device_mix",
        ["device=x.device"],
    ),
    (
        "pack_lengths_on_meta",
        lambda: nn.utils.rnn.pack_padded_sequence(
            torch.randn(3, 2, 4, device="meta"), torch.tensor([3, 2], device="meta")
        ),
        RuntimeError,
        "'lengths' argument should be a 1D CPU int64 tensor, but got 1D meta Long tensor",
        "cpu_argument",
        ["lengths=[...]", "input_data as lists"],
    ),
    (
        "tensor_split_meta_indices",
        lambda: torch.tensor_split(X, torch.tensor([1], device="meta")),
        RuntimeError,
        "tensor_split expected tensor_indices_or_sections to be on cpu, but it's on meta",
        "cpu_argument",
        ["Python list"],
    ),
]


def _strict_warnings_off(run: Callable[[], object]) -> object:
    # fbgemm_linear_fp16_weight warns that it is deprecated before it fails
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return run()


def _raise(raiser: Callable[[], object], kind: type[BaseException]) -> BaseException:
    with pytest.raises(kind) as info:
        raiser()
    return info.value


@pytest.mark.parametrize(
    ("raiser", "kind", "message", "entry", "fix"),
    [row[1:] for row in ROWS],
    ids=[row[0] for row in ROWS],
)
def test_every_meta_error_is_recognised_and_explained(
    raiser: Callable[[], object],
    kind: type[BaseException],
    message: str,
    entry: str,
    fix: list[str],
) -> None:
    exc = _raise(raiser, kind)
    assert message in str(exc)  # the message PyTorch raises today
    assert is_meta_error(exc)
    assert explanation_name(exc) == entry
    explained = mw.explain(exc)
    assert explained.title != GENERIC
    for words in fix:
        assert words in explained.fix, (words, explained.fix)
    # the same message pasted as text (a traceback's last line) is explained the same way,
    # except for entries that also read the traceback (one_hot, module moves)
    pasted = mw.explain(f"{type(exc).__name__}: {exc}")
    assert pasted.type == type(exc).__name__ and pasted.message == str(exc)
    if entry not in ("one_hot", "module_move"):
        assert pasted.title == explained.title and is_meta_error(str(exc))


def test_the_catalogue_covers_every_meta_entry() -> None:
    produced = {row[4] for row in ROWS}
    # "to_empty" explains the module-move message when the traceback is gone (pickled across a
    # process, or pasted as text): checked below with the real message
    assert META_ERRORS - produced == {"to_empty"}
    exc = _raise(lambda: nn.Linear(3, 2, device="meta").to("cpu"), NotImplementedError)
    bare = NotImplementedError(str(exc))  # no traceback: not raised inside Module._apply
    assert explanation_name(bare) == "to_empty" and is_meta_error(bare)
    assert "to_empty(device='cpu')" in mw.explain(bare).fix


def test_the_two_device_mix_wordings_get_the_fix_for_their_direction() -> None:
    into_real = mw.explain(_raise(lambda: CPU * X, RuntimeError))
    into_meta = mw.explain(_raise(lambda: X * CPU, RuntimeError))
    assert (
        "expected device cpu" in into_real.message and "expected device meta" in into_meta.message
    )
    assert into_real.title != into_meta.title
    assert "meta inputs" in into_real.fix and "register_buffer" in into_meta.fix


def test_errors_real_devices_raise_too_are_not_meta_errors() -> None:
    shape = _raise(lambda: nn.Linear(3, 2)(torch.ones(4, 5)), RuntimeError)
    unsorted = _raise(
        lambda: nn.utils.rnn.pack_padded_sequence(torch.randn(3, 2, 4), torch.tensor([2, 3])),
        RuntimeError,
    )
    as_index = _raise(lambda: range(torch.ones(2)), TypeError)
    for exc in (shape, unsorted, as_index, ZeroDivisionError("division by zero")):
        assert not is_meta_error(exc), exc
    # a device mix without meta (cuda and cpu) is not ours either
    assert not is_meta_error(
        "RuntimeError: Expected all tensors to be on the same device, but found at least two "
        "devices, cuda:0 and cpu!"
    )


def test_explain_takes_a_message_and_refuses_other_objects() -> None:
    buffer = io.StringIO()
    explained = mw.explain("Tensor.item() cannot be called on meta tensors")
    assert explained.type == "" and explained.title != GENERIC and explained.file is None
    print(explained, file=buffer)
    assert buffer.getvalue().startswith("Python needed a value from a meta tensor: Tensor.item()")
    assert mw.explain("text").title == GENERIC
    for wrong in (3, None, ["RuntimeError"]):
        with pytest.raises(TypeError, match="explain\\(\\) takes an exception or an error message"):
            mw.explain(wrong)  # type: ignore[arg-type]
