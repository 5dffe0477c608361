"""The explanations of errors meta tensors raise, in the order they are tried.

``EXPLANATIONS`` is the registry (``meta_widget.registry``): each entry a matcher (a predicate
``(exc, message)`` or a regex over the message), a title, what happened and the fix. Specific
explanations come first: the first matching entry wins. ``register_explanation`` adds one (a
user's own, for the errors of their own code); ``meta_widget.trace.explain`` uses them.
"""

from __future__ import annotations

import linecache
import os
import re
import traceback
from collections.abc import Callable

from ..registry import Registry

__all__ = ["EXPLANATIONS", "register_explanation"]

_Matcher = Callable[[BaseException, str], bool]
#: the explanations by name: (matcher, title, explanation, fix); the first that matches wins
EXPLANATIONS: Registry[str, tuple[_Matcher, str, str, str]] = Registry("explanation")


def register_explanation(
    name: str,
    matcher: _Matcher | str,
    *,
    title: str,
    explanation: str,
    fix: str,
    first: bool = False,
) -> None:
    """Add an explanation; ``matcher`` is a predicate ``(exc, message)`` or a regex. It is
    tried after those registered before it (the first that matches wins), or before all of
    them with ``first``."""
    if isinstance(matcher, str):
        pattern = re.compile(matcher, re.IGNORECASE | re.DOTALL)

        def matches(_exc: BaseException, message: str) -> bool:
            return bool(pattern.search(message))

        matcher = matches
    EXPLANATIONS.register(name, (matcher, title, explanation, fix), first=first)


# -- specific explanations first: the first matching entry wins ----------------------------------


def _frames_mention(exc: BaseException, needle: str) -> bool:
    """True when a source line of ``exc``'s traceback contains ``needle``."""
    for frame in traceback.extract_tb(exc.__traceback__):
        code = frame.line or linecache.getline(frame.filename, frame.lineno or 0)
        if needle in code:
            return True
    return False


def _in_module_apply(exc: BaseException) -> bool:
    """True when ``exc`` was raised inside ``nn.Module._apply`` (``.to()``, ``.cpu()``...)."""
    return any(
        frame.name == "_apply"
        and frame.filename.replace(os.sep, "/").endswith("nn/modules/module.py")
        for frame in traceback.extract_tb(exc.__traceback__)
    )


