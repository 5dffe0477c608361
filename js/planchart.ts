/**
 * The plan chart: each candidate `mw.plan` traced as a point, its step time (y) against what
 * its rank 0's GPU holds (x: `heldBytes`, what `fits` holds against the budget); the ones that fit the budget filled, the others hollow, colored by
 * precision; the budget as a vertical dashed line; the best one ringed and named. An SVG, like
 * the "what fits" chart (`fit.ts`); text only through `textContent`.
 */
import { IN_VIEW, memoryText } from "./budget";
import { formatBytes } from "./format";
import type { PlanCandidate, PlanPayload } from "./protocol";
import { formatSeconds } from "./timing";

const SVG = "http://www.w3.org/2000/svg";

function svg<K extends keyof SVGElementTagNameMap>(tag: K, attrs: Record<string, string | number>): SVGElementTagNameMap[K] {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  return e;
}

/** A candidate that has a point: traced, with a peak and a step time. */
export type Drawn = PlanCandidate & { peakBytes: number; stepS: number };

export function isDrawn(c: PlanCandidate): c is Drawn {
  return c.error === null && c.peakBytes !== null && c.stepS !== null;
}

/** What `c`'s GPU holds at its peak (`deviceBytes`), or its peak from a kernel without it. */
export function heldBytes(c: Drawn): number {
  return c.deviceBytes ?? c.peakBytes;
}

/** The precisions' colors, in the order `plan.PRECISIONS` tries them (others cycle). */
const PRECISION_CLASSES = ["mw-plan-p0", "mw-plan-p1", "mw-plan-p2", "mw-plan-p3"];

/** Each precision among `candidates` and its color class, in order of first appearance. */
export function precisionClasses(candidates: readonly PlanCandidate[]): Map<string, string> {
  const out = new Map<string, string>();
  for (const c of candidates) {
    if (!out.has(c.precision)) out.set(c.precision, PRECISION_CLASSES[out.size % PRECISION_CLASSES.length] as string);
  }
  return out;
}

/** "fsdp=2 tp=2", "fsdp=2 pp=4 1F1B", or "1 device". */
export function layoutText(c: PlanCandidate): string {
  const parts = (
    [
      ["replicate", c.replicate],
      ["fsdp", c.fsdp],
      ["tp", c.tp],
      ["pp", c.pp ?? 1],
      ["cp", c.cp ?? 1],
      ["ep", c.ep ?? 1],
    ] as const
  ).filter(([, n]) => n > 1);
  const sp = c.sequenceParallel && c.tp > 1 ? " sp" : "";
  const text = parts.map(([name, n]) => `${name}=${n}`).join(" ") + sp || "1 device";
  if ((c.pp ?? 1) <= 1 || !c.schedule) return text;
  const stages = (c.virtualStages ?? 1) > 1 ? ` x${c.virtualStages}` : "";
  return `${text} ${c.schedule}${stages}`;
}

/** GPU-hours in 3 significant digits, grouped: "30,800,000", "1,230", "4.57". */
export function gpuHoursText(h: number): string {
  return Number(h.toPrecision(3)).toLocaleString("en-US");
}

/** Modules named, as a cell holds them: "LlamaMLP", "a, b", "a, b and 58 more". */
export function modulesText(names: readonly string[]): string {
  return names.length <= 2 ? names.join(", ") : `${names.slice(0, 2).join(", ")} and ${names.length - 2} more`;
}

/** Checkpointing settings as the table sorts them (and `Plan.sort`): none, modules named,
 * selective, every block whole. */
export const RECOMPUTED: Record<PlanCandidate["checkpointing"], number> = { none: 0, modules: 0.5, selective: 1, full: 2 };

/** A candidate's checkpointing in words: "no checkpointing", "checkpointing" (every block
 * whole), "selective checkpointing", "checkpointing LlamaMLP". */
export function checkpointingText(c: PlanCandidate): string {
  if (c.checkpointing === "modules") return `checkpointing ${modulesText(c.checkpointedModules)}`;
  return c.checkpointing === "none" ? "no checkpointing" : c.checkpointing === "full" ? "checkpointing" : "selective checkpointing";
}

