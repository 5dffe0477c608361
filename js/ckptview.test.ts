/**
 * The checkpoint view of `mw.inspect_checkpoint`, from the Python side's own payload of a real
 * safetensors file (two alike layers of a float32 weight and a float16 bias, a bfloat16 head).
 */
import { describe, expect, it } from "vitest";
import { checkpointRows, isCheckpoint, renderCheckpoint } from "./ckptview";
import { decodePayload } from "./decode";
import raw from "./fixtures/tiny.checkpoint.json";

describe("the checkpoint view", () => {
  const a = decodePayload(raw)!;

  it("lists every tensor with its shape, dtype and bytes; alike layers folded", () => {
    expect(isCheckpoint(a)).toBe(true);
    const rows = checkpointRows(a).map((r) => [r.depth, r.name, r.kind, r.shape, r.dtype, r.bytes, r.count]);
    expect(rows).toEqual([
      [0, "head", "group", null, "", 16, 1],
      [1, "weight", "tensor", [2, 4], "bfloat16", 16, 1],
      [0, "layers", "group", null, "", 112, 1],
      [1, "0–1", "group", null, "", 112, 2],
      [2, "b", "tensor", [4], "float16", 8, 1],
      [2, "w", "tensor", [4, 3], "float32", 48, 1],
    ]);
    // the bytes of the tensors shown add up to the file's (the folded group counted twice)
    expect(16 + 2 * (8 + 48)).toBe(a.totals.param_bytes);
  });

  it("has no switches, no tabs, and keeps names as text", () => {
    const el = document.createElement("div");
    const cleanup = renderCheckpoint(el, { ...a, title: "<img src=x>" });
    expect(el.querySelector("img")).toBeNull();
    expect(el.querySelector(".mw-switches, .mw-tab, .mw-toolbar")).toBeNull();
    expect(el.querySelector(".mw-ckpt-totals")!.textContent).toContain("5 tensors");
    expect(el.textContent).toContain("bfloat16");
    cleanup();
    expect(el.children).toHaveLength(0);
  });
});