register_explanation(
    "one_hot",
    lambda exc, message: (
        "cannot be called on meta tensors" in message and _frames_mention(exc, "one_hot")
    ),
    title="F.one_hot needs num_classes on meta",
    explanation=(
        "Without num_classes, F.one_hot reads the largest value of its input (an .item() call) "
        "to size its output; a meta tensor has no values."
    ),
    fix="Pass the number of classes: F.one_hot(labels, num_classes=N) (e.g. the vocabulary size).",
)
register_explanation(
    "load_meta_state_dict",
    r"Error\(s\) in loading state_dict.*Cannot copy out of meta tensor",
    title="A meta state dict was loaded into a real model",
    explanation=(
        "The state dict's tensors are on the meta device (the state_dict() of a meta model, or "
        "torch.load(..., map_location='meta')): they have shapes but no values, so there is "
        "nothing to copy into the model's real parameters."
    ),
    fix=(
        "Load the real weights: torch.load(path, map_location='cpu') or "
        "safetensors.torch.load_file(path). To only check names and shapes without reading "
        "data, use mw.analyze(model, checkpoint=path) (or mw.inspect_checkpoint(path))."
    ),
)
register_explanation(
    "module_move",
    lambda exc, message: "Cannot copy out of meta tensor" in message and _in_module_apply(exc),
    title="A meta module cannot be moved with .to()/.cpu()/.cuda()",
    explanation=(
        "The module's parameters live on the meta device: they have shapes but no data, so "
        "there is nothing to copy to another device."
    ),
    fix=(
        "Please use torch.nn.Module.to_empty(device=...) instead of .to(): it allocates real "
        "(uninitialized) memory; then call reset_parameters() on each module that has one, or "
        "load weights with model.load_state_dict(state_dict, assign=True). "
        "meta_widget.materialize(model) does both and keeps tied weights tied."
    ),
)
register_explanation(
    "numpy",
    r"can't convert meta device type tensor to numpy",
    title="NumPy was asked for the values of a meta tensor",
    explanation=(
        "A meta tensor has a shape and dtype but no values, so .numpy() has nothing to give."
    ),
    fix=(
        "Keep the computation in torch (no .numpy() inside forward), or skip that step for meta "
        "tensors (`if x.is_meta: ...`); for values, build the model for real (to_empty and "
        "reset_parameters, or meta_widget.materialize)."
    ),
)
register_explanation(
    "masked_select",
    r"aten::masked_select\b.*(no fake impl or Meta kernel|Meta)",
    title="masked_select has no meta kernel",
    explanation=(
        "torch.masked_select returns as many elements as the mask has True values, which a meta "
        "tensor cannot know, and PyTorch registers no meta kernel for it."
    ),
    fix=(
        "Keep the shape: torch.where(mask, x, 0) or x.masked_fill(~mask, 0); or write x[mask], "
        "which traces with an upper-bound size under mw.analyze(..., assume_nonzero=True) "
        "(PyTorch's torch.fx.experimental._config.meta_nonzero_assume_all_nonzero switch)."
    ),
)
register_explanation(
    "unique",
    r"aten::(_unique2|unique_dim|unique_consecutive|_unique)\b",
    title="unique has no meta kernel",
    explanation=(
        "torch.unique returns as many elements as there are distinct values, which a meta "
        "tensor cannot know, and PyTorch registers no meta kernel for it."
    ),
    fix=(
        "mw.analyze takes the upper bound (every value distinct) and marks the results as "
        "assumed. On plain meta, use a known upper bound instead (e.g. torch.arange(num_classes, "
        "device=x.device)), or skip that step when x.is_meta."
    ),
)
register_explanation(
    "bincount",
    r"aten::bincount\b",
    title="bincount has no meta kernel",
    explanation=(
        "torch.bincount returns max(x) + 1 counts (at least minlength): a size that depends on "
        "the values, which a meta tensor does not have, so PyTorch registers no meta kernel."
    ),
    fix=(
        "With a known number of bins N, count with a fixed size: torch.zeros(N, "
        "device=x.device).scatter_add_(0, x, torch.ones_like(x, dtype=torch.float)) (equal to "
        "torch.bincount(x, minlength=N) when every value is below N)."
    ),
)
register_explanation(
    "histogram",
    r"aten::histogram\b",
    title="torch.histogram has no meta kernel",
    explanation=(
        "torch.histogram computes its bin edges from the data when none are given, and PyTorch "
        "registers no meta kernel for it."
    ),
    fix=(
        "Use torch.histc(x, bins=N, min=LOW, max=HIGH): it has a meta kernel and returns N "
        "counts; or skip the step when x.is_meta."
    ),
)
register_explanation(
    "equal",
    r"aten::equal\b",
    title="torch.equal compares values a meta tensor does not have",
    explanation=(
        "torch.equal returns a Python bool computed from the values of both tensors; meta "
        "tensors have only shapes and dtypes, and PyTorch registers no meta kernel for it."
    ),
    fix=(
        "Compare what meta tensors have (a.shape == b.shape and a.dtype == b.dtype), or keep "
        "the comparison a tensor: (a == b).all(), whose truth value mw.analyze assumes and "
        "lists in Analysis.assumptions."
    ),
)
register_explanation(
    "repeat_interleave",
    r"cannot repeat_interleave a meta tensor without output_size",
    title="repeat_interleave needs output_size on meta",
    explanation=(
        "With a tensor of repeats, the output length is the sum of the repeats, a value a meta "
        "tensor does not have."
    ),
    fix="Pass the total length: torch.repeat_interleave(x, repeats, output_size=N).",
)
register_explanation(
    "selective_checkpoint_mismatch",
    r"encountered during backward but not found in storage|not found in storage\. This can",
    title="selective checkpointing saw another forward in the recomputation",
    explanation=(
        "torch.utils.checkpoint's selective mode hands the recomputation the outputs it saved "
        "by op and position, so the recomputed forward must run the same ops as the first. "
        "It ran others: most often a layer that writes a KV cache (a transformers model with "
        "use_cache=True) finds the cache grown by the forward and attends to twice the keys."
    ),
    fix=(
        "Turn the cache off for training, as transformers' own gradient checkpointing does: "
        "config.use_cache = False (or pass use_cache=False in the inputs). A real run with "
        "the same policy fails the same way."
    ),
)
register_explanation(
    "load_state_dict_noop",
    r"copying from a non-meta parameter in the checkpoint to a meta parameter.*no-op",
    title="load_state_dict into a meta model did nothing",
    explanation=(
        "load_state_dict copies values into the existing tensors, and a meta tensor has no "
        "memory to copy into: every key 'matches', yet every parameter stays on meta."
    ),
    fix=(
        "Load with model.load_state_dict(state_dict, assign=True), which puts the checkpoint's "
        "tensors in place of the meta ones (or use meta_widget.materialize(model, "
        "checkpoint=path))."
    ),
)

