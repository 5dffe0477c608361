"""``MetaWidget``: the anywidget that shows an analysis, and streams calls while tracing.

State is in traits (``payload``: the whole analysis, saved with the notebook); live events are
custom messages (see ``meta_widget.views.protocol``).
"""

from __future__ import annotations

import html
import json
import pathlib
import time
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import anywidget
import traitlets
from IPython.display import display

from ..choices import Device, KernelMessage, Mode, Optimizer, Status, WaitState
from .fallback import fallback_html
from .protocol import (
    MESSAGE_TYPES_FROM_JS,
    Dictionary,
    drop_zero_columns,
    encode_calls,
    encode_error,
    encode_header,
)

if TYPE_CHECKING:
    from ..data.records import CallRecord
    from ..data.tree import ModuleNode
    from ..trace.explain import Explanation
    from .analyzed import Analyzed

STATIC = pathlib.Path(__file__).parent.parent / "static"

#: what the front end may change when it asks for a re-run, and the values it may send
RERUN_OPTIONS: dict[str, tuple[Any, ...]] = {
    "mode": tuple(m.value for m in Mode),
    "optimizer": (*(o.value for o in Optimizer), None),
    "device": tuple(d.value for d in Device),
}

#: the widget output's ``text/plain``: its static view is the next output
WIDGET_TEXT = "meta_widget: the interactive view (its static view and summary follow)"

#: Rules that show either the widget or the static view after it, never both: a widget's output
#: with no widget in it (no model for it: "Error displaying widget: model not found", or still
#: loading) is hidden while its static view follows it; a static view after a mounted widget is
#: hidden. JupyterLab / Notebook 7 / nbconvert's lab template (``jp-OutputArea-child``) and the
#: classic template (``output_area``). Kept by a trusted output (a notebook run or saved here)
#: and nbconvert; a sanitizer drops them, and then the view hides the static output itself.
STATIC_RULES = "".join(
    f"{c}:not(:has(.mw-root)):has(+ {c} .mw-static){{display:none}}"
    f"{c}:has(.mw-root) + {c}:has(.mw-static){{display:none}}"
    for c in (".jp-OutputArea-child", ".output_area")
)


def static_bundle(analysis: Analyzed) -> dict[str, str]:
    """The output that follows the widget's: the static view as HTML, the summary as text."""
    return {
        "text/html": f"<style>{STATIC_RULES}</style><div class='mw-static'>"
        f"{fallback_html(analysis)}</div>",
        "text/plain": analysis.summary(),
    }


#: the module shown where the front end was not built
NOT_BUILT = """
export default { render({ el }) {
  el.textContent = "meta_widget: the front end is not built (run `npm install && npm run build`).";
} };
"""


def asset(name: str, fallback: str) -> pathlib.Path | str:
    """The built file ``name`` in ``static/``, or ``fallback`` where it was not built."""
    path = STATIC / name
    return path if path.exists() else fallback


