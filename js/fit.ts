/**
 * The "what fits" panel of `mw.max_fit`: the answer in one sentence, the bytes at that size
 * against the budget (stacked by category), and every size the search traced (an SVG chart with
 * the budget line). Text only through `textContent`.
 */
import { h } from "./details";
import { formatBytes, formatExact } from "./format";
import type { FitPayload } from "./protocol";

/**
 * One sentence that says "fits" of the answer and "does not fit" of the next size, with what
 * it is over by (rounded, "needs 80.0 GiB" of an 80 GiB budget read as if it fit):
 * `seq = 176,456 fits: 79.99 GiB of 80 GiB; seq = 176,457 does not fit: 80.00 GiB, over by 312 B`.
 */
export function verdict(p: FitPayload): string {
  const where = p.devices ? ` per device (${p.devices} × ${p.strategy})` : "";
  const head = `${p.vary} = ${formatExact(p.size)} fits: ${formatBytes(p.peakBytes)} of ${formatBytes(p.budget)}${where}`;
  if (p.nextPeakBytes === null) return `${head} (the largest size tried).`;
  const over = formatBytes(Math.max(0, p.nextPeakBytes - p.budget));
  return `${head}; ${p.vary} = ${formatExact(p.size + 1)} does not fit: ${formatBytes(p.nextPeakBytes)}, over by ${over}.`;
}

const SVG = "http://www.w3.org/2000/svg";

function svg<K extends keyof SVGElementTagNameMap>(tag: K, attrs: Record<string, string | number>): SVGElementTagNameMap[K] {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  return e;
}

/** The traced sizes as points (fits: filled, over: hollow) under the dashed budget line, on a
 * byte scale (0, half, the top) and a size scale (0, the largest size traced). */
export function historyChart(p: FitPayload, width = 380, height = 140): SVGSVGElement {
  const pad = 30;
  const left = 62; // room for the byte scale's labels ("80.0 GiB")
  const xs = p.history.map(([s]) => s);
  const ys = p.history.map(([, b]) => b);
  const xMax = Math.max(...xs, 1);
  const top = Math.max(...ys, p.budget);
  const yMax = top * 1.05;
  const x = (v: number): number => left + ((width - left - pad) * v) / xMax;
  const y = (v: number): number => height - pad - ((height - 2 * pad) * v) / yMax;
  const root = svg("svg", { viewBox: `0 0 ${width} ${height}`, class: "mw-fit-chart", role: "img" });
  const title = svg("title", {});
  title.textContent = `bytes at each ${p.vary} traced; the dashed line is the budget`;
  root.append(title);
  root.append(svg("line", { x1: left, x2: width - pad, y1: y(p.budget), y2: y(p.budget), class: "mw-fit-budget" }));
  root.append(svg("line", { x1: left, x2: left, y1: pad / 2, y2: height - pad, class: "mw-fit-axis" }));
  root.append(svg("line", { x1: left, x2: width - pad, y1: height - pad, y2: height - pad, class: "mw-fit-axis" }));
  for (const [size, bytes] of p.history) {
    const dot = svg("circle", { cx: x(size), cy: y(bytes), r: 3.5, class: bytes <= p.budget ? "mw-fit-in" : "mw-fit-out" });
    const tip = svg("title", {});
    tip.textContent = `${p.vary} = ${formatExact(size)}: ${formatBytes(bytes)}`;
    dot.append(tip);
    root.append(dot);
  }
  const text = (x0: number, y0: number, value: string, anchor = "start", cls = "mw-fit-label"): void => {
    const t = svg("text", { x: x0, y: y0, class: cls, "text-anchor": anchor });
    t.textContent = value;
    root.append(t);
  };
  for (const v of [0, top / 2, top]) {
    root.append(svg("line", { x1: left - 3, x2: left, y1: y(v), y2: y(v), class: "mw-fit-axis" }));
    text(left - 5, y(v) + 3, v ? formatBytes(v) : "0 B", "end", "mw-fit-label mw-fit-ytick");
  }
  text(left + 4, y(p.budget) - 4, `budget ${formatBytes(p.budget)}`);
  text(left, height - pad + 12, "0", "middle");
  text(x(xMax), height - pad + 12, formatExact(xMax), "middle");
  text((left + width - pad) / 2, height - 4, p.vary, "middle");
  return root;
}

/** Render the panel into `el` (replacing what was there). */
export function renderFit(el: HTMLElement, p: FitPayload): void {
  el.replaceChildren();
  const root = h("div", "mw-root mw-fit");
  root.append(h("div", "mw-fit-title", `What fits: ${p.title}, ${p.mode}`));
  root.append(h("div", "mw-fit-verdict", verdict(p)));
  const bar = h("div", "mw-fit-bar");
  bar.title = "bytes at the peak by category, against the budget";
  for (const [name, bytes] of Object.entries(p.categories)) {
    const part = h("div", `mw-fit-part mw-cat-${name.replace(/\s+/g, "-")}`);
    part.style.width = `${Math.min(100, (100 * bytes) / p.budget)}%`;
    part.title = `${name}: ${formatBytes(bytes)}`;
    bar.append(part);
  }
  root.append(bar);
  const legend = h("div", "mw-fit-legend");
  for (const [name, bytes] of Object.entries(p.categories)) legend.append(h("span", "", `${name} ${formatBytes(bytes)}`));
  root.append(legend);
  if (p.peakOwner) root.append(h("div", "mw-fit-note", `Peak at ${p.vary} = ${formatExact(p.size)}: ${p.peakOwner}`));
  root.append(historyChart(p));
  root.append(h("div", "mw-fit-note", `${p.history.length} traces, each a full analysis.`));
  el.append(root);
}
