import { describe, expect, it } from "vitest";
import {
  formatBytes,
  formatCount,
  formatDuration,
  formatExact,
  formatFlops,
  formatShape,
  formatShapes,
} from "./format";

/** The table `tests/test_format_cases.py` holds the Python formatters to (meta_widget/units.py). */
type Case = [number | string, string, string];
const shared = import.meta.glob<{ default: Record<"bytes" | "count" | "flops", Case[]> }>(
  "../tests/format_cases.json",
  { eager: true },
);
const CASES = Object.values(shared)[0]?.default;
const FORMATS = { bytes: formatBytes, count: formatCount, flops: formatFlops } as const;

describe("the shared table of formats (as meta_widget.units writes them)", () => {
  it("is found", () => expect(CASES).toBeDefined());
  for (const kind of ["bytes", "count", "flops"] as const) {
    it.each(CASES?.[kind] ?? [])(`${kind}: %s -> %s (%s)`, (value, expected) =>
      expect(FORMATS[kind](Number(value))).toBe(expected),
    );
  }
});

describe("formatBytes (1024-based)", () => {
  it.each([
    [0, "0 B"],
    [1023, "1023 B"],
    [1024, "1.00 KiB"],
    [1536, "1.50 KiB"],
    [1048576, "1.00 MiB"],
    [10.5 * 1048576, "10.5 MiB"],
    [5 * 1024 ** 3, "5.00 GiB"],
    [140 * 1024 ** 3, "140 GiB"],
    [2 * 1024 ** 4, "2.00 TiB"],
    // 1023.999 KiB must not read "1024 KiB"
    [1024 * 1024 - 1, "1.00 MiB"],
  ])("%d bytes -> %s", (n, s) => expect(formatBytes(n)).toBe(s));
});

describe("formatCount (1000-based, short scale)", () => {
  it.each([
    [0, "0"],
    [999, "999"],
    [1234, "1.23 K"],
    [172288, "172 K"],
    [999_999, "1.00 M"],
    [7_000_000, "7.00 M"],
    [70_600_000_000, "70.6 B"],
    [1.2e12, "1.20 T"],
  ])("%d -> %s", (n, s) => expect(formatCount(n)).toBe(s));
});

describe("formatFlops", () => {
  it.each([
    [0, "0 FLOPs"],
    [512, "512 FLOPs"],
    [5_324_800, "5.32 MFLOPs"],
    [3.5e9, "3.50 GFLOPs"],
    [2.5e12, "2.50 TFLOPs"],
  ])("%d -> %s", (n, s) => expect(formatFlops(n)).toBe(s));
});

describe("shapes, durations, exact", () => {
  it("formats shapes like Python lists", () => {
    expect(formatShape([1, 4096, 8192])).toBe("[1, 4096, 8192]");
    expect(formatShape([])).toBe("[]");
    expect(formatShapes([[1, 16], [1, 16, 64]])).toBe("[1, 16], [1, 16, 64]");
    expect(formatShapes([])).toBe("");
  });
  it.each([
    [850, "850 µs"],
    [12_300, "12.3 ms"],
    [4_200_000, "4.20 s"],
    [125_000_000, "2 min 05 s"],
  ])("%d µs -> %s", (n, s) => expect(formatDuration(n)).toBe(s));
  it("adds thousands separators", () => {
    expect(formatExact(1234567)).toBe("1,234,567");
  });
});
