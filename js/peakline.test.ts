/**
 * The header's peak line, on the recorded fixtures: the split adds up to the peak the Python
 * side computed, the budget is the GPU's (80 GiB H100) or one typed in, and the levers' numbers
 * come from the payload's own `what_if` (bf16, int4) or from the split (FSDP, checkpointing:
 * recomputed here from the categories, as the lever's title says).
 */
import { describe, expect, it } from "vitest";
import { decodePayload } from "./decode";
import { budgetVerdict, levers, PeakLine, peakSplit, repeatedBlocks } from "./peakline";
import type { Analysis } from "./protocol";

const files = import.meta.glob<{ default: unknown }>("./fixtures/*.json", { eager: true });
const get = (name: string): Analysis => decodePayload(files[`./fixtures/${name}`]?.default) as Analysis;
const GIB = 2 ** 30;

describe("the peak line", () => {
  it("splits the peak into categories that add up to it", () => {
    for (const name of ["gpt2-tiny.json", "gpt2-tiny.training.json"]) {
      const a = get(name);
      const split = peakSplit(a);
      expect(split.length).toBeGreaterThan(1);
      expect(split.reduce((s, [, b]) => s + b, 0)).toBe(a.totals.peak_bytes);
    }
    expect(peakSplit(get("gpt2-tiny.training.json")).map(([n]) => n)).toContain("optimizer");
  });

  it("holds the peak against the GPU's memory, or a typed budget", () => {
    const a = get("gpt2-tiny.training.json");
    const line = new PeakLine();
    line.render(a);
    const text = line.el.textContent ?? "";
    expect(text).toContain("fits:");
    expect(text).toContain("H100 80 GiB");
    // a typed budget under the peak: "over … by"
    const input = line.el.querySelector("input") as HTMLInputElement;
    input.value = String(a.totals.peak_bytes / 2 / GIB);
    input.dispatchEvent(new Event("change"));
    expect(line.el.querySelector(".mw-over")?.textContent).toContain("over");
    expect(budgetVerdict(3 * GIB, { bytes: 2 * GIB, label: "2 GiB" })).toBe("over 2 GiB by 1.00 GiB");
  });

  it("offers levers with what each gives", () => {
    const inf = get("gpt2-tiny.json");
    const names = levers(inf, null).map((l) => l.name);
    expect(names).toContain("int4 weights");
    const int4 = levers(inf, null).find((l) => l.name === "int4 weights");
    expect(int4?.bytes).toBe(inf.memory.whatIf.int4?.total);
    expect(int4?.estimate).toBe(false);
    const train = get("gpt2-tiny.training.json");
    const cats = train.memory.categories;
    const fsdp = levers(train, { bytes: 80 * GIB, label: "H100 80 GiB" }).find((l) => l.name.startsWith("FSDP"));
    expect(fsdp?.estimate).toBe(true);
    // everything fits in 80 GiB: the smallest FSDP size is shown, its estimate from the split
    const pgo = (cats.parameters ?? 0) + (cats.gradients ?? 0) + (cats["optimizer state"] ?? 0);
    expect(fsdp?.name).toBe("FSDP 2");
    expect(fsdp?.bytes).toBeCloseTo(train.totals.peak_bytes - pgo / 2);
    const blocks = repeatedBlocks(train);
    expect(blocks.count).toBeGreaterThanOrEqual(2);
  });

  it("is hidden while a trace runs and without a split", () => {
    const a = { ...get("gpt2-tiny.json"), status: "running" } as Analysis;
    const line = new PeakLine();
    line.render(a);
    expect(line.el.style.display).toBe("none");
  });
});
