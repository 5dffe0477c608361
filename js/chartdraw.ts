/**
 * Canvas drawing helpers of the memory timeline (charts.ts): the stacked category bands and
 * text shortened to fit.
 */
import uPlot from "uplot";
import type { StackBand } from "./stack";

/**
 * Stacked areas of `bands` (bottom first), stepped as the live-bytes line is: each point's
 * value holds until the next event. Translucent, so the phase bands show through.
 */
export function drawBands(u: uPlot, bands: readonly StackBand[], color: (k: number) => string, xOf: (i: number) => number): void {
  const ctx = u.ctx;
  const n = bands[0]?.top.length ?? 0;
  if (n === 0) return;
  const x = (i: number): number => u.valToPos(xOf(i), "x", true);
  const y = (v: number): number => u.valToPos(v, "y", true);
  ctx.save();
  ctx.beginPath();
  ctx.rect(u.bbox.left, u.bbox.top, u.bbox.width, u.bbox.height);
  ctx.clip();
  ctx.globalAlpha = 0.55;
  let below: readonly number[] = new Array<number>(n).fill(0);
  for (const b of bands) {
    ctx.fillStyle = color(b.color);
    ctx.beginPath();
    for (let i = 0; i < n; i++) {
      const yt = y(b.top[i] ?? 0);
      if (i === 0) ctx.moveTo(x(0), yt);
      else ctx.lineTo(x(i), yt);
      ctx.lineTo(x(i + 1), yt);
    }
    for (let i = n - 1; i >= 0; i--) {
      const yb = y(below[i] ?? 0);
      ctx.lineTo(x(i + 1), yb);
      ctx.lineTo(x(i), yb);
    }
    ctx.closePath();
    ctx.fill();
    below = b.top;
  }
  ctx.restore();
}

/** `text` shortened in the middle ("peak 1.02 TiB · model.la…s.79.mlp") to fit `width` px. */
export function fitText(ctx: CanvasRenderingContext2D, text: string, width: number): string {
  if (ctx.measureText(text).width <= width) return text;
  let lo = 0;
  let hi = text.length;
  while (lo < hi) {
    const k = Math.ceil((lo + hi) / 2);
    const cut = `${text.slice(0, Math.ceil(k / 2))}…${text.slice(text.length - Math.floor(k / 2))}`;
    if (ctx.measureText(cut).width <= width) lo = k;
    else hi = k - 1;
  }
  return `${text.slice(0, Math.ceil(lo / 2))}…${text.slice(text.length - Math.floor(lo / 2))}`;
}
