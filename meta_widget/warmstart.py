"""What the warm-up does (``meta_widget.warm`` runs it): PyTorch's first meta forward and
backward, on a two-by-two layer; the package modules an analysis and its widget load; and, when
transformers is installed, its model base and the Llama family's modules (what a first analysis
of a decoder config would import: ~1 s of the first analysis in a fresh kernel), then a
one-layer Llama built on meta and run forward and backward under a dispatch mode of this thread
(:func:`run_tiny_decoder`): the first calls of a decoder's ops through a Python dispatch mode, as
the recorder's are (each op's Python overload objects, its meta kernel's first run, the regular
expressions transformers compiles when a model is made). After it, the first analysis of a
small decoder takes 1.1x a warm one's (``benchmarks/warm_start.py``), 1.8x without it.

Importing transformers' model base imports what it integrates (torchao, when installed), which
logs warnings about kernels it cannot load on this machine ("Failed to load …_C_mxfp8…so") and
torch's ``_pytree`` logs deprecations; from a background thread those would land under whatever
cell the user runs at that moment. So the warm-up drops the log records of its own thread while
it imports (``heavy.quiet_logs``): records of the user's threads pass as before. (They concern
running kernels on a GPU, which a meta trace never does.)

It touches nothing global: no module hooks, no dispatch mode but one of its own thread (mode
stacks are per thread), nothing the user's own code in the main thread could see (a filter on
the logging handlers, for the records of its own thread, while it runs). Modules run in it only
while no global module hook is registered (``register_module_forward_hook`` and its kin: the
user's would be called from this thread); with one, the first analysis pays those first calls.
Started by ``%load_ext meta_widget`` and by ``import meta_widget`` in a Jupyter kernel;
``META_WIDGET_WARMUP=0`` turns it off.
"""

from __future__ import annotations

import importlib
import importlib.util
import os

from . import heavy, warm

__all__ = ["start", "start_in_kernel", "warm_up"]

#: the package modules the first analysis (and its widget, in a kernel) would load
MODULES = (".pipeline", ".analysis")
WIDGET_MODULES = (".views.widget",)
#: transformers' modules a first analysis of a (Llama-family) decoder config imports
TRANSFORMERS_MODULES = ("transformers.modeling_utils", "transformers.models.llama.modeling_llama")


def warm_up() -> None:
    """The warm-up itself: a meta forward and backward, the analysis's modules, transformers'
    model base and a tiny decoder's first run."""
    torch = heavy.torch()
    if not global_module_hooks():
        layer = torch.nn.Linear(2, 2, device="meta")
        x = torch.ones(1, 2, device="meta", requires_grad=True)
        layer(x).sum().backward()
    with warm.imports:  # not while the user's thread imports them (``mw.Analysis``)
        for name in (*MODULES, *(WIDGET_MODULES if warm.in_kernel() else ())):
            importlib.import_module(name, "meta_widget")
    if importlib.util.find_spec("transformers") is not None:
        with heavy.quiet_logs() as cover:
            importlib.import_module("transformers.utils.logging")  # its handler, made at import
            cover()
            for name in TRANSFORMERS_MODULES:
                importlib.import_module(name)
            if not global_module_hooks():
                run_tiny_decoder()


def global_module_hooks() -> bool:
    """Whether any global module hook is registered (forward, backward or registration
    hooks: ``torch.nn.modules.module.register_module_*``)."""
    module = heavy.torch().nn.modules.module
    tables = (
        "_global_forward_pre_hooks",
        "_global_forward_hooks",
        "_global_backward_pre_hooks",
        "_global_backward_hooks",
        "_global_module_registration_hooks",
        "_global_parameter_registration_hooks",
        "_global_buffer_registration_hooks",
    )
    return any(getattr(module, name, None) for name in tables)


def run_tiny_decoder() -> None:
    """A one-layer Llama (hidden 32) built on meta, its loss's forward and backward run under a
    pass-through dispatch mode of this thread: what a first trace would otherwise pay."""
    torch = heavy.torch()
    transformers = heavy.transformers()

    class _PassThrough(torch.utils._python_dispatch.TorchDispatchMode):  # type: ignore[misc,name-defined]
        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            return False  # as the recorder's mode: no ``torch._dynamo`` import for it

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            return func(*args, **(kwargs or {}))

    config = transformers.LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=64,
    )
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config)
    ids = torch.zeros(1, 8, dtype=torch.long, device="meta")
    with _PassThrough():
        model(input_ids=ids, labels=ids).loss.backward()


def enabled() -> bool:
    return os.environ.get("META_WIDGET_WARMUP", "1") not in ("0", "", "false", "no")


def start() -> bool:
    """Start the warm-up (once per process); False when off or already started."""
    return enabled() and warm.start(warm_up)


def start_in_kernel() -> bool:
    """``import meta_widget``: start the warm-up when this is a Jupyter kernel."""
    return warm.in_kernel() and start()
