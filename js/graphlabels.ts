/**
 * What a Graph tab node says in its box: its name (the last parts of its path, `shortLabels`),
 * its second line (type, repeats, calls), cut to the box (`clip`), and the box's width for them.
 * DOM-free.
 */
import type { GNode } from "./graph";

/** Pixels a character of a node's text takes (the tab's 11 px font). */
export const CHAR_W = 7;

/** A node's second line: its type, the residual's branch, repeats and calls. */
export function typeLine(n: GNode): string {
  const detail = n.kind === "residual" && n.detail ? ` (${n.detail})` : "";
  return `${n.type}${detail}${n.repeats > 1 ? ` × ${n.repeats}` : ""}${n.calls > n.repeats ? ` · ${n.calls} calls` : ""}`;
}

/** The second line of a "… N more" node. */
export const moreLine = (n: GNode): string => `${n.type} · click for more`;

/** A node's box width for its shown name and its second line. */
export function nodeWidth(n: GNode, label: string): number {
  const type = n.more === null ? typeLine(n).length : moreLine(n).length;
  const text = Math.max(label.length, type);
  return Math.max(90, Math.min(260, text * CHAR_W + 30));
}

/**
 * The name each node shows in its box: the last two parts of its path ("self_attn.v_proj" for
 * "model.layers.0–3.self_attn.v_proj"), more where two nodes would read the same (an opened
 * layer beside its neighbours: "1.self_attn.q_proj"). The whole path is the node's tooltip and
 * `data-label`, and the tree's selection; the boxes are narrower, so a graph fits a narrow view
 * at a larger, readable scale.
 */
export function shortLabels(nodes: readonly GNode[]): Map<string, string> {
  const parts = new Map(nodes.map((n) => [n.key, n.label.split(".")]));
  const take = new Map(nodes.map((n) => [n.key, 2]));
  const shown = (key: string): string => {
    const p = parts.get(key) ?? [];
    return p.slice(Math.max(0, p.length - (take.get(key) ?? 2))).join(".");
  };
  for (let round = 0; round < 64; round++) {
    const byText = new Map<string, string[]>();
    for (const n of nodes) (byText.get(shown(n.key)) ?? byText.set(shown(n.key), []).get(shown(n.key)))?.push(n.key);
    let grew = false;
    for (const keys of byText.values()) {
      if (keys.length < 2) continue;
      for (const k of keys) {
        if ((take.get(k) ?? 2) < (parts.get(k)?.length ?? 0)) {
          take.set(k, (take.get(k) ?? 2) + 1);
          grew = true;
        }
      }
    }
    if (!grew) break;
  }
  return new Map(nodes.map((n) => [n.key, shown(n.key)]));
}

/** `text` cut to fit `width` pixels, its middle elided (the ends say most). */
export function clip(text: string, width: number): string {
  const max = Math.floor((width - 26) / CHAR_W);
  if (text.length <= max) return text;
  const head = Math.ceil((max - 1) / 2);
  return `${text.slice(0, head)}…${text.slice(text.length - (max - 1 - head))}`;
}
