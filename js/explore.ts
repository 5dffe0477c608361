/**
 * anywidget entry of the exploration views (`meta_widget/explore_view.py`): traits `kind`
 * (`"fit"` or `"compare"`) and `payload`. Re-renders when the payload changes.
 */
import type { AnyModel, Render } from "@anywidget/types";
import { decodeCompare, renderComparison } from "./compare";
import { decodeFit, renderFit } from "./fit";
import { watchTheme } from "./theme";

interface Traits {
  kind: string;
  payload: unknown;
}

/** Draw the view the traits describe; returns the cleanup of what it added. */
export function draw(el: HTMLElement, kind: string, payload: unknown): () => void {
  if (kind === "fit") {
    const fit = decodeFit(payload);
    if (fit) {
      renderFit(el, fit);
      return () => undefined;
    }
  } else if (kind === "compare") {
    const comparison = decodeCompare(payload);
    if (comparison) return renderComparison(el, comparison);
  }
  el.textContent = "meta_widget: nothing to show yet.";
  return () => undefined;
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