/** The candidate in words, as the hover and the table say it. */
export function candidateText(c: PlanCandidate): string {
  const micro = `${c.microBatches} micro-batch${c.microBatches === 1 ? "" : "es"}`;
  const head = `${layoutText(c)} · ${checkpointingText(c)} · ${c.precision} · ${micro}`;
  if (!isDrawn(c)) return `${head}: ${c.error ?? "not traced"}`;
  const mfu = c.mfu === null ? "" : ` · MFU ${(c.mfu * 100).toPrecision(2)}%`;
  const cost = typeof c.gpuHours === "number" ? ` · ${gpuHoursText(c.gpuHours)} GPU-hours` : "";
  return `${head}: ${formatBytes(heldBytes(c))} on the GPU (peak ${formatBytes(c.peakBytes)})${c.fits ? "" : ", over the budget"} · step ${formatSeconds(c.stepS)}${mfu}${cost}`;
}

/**
 * The Pareto front: the fitting candidates no other fitting one beats on both step time and
 * memory on the GPU (equal on one, better on the other), in order of memory. From the kernel's
 * `pareto` flags when every candidate has one (`plan.pareto`), else worked out here.
 */
export function paretoFront(candidates: readonly PlanCandidate[]): Drawn[] {
  const fitting = candidates.filter(isDrawn).filter((c) => c.fits);
  const byMemory = (a: Drawn, b: Drawn): number => heldBytes(a) - heldBytes(b) || a.stepS - b.stepS;
  if (candidates.length && candidates.every((c) => typeof c.pareto === "boolean")) {
    return fitting.filter((c) => c.pareto).sort(byMemory);
  }
  const beats = (a: Drawn, b: Drawn): boolean =>
    heldBytes(a) <= heldBytes(b) && a.stepS <= b.stepS && (heldBytes(a) < heldBytes(b) || a.stepS < b.stepS);
  return fitting.filter((c) => !fitting.some((o) => beats(o, c))).sort(byMemory);
}

/** A box in the chart's units. */
export interface Box {
  x0: number;
  y0: number;
  x1: number;
  y1: number;
}

/**
 * Where the best point's label goes: beside its ring (right, left, above, below), the first
 * place that covers no other point and stays inside `area`; right when none is free.
 * `points`: the other points' centres; `w`, `h`: the label's size.
 */
export function labelBox(at: [number, number], points: readonly [number, number][], w: number, h: number, area: Box): Box {
  const [cx, cy] = at;
  const gap = 13;
  const places: Box[] = [
    { x0: cx + gap, y0: cy - h / 2, x1: cx + gap + w, y1: cy + h / 2 },
    { x0: cx - gap - w, y0: cy - h / 2, x1: cx - gap, y1: cy + h / 2 },
    { x0: cx - w / 2, y0: cy - gap - h, x1: cx + w / 2, y1: cy - gap },
    { x0: cx - w / 2, y0: cy + gap, x1: cx + w / 2, y1: cy + gap + h },
  ];
  const r = 7; // a dot's radius and its stroke, with a pixel to spare
  const covers = (b: Box, [px, py]: [number, number]): boolean => px + r > b.x0 && px - r < b.x1 && py + r > b.y0 && py - r < b.y1;
  const inside = (b: Box): boolean => b.x0 >= area.x0 && b.x1 <= area.x1 && b.y0 >= area.y0 && b.y1 <= area.y1;
  return places.find((b) => inside(b) && !points.some((p) => covers(b, p))) ?? (places[0] as Box);
}

/**
 * "Nice" axis ticks from 0 to at most `max`, about `count` of them: a step of 1, 2 or 5 times a
 * power of ten (the one closest to `max / count` on a log scale, as d3's `tickStep` picks it),
 * or of a power of two for `base` 2 (bytes).
 */
export function ticks(max: number, count = 4, base = 10): number[] {
  if (!(max > 0)) return [0];
  const raw = max / count;
  const p = base ** Math.floor(Math.log(raw) / Math.log(base));
  const step =
    base === 10
      ? p * (raw / p >= Math.sqrt(50) ? 10 : raw / p >= Math.sqrt(10) ? 5 : raw / p >= Math.sqrt(2) ? 2 : 1)
      : ([1, 2, 5, base].map((m) => m * p).find((s) => s >= raw) ?? raw);
  const out: number[] = [];
  for (let i = 0; i * step <= max * 1.0001; i++) out.push(Number((i * step).toPrecision(12)));
  return out;
}

