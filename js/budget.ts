/**
 * The GPU's memory as the memory charts' budget line (an analysis with `gpu=`, see
 * `timing.ts`): a dashed line labelled "H100 80 GiB" across the memory-by-module bars and the
 * timeline, as the "what fits" chart draws its budget (`fit.ts`). The axis reaches the line
 * when the numbers come within a quarter of it; further below, the line would flatten them, so
 * the legend says where it is instead ("H100 80 GiB: off the scale, peak 0.01 %").
 */
import uPlot from "uplot";
import { formatBytes } from "./format";
import type { Analysis } from "./protocol";

export interface Budget {
  /** The GPU's memory, bytes. */
  bytes: number;
  /** "H100 80 GiB". */
  label: string;
}

/** Room a chart keeps above its plot for a vertical budget line's label (CSS px). */
export const BUDGET_ROOM = 16;

/** The axis reaches the budget when the largest value is at least this share of it. */
export const IN_VIEW = 0.25;

/** "80 GiB", "141 GiB", "23.5 GiB": bytes without trailing zeros. */
export function memoryText(bytes: number): string {
  return formatBytes(bytes).replace(/\.0+ /, " ");
}

/** The budget line of `a`: its GPU's memory; null without `time` (no `gpu=`) or memory. */
export function gpuBudget(a: Analysis | null | undefined): Budget | null {
  const t = a?.time;
  if (!t || !(t.memoryBytes > 0)) return null;
  return { bytes: t.memoryBytes, label: `${t.gpu} ${memoryText(t.memoryBytes)}` };
}

/** Whether a chart whose largest value is `max` draws the budget line (its axis reaching it). */
export function budgetInView(max: number, budget: Budget | null): budget is Budget {
  return budget !== null && budget.bytes > 0 && max >= IN_VIEW * budget.bytes;
}

/** The top of a byte axis whose largest value is `max`: `max * headroom`, or past the budget. */
export function axisTop(max: number, budget: Budget | null, headroom: number): number {
  const top = max > 0 ? max * headroom : 1;
  return budgetInView(max, budget) ? Math.max(top, budget.bytes * 1.08) : top;
}

/** The legend's words for the budget: its label, and where it is when it is off the scale. */
export function budgetLegend(max: number, budget: Budget): string {
  if (max >= IN_VIEW * budget.bytes) return `${budget.label} (the GPU's memory)`;
  const share = (100 * max) / budget.bytes;
  const pct = share >= 1 ? share.toFixed(0) : Number(share.toPrecision(1)).toString();
  return `${budget.label}: off the scale, the largest value here is ${pct} % of it`;
}

/**
 * Draw the budget as a dashed line on `u`'s byte scale `scale` at `bytes`: vertical when that
 * scale runs across (the bars; its label above the plot, in `BUDGET_ROOM`), horizontal when it
 * runs up (the timeline; its label above the line, at the right), with its label.
 */
export function drawBudgetLine(u: uPlot, scale: string, bytes: number, label: string, color: string, font: string): void {
  const ctx = u.ctx;
  const dpr = uPlot.pxRatio;
  const at = u.valToPos(bytes, scale, true);
  const { left, top, width, height } = u.bbox;
  const across = u.scales[scale]?.ori === 0;
  if (across ? at < left || at > left + width : at < top || at > top + height) return;
  ctx.save();
  ctx.strokeStyle = color;
  ctx.fillStyle = color;
  ctx.lineWidth = 1.5 * dpr;
  ctx.setLineDash([6 * dpr, 4 * dpr]);
  ctx.beginPath();
  if (across) {
    ctx.moveTo(Math.round(at) + 0.5, top);
    ctx.lineTo(Math.round(at) + 0.5, top + height);
  } else {
    ctx.moveTo(left, Math.round(at) + 0.5);
    ctx.lineTo(left + width, Math.round(at) + 0.5);
  }
  ctx.stroke();
  ctx.font = `${11 * dpr}px ${font}`;
  ctx.textBaseline = "bottom";
  if (across) {
    // above the plot (the chart keeps `BUDGET_ROOM` there), on the side with room
    const w = ctx.measureText(label).width;
    const room = left + width - at > w + 8 * dpr;
    ctx.textAlign = room ? "left" : "right";
    ctx.fillText(label, room ? at + 4 * dpr : at - 4 * dpr, top - 3 * dpr);
  } else {
    ctx.textAlign = "right";
    ctx.fillText(label, left + width - 4 * dpr, at - 3 * dpr);
  }
  ctx.restore();
}

/** A legend item for the budget: a dashed swatch and `text`. */
export function budgetItem(text: string): HTMLSpanElement {
  const item = document.createElement("span");
  item.className = "mw-budget-item";
  const sw = document.createElement("span");
  sw.className = "mw-swatch mw-budget-swatch";
  item.append(sw, document.createTextNode(text));
  return item;
}
