/**
 * anywidget entry: `export default { render }`.
 *
 * Traits: `payload` (the analysis; `{}` until there is one), `selected` (module row, set here),
 * `depth` (optional: how deep the tree opens at first).
 * Custom messages from the kernel (`waiting`, `start`, `calls`, `done`, `error`) stream a trace in;
 * `{type: "select", module}` goes back when the user selects a row.
 *
 * The kernel sends `start` (the module table) as soon as it displays the widget, before any view
 * has mounted, and anywidget delivers a custom message only to the listeners there are: a view
 * that mounted later missed it, and drew the calls after it over no module table ("123 calls
 * recorded" over "Waiting for the first calls…" and "params 0"). `initialize`, which runs once
 * per model before any message is delivered, keeps the stream (`keepStreamed`) and every view
 * starts from it (`mount`).
 */
import type { AnyModel, Initialize, Render } from "@anywidget/types";
import { App } from "./app";
import { isCheckpoint, renderCheckpoint } from "./ckptview";
import type { RerunMessage, ViewMessage } from "./protocol";
import { decodeMessage, decodePayload } from "./decode";

/** The synced traits (`meta_widget/views/widget.py`); `depth` is optional: how deep the tree opens. */
export interface Traits {
  payload: unknown;
  selected: number;
  depth?: number;
  /** The kernel-side widget's own id: the key of its stream's backlog (`backlogs`). */
  stream_id?: string;
}

/**
 * The raw messages the kernel streamed to each model since its last `start` (the last `done`
 * once it ended: the payload trait then holds the analysis), by the model's `stream_id`:
 * anywidget gives `initialize` and each view different wrappers of one model.
 */
const backlogs = new Map<string, Streamed[]>();

/** A message the kernel sent, and when it arrived (`performance.now()`). */
export interface Streamed {
  content: unknown;
  at: number;
}

/** The messages a stream's backlog keeps: the start, then what follows it until `done`. */
const AFTER_START = new Set(["calls", "phase", "error", "waiting"]);

/**
 * Add `content`, a message from the kernel that arrived `at`, to a stream's backlog `log`.
 * Before the `start` (the model not built yet) only the latest `waiting` matters, and an
 * `error` after it (the analysis stopped there): a view mounting then says the same.
 */
export function keepStreamed(log: Streamed[], content: unknown, at = performance.now()): void {
  const type = typeOf(content);
  const first = typeOf(log[0]?.content);
  if (type === "start" || type === "done" || (type === "waiting" && first !== "start")) log.splice(0, log.length, { content, at });
  else if (AFTER_START.has(type) && (first === "start" || first === "waiting")) log.push({ content, at });
}

function typeOf(content: unknown): string {
  const type = typeof content === "object" && content !== null ? (content as { type?: unknown }).type : undefined;
  return typeof type === "string" ? type : "";
}

/** Once per model, before the kernel's messages reach it: keep its stream for later views. */
export const initialize: Initialize<Traits> = ({ model }) => {
  const id = model.get("stream_id");
  if (typeof id !== "string" || !id) return;
  const log: Streamed[] = [];
  backlogs.set(id, log);
  const keep = (content: unknown): void => keepStreamed(log, content);
  model.on("msg:custom", keep);
  return () => {
    model.off("msg:custom", keep);
    backlogs.delete(id);
  };
};

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
  const onMsg = (content: unknown, at = performance.now()): void => {
    const msg = decodeMessage(content);
    if (!msg) return;
    app.handleMessage(msg, at); // a replayed start keeps its time: the views' clocks agree
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
  onDepth();
  onPayload();
  // what the kernel streamed before this view mounted (its start among it), then the rest
  const id = model.get("stream_id");
  for (const { content, at } of (typeof id === "string" && backlogs.get(id)) || []) onMsg(content, at);
  const onLive = (content: unknown): void => onMsg(content);
  model.on("msg:custom", onLive);
  // is a kernel-side widget behind this view? (none, when restored from a saved notebook)
  if (kernel) send({ type: "hello" });
  const cleanup = (): void => {
    model.off("change:payload", onPayload);
    model.off("change:depth", onDepth);
    model.off("msg:custom", onLive);
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
  // mw.inspect_checkpoint: a view of its own (tensors, shapes, dtypes, bytes; nothing to re-run)
  const payload = decodePayload(model.get("payload"));
  const { cleanup } = isCheckpoint(payload) ? { cleanup: renderCheckpoint(el, payload) } : mount(model, el);
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

export default { initialize, render };