/** A tick's seconds in the fewest digits: "0", "20 s", "250 ms", "1.5 ms", "40 µs". */
export function tickSeconds(v: number): string {
  if (v === 0) return "0";
  const [scale, unit] = v >= 1 ? [1, "s"] : v >= 1e-3 ? [1e3, "ms"] : [1e6, "µs"];
  return `${Number((v * scale).toPrecision(6))} ${unit}`;
}

export interface ChartHandlers {
  onHover(c: PlanCandidate | null): void;
  onOpen(c: PlanCandidate): void;
}

/** The chart's x range over the points `drawn` (every candidate traced when not given) and
 * whether it reaches the budget (see `budget.ts`: a quarter of it). */
export function xRange(p: PlanPayload, drawn: readonly Drawn[] = p.candidates.filter(isDrawn)): { max: number; budgetShown: boolean } {
  const largest = Math.max(0, ...drawn.map(heldBytes));
  const budgetShown = p.budget > 0 && largest >= IN_VIEW * p.budget;
  return { max: Math.max(budgetShown ? p.budget : 0, largest) * 1.1 || 1, budgetShown };
}

/** Whether the chart may show only the candidates that fit: some fit and some drawn do not. */
export function canZoom(p: PlanPayload): boolean {
  const drawn = p.candidates.filter(isDrawn);
  return drawn.some((c) => c.fits) && drawn.some((c) => !c.fits);
}

/**
 * Draw the chart (`width` x `height` user units, scaled to its box): every candidate traced, or
 * with `fitting` only those that fit (the axes then span them alone).
 */
