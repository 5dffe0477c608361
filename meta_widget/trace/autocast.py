"""Autocast on meta: the casts ``torch.autocast`` would make on the target device, made here.

Meta tensors never take the autocast path: autocast's dispatch keys (``AutocastCPU``,
``AutocastCUDA``) apply to tensors of their backend only, and a meta tensor is neither, so under
``torch.autocast`` a meta trace runs every op in float32 (checked by the tests). While tracing
with ``analyze(..., autocast=torch.bfloat16)``, :class:`Autocast` (a ``TorchFunctionMode``) applies
the policy of the target device's autocast kernels to each torch function whose name is in that
device's lists, transcribed from PyTorch's ``aten/src/ATen/autocast_mode.cpp`` (the tests check
that every name is registered for that dispatch key in the running PyTorch, and compare dtypes
with a real CPU autocast):

- **lower precision** (matmuls, convolutions, linear, attention): every floating argument is cast
  to the autocast dtype. Casts of parameters (leaf fp32 tensors that require grad) are cached, as
  autocast caches them: one low-precision copy per weight, alive until the autocast region ends
  (the forward pass and the loss), or longer when autograd saved it for backward.
- **fp32** (norms and losses on CUDA, many more ops on the CPU): 16-bit arguments cast to fp32.
- **fp32 output** (``softmax``, ``log_softmax``, ``sum``, ``cumsum``, ``prod`` on CUDA): the op
  runs with ``dtype=torch.float32`` (its input is read as is, its output is fp32).
- **promote** (``cat``, ``stack``, ``addcmul``...): every floating argument cast to the widest
  floating dtype among them.

Other ops run on their arguments' dtypes, with PyTorch's type promotion, as under autocast.

Limits (documented in the README): the casts are applied where a torch function is called, and
the mode does not see the torch functions that a Python function (most of
``torch.nn.functional``) calls inside: those are taken by what they run (``F.cross_entropy`` as
``cross_entropy_loss``, ``F.grid_sample`` as ``grid_sampler``, ``torch.lu`` as
``_lu_with_info``, ``F.multi_head_attention_forward`` as a ``linear``: its weights and inputs
cast), and ``F.interpolate`` and ``F.pad`` by the op their arguments pick (``mode="area"`` on a
volume is ``adaptive_avg_pool3d``, ``mode="reflect"`` on two dimensions ``reflection_pad2d``).
Ops that autocast reaches only inside a composite op are listed by the composite's name where
we know them (``einsum`` and ``tensordot`` on the CPU reach ``bmm``/``mm``), and CUDA's
``cross_entropy`` (``log_softmax`` then ``nll_loss``) is cast as one fp32 op.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["CPU_POLICY", "CUDA_POLICY", "Autocast", "Cast", "policy_for"]


class Cast(Enum):
    """What autocast does to one op's arguments (``autocast_mode.cpp``'s cast policies)."""

    LOWER = "lower_precision_fp"
    FP32 = "fp32"
    SET_DTYPE = "fp32_set_opt_dtype"
    PROMOTE = "promote"


def _table(**groups: str) -> dict[str, Cast]:
    return {name: Cast[group] for group, names in groups.items() for name in names.split()}


#: ``TORCH_LIBRARY_IMPL(aten, AutocastCUDA, m)``, by op name (overloads share a policy)
CUDA_POLICY = _table(
    LOWER="""_convolution conv1d conv2d conv3d conv_tbc conv_transpose1d conv_transpose2d
        conv_transpose3d convolution prelu addmm addmv addr matmul einsum mm mv linalg_vecdot
        linear addbmm baddbmm bmm chain_matmul linalg_multi_dot _thnn_fused_lstm_cell
        _thnn_fused_gru_cell lstm_cell gru_cell rnn_tanh_cell rnn_relu_cell
        _scaled_dot_product_flash_attention scaled_dot_product_attention cudnn_convolution
        cudnn_convolution_transpose""",
    FP32="""acos asin cosh erfinv exp expm1 log log10 log2 log1p reciprocal rsqrt sinh tan pow
        softplus layer_norm native_layer_norm group_norm frobenius_norm nuclear_norm
        cosine_similarity poisson_nll_loss cosine_embedding_loss nll_loss nll_loss2d
        hinge_embedding_loss kl_div l1_loss smooth_l1_loss huber_loss mse_loss
        margin_ranking_loss multilabel_margin_loss soft_margin_loss triplet_margin_loss
        multi_margin_loss binary_cross_entropy_with_logits dist pdist cdist renorm logsumexp
        upsample_nearest1d _upsample_nearest_exact1d upsample_nearest2d _upsample_nearest_exact2d
        upsample_nearest3d _upsample_nearest_exact3d upsample_linear1d upsample_bilinear2d
        _upsample_bilinear2d_aa upsample_trilinear3d upsample_bicubic2d _upsample_bicubic2d_aa
        rms_norm binary_cross_entropy cross_entropy_loss""",
    SET_DTYPE="""prod softmax log_softmax cumprod cumsum linalg_vector_norm linalg_matrix_norm
        sum norm""",
    PROMOTE="addcdiv addcmul atan2 bilinear cross dot vdot grid_sampler index_put tensordot "
    "scatter_add",
)

#: ``TORCH_LIBRARY_IMPL(aten, AutocastCPU, m)``; ``einsum``/``tensordot`` reach ``bmm``/``mm``
CPU_POLICY = _table(
    LOWER="""conv1d conv2d conv3d bmm mm linalg_vecdot baddbmm addmm addbmm linear _convolution
        matmul conv_tbc mkldnn_rnn_layer conv_transpose1d conv_transpose2d conv_transpose3d prelu
        scaled_dot_product_attention _native_multi_head_attention _addmm_activation
        einsum tensordot""",
    FP32="""avg_pool3d binary_cross_entropy grid_sampler polar prod quantile nanquantile stft
        cdist grid_sampler_2d _grid_sampler_2d_cpu_fallback grid_sampler_3d trace view_as_complex
        cholesky cholesky_inverse cholesky_solve inverse lu_solve orgqr ormqr pinverse max_pool3d
        max_unpool2d max_unpool3d adaptive_avg_pool3d reflection_pad1d reflection_pad2d
        replication_pad1d replication_pad2d replication_pad3d mse_loss cosine_embedding_loss
        nll_loss nll_loss2d hinge_embedding_loss poisson_nll_loss smooth_l1_loss
        cross_entropy_loss l1_loss huber_loss margin_ranking_loss soft_margin_loss
        triplet_margin_loss multi_margin_loss ctc_loss kl_div multilabel_margin_loss
        binary_cross_entropy_with_logits fft_fft fft_ifft fft_fft2 fft_ifft2 fft_fftn fft_ifftn
        fft_rfft fft_irfft fft_rfft2 fft_irfft2 fft_rfftn fft_irfftn fft_hfft fft_ihfft
        linalg_cond linalg_matrix_rank linalg_solve linalg_cholesky linalg_svdvals
        linalg_eigvals linalg_eigvalsh linalg_inv linalg_householder_product linalg_tensorinv
        linalg_tensorsolve fake_quantize_per_tensor_affine geqrf _lu_with_info qr svd
        triangular_solve fractional_max_pool2d fractional_max_pool3d adaptive_max_pool3d
        multilabel_margin_loss_forward linalg_qr linalg_cholesky_ex linalg_svd linalg_eig
        linalg_eigh linalg_lstsq linalg_inv_ex""",
    PROMOTE="stack cat index_copy",
)

#: torch-level names of the same ops (``x @ w`` reaches the mode as ``matmul`` already), and
#: Python functions of ``torch.nn.functional`` by what they run (the torch functions a Python
#: function calls are not seen by the mode: it is off while the function runs)
_ALIASES = {
    "__matmul__": "matmul",
    "__rmatmul__": "matmul",
    "__pow__": "pow",
    "__rpow__": "pow",
    "cross_entropy": "cross_entropy_loss",
    "grid_sample": "grid_sampler",
    "lu": "_lu_with_info",
    "multi_head_attention_forward": "linear",
}


def _interpolate_op(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """The op ``F.interpolate(input, size, scale_factor, mode, align_corners,
    recompute_scale_factor, antialias)`` reaches: by ``mode`` and the input's spatial rank."""
    x = args[0] if args else kwargs.get("input")
    mode = kwargs.get("mode", args[3] if len(args) > 3 else "nearest")
    antialias = kwargs.get("antialias", args[6] if len(args) > 6 else False)
    n = x.dim() - 2 if isinstance(x, torch.Tensor) else 0
    ops = {
        "nearest": f"upsample_nearest{n}d",
        "nearest-exact": f"_upsample_nearest_exact{n}d",
        "area": f"adaptive_avg_pool{n}d",
        "linear": "upsample_linear1d",
        "bilinear": "_upsample_bilinear2d_aa" if antialias else "upsample_bilinear2d",
        "trilinear": "upsample_trilinear3d",
        "bicubic": "_upsample_bicubic2d_aa" if antialias else "upsample_bicubic2d",
    }
    return ops.get(mode, "")


