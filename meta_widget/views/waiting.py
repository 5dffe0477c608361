"""What a running analysis says it waits for (the ``waiting`` message, see
``meta_widget.views.protocol``), in words, for the states the pipeline knows it is in:

- ``warm-up``: the warm-up ``%load_ext meta_widget`` (or ``import meta_widget`` in a kernel)
  started is still loading PyTorch's meta path, and the analysis waits for it
  (``meta_widget.warm.wait``); its clock counts from the warm-up's own start;
- ``build``: the model is built (or copied) on the meta device, by the source that takes it;
- ``trace``: the module tree was sent (``start``) and the forward pass runs (the views count
  the calls and layers recorded as they stream in);
- ``analyze``: the trace ended; the memory report, totals and (with ``gpu=``) the time model.

No progress is made up: a state is sent when the pipeline enters it, and the front end's own
clock counts the seconds since (the kernel runs no timer for it).
"""

from __future__ import annotations

from ..choices import WaitState

__all__ = ["TRACE_TEXT", "WARM_UP_TEXT", "analyze_text", "build_text"]

#: (the analysis waits for the warm-up rather than import the same modules beside it)
WARM_UP_TEXT = "waiting for PyTorch's meta kernels to load (meta_widget's warm-up, started at load)"

#: the words for the model's build, by the source that builds it (``sources.models.SOURCES``)
BUILD_TEXTS = {
    "config": "building the model from its transformers config on the meta device",
    "hub": "building the Hub model from its config on the meta device",
    "module": "copying the model's structure to the meta device (no weight data)",
    "meta model": "preparing the meta model again",
    "factory": "building the model on the meta device (your function or class)",
    "pipeline": "building the pipeline's models on the meta device",
}


def build_text(source: str | None) -> str:
    """The build state's words for a model taken by ``source`` (a name in ``SOURCES``)."""
    if source is None:
        return "building the model on the meta device"
    return BUILD_TEXTS.get(source, f"building the model on the meta device (from a {source})")


#: the trace state's words before the first module call arrives (the views then count calls and
#: layers themselves). PyTorch's own first-forward imports (``torch._dynamo``, sympy: ~2,000
#: modules) are paid when ``meta_widget.analysis`` is imported (``meta_widget.trace.passes``
#: imports them before any trace), i.e. by the warm-up or at the first ``mw.analyze`` lookup,
#: before any widget exists: the trace itself has none left to pay.
TRACE_TEXT = "tracing: waiting for the first module call"


def analyze_text(gpu: str | None, training: bool) -> str:
    """The analyze state's words: what is computed from the trace."""
    parts = ["the memory timeline", "the totals per module"]
    if training:
        parts[0] = "the memory timeline of the step"
    if gpu is not None:
        parts.append(f"the time on {gpu}")
    return "analyzing the trace: " + ", ".join(parts[:-1]) + " and " + parts[-1]


#: the states, in the order an analysis goes through them
ORDER = (WaitState.WARM_UP, WaitState.BUILD, WaitState.TRACE, WaitState.ANALYZE)
