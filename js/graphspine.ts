/**
 * The residual stream as the graph's spine: after the layered layout, the residual adds (the
 * ends of the "residual" edges that are op nodes) move into one column of their own, left of
 * everything, so the stream runs down it as one straight line and each branch leaves it and
 * comes back from the side. The edges that touch the column are redrawn as elbows whose
 * horizontal part lies in the gap between two ranks, where no box is. DOM-free.
 */
import type { Box, Point } from "./graphlayout";

/** Space between the spine's column and the rest (pixels). */
const GAP = 40;

interface Ends {
  src: string;
  dst: string;
  kind?: string;
}

/**
 * Move the `spine` nodes' boxes into a column left of the others and route the edges touching
 * them (in place). Returns the layout's new width, or null (nothing moved: no spine, or two of
 * its nodes in one rank, which one column cannot hold).
 */
export function straighten(spine: ReadonlySet<string>, boxes: Map<string, Box>, edges: readonly Ends[], points: Point[][], width: number, gapY: number, margin: number): number | null {
  const moved = [...spine].map((k) => boxes.get(k)).filter((b): b is Box => b !== undefined);
  if (moved.length === 0) return null;
  const ys = new Set(moved.map((b) => Math.round(b.y)));
  if (ys.size < moved.length) return null;
  const others = [...boxes].filter(([k]) => !spine.has(k)).map(([, b]) => b);
  const left = Math.min(...others.map((b) => b.x - b.width / 2));
  const colW = Math.max(...moved.map((b) => b.width));
  // the column's centre; everything shifts right where it would leave the margin
  let x = left - GAP - colW / 2;
  const shift = Math.max(0, margin + colW / 2 - x);
  x += shift;
  if (shift > 0) {
    for (const b of others) b.x += shift;
    for (const pts of points) for (const p of pts) p.x += shift;
  }
  for (const b of moved) b.x = x;
  const corridor = x + colW / 2 + GAP / 2;
  edges.forEach((e, i) => {
    if (e.src === e.dst || (!spine.has(e.src) && !spine.has(e.dst))) return;
    const a = boxes.get(e.src);
    const b = boxes.get(e.dst);
    if (a && b) points[i] = elbow(a, b, e, spine, corridor, gapY);
  });
  return width + shift;
}

/**
 * An edge touching the spine's column. The stream itself runs down the column into a node's
 * top; a branch leaves a node of the column by its right side and comes back into one the same
 * way, along the corridor between the column and the rest; every horizontal part lies in a gap
 * between ranks, where no box is.
 */
function elbow(a: Box, b: Box, e: Ends, spine: ReadonlySet<string>, corridor: number, gapY: number): Point[] {
  const bottom = { x: a.x, y: a.y + a.height / 2 };
  const top = { x: b.x, y: b.y - b.height / 2 };
  if (top.y <= bottom.y) return [bottom, top]; // upward (never in a feed-forward graph)
  if (spine.has(e.src) && spine.has(e.dst)) return [bottom, top];
  if (spine.has(e.dst)) {
    const below = bottom.y + gapY / 2;
    if (e.kind === "residual") return [bottom, { x: a.x, y: below }, { x: b.x, y: below }, top];
    const side = { x: b.x + b.width / 2, y: b.y };
    return [bottom, { x: a.x, y: below }, { x: corridor, y: below }, { x: corridor, y: side.y }, side];
  }
  const above = top.y - gapY / 2;
  const side = { x: a.x + a.width / 2, y: a.y };
  return [side, { x: corridor, y: side.y }, { x: corridor, y: above }, { x: b.x, y: above }, top];
}