export function planChart(p: PlanPayload, handlers: ChartHandlers, width = 640, height = 300, fitting = false): SVGSVGElement {
  const drawn = p.candidates.filter(isDrawn).filter((c) => c.fits || !fitting);
  const { max: xMax, budgetShown } = xRange(p, drawn);
  const yMax = Math.max(0, ...drawn.map((c) => c.stepS)) * 1.12 || 1;
  const yTicks = ticks(yMax, 5);
  // room on the left for the widest tick text (11px: about 6.5px a character) and the axis title
  const left = Math.max(44, 30 + 6.5 * Math.max(...yTicks.map((v) => tickSeconds(v).length)));
  const right = 16;
  const top = 18;
  const bottom = 40;
  const x = (v: number): number => left + ((width - left - right) * v) / xMax;
  const y = (v: number): number => height - bottom - ((height - top - bottom) * v) / yMax;
  const root = svg("svg", { viewBox: `0 0 ${width} ${height}`, class: "mw-plan-chart", role: "img" });
  const title = svg("title", {});
  title.textContent = `step time against the memory each device holds for ${drawn.length} candidates${fitting ? " that fit" : ""} on ${p.gpu}; the dashed line is the budget`;
  root.append(title);
  const text = (x0: number, y0: number, value: string, cls: string, anchor = "start"): SVGTextElement => {
    const t = svg("text", { x: x0, y: y0, class: cls, "text-anchor": anchor });
    t.textContent = value;
    root.append(t);
    return t;
  };
  // axes, grid and ticks
  for (const v of ticks(xMax, 4, 2)) {
    root.append(svg("line", { x1: x(v), x2: x(v), y1: top, y2: height - bottom, class: "mw-plan-grid" }));
    // the last tick's text ends at the edge rather than past it
    const edge = x(v) + 32 > width;
    text(edge ? width - 2 : x(v), height - bottom + 14, v === 0 ? "0" : formatBytes(v), "mw-plan-tick", edge ? "end" : "middle");
  }
  for (const v of yTicks) {
    root.append(svg("line", { x1: left, x2: width - right, y1: y(v), y2: y(v), class: "mw-plan-grid" }));
    text(left - 6, y(v) + 4, tickSeconds(v), "mw-plan-tick", "end");
  }
  root.append(svg("line", { x1: left, x2: left, y1: top, y2: height - bottom, class: "mw-plan-axis" }));
  root.append(svg("line", { x1: left, x2: width - right, y1: height - bottom, y2: height - bottom, class: "mw-plan-axis" }));
  const xTitle = width >= 480 ? "memory per GPU (rank 0, as nvidia-smi would show it)" : "memory per GPU (rank 0)";
  text((left + width - right) / 2, height - 6, xTitle, "mw-plan-label", "middle");
  const yLabel = text(12, (top + height - bottom) / 2, "step time", "mw-plan-label", "middle");
  yLabel.setAttribute("transform", `rotate(-90 12 ${(top + height - bottom) / 2})`);
  // the budget: a vertical dashed line, or an arrow at the right edge when off the scale
  const budgetText = `budget ${memoryText(p.budget)}`;
  if (budgetShown) {
    root.append(svg("line", { x1: x(p.budget), x2: x(p.budget), y1: top - 6, y2: height - bottom, class: "mw-plan-budget" }));
    const room = x(p.budget) + 110 < width;
    text(room ? x(p.budget) + 4 : x(p.budget) - 4, top + 4, budgetText, "mw-plan-budget-label", room ? "start" : "end");
  } else {
    text(width - right, top + 4, `${budgetText} →`, "mw-plan-budget-label", "end");
  }
  // the Pareto front: a step line through the fitting candidates nothing beats on both axes
  const front = paretoFront(p.candidates);
  if (front.length > 1) {
    const pts = front.map((c) => [x(heldBytes(c)), y(c.stepS)] as const);
    let d = `M${pts[0]?.[0]},${pts[0]?.[1]}`;
    for (const [px, py] of pts.slice(1)) d += ` H${px} V${py}`;
    const line = svg("path", { d, class: "mw-plan-pareto", "pointer-events": "none" });
    const tip = svg("title", {});
    tip.textContent = "the Pareto front: no candidate that fits is both faster and smaller on the GPU";
    line.append(tip);
    root.append(line);
  }
  for (const c of front) root.append(svg("circle", { cx: x(heldBytes(c)), cy: y(c.stepS), r: 7.5, class: "mw-plan-pareto-mark", "data-front": c.index, "pointer-events": "none" }));
  // the points: the best last, on top; labels go before them
  const pointsStart = svg("g", { class: "mw-plan-points" });
  root.append(pointsStart);
  const classes = precisionClasses(p.candidates);
  const order = [...drawn].sort((a, b) => Number(a.index === p.best) - Number(b.index === p.best));
  for (const c of order) {
    const g = svg("g", { class: "mw-plan-point", "data-index": c.index, tabindex: 0 });
    if (c.index === p.best) {
      const at: [number, number] = [x(heldBytes(c)), y(c.stepS)];
      g.append(svg("circle", { cx: at[0], cy: at[1], r: 10, class: "mw-plan-best-ring" }));
      const others = drawn.filter((o) => o.index !== c.index).map((o): [number, number] => [x(heldBytes(o)), y(o.stepS)]);
      const area = { x0: left, y0: top, x1: width - right, y1: height - bottom };
      const b = labelBox(at, others, 30, 12, area);
      // drawn before the points, and deaf to the pointer: it never takes a point's click
      const label = text((b.x0 + b.x1) / 2, b.y1 - 2, "best", "mw-plan-best-label", "middle");
      label.setAttribute("pointer-events", "none");
      root.insertBefore(label, pointsStart);
    }
    const dot = svg("circle", {
      cx: x(heldBytes(c)),
      cy: y(c.stepS),
      r: 5,
      class: `mw-plan-dot ${c.fits ? "mw-plan-in" : "mw-plan-out"} ${classes.get(c.precision) ?? ""}`,
    });
    const tip = svg("title", {});
    tip.textContent = candidateText(c);
    dot.append(tip);
    g.append(dot);
    g.addEventListener("mouseenter", () => handlers.onHover(c));
    g.addEventListener("mouseleave", () => handlers.onHover(null));
    g.addEventListener("click", () => handlers.onOpen(c));
    g.addEventListener("keydown", (e: KeyboardEvent) => {
      if (e.key === "Enter" || e.key === " ") handlers.onOpen(c);
    });
    root.append(g);
  }
  return root;
}
