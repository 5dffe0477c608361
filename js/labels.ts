/**
 * Labels drawn on a chart's canvas: their boxes, so that a label placed later moves clear of
 * those placed before it (and a browser test can check that none overlaps another).
 */

/** A label's box, canvas pixels. */
export interface LabelBox {
  name: string;
  x: number;
  y: number;
  w: number;
  h: number;
}

/** Whether two boxes share any area. */
export function overlaps(a: LabelBox, b: LabelBox): boolean {
  return a.x < b.x + b.w && b.x < a.x + a.w && a.y < b.y + b.h && b.y < a.y + a.h;
}
