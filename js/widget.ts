/**
 * anywidget entry: `export default { render }`.
 *
 * Traits: `payload` (the analysis; `{}` until there is one), `selected` (module row, set here),
 * `depth` (optional: how deep the tree opens at first).
 * Custom messages from the kernel (`start`, `calls`, `done`, `error`) stream a trace in;
 * `{type: "select", module}` goes back when the user selects a row.
 */
import type { AnyModel, Render } from "@anywidget/types";
import { App } from "./app";
import type { RerunMessage, ViewMessage } from "./protocol";
import { decodeMessage, decodePayload } from "./decode";

/** The synced traits (`meta_widget/views/widget.py`); `depth` is optional: how deep the tree opens. */
export interface Traits {
  payload: unknown;
  selected: number;
  depth?: number;
}

/**
 * The part of anywidget's model that the view uses, in anywidget's own types; the standalone
 * page's fake model (no kernel behind it, `noKernel`: no re-runs) satisfies it too.
 */
export type WidgetModel = Pick<AnyModel<Traits>, "get" | "set" | "save_changes" | "send" | "on" | "off"> & {
  readonly noKernel?: boolean;
};

export interface Rendered {
  app: App;
  cleanup: () => void;
}

/** Mount the view on `el`, wired to `model`; returns the app and the cleanup. */
export function mount(model: WidgetModel, el: HTMLElement, standalone = false): Rendered {
  const kernel = !standalone && model.noKernel !== true;
  /** Every message to the kernel is one of `VIEW_MESSAGE_TYPES` (Python has a handler each). */
  const send = (msg: ViewMessage): void => model.send(msg);
  const app = new App(el, {
    standalone,
    onRerun: kernel ? (msg: RerunMessage) => send(msg) : undefined,
    onSelect: (module) => {
      send({ type: "select", module });
      model.set("selected", module);
      model.save_changes();
    },
  });
  const onPayload = (): void => app.setAnalysis(decodePayload(model.get("payload")));
  const onMsg = (content: unknown): void => {
    const msg = decodeMessage(content);
    if (!msg) return;
    app.handleMessage(msg);
    // the final payload is in the trait once "done" arrives (its change event may come first)
    if (msg.type === "done") onPayload();
  };
  // optional `depth` trait (not part of protocol.py): the initial expand depth
  const onDepth = (): void => {
    const d = model.get("depth");
    if (typeof d === "number") app.setDepth(d);
  };
  model.on("change:payload", onPayload);
  model.on("change:depth", onDepth);
  model.on("msg:custom", onMsg as (...args: unknown[]) => void);
  onDepth();
  onPayload();
  // is a kernel-side widget behind this view? (none, when restored from a saved notebook)
  if (kernel) send({ type: "hello" });
  const cleanup = (): void => {
    model.off("change:payload", onPayload);
    model.off("change:depth", onDepth);
    model.off("msg:custom", onMsg as (...args: unknown[]) => void);
    app.destroy();
  };
  return { app, cleanup };
}

/**
 * The static view the kernel displays right after the widget's output (`static_bundle` in
 * `views/widget.py`) is hidden by its own style rules once the widget mounts; where a sanitizer
 * dropped them (an untrusted notebook), hide it here. Returns what undoes it.
 */
export function hideStaticView(el: HTMLElement): () => void {
  const output = el.closest(".jp-OutputArea-child, .output_area");
  const next = output?.nextElementSibling;
  if (!(next instanceof HTMLElement) || !next.querySelector(".mw-static")) return () => undefined;
  next.style.display = "none";
  return () => next.style.removeProperty("display");
}

const render: Render<Traits> = ({ model, el }) => {
  const { cleanup } = mount(model, el);
  // the output is attached after render returns: look until it is in the page (2 s at most)
  let undo: (() => void) | undefined;
  let timer: ReturnType<typeof setTimeout> | undefined;
  const look = (tries: number): void => {
    if (el.closest(".jp-OutputArea-child, .output_area")) undo = hideStaticView(el);
    else if (tries > 0) timer = setTimeout(() => look(tries - 1), 100);
  };
  look(20);
  return () => {
    clearTimeout(timer);
    undo?.();
    cleanup();
  };
};

export default { render };