register_explanation(
    "matmul_shape",
    r"must have same reduction dim|mat1 and mat2 shapes cannot be multiplied",
    title="The input's last dimension does not fit this layer",
    explanation=(
        "A matrix multiplication (an nn.Linear, or x @ w) got an input whose last dimension "
        "differs from the weight's: on meta the message reads 'a and b must have same reduction "
        "dim, but got [.., IN] X [WANT, OUT]'. Usually the layer before produces another size "
        "than this layer was built for (a flatten after a conv sized for another image size)."
    ),
    fix=(
        "Make the layer's in_features equal the input's last dimension (the first number after "
        "'X' must equal the last number before it), or fix input_size; the failing call's input "
        "shapes are shown with the error."
    ),
)
register_explanation(
    "to_empty",
    r"Please use torch\.nn\.Module\.to_empty",
    title="A meta module cannot be moved with .to()",
    explanation=(
        "The module's parameters live on the meta device: they have shapes but no data, so "
        "there is nothing to copy to another device."
    ),
    fix=(
        "Allocate real (uninitialized) memory with module.to_empty(device='cpu'), then fill it: "
        "call reset_parameters() on each module that has one, or load a checkpoint with "
        "model.load_state_dict(state_dict, assign=True). mw.analyze(...).materialize() does both."
    ),
)
register_explanation(
    "copy_out",
    r"Cannot copy out of meta tensor",
    title="Data was read from a meta tensor",
    explanation=(
        "A meta tensor has a shape and dtype but no values, so .cpu(), .tolist(), .numpy() or "
        "printing its values cannot work."
    ),
    fix=(
        "Keep the computation on tensors (no .cpu()/.tolist()/.numpy() inside forward), or make "
        "that step skip meta tensors (`if x.is_meta: ...`). To get real values, build the model "
        "for real: module.to_empty(device='cpu') and load or initialize the weights."
    ),
)
register_explanation(
    "item",
    r"item\(\) cannot be called on meta tensors|cannot be called on meta tensors",
    title="Python needed a value from a meta tensor",
    explanation=(
        "Code asked for a tensor's value (.item(), int(t), float(t), bool(t), `if t:`, "
        "t.any()/t.all() used as a condition, or F.one_hot without num_classes). A meta tensor "
        "has no values, so this branch of the code cannot be decided on meta."
    ),
    fix=(
        "mw.analyze assumes truth values by default (strict=False) and lists the assumption; for "
        ".item()/int()/float() pass the value with assume={'file.py:LINE': value}. In your own "
        "code, pass such numbers as arguments (e.g. F.one_hot(x, num_classes=N))."
    ),
)
#: the title of the explanation of a multi-tensor optimizer step over DTensors and plain tensors:
#: which parameters are DTensors is the parallel layout's doing (``plan`` learns it per layout)
FOREACH_MIXED_TITLE = "A multi-tensor optimizer step over DTensors and plain tensors"
register_explanation(
    "foreach_mixed_dtensor",
    r"_foreach_\w+\S* got mixed torch\.Tensor and DTensor",
    title=FOREACH_MIXED_TITLE,
    explanation=(
        "The optimizer step runs as PyTorch runs it on CUDA: one multi-tensor (foreach) op per "
        "list of parameters. Tensor parallelism alone turned some parameters into DTensors and "
        "left others (norms, biases of modules outside the plan) plain tensors, and a foreach "
        "op cannot take both: a real run of torch.optim.AdamW(params) fails the same way."
    ),
    fix=(
        "Pass foreach=False (the optimizer one parameter at a time, as "
        "torch.optim.AdamW(params, foreach=False) runs; fused=True holds no more), or give "
        "every parameter a DTensor (FSDP's fully_shard does; SequenceParallel for the norms)."
    ),
)
register_explanation(
    "unbacked_size",
    r"may return an output Tensor with data-dependent shape|get_ctx\(\) for the meta",
    title="An op whose output size depends on values",
    explanation=(
        "The op's fake kernel asks for a data-dependent size (torch.library.get_ctx()."
        "new_dynamic_size()): how many elements it returns depends on the values, which meta "
        "tensors do not have. The op's name starts the message."
    ),
    fix=(
        "Give the trace an upper bound for that size, computed from the arguments' shapes: "
        "mw.register_bound('namespace::op', lambda *args, **kwargs: N) (e.g. the number of "
        "input rows). The outputs then get upper-bound shapes, marked as assumed."
    ),
)
register_explanation(
    "nonzero",
    r"data-independent implementation does not exist|aten::nonzero|meta_nonzero_assume_all_nonzero",
    title="A data-dependent shape (nonzero / boolean mask)",
    explanation=(
        "torch.nonzero, boolean-mask indexing (x[mask]) and routing in mixture-of-experts "
        "models return a tensor whose size depends on the values, which meta tensors do not have."
    ),
    fix=(
        "Analyze with assume_nonzero=True (every element is assumed selected: upper-bound "
        "shapes, marked as assumed), or rewrite with shape-stable ops (torch.where, "
        "masked_fill, gather)."
    ),
)
register_explanation(
    "no_meta_kernel",
    r"no fake impl or Meta kernel|Could not run '[^']+' with arguments from the 'Meta' backend",
    title="This operation has no meta implementation",
    explanation=(
        "PyTorch has no meta kernel for this op (masked_select and unique are examples): its "
        "output shape depends on data, or nobody wrote the shape rule."
    ),
    fix=(
        "Replace the op with a shape-stable one, or analyze with assume_nonzero=True where the "
        "op is a boolean selection. Otherwise trace that part on a real device with small inputs."
    ),
)
register_explanation(
    "meta_into_real",
    r"Tensor on device meta is not on the expected device (?!meta)",
    title="A meta tensor was given to a computation on a real device",
    explanation=(
        "An operation whose first tensor is on a real device (the 'expected device') was given "
        "a meta tensor. Most often a model built on meta (under torch.device('meta') or "
        "init_empty_weights) was called with a real input: in F.linear(input, weight) the "
        "input comes first, so its device is expected and the meta weight is refused. A tensor "
        "created inside forward without device= and combined with a meta tensor does the same."
    ),
    fix=(
        "Give a meta model meta inputs: torch.randn(shape, device='meta'), or let meta_widget "
        "convert them: mw.analyze(model, input_data=x) (or input_size=...). To run on real data, "
        "materialize the model first (model.to_empty(device='cpu') and load or initialize the "
        "weights, or mw.analyze(model).materialize()). Inside forward, create tensors with "
        "device=x.device."
    ),
)
register_explanation(
    "cpu_argument",
    r"to be on cpu, but it's on meta|should be a 1D CPU int64 tensor, but got .*\bmeta\b",
    title="An argument PyTorch reads on the host is a meta tensor",
    explanation=(
        "Some arguments are numbers that PyTorch reads on the CPU before it runs the op "
        "(pack_padded_sequence's lengths, tensor_split's indices): they must be Python lists "
        "or CPU tensors, and a meta tensor has no values to read."
    ),
    fix=(
        "Pass them as a Python list (pack_padded_sequence(x, lengths=[...]), "
        "torch.tensor_split(x, [1, 3])) or as a CPU tensor created without device=. With "
        "mw.analyze, give them in input_data as lists: every tensor in input_data becomes a "
        "meta tensor."
    ),
)
register_explanation(
    "device_mix",
    r"is not on the expected device meta|Expected all tensors to be on the same device"
    r"|found at least two devices|(same|different) device|not at the same device",
    title="A real tensor met a meta tensor",
    explanation=(
        "The forward pass mixed a meta tensor with a tensor on a real device: usually a tensor "
        "created inside forward without device= (torch.tensor(...), torch.arange(...)), or one "
        "kept as a plain attribute instead of a registered buffer."
    ),
    fix=(
        "Create tensors on the input's device (torch.arange(n, device=x.device)) and keep "
        "constant tensors as buffers (self.register_buffer('name', t)), so they follow the "
        "module. A module given meta inputs must be on meta too: build it under "
        "torch.device('meta'), or pass it to mw.analyze, which analyzes meta stand-ins."
    ),
)
register_explanation(
    "storage_bytes",
    r"Not available for 'meta' device type",
    title="The bytes of a meta tensor's storage were read",
    explanation=(
        "A meta tensor's storage has a size (untyped_storage().nbytes()) but no bytes, so it "
        "cannot be iterated, converted to a list or to bytes."
    ),
    fix=(
        "Read only sizes from meta storages (nbytes(), size()); skip the step that reads bytes "
        "when t.is_meta, or materialize the model for real values."
    ),
)
register_explanation(
    "pin_memory",
    r"cannot pin '\w*Meta\w*'",
    title="pin_memory was called on a meta tensor",
    explanation=(
        "Pinning locks a CPU tensor's memory for fast copies to a GPU; a meta tensor has no "
        "memory to lock."
    ),
    fix=(
        "Pin only real CPU tensors: `if not x.is_meta: x = x.pin_memory()`, or create the "
        "DataLoader with pin_memory=False while analyzing."
    ),
)
register_explanation(
    "dlpack",
    r"Cannot pack tensors on meta",
    title="A meta tensor cannot be shared through DLPack",
    explanation=(
        "DLPack hands another library a pointer to the tensor's memory; a meta tensor has none."
    ),
    fix=(
        "Keep the computation in torch while analyzing, or skip the export when x.is_meta "
        "(torch.utils.dlpack.to_dlpack, __dlpack__, and libraries that call them)."
    ),
)
register_explanation(
    "unallocated",
    r"but its data is not allocated yet",
    title="A kernel read the memory of a meta tensor",
    explanation=(
        "This operation's kernel reads its inputs' memory directly (a C++/CUDA extension, or "
        "an op such as fbgemm_linear_fp16_weight without a meta implementation), and a meta "
        "tensor has no memory."
    ),
    fix=(
        "Give the op a meta implementation (torch.library.register_fake for a custom op), or "
        "use standard torch ops for that step when x.is_meta (e.g. F.linear instead of the "
        "fused kernel)."
    ),
)
register_explanation(
    "ids_dtype",
    r"Expected tensor for argument #1 'indices' to have one of the following scalar types"
    r"|embedding.*(Long|Int)|indices.*(Long|Int)",
    title="An embedding was given floating-point input",
    explanation="nn.Embedding looks up rows by integer index; its input must be integer ids.",
    fix="Pass integer ids: mw.analyze(model, input_size=(1, 128), dtypes=[torch.long]).",
)
register_explanation(
    "shape",
    r"shapes cannot be multiplied|size mismatch|must match the size|Expected .*(input|size|shape)"
    r"|expected input|Given groups|not divisible|invalid for input of size|shape '\["
    r"|Attempting to broadcast a dimension",
    title="The input's shape does not fit this layer",
    explanation=(
        "A layer received a tensor whose shape differs from what it was built for: the "
        "input_size given to analyze, or the output of the layer before, does not match."
    ),
    fix=(
        "Compare the failing call's input shapes (shown with the error) with the layer's "
        "parameters, then fix input_size (batch dimension included) or the layer's sizes."
    ),
)


#: registry entries for errors the meta device itself raises (the others, e.g. shape errors,
#: happen on real devices too)