class MetaWidget(anywidget.AnyWidget):  # type: ignore[misc]
    """The module tree, charts and details of an analysis, live while it is recorded."""

    _esm = asset("widget.js", NOT_BUILT)
    _css = asset("widget.css", "")

    payload = traitlets.Dict().tag(sync=True)
    selected = traitlets.Int(-1).tag(sync=True)
    depth = traitlets.Int(3).tag(sync=True)
    #: this widget's own id: the front end keeps what the kernel streamed to it under it, so
    #: that a view mounting after the stream's ``start`` (sent as soon as the widget is
    #: displayed, before any view exists) starts from it (``initialize`` in ``js/widget.ts``)
    stream_id = traitlets.Unicode().tag(sync=True)

    @traitlets.default("stream_id")
    def _stream_id_default(self) -> str:
        return uuid.uuid4().hex

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.on_msg(self._on_message)

    #: the Analysis shown, when the kernel has it (the mode/optimizer/device switches re-run it
    #: and put the new one here)
    analysis: Analyzed | None = None
    #: the output that showed this widget before its analysis existed (``analyze(...,
    #: widget=True)``): IPython's display handle, updated once when the analysis is there, so
    #: that this output too carries the static view (see ``_repr_mimebundle_``)
    live_display: Any = None
    #: the ``done`` message of the last finished stream, sent again to a view that mounts later
    #: (the view re-created by that update, or another display of this widget): its progress
    #: line then says how many calls were recorded in how long, as the streamed view did
    last_done: dict[str, Any] | None = None
    #: the placeholder output below a widget shown before its analysis (IPython's display
    #: handle), which ``update_live_display`` fills with the static view
    static_display: Any = None
    #: when the analysis this widget will show started (set by the pipeline: ``analyze``'s start,
    #: the model's build included; a re-run: its start), for the ``done`` message's ``total_s``
    run_started: float | None = None

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        """The widget, with the summary as text (front ends that show one bundle per object:
        marimo, VS Code's text view). Jupyter front ends go through ``_ipython_display_``."""
        bundle = super()._repr_mimebundle_(**kwargs)
        if self.analysis is None or bundle is None:
            return bundle
        data, meta = bundle if isinstance(bundle, tuple) else (bundle, {})
        data["text/plain"] = self.analysis.summary()
        return data, meta

    def _ipython_display_(self) -> None:
        """Two outputs: the widget, then its static view (``static_bundle``).

        A notebook saved without its widget state (JupyterLab's default) or opened where no
        widget manager loads (nbconvert's HTML offline, GitHub) has the widget's output but no
        model for it: JupyterLab shows "Error displaying widget: model not found" for it and
        never the ``text/html`` of the same output, so the static view is an output of its own.
        Its style rules hide whichever of the two is not wanted: the static view once the
        widget mounted beside it, the widget's output while it shows no widget (the view hides
        the static output too, where a sanitizer dropped the rules). Displayed before its
        analysis exists (``widget=True``), the second output is a placeholder that
        ``update_live_display`` fills when the analysis ends.
        """
        bundle = super()._repr_mimebundle_()
        if bundle is None:
            return
        data, meta = bundle if isinstance(bundle, tuple) else (bundle, {})
        data["text/plain"] = WIDGET_TEXT
        display(data, metadata=meta, raw=True)
        if self.analysis is not None:
            display(static_bundle(self.analysis), raw=True)
        elif not self.payload:  # widget=True: the analysis comes later
            self.static_display = display({"text/plain": ""}, raw=True, display_id=True)

    def _on_message(self, _widget: Any, content: Any, _buffers: Any) -> None:
        """A custom message from a view: run its handler (``MESSAGE_HANDLERS``); a message of
        no known type, or not an object, is ignored (a newer front end may send more)."""
        if not isinstance(content, dict):
            return
        handler = MESSAGE_HANDLERS.get(str(content.get("type")))
        if handler is not None:
            handler(self, content)

    def _on_hello(self, _content: dict[str, Any]) -> None:
        """A view mounted: say this kernel-side widget is alive (a view restored from a saved
        notebook without its kernel gets no answer, and keeps its switches off)."""
        self.send({"type": KernelMessage.READY.value})
        if self.last_done is not None:
            self.send(self.last_done)

    def _on_select(self, content: dict[str, Any]) -> None:
        """The user selected a module row: it becomes the ``selected`` trait."""
        module = content.get("module")
        if isinstance(module, int):
            self.selected = module

    def _on_rerun(self, content: dict[str, Any]) -> None:
        """The switches changed: analyze again with the options the message carries."""
        self.rerun(**{k: content[k] for k in RERUN_OPTIONS if k in content})

    def rerun(self, **changes: Any) -> None:
        """Re-analyze with ``changes`` (mode, optimizer, device), streaming into this widget."""
        if self.analysis is None:
            self.send(
                {
                    "type": "error",
                    "error": {
                        "type": "NoKernelModel",
                        "message": (
                            "This view has no model in the kernel to re-run (a saved notebook "
                            "or a page): run the cell again."
                        ),
                        "title": "Cannot re-run",
                        "explanation": "",
                        "fix": "",
                    },
                }
            )
            return
        for key, value in changes.items():
            allowed = RERUN_OPTIONS[key]
            if value not in allowed:
                raise ValueError(f"{key} must be one of {allowed}, not {value!r}")
        if changes.get("mode", self.analysis.mode) == "inference":
            # the switches always send the optimizer (its menu is only disabled in inference):
            # keep the analysis's own for a later training run, and no "not used" note
            changes.pop("optimizer", None)
        self.run_started = time.perf_counter()
        self.analysis = self.analysis.rerun(widget=self, **changes)

    def show(self, analysis: Analyzed) -> None:
        """Show a finished analysis (sets the ``payload`` trait)."""
        self.payload = analysis.to_payload()

    def update_live_display(self) -> None:
        """Fill the placeholder output that ``_ipython_display_`` left below a widget shown
        before its analysis (``analyze(..., widget=True)``) with the analysis's static view.

        Once: after a re-run from the switches the views already show the new analysis, and
        the static view stays that of the analysis the cell made.
        """
        handle, self.static_display = self.static_display, None
        self.live_display = None
        if handle is not None and self.analysis is not None:
            handle.update(static_bundle(self.analysis), raw=True)

    def waiting(self, state: WaitState, text: str, elapsed_s: float = 0.0) -> None:
        """Say what the analysis waits for now (``waiting``: ``meta_widget.views.waiting``),
        ``elapsed_s`` into that state; the views count the seconds on from there themselves."""
        self.last_done = None  # a view mounting now must not see the last analysis finished
        self.send(
            {
                "type": KernelMessage.WAITING.value,
                "state": WaitState(state).value,
                "text": text,
                "elapsed_s": round(max(0.0, elapsed_s), 3),
            }
        )

    def fail(self, error: Explanation) -> None:
        """The analysis stopped before it had a result (its model did not build, an option did
        not fit the model, an interrupt): the views say why instead of waiting on."""
        self.send({"type": KernelMessage.ERROR.value, "error": encode_error(error)})

    def stream(
        self, nodes: Sequence[ModuleNode], *, title: str, source: str, mode: str
    ) -> CallStream:
        """Start a live view: send the module table now, then calls in batches."""
        return CallStream(self, nodes, title=title, source=source, mode=mode)


