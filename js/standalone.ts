/**
 * The standalone page: `window.metaWidget.renderStandalone(el, payload)` renders the widget's
 * view from a payload object, with a tiny fake model and no kernel. Python inlines this file,
 * widget.css and the payload JSON into one HTML file.
 */
import { mount, type WidgetModel } from "./widget";
import type { App } from "./app";

/** A model with one trait and no kernel: `send` and `save_changes` do nothing. */
export function fakeModel(payload: unknown): WidgetModel {
  const traits: Record<string, unknown> = { payload, selected: -1 };
  return {
    get: (name) => traits[name],
    set: (name, value) => {
      traits[name] = value;
    },
    save_changes: () => undefined,
    send: () => undefined,
    on: () => undefined,
    off: () => undefined,
  };
}

const apps = new WeakMap<HTMLElement, App>();

export function renderStandalone(el: HTMLElement, payload: unknown): () => void {
  const { app, cleanup } = mount(fakeModel(payload), el, true);
  apps.set(el, app);
  return cleanup;
}

/** Screen centers of the memory chart's bars under `el` (for browser tests). */
export function barCenters(el: HTMLElement): { module: number; x: number; y: number }[] {
  return apps.get(el)?.barCenters() ?? [];
}

declare global {
  interface Window {
    metaWidget: { renderStandalone: typeof renderStandalone; barCenters: typeof barCenters };
  }
}

window.metaWidget = { renderStandalone, barCenters };
