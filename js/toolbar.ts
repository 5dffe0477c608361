/**
 * The toolbar above the table: the filter box, the depth menu, the precision switch, "Collapse
 * all" and the kernel switches (`switches.ts`). It holds no state: `render` shows the view
 * state, and what the user does goes out through its handlers.
 */
import { DTYPE_CHOICES, type DtypeChoice } from "./charts";
import { h } from "./details";
import { PRECISION_HINT } from "./precision";
import type { ViewState } from "./viewstate";

export interface ToolbarHandlers {
  onFilter(text: string): void;
  onDepth(depth: number): void;
  onDtype(dtype: DtypeChoice): void;
  onCollapse(): void;
}

export class Toolbar {
  readonly el = h("div", "mw-toolbar");
  private search = h("input", "mw-search");
  /** How many modules the filter matches ("" without a filter). */
  private matchCount = h("span", "mw-match-count");
  private depthSel = h("select", "mw-select");
  private dtypeBox = h("div", "mw-seg");
  /** The depth the menu's options were made for (-1: none yet). */
  private optionsFor = -1;

  constructor(
    private handlers: ToolbarHandlers,
    switches: HTMLElement,
  ) {
    this.search.type = "search";
    this.search.placeholder = "Filter: name, type, path or glob (layers.*.mlp)";
    this.search.setAttribute("aria-label", "Filter modules by name, type, dotted path or glob");
    this.search.title =
      "A name or class substring (attn, Linear), or a dotted path from any depth (mlp.c_fc) where * stands for one segment (layers.*.mlp). Matches inside folded layers stay folded: the first one is shown.";
    this.search.addEventListener("input", this.onSearch);
    const depthLabel = h("label", "mw-label", "Depth ");
    depthLabel.append(this.depthSel);
    depthLabel.title = "Expand the tree to this depth (the memory chart shows modules at it)";
    this.depthSel.addEventListener("change", this.onDepth);
    const dtypeLabel = h("span", "mw-label", "Precision ");
    dtypeLabel.title = PRECISION_HINT;
    for (const d of DTYPE_CHOICES) {
      const b = h("button", "mw-seg-btn", d);
      b.type = "button";
      b.dataset.dtype = d;
      b.addEventListener("click", () => handlers.onDtype(d));
      this.dtypeBox.append(b);
    }
    dtypeLabel.append(this.dtypeBox);
    const collapse = h("button", "mw-btn", "Collapse all");
    collapse.type = "button";
    collapse.addEventListener("click", () => handlers.onCollapse());
    // after the depth menu: tests and the benchmark find the depth menu as the first .mw-select
    this.matchCount.setAttribute("aria-live", "polite");
    this.el.append(this.search, this.matchCount, depthLabel, dtypeLabel, collapse, switches);
  }

  /**
   * Show the view state: filter text, depth (menu options up to `maxDepth`), precision, and
   * `matches`: how many modules the filter matches (null: no filter).
   */
  render(s: ViewState, maxDepth: number, matches: number | null = null): void {
    if (this.search.value !== s.filter) this.search.value = s.filter;
    const count = matches === null ? "" : matches === 0 ? "no match" : `${matches.toLocaleString("en-US")} match${matches > 1 ? "es" : ""}`;
    if (this.matchCount.textContent !== count) this.matchCount.textContent = count;
    this.matchCount.classList.toggle("mw-no-match", matches === 0);
    if (maxDepth !== this.optionsFor) this.fillDepthOptions(maxDepth);
    if (this.depthSel.value !== String(s.depth)) this.depthSel.value = String(s.depth);
    for (const b of this.dtypeBox.querySelectorAll<HTMLButtonElement>("button")) {
      b.classList.toggle("mw-active", b.dataset.dtype === s.dtype);
      b.setAttribute("aria-pressed", String(b.dataset.dtype === s.dtype));
    }
  }

  destroy(): void {
    this.search.removeEventListener("input", this.onSearch);
    this.depthSel.removeEventListener("change", this.onDepth);
  }

  private onSearch = (): void => this.handlers.onFilter(this.search.value);

  private onDepth = (): void => this.handlers.onDepth(Number(this.depthSel.value));

  private fillDepthOptions(maxDepth: number): void {
    this.optionsFor = maxDepth;
    this.depthSel.textContent = "";
    for (let d = 1; d <= Math.max(1, maxDepth); d++) {
      const o = h("option", "", d === maxDepth && d > 1 ? `${d} (all)` : String(d));
      o.value = String(d);
      this.depthSel.append(o);
    }
  }
}