#: what the widget does with each message type a view sends (``protocol.MESSAGE_TYPES_FROM_JS``):
#: ``MetaWidget._on_<type>``, looked up here so that a type without a handler fails at import
MESSAGE_HANDLERS: dict[str, Callable[[MetaWidget, dict[str, Any]], None]] = {
    kind: getattr(MetaWidget, f"_on_{kind}") for kind in MESSAGE_TYPES_FROM_JS
}


#: Containers that hold modules but have no ``forward``: they are never called.
CONTAINERS = frozenset({"ModuleList", "ModuleDict", "ParameterList", "ParameterDict"})


def estimate_calls(nodes: Sequence[ModuleNode]) -> int:
    """The number of module calls expected before the trace runs: an estimate, never exact.

    One call per module that is not a container without ``forward`` (``CONTAINERS``). The real
    count is known only after the forward pass: modules that are never called (a dropout that
    scaled-dot-product attention bypasses, an unused head) make it smaller, modules called
    several times (shared blocks, loops) larger. The front end shows it as an estimate.
    """
    return sum(1 for n in nodes if n.type not in CONTAINERS)


class CallStream:
    """Sends ``calls`` messages in batches (every ``batch`` records or ``interval_s`` seconds)."""

    def __init__(
        self,
        widget: MetaWidget,
        nodes: Sequence[ModuleNode],
        *,
        title: str,
        source: str,
        mode: str,
        batch: int = 256,
        interval_s: float = 0.05,
    ) -> None:
        self.widget = widget
        self.dictionary = Dictionary()
        self.pending: list[CallRecord] = []
        self.batch = batch
        self.interval_s = interval_s
        self.start = self.last = time.perf_counter()
        #: the analysis's own start (the model built before the trace), else the trace's
        self.begun = getattr(widget, "run_started", None) or self.start
        widget.run_started = None
        header = encode_header(
            nodes,
            self.dictionary,
            title=title,
            source=source,
            mode=mode,
            status=Status.RUNNING.value,
        )
        self.dictionary.take_new()  # the header carries the dictionary so far
        widget.last_done = None  # a view mounting while this runs must not see it finished
        widget.send({"type": "start", "expected_calls": estimate_calls(nodes), "payload": header})

    def add(self, record: CallRecord) -> None:
        self.pending.append(record)
        now = time.perf_counter()
        if len(self.pending) >= self.batch or now - self.last >= self.interval_s:
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        calls = drop_zero_columns(encode_calls(self.pending, self.dictionary))
        self.widget.send({"type": "calls", **self.dictionary.take_new(), "calls": calls})
        self.pending.clear()
        self.last = time.perf_counter()

    def waiting(self, state: WaitState, text: str) -> None:
        """The trace entered ``state`` (``MetaWidget.waiting``): its calls so far first."""
        self.flush()
        self.widget.waiting(state, text)

    def phase(self, name: str) -> None:
        """A training step moved on to ``name`` (backward, optimizer): say so, calls first."""
        self.flush()
        self.widget.send({"type": "phase", "phase": name})

    def finish(self, analysis: Analyzed) -> None:
        self.flush()
        if analysis.error is not None:
            self.widget.send({"type": "error", "error": encode_error(analysis.error)})
        self.widget.payload = analysis.to_payload()
        now = time.perf_counter()
        done = {"type": "done", "elapsed_s": now - self.start, "total_s": now - self.begun}
        self.widget.send(done)
        self.widget.last_done = done


