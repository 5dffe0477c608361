/**
 * anywidget entry of the exploration views (`meta_widget/explore/view.py`): traits `kind`
 * (`"fit"`, `"compare"` or `"plan"`), `payload` and `detail` (what the plan view opened, set
 * by the kernel). Re-renders when the payload changes; the plan view sends
 * `{type: "open", index}` and shows `detail` when it changes.
 */
import type { AnyModel, Render } from "@anywidget/types";
import { renderComparison } from "./compare";
import { decodeCompare, decodeFit } from "./decode";
import { renderFit } from "./fit";
import { decodePlan, renderPlan } from "./plan";
import { EXPLORE_KINDS, type ExploreKind, type OpenMessage } from "./protocol";
import { watchTheme } from "./theme";

interface Traits {
  kind: string;
  payload: unknown;
  detail?: unknown;
}

/** The part of the model a view talks to: the plan view's `open` and its `detail` trait. */
export type ExploreLink = Pick<AnyModel<Traits>, "get" | "send" | "on" | "off">;

type Drawer = (el: HTMLElement, payload: unknown, link?: ExploreLink) => (() => void) | null;

/** Draw the view the traits describe; returns the cleanup of what it added. */
export function draw(el: HTMLElement, kind: string, payload: unknown, link?: ExploreLink): () => void {
  const known: Record<ExploreKind, Drawer> = {
    fit: drawFit,
    compare: drawCompare,
    plan: drawPlan,
  };
  const undraw = isKind(kind) ? known[kind](el, payload, link) : null;
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

/** The plan view; opening a candidate asks the kernel, whose answer is the `detail` trait. */
function drawPlan(el: HTMLElement, payload: unknown, link?: ExploreLink): (() => void) | null {
  const plan = decodePlan(payload);
  if (!plan) return null;
  const view = renderPlan(el, plan, {
    onOpen: (index) => link?.send({ type: "open", index } satisfies OpenMessage),
  });
  const onDetail = (): void => view.showDetail(link?.get("detail"));
  link?.on("change:detail", onDetail);
  onDetail();
  return () => {
    link?.off("change:detail", onDetail);
    view.destroy();
  };
}

/** `draw`, with the drawn root following the host's light or dark theme (see `theme.ts`). */
function drawThemed(el: HTMLElement, kind: string, payload: unknown, link?: ExploreLink): () => void {
  const undraw = draw(el, kind, payload, link);
  const root = el.querySelector<HTMLElement>(".mw-root");
  const unwatch = root ? watchTheme(root, () => undefined) : () => undefined;
  return () => {
    unwatch();
    undraw();
  };
}

const render: Render<Traits> = ({ model, el }) => {
  let cleanup = drawThemed(el, model.get("kind"), model.get("payload"), model);
  const update = (): void => {
    cleanup();
    cleanup = drawThemed(el, model.get("kind"), model.get("payload"), model);
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
