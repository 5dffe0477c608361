/**
 * The checkpoint view: how the model's state dict and a checkpoint disagree
 * (`analyze(..., checkpoint=path)`), as a box above the table and as a marker on the rows whose
 * parameters are missing or mis-shaped. Text only through `textContent`.
 */
import { h } from "./details";
import { formatExact } from "./format";
import type { Analysis, CheckpointDiff } from "./protocol";
import type { TreeNode } from "./tree";

/**
 * Parameter paths with a checkpoint problem, by module path: a parameter `a.b.weight` belongs to
 * module `a.b` (`name.rpartition(".")[0]`). Values say what is wrong, for the row's tooltip.
 */
export function checkpointProblems(a: Analysis): Map<string, string[]> {
  const out = new Map<string, string[]>();
  const c = a.checkpoint;
  if (!c) return out;
  const add = (name: string, what: string): void => {
    const k = name.lastIndexOf(".");
    const module = k < 0 ? "" : name.slice(0, k);
    const list = out.get(module) ?? [];
    list.push(`${name}: ${what}`);
    out.set(module, list);
  };
  for (const n of c.missing) add(n, "missing from the checkpoint");
  for (const m of c.shapeMismatches)
    add(m.name, `shape [${m.model.join(", ")}] in the model, [${m.checkpoint.join(", ")}] in the checkpoint`);
  return out;
}

/**
 * Checkpoint problems of the row's own parameters (a group: of any member); a collapsed row
 * also shows those of the modules it hides, so that a folded problem is not lost.
 */
export function checkpointMarker(
  problems: Map<string, string[]>,
  a: Analysis,
  node: TreeNode,
  collapsed: boolean,
): string {
  if (problems.size === 0) return "";
  const members = node.kind === "module" ? [node.module] : node.members;
  const lines: string[] = [];
  for (const i of members) {
    const path = a.modules[i]?.path;
    if (path === undefined) continue;
    for (const [k, p] of problems) {
      if (k === path || (collapsed && (path === "" || k.startsWith(`${path}.`)))) lines.push(...p);
    }
  }
  if (lines.length === 0) return "";
  return lines.slice(0, 8).join("\n") + (lines.length > 8 ? `\n… ${lines.length - 8} more` : "");
}

/** The box above the table: what matched, what is missing, unexpected or mis-shaped. */
export function renderCheckpoint(el: HTMLElement, c: CheckpointDiff | null, marked: boolean): void {
  el.textContent = "";
  el.style.display = c ? "" : "none";
  if (!c) return;
  el.classList.toggle("mw-checkpoint-ok", c.ok);
  const head = h(
    "div",
    "mw-checkpoint-head",
    c.ok
      ? `Checkpoint fits the model: ${formatExact(c.matched.length)} keys match.`
      : `Checkpoint does not fit the model: ${formatExact(c.matched.length)} keys match.`,
  );
  el.append(head);
  const some = (names: string[]): string =>
    names.slice(0, 5).join(", ") + (names.length > 5 ? `, … (${names.length} in all)` : "");
  const lines: [string, number, string][] = [
    ["missing from the checkpoint", c.missing.length, some(c.missing)],
    ["unexpected in the checkpoint", c.unexpected.length, some(c.unexpected)],
    [
      "shape mismatches",
      c.shapeMismatches.length,
      some(c.shapeMismatches.map((m) => `${m.name} (model [${m.model.join(", ")}], checkpoint [${m.checkpoint.join(", ")}])`)),
    ],
    [
      "dtype mismatches",
      c.dtypeMismatches.length,
      some(c.dtypeMismatches.map((m) => `${m.name} (${m.model} vs ${m.checkpoint})`)),
    ],
  ];
  for (const [label, n, names] of lines) {
    if (n === 0) continue;
    const line = h("div", "mw-checkpoint-line");
    line.dataset.kind = label;
    line.append(h("span", "mw-checkpoint-count", `${formatExact(n)} ${label}`), h("span", "mw-checkpoint-names", `: ${names}`));
    el.append(line);
  }
  for (const hint of c.hints) el.append(h("div", "mw-checkpoint-hint", hint));
  if (marked) el.append(h("div", "mw-muted", "Rows marked ✕ hold parameters that are missing or mis-shaped."));
}