def standalone_html(payload: dict[str, Any]) -> str:
    """One self-contained HTML page rendering ``payload`` with the widget's own code."""
    script = STATIC / "standalone.js"
    css = STATIC / "widget.css"
    if not script.exists():
        raise FileNotFoundError(
            f"{script} is missing: the front end was not built. Reinstall meta_widget "
            "(pip install meta-widget) or build it with `npm install && npm run build`."
        )
    data = script_json(payload)
    title = html.escape(str(payload.get("title", "model")), quote=True)
    return (
        "<!doctype html>\n<html><head><meta charset='utf-8'>"
        f"<title>meta_widget · {title}</title>\n"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>\n"
        f"<style>{css.read_text(encoding='utf-8') if css.exists() else ''}\n"
        "body{margin:0;padding:16px;background:var(--jp-layout-color0,#fff)}"
        "@media (prefers-color-scheme: dark){body{background:#111}}</style>\n"
        "</head><body><div id='meta-widget-root'></div>\n"
        f"<script id='meta-widget-data' type='application/json'>{data}</script>\n"
        f"<script>{_inline(script.read_text(encoding='utf-8'))}</script>\n"
        "<script>window.metaWidget.renderStandalone(document.getElementById('meta-widget-root'),"
        "JSON.parse(document.getElementById('meta-widget-data').textContent));</script>\n"
        "</body></html>\n"
    )


#: characters that could end or re-mode a <script> element (``</script>``, ``<!--<script>``);
#: inside JSON strings they are written as \\u escapes, which ``JSON.parse`` reads back
_SCRIPT_UNSAFE = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026"})


def script_json(payload: Any) -> str:
    """``payload`` as JSON that is inert inside a ``<script type='application/json'>`` element.

    Names in the payload are the user's (class names, module names, error messages). The HTML
    tokenizer ends a script element at ``</script``, and after ``<!--`` followed by ``<script``
    it stops ending it there at all ("script data double escaped" state), so the rest of the page
    becomes data. With ``<``, ``>`` and ``&`` escaped no markup can appear: JSON has these
    characters only inside strings, where ``\\u003c`` means the same character.
    """
    return json.dumps(payload, separators=(",", ":")).translate(_SCRIPT_UNSAFE)


def _inline(js: str) -> str:
    """JS text safe inside a <script> element (no early ``</script>``)."""
    return js.replace("</script", "<\\/script").replace("<!--", "<\\!--")
