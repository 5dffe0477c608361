/**
 * A parallel trace's collectives (`analyze(..., parallel=...)`): decoded from the payload's
 * `comms` columns, drawn as marks along the memory timeline (one tick per all-gather,
 * reduce-scatter or all-reduce, at the point of the step where it ran) and summed in a table.
 * Every name reaches the DOM as text.
 */

export interface Comm {
  /** Index into the payload's timeline at which the collective ran. */
  point: number;
  collective: string;
  bytes: number;
  group: string;
  module: string;
  phase: string;
}

function col(raw: Record<string, unknown>, key: string): unknown[] {
  const v = raw[key];
  return Array.isArray(v) ? v : [];
}

/** The `comms` columns of a payload as rows; `[]` when absent or malformed. */
export function decodeComms(raw: unknown): Comm[] {
  if (typeof raw !== "object" || raw === null || Array.isArray(raw)) return [];
  const r = raw as Record<string, unknown>;
  const points = col(r, "point");
  const out: Comm[] = [];
  for (let i = 0; i < points.length; i++) {
    const num = (key: string): number => {
      const v = col(r, key)[i];
      return typeof v === "number" && Number.isFinite(v) ? v : 0;
    };
    const text = (key: string): string => {
      const v = col(r, key)[i];
      return typeof v === "string" ? v : "";
    };
    out.push({
      point: num("point"),
      collective: text("collective"),
      bytes: num("bytes"),
      group: text("group"),
      module: text("module"),
      phase: text("phase"),
    });
  }
  return out;
}

export interface CommTotal {
  phase: string;
  collective: string;
  group: string;
  calls: number;
  bytes: number;
}

/** The collectives summed by phase, collective and group, in order of first appearance. */
export function commTotals(comms: readonly Comm[]): CommTotal[] {
  const rows = new Map<string, CommTotal>();
  for (const c of comms) {
    const key = `${c.phase}\u0000${c.collective}\u0000${c.group}`;
    const row = rows.get(key) ?? { phase: c.phase, collective: c.collective, group: c.group, calls: 0, bytes: 0 };
    row.calls += 1;
    row.bytes += c.bytes;
    rows.set(key, row);
  }
  return [...rows.values()];
}

const COLORS: Record<string, string> = {
  all_gather: "var(--mw-comm-gather, #2a9d8f)",
  reduce_scatter: "var(--mw-comm-reduce, #e76f51)",
  all_reduce: "var(--mw-comm-allreduce, #8e7dbe)",
};

/**
 * Fill `parent` with the marks strip (ticks at `point / points` of `width`) and the totals
 * table; empty it when there are no collectives. `format` formats byte counts.
 */
export function renderComms(
  parent: HTMLElement,
  comms: readonly Comm[],
  points: number,
  width: number,
  format: (bytes: number) => string,
): void {
  parent.textContent = "";
  parent.style.display = comms.length ? "" : "none";
  if (!comms.length) return;
  const title = document.createElement("div");
  title.className = "mw-muted mw-chart-note";
  title.textContent = `Collectives of this rank along the step (${comms.length}): each mark is one, at the moment it ran; hover for the module it serves.`;
  const strip = document.createElement("div");
  strip.className = "mw-comms-strip";
  strip.style.position = "relative";
  strip.style.height = "14px";
  strip.style.width = `${Math.max(width, 50)}px`;
  const span = Math.max(points - 1, 1);
  for (const c of comms) {
    const mark = document.createElement("span");
    mark.className = `mw-comm mw-comm-${c.collective}`;
    mark.style.position = "absolute";
    mark.style.left = `${(100 * Math.min(c.point, span)) / span}%`;
    mark.style.top = "0";
    mark.style.width = "2px";
    mark.style.height = "100%";
    mark.style.background = COLORS[c.collective] ?? "var(--jp-ui-font-color2, #888)";
    mark.title = `${c.collective} ${format(c.bytes)} (${c.group}) for ${c.module || "the root module"}, ${c.phase}`;
    strip.append(mark);
  }
  const table = document.createElement("table");
  table.className = "mw-comms-table";
  const head = table.insertRow();
  for (const name of ["phase", "collective", "group", "calls", "bytes"]) {
    const th = document.createElement("th");
    th.textContent = name;
    head.append(th);
  }
  for (const t of commTotals(comms)) {
    const row = table.insertRow();
    for (const v of [t.phase, t.collective, t.group, String(t.calls), format(t.bytes)]) {
      row.insertCell().textContent = v;
    }
  }
  parent.append(title, strip, table);
  alignWithChart(parent, strip);
}

/**
 * Put the marks under the timeline chart drawn beside `parent` (uPlot's plot area, `.u-over`),
 * so that a mark sits under the point of the step it belongs to; without a chart, as is.
 */
function alignWithChart(parent: HTMLElement, strip: HTMLElement): void {
  const host = parent.parentElement;
  if (!host) return;
  host.append(parent); // after the chart
  const align = (): void => {
    const over = host.querySelector<HTMLElement>(".u-over");
    const plot = over?.getBoundingClientRect();
    if (!plot || plot.width <= 0) return;
    strip.style.marginLeft = `${plot.left - parent.getBoundingClientRect().left}px`;
    strip.style.width = `${plot.width}px`;
  };
  align();
  requestAnimationFrame(align); // the chart may lay itself out in the next frame
}
