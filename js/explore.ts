/**
 * anywidget entry of the exploration views (`meta_widget/explore/view.py`): traits `kind`
 * (`"fit"` or `"compare"`) and `payload`. Re-renders when the payload changes.
 */
import type { AnyModel, Render } from "@anywidget/types";
import { renderComparison } from "./compare";
import { decodeCompare, decodeFit } from "./decode";
import { renderFit } from "./fit";
import { EXPLORE_KINDS, type ExploreKind } from "./protocol";
import { watchTheme } from "./theme";

interface Traits {
  kind: string;
  payload: unknown;
}

/** Draw the view the traits describe; returns the cleanup of what it added. */
export function draw(el: HTMLElement, kind: string, payload: unknown): () => void {
  const known: Record<ExploreKind, (el: HTMLElement, payload: unknown) => (() => void) | null> = {
    fit: drawFit,
    compare: drawCompare,
  };
  const undraw = isKind(kind) ? known[kind](el, payload) : null;
  if (undraw) return undraw;
  el.textContent = "meta_widget: nothing to show yet.";
  return () => undefined;
}

function isKind(kind: string): kind is ExploreKind {
  return (EXPLORE_KINDS as readonly string[]).includes(kind);
}

function drawFit(el: HTMLElement, payload: unknown): (() => void) | null {
  const fit = decodeFit(payload);
  if (!fit) return null;
  renderFit(el, fit);
  return () => undefined;
}

function drawCompare(el: HTMLElement, payload: unknown): (() => void) | null {
  const comparison = decodeCompare(payload);
  return comparison ? renderComparison(el, comparison) : null;
}

/** `draw`, with the drawn root following the host's light or dark theme (see `theme.ts`). */
function drawThemed(el: HTMLElement, kind: string, payload: unknown): () => void {
  const undraw = draw(el, kind, payload);
  const root = el.querySelector<HTMLElement>(".mw-root");
  const unwatch = root ? watchTheme(root, () => undefined) : () => undefined;
  return () => {
    unwatch();
    undraw();
  };
}

const render: Render<Traits> = ({ model, el }) => {
  let cleanup = drawThemed(el, model.get("kind"), model.get("payload"));
  const update = (): void => {
    cleanup();
    cleanup = drawThemed(el, model.get("kind"), model.get("payload"));
  };
  model.on("change:payload", update);
  model.on("change:kind", update);
  return () => {
    cleanup();
    model.off("change:payload", update);
    model.off("change:kind", update);
  };
};

export type ExploreModel = AnyModel<Traits>;
export default { render };
