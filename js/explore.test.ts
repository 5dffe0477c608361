import { describe, expect, it } from "vitest";
import { compareTitle, pair, renderComparison, withAncestors } from "./compare";
import { decodeCompare, decodeFit } from "./decode";
import type { CompareRow } from "./protocol";
import { draw } from "./explore";
import { renderFit, verdict } from "./fit";
import { formatBytes, formatFlops } from "./format";

/** Written by the Python encoders (`python tests/test_explore_view.py`). */
const files = import.meta.glob<{ default: { fit: unknown; compare: unknown } }>("./fixtures/explore.json", {
  eager: true,
});
const sample = files["./fixtures/explore.json"]!.default;

describe("what fits panel", () => {
  const fit = decodeFit(sample.fit)!;

  it("says the size, its bytes against the budget and the next size", () => {
    expect(verdict(fit)).toBe(
      "batch = 107 fits: 7.95 MiB of 8.00 MiB; batch = 108 does not fit: 8.02 MiB, over by 22.5 KiB.",
    );
  });

  it("draws every traced size, over-budget ones apart, and the category bar", () => {
    const el = document.createElement("div");
    renderFit(el, fit);
    expect(el.querySelectorAll("circle").length).toBe(fit.history.length);
    const over = fit.history.filter(([, b]) => b > fit.budget).length;
    expect(el.querySelectorAll("circle.mw-fit-out").length).toBe(over);
    expect(el.querySelectorAll(".mw-fit-part").length).toBe(Object.keys(fit.categories).length);
    expect(el.textContent).toContain("Peak at batch = 107: features.1");
    expect(el.textContent).toContain("budget 8.00 MiB");
  });

  it("puts the bytes on a scale: 0, half and the top (the largest traced, or the budget)", () => {
    const el = document.createElement("div");
    renderFit(el, fit);
    const ticks = [...el.querySelectorAll("text.mw-fit-ytick")].map((t) => t.textContent);
    const top = Math.max(...fit.history.map(([, b]) => b), fit.budget);
    expect(ticks).toEqual(["0 B", formatBytes(top / 2), formatBytes(top)]);
    const ys = [...el.querySelectorAll("text.mw-fit-ytick")].map((t) => Number(t.getAttribute("y")));
    expect(ys[0]).toBeGreaterThan(ys[1]!); // 0 at the bottom, the top above it
    expect(ys[1]).toBeGreaterThan(ys[2]!);
  });

  it("refuses what is not a fit", () => {
    expect(decodeFit({ rows: [] })).toBeNull();
    const el = document.createElement("div");
    draw(el, "fit", {});
    expect(el.textContent).toContain("nothing to show");
  });
});

describe("comparison view", () => {
  const cmp = decodeCompare(sample.compare)!;

  it("counts modules as Comparison.summary() does, and says how many rows show them", () => {
    // three changed rows, each two layers folded: 6 modules (the Python summary's count)
    const modules = cmp.rows.filter((r) => r.changed).reduce((n, r) => n + r.count, 0);
    expect(modules).toBe(6);
    expect(compareTitle(cmp)).toMatch(/: 6 modules differ \(3 rows, repeated layers folded\)$/);
  });

  it("shows totals side by side and highlights exactly the changed rows", () => {
    const el = document.createElement("div");
    renderComparison(el, cmp);
    const changed = [...el.querySelectorAll<HTMLElement>(".mw-cmp-tree tr.mw-cmp-changed .mw-cmp-name")];
    expect(changed.map((e) => e.querySelector("span")!.textContent)).toEqual(["self_attn", "k_proj", "v_proj"]);
    expect(changed.map((e) => e.title)).toEqual([
      "model.layers.0–1.self_attn",
      "model.layers.0–1.self_attn.k_proj",
      "model.layers.0–1.self_attn.v_proj",
    ]);
    expect(el.querySelector(".mw-cmp-totals")!.textContent).toContain("parameters");
    // the folded count is plain text in the type cell, as the tree writes it; no chip
    expect(el.querySelector(".mw-cmp-count")!.parentElement!.textContent).toMatch(/^2 × \w+/);
    expect(el.querySelector(".mw-cmp-name .mw-cmp-count")).toBeNull();
  });

  it("differences only keeps the changed rows and their ancestors; unticked, every row", () => {
    const el = document.createElement("div");
    const cleanup = renderComparison(el, cmp);
    const kept = withAncestors(cmp.rows).map((r) => r.module);
    expect(kept).toEqual([
      "",
      "model",
      "model.layers",
      "model.layers.0–1",
      "model.layers.0–1.self_attn",
      "model.layers.0–1.self_attn.k_proj",
      "model.layers.0–1.self_attn.v_proj",
    ]);
    expect(el.querySelectorAll(".mw-cmp-tree tr.mw-cmp-row").length).toBe(kept.length);
    const box = el.querySelector("input")!;
    box.checked = false;
    box.dispatchEvent(new Event("change"));
    expect(el.querySelectorAll(".mw-cmp-tree tr.mw-cmp-row").length).toBe(cmp.rows.length);
    cleanup();
  });

  it("writes names as text, never as markup", () => {
    const row: CompareRow = {
      module: '<img src=x onerror="alert(1)">', depth: 0, type: "<b>T</b>", count: 1,
      changed: true, onlyIn: "b", params: [0, 4], flops: [0, 0], activation_bytes: [0, 0],
    };
    const el = document.createElement("div");
    renderComparison(el, { a: "A", b: "B", totals: {}, rows: [row] });
    expect(el.querySelector("img")).toBeNull();
    expect(el.textContent).toContain('<img src=x onerror="alert(1)">');
    expect(pair([0, 4], String)).toBe("0 → 4 (+4)");
  });

  it("writes a zero on both sides as the tree and summary() do: –, not 0 FLOPs (issue 28.8)", () => {
    expect(pair([0, 0], formatFlops)).toBe("–");
    expect(pair([0, 5_324_800], formatFlops)).toBe("0 FLOPs → 5.32 MFLOPs (+5.32 MFLOPs)");
    expect(pair([2818572288, 2818572288], formatBytes)).toBe("2.63 GiB");
  });
});
