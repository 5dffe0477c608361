/**
 * The comparison view of `mw.compare(a, b)`: totals side by side, then the module tree with the
 * modules that differ highlighted, repeated layers folded (`layers.0–31 · 32 ×`, folded by the
 * kernel). "Differences only" keeps the changed rows and their ancestors. Text only through
 * `textContent`.
 */
import { h } from "./details";
import { NONE, formatBytes, formatCount, formatFlops } from "./format";
import { COMPARE_NUMBERS, type CompareNumber, type ComparePayload, type CompareRow } from "./protocol";

const TOTALS: [string, string, (n: number) => string][] = [
  ["total_params", "parameters", formatCount],
  ["total_flops", "FLOPs", formatFlops],
  ["activation_bytes", "allocated by forward", formatBytes],
  ["param_bytes", "parameter bytes", formatBytes],
  ["peak_bytes", "peak", formatBytes],
];

/** The columns of the tree: one per number of `COMPARE_NUMBERS` (`comparison.NUMBERS`). */
export const COMPARE_COLUMNS: Record<CompareNumber, [string, (n: number) => string]> = {
  params: ["params", formatCount],
  flops: ["FLOPs", formatFlops],
  activation_bytes: ["output mem", formatBytes],
};
const COLUMNS = COMPARE_NUMBERS.map((key) => [key, ...COMPARE_COLUMNS[key]] as const);

/** `a → b (+d)`, or just `a` when equal; "–" when both are 0, as the tree and `summary()` write it. */
export function pair(values: [number, number], format: (n: number) => string): string {
  const [a, b] = values;
  if (a === b) return a === 0 ? NONE : format(a);
  const d = b - a;
  return `${format(a)} → ${format(b)} (${d > 0 ? "+" : "−"}${format(Math.abs(d))})`;
}

/** A number cell: `a → b` and `(+d)` each kept whole, free to break between them (a table
 * that fits the notebook instead of scrolling sideways). */
function pairCell(values: [number, number], format: (n: number) => string): HTMLTableCellElement {
  const td = h("td", "mw-cmp-num");
  const text = pair(values, format);
  const cut = text.lastIndexOf(" (");
  const [change, delta] = cut < 0 ? [text, ""] : [text.slice(0, cut), text.slice(cut + 1)];
  const arrow = change.indexOf(" → ");
  const parts = arrow < 0 ? [change] : [change.slice(0, arrow + 2), change.slice(arrow + 3)];
  parts.forEach((part, i) => {
    if (i) td.append(document.createTextNode(" "));
    td.append(h("span", "mw-cmp-part", part));
  });
  if (delta) td.append(document.createTextNode(" "), h("span", "mw-cmp-part mw-cmp-delta", delta));
  return td;
}

/** The rows kept by "differences only": changed rows and every ancestor of one. */
export function withAncestors(rows: CompareRow[]): CompareRow[] {
  const keep = new Set<number>();
  const stack: { index: number; depth: number }[] = [];
  rows.forEach((r, i) => {
    while (stack.length && (stack[stack.length - 1]?.depth ?? -1) >= r.depth) stack.pop();
    if (r.changed) {
      keep.add(i);
      for (const parent of stack) keep.add(parent.index);
    }
    stack.push({ index: i, depth: r.depth });
  });
  return rows.filter((_, i) => keep.has(i));
}

function totalsTable(p: ComparePayload): HTMLTableElement {
  const table = h("table", "mw-cmp-totals");
  const head = h("tr");
  for (const t of ["", `a: ${p.a}`, `b: ${p.b}`, "b − a"]) head.append(h("th", "", t));
  table.append(head);
  for (const [key, label, format] of TOTALS) {
    const v = p.totals[key];
    if (!v) continue;
    const tr = h("tr", v[0] !== v[1] ? "mw-cmp-changed" : "");
    const d = v[1] - v[0];
    tr.append(h("td", "", label), h("td", "", format(v[0])), h("td", "", format(v[1])));
    tr.append(h("td", "", d === 0 ? "=" : `${d > 0 ? "+" : "−"}${format(Math.abs(d))}`));
    table.append(tr);
  }
  return table;
}

function treeTable(rows: CompareRow[]): HTMLTableElement {
  const table = h("table", "mw-cmp-tree");
  const head = h("tr");
  head.append(h("th", "", "module"), h("th", "mw-cmp-type", "type"));
  for (const [, label] of COLUMNS) head.append(h("th", "", label));
  table.append(head);
  for (const r of rows) {
    const cls = ["mw-cmp-row", r.changed ? "mw-cmp-changed" : "", r.onlyIn ? `mw-cmp-only-${r.onlyIn}` : ""];
    const tr = h("tr", cls.filter(Boolean).join(" "));
    const name = h("td", "mw-cmp-name");
    name.style.paddingLeft = `${4 + 10 * r.depth}px`;
    // its own name under its parent's row, as the tree writes it; the whole path in the tooltip
    name.append(h("span", "", r.module ? (r.module.split(".").pop() as string) : "(root)"));
    name.title = r.module || "(root)";
    // shown only where the class column is left out (a narrow notebook)
    if (r.count > 1) name.append(h("span", "mw-cmp-count-narrow", ` (${r.count} ×)`));
    if (r.onlyIn) name.append(h("span", "mw-cmp-only", `only in ${r.onlyIn}`));
    // a folded group counts its layers in its class, as the tree writes it ("2 × LlamaDecoderLayer"):
    // plain text, not a chip that reads as a close button
    const type = h("td", "mw-cmp-type");
    if (r.count > 1) type.append(h("span", "mw-cmp-count", `${r.count} × `));
    type.append(document.createTextNode(r.type));
    tr.append(name, type);
    for (const [key, , format] of COLUMNS) tr.append(pairCell(r[key], format));
    table.append(tr);
  }
  return table;
}

/** Render the comparison into `el` (replacing what was there). */
export function renderComparison(el: HTMLElement, p: ComparePayload): () => void {
  el.replaceChildren();
  const root = h("div", "mw-root mw-cmp");
  const changed = p.rows.filter((r) => r.changed).length;
  root.append(h("div", "mw-cmp-title", compareTitle(p)));
  root.append(totalsTable(p));
  const label = h("label", "mw-cmp-filter");
  const only = h("input");
  only.type = "checkbox";
  only.checked = changed > 0;
  label.append(only, document.createTextNode(" differences only"));
  root.append(label);
  const holder = h("div", "mw-cmp-holder");
  const draw = (): void => holder.replaceChildren(treeTable(only.checked ? withAncestors(p.rows) : p.rows));
  only.addEventListener("change", draw);
  draw();
  root.append(holder);
  el.append(root);
  return () => only.removeEventListener("change", draw);
}

/**
 * The comparison's headline, counting modules as `Comparison.summary()` does (a folded row of
 * 32 layers is 32 modules) and saying how many rows show them:
 * "LlamaForCausalLM (a) against LlamaForCausalLM (b): 96 modules differ (3 rows, layers folded)".
 */
export function compareTitle(p: ComparePayload): string {
  const rows = p.rows.filter((r) => r.changed);
  const modules = rows.reduce((s, r) => s + Math.max(1, r.count), 0);
  if (modules === 0) return `${p.a} (a) against ${p.b} (b): no module differs`;
  const folded = modules > rows.length ? ` (${rows.length} row${rows.length > 1 ? "s" : ""}, repeated layers folded)` : "";
  return `${p.a} (a) against ${p.b} (b): ${modules} module${modules > 1 ? "s" : ""} differ${modules > 1 ? "" : "s"}${folded}`;
}