def _pad_op(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """The op ``F.pad(input, pad, mode, value)`` reaches: ``reflection_pad{n}d`` or
    ``replication_pad{n}d`` for ``n`` padded dimensions (other modes reach no listed op)."""
    pad = args[1] if len(args) > 1 else kwargs.get("pad", ())
    mode = kwargs.get("mode", args[2] if len(args) > 2 else "constant")
    prefix = {"reflect": "reflection", "replicate": "replication"}.get(mode)
    return f"{prefix}_pad{len(pad) // 2}d" if prefix is not None else ""


#: Python functions whose op depends on their arguments (a mode, the input's rank)
_BY_ARGUMENTS: dict[str, Callable[[tuple[Any, ...], dict[str, Any]], str]] = {
    "interpolate": _interpolate_op,
    "pad": _pad_op,
}
_LOW = (torch.bfloat16, torch.float16)
#: a function's cast, none, or what names its op from its arguments (see ``_BY_ARGUMENTS``)
_Plan = Cast | Callable[[tuple[Any, ...], dict[str, Any]], str] | None


#: names in the tables that autocast reaches inside a composite op (see the module docstring)
COMPOSITES = {"cuda": frozenset({"cross_entropy_loss"}), "cpu": frozenset({"einsum", "tensordot"})}


def registered(key: str) -> frozenset[str]:
    """The op names (overloads dropped) the running PyTorch registers for dispatch ``key``."""
    names = torch._C._dispatch_get_registrations_for_dispatch_key(key)
    return frozenset(n.removeprefix("aten::").split(".")[0] for n in names)


def _running(table: dict[str, Cast], key: str, composites: frozenset[str]) -> dict[str, Cast]:
    """``table`` less the ops the running PyTorch's autocast does not have (CUDA's
    ``rms_norm`` in 2.11, seen on a GPU: it stays in the input's dtype there)."""
    known = registered(key) | composites
    return {name: cast for name, cast in table.items() if name in known}


_RUNNING = {
    "cuda": _running(CUDA_POLICY, "AutocastCUDA", COMPOSITES["cuda"]),
    "cpu": _running(CPU_POLICY, "AutocastCPU", COMPOSITES["cpu"]),
}


def policy_for(device: str) -> dict[str, Cast]:
    """The autocast table of the target ``device`` (``"cuda"``; ``"cpu"`` and ``"math"``: the
    CPU's), less the ops the running PyTorch's autocast does not register."""
    return _RUNNING["cuda" if device == "cuda" else "cpu"]


def _eligible(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64


class Autocast(TorchFunctionMode):
    """While active, torch functions take the casts ``torch.autocast(device, dtype)`` makes.

    ``with Autocast("cuda", torch.bfloat16): model(x)``. The cache of parameter casts is dropped
    when the outermost ``with`` ends, as autocast's is.
    """

    def __init__(self, device: str, dtype: torch.dtype) -> None:
        super().__init__()
        self.table = policy_for(device)
        self.dtype = dtype
        self.cache: dict[int, torch.Tensor] = {}
        self._plans: dict[Any, _Plan] = {}
        self._depth = 0

    def __enter__(self) -> Autocast:
        self._depth += 1
        super().__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        self._depth -= 1
        if self._depth == 0:
            self.cache.clear()

    def __torch_function__(
        self,
        func: Any,
        types_: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func in self._plans:
            plan = self._plans[func]
        else:
            plan = self._plans[func] = self._plan(func)
        if plan is not None and not isinstance(plan, Cast):
            plan = self.table.get(plan(args, kwargs))
        if plan is not None:
            args, kwargs = self._apply(plan, args, kwargs)
        return func(*args, **kwargs)

    def _plan(self, func: Callable[..., Any]) -> _Plan:
        """``func``'s cast; for a function whose op depends on its arguments, what names
        that op."""
        name = getattr(func, "__name__", "")
        chooser = _BY_ARGUMENTS.get(name)
        if chooser is not None:
            return chooser
        return self.table.get(_ALIASES.get(name, name))

    def _apply(
        self, cast: Cast, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        if cast is Cast.SET_DTYPE:
            first = next((a for a in args if isinstance(a, torch.Tensor)), None)
            if _eligible(first) and kwargs.get("dtype") is None:
                kwargs = {**kwargs, "dtype": torch.float32}
            return args, kwargs
        if cast is Cast.LOWER:
            to = self.dtype
        elif cast is Cast.FP32:
            to = torch.float32
        else:  # promote: fp32 if any floating argument is fp32
            found = [t.dtype for t in _tensors(args, kwargs) if _eligible(t)]
            to = torch.float32 if torch.float32 in found else self.dtype
        return (
            tuple(self._cast(a, to) for a in args),
            {k: self._cast(v, to) for k, v in kwargs.items()},
        )

    def _cast(self, value: Any, to: torch.dtype) -> Any:
        if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
            return type(value)(self._cast(v, to) for v in value)
        if not _eligible(value) or value.dtype == to:
            return value
        if to == torch.float32 and value.dtype not in _LOW:
            return value
        cache = (
            to == self.dtype
            and value.dtype == torch.float32
            and value.requires_grad
            and value.is_leaf
            and not value._is_view()
        )
        if not cache:
            return value.to(to)
        found = self.cache.get(id(value))
        if found is None:
            found = self.cache[id(value)] = value.to(to)
        return found


def _tensors(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for v in (*args, *kwargs.values()):
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            out.extend(t for t in v if isinstance(t, torch.Tensor))
    return out
