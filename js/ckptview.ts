/**
 * The view of `mw.inspect_checkpoint(path)`: what the file holds, read without its data. A
 * line of totals and the notes, then a table of the tensors under their dotted groups (repeated
 * layers folded: `layers.0–79 · 80 ×` shows the first's tensors), each with its shape, dtype and
 * bytes. No switches (nothing is traced, so nothing can be re-run) and no tabs waiting for a
 * trace: the analysis widget is for `mw.analyze`. Text only through `textContent`.
 */
import { h } from "./details";
import { formatBytes, formatCount, formatExact, formatShape } from "./format";
import type { Analysis, ModuleInfo } from "./protocol";

/** A payload of `checkpoints.view.to_payload` (`source: "checkpoint"`). */
export function isCheckpoint(a: Analysis | null): a is Analysis {
  return a !== null && a.source === "checkpoint";
}

/** A row of the table: a group of tensors (a dotted prefix, maybe folded) or a tensor. */
export interface CheckpointRow {
  depth: number;
  name: string;
  /** "group" rows sum their tensors; "tensor" rows are one tensor. */
  kind: "group" | "tensor";
  shape: number[] | null;
  dtype: string;
  numel: number;
  bytes: number;
  /** How many identical groups a folded row stands for (1: not folded). */
  count: number;
}

/** Sibling groups alike: same tensors (names, shapes, dtypes) and same sub-groups. */
function signature(a: Analysis, m: ModuleInfo): string {
  const own = m.ownParams.map((t) => `${t.name}:${t.shape.join("x")}:${t.dtype}`).join(",");
  const kids = m.children.map((c) => {
    const child = a.modules[c] as ModuleInfo;
    return `${child.name}(${signature(a, child)})`;
  });
  return `${own}|${kids.join(",")}`;
}

/** The table's rows in order: groups, each followed by its tensors and sub-groups; runs of
 * numbered siblings alike folded into one row ("0–79"). */
export function checkpointRows(a: Analysis): CheckpointRow[] {
  const rows: CheckpointRow[] = [];
  const bytesOf = (t: { shape: number[]; dtype: string }, m: ModuleInfo): number => {
    const numel = t.shape.reduce((x, y) => x * y, 1);
    // a tensor's bytes: its share of its group's bytes by element count and dtype width
    return numel * dtypeBytes(t.dtype, m);
  };
  const walk = (m: ModuleInfo, depth: number, count: number, label: string): void => {
    if (m.parent >= 0) {
      rows.push({ depth, name: label, kind: "group", shape: null, dtype: "", numel: m.params * count, bytes: m.paramBytes * count, count });
    }
    const inner = m.parent >= 0 ? depth + 1 : depth;
    for (const t of m.ownParams) {
      const numel = t.shape.reduce((x, y) => x * y, 1);
      rows.push({ depth: inner, name: t.name, kind: "tensor", shape: t.shape, dtype: t.dtype, numel, bytes: bytesOf(t, m), count: 1 });
    }
    const kids = m.children.map((c) => a.modules[c] as ModuleInfo);
    for (let i = 0; i < kids.length; ) {
      const first = kids[i] as ModuleInfo;
      let j = i + 1;
      if (/^\d+$/.test(first.name)) {
        const sig = signature(a, first);
        while (j < kids.length && /^\d+$/.test((kids[j] as ModuleInfo).name) && signature(a, kids[j] as ModuleInfo) === sig) j += 1;
      }
      const n = j - i;
      walk(first, inner, n, n > 1 ? `${first.name}–${(kids[j - 1] as ModuleInfo).name}` : first.name);
      i = j;
    }
  };
  const root = a.modules[0];
  if (root) walk(root, 0, 1, "");
  return rows;
}

const WIDTHS: Record<string, number> = {
  float64: 8, int64: 8, complex64: 8, float32: 4, int32: 4, uint32: 4, float16: 2, bfloat16: 2, int16: 2, uint16: 2,
  int8: 1, uint8: 1, bool: 1, float8_e4m3fn: 1, float8_e5m2: 1,
};

/** Bytes per element of `dtype` (the group's own bytes per element when the name is unknown). */
function dtypeBytes(dtype: string, m: ModuleInfo): number {
  const known = WIDTHS[dtype.replace(/^torch\./, "")];
  if (known !== undefined) return known;
  return m.params > 0 ? m.paramBytes / m.params : 0;
}

/** Render the checkpoint view into `el`; returns what removes it. */
export function renderCheckpoint(el: HTMLElement, a: Analysis): () => void {
  const root = h("div", "mw-root mw-ckpt");
  const tensors = a.modules.reduce((n, m) => n + m.ownParams.length, 0);
  root.append(h("div", "mw-ckpt-title", `Checkpoint: ${a.title}`));
  root.append(
    h(
      "div",
      "mw-ckpt-totals",
      `${formatExact(tensors)} tensors · ${formatCount(a.totals.params)} elements (${formatExact(a.totals.params)}) · ${formatBytes(a.totals.param_bytes)}`,
    ),
  );
  for (const note of a.notes) root.append(h("div", "mw-ckpt-note", note));
  const table = h("table", "mw-ckpt-table");
  const head = h("tr");
  for (const [label, cls] of [["tensor", ""], ["shape", ""], ["dtype", ""], ["elements", "mw-num"], ["bytes", "mw-num"]] as const) {
    head.append(h("th", cls, label));
  }
  table.append(head);
  for (const r of checkpointRows(a)) {
    const tr = h("tr", `mw-ckpt-${r.kind}`);
    const name = h("td", "mw-ckpt-name");
    name.style.paddingLeft = `${4 + 14 * r.depth}px`;
    name.append(h("span", "", r.name));
    if (r.count > 1) name.append(h("span", "mw-ckpt-count", ` · ${r.count} ×`));
    tr.append(
      name,
      h("td", "mw-ckpt-shape", r.shape ? formatShape(r.shape) : ""),
      h("td", "mw-ckpt-dtype", r.dtype),
      h("td", "mw-num", formatCount(r.numel)),
      h("td", "mw-num", formatBytes(r.bytes)),
    );
    if (r.kind === "group" && r.count > 1) tr.title = `${r.count} groups alike: the first one's tensors are shown; the numbers are all ${r.count}'s`;
    table.append(tr);
  }
  const holder = h("div", "mw-ckpt-holder");
  holder.append(table);
  root.append(holder);
  el.append(root);
  return () => root.remove();
}
