/**
 * The standalone page: `window.metaWidget.renderStandalone(el, payload)` renders the widget's
 * view from a payload object, with a tiny fake model and no kernel. Python inlines this file,
 * widget.css and the payload JSON into one HTML file.
 *
 * `renderLive(el)` does the same but hands back the fake model, so that a page (or a browser
 * test) can replay a recorded stream: `live.message({type: "start", ...})`, `live.set("payload", p)`.
 */
import { mount, type Traits, type WidgetModel } from "./widget";
import type { App } from "./app";

// anywidget types listeners loosely (a custom message's handler takes the content and buffers)
type Listener = (...args: any[]) => void;

export interface FakeModel extends WidgetModel {
  /** Deliver a custom message, as the kernel would. */
  message(content: unknown): void;
}

/** A model with traits and events but no kernel: `send` and `save_changes` do nothing. */
export function fakeModel(payload: unknown): FakeModel {
  const traits: Traits = { payload, selected: -1 };
  const listeners = new Map<string, Set<Listener>>();
  const emit = (event: string, ...args: unknown[]): void => {
    for (const cb of listeners.get(event) ?? []) cb(...args);
  };
  return {
    noKernel: true,
    get: <K extends keyof Traits>(name: K): Traits[K] => traits[name],
    set: <K extends keyof Traits>(name: K, value: Traits[K]) => {
      traits[name] = value;
      emit(`change:${name}`);
    },
    save_changes: () => undefined,
    send: () => undefined,
    on: (event, cb) => {
      if (!listeners.has(event)) listeners.set(event, new Set());
      listeners.get(event)?.add(cb);
    },
    off: (event, cb) => {
      if (event && cb) listeners.get(event)?.delete(cb);
      else if (event) listeners.delete(event);
      else listeners.clear();
    },
    message: (content) => emit("msg:custom", content),
  };
}

const apps = new WeakMap<HTMLElement, App>();

export function renderLive(el: HTMLElement, payload: unknown = {}): FakeModel & { cleanup: () => void } {
  const model = fakeModel(payload);
  const { app, cleanup } = mount(model, el, true);
  apps.set(el, app);
  return Object.assign(model, { cleanup });
}

export function renderStandalone(el: HTMLElement, payload: unknown): () => void {
  return renderLive(el, payload).cleanup;
}

/** Screen centers of the memory chart's bars under `el` (for browser tests). */
export function barCenters(el: HTMLElement): { module: number; x: number; y: number }[] {
  return apps.get(el)?.barCenters() ?? [];
}

declare global {
  interface Window {
    metaWidget: {
      renderStandalone: typeof renderStandalone;
      renderLive: typeof renderLive;
      barCenters: typeof barCenters;
    };
  }
}

window.metaWidget = { renderStandalone, renderLive, barCenters };
