import { describe, expect, it } from "vitest";
import {
  BYTE_INCRS,
  floatDtypeBytes,
  paramBytesAt,
  recordedFloatBytes,
  timelinePeak,
} from "./charts";
import { type Analysis, type ModuleInfo } from "./protocol";
import { decodePayload } from "./decode";
import { tiny } from "./testdata";

const a = decodePayload(tiny().payload) as Analysis;
const root = a.modules[0] as ModuleInfo;

describe("dtype what-if for parameter memory", () => {
  it("reads the recorded float dtype from the parameters", () => {
    expect(recordedFloatBytes(a)).toBe(4);
    expect(floatDtypeBytes("torch.bfloat16")).toBe(2);
    expect(floatDtypeBytes("int64")).toBeNull();
  });

  it("rescales float parameters: 1106 params", () => {
    expect(paramBytesAt(root, "recorded", 4)).toBe(4424);
    expect(paramBytesAt(root, "fp32", 4)).toBe(4424);
    expect(paramBytesAt(root, "bf16", 4)).toBe(2212);
    expect(paramBytesAt(root, "fp16", 4)).toBe(2212);
    expect(paramBytesAt(root, "int8", 4)).toBe(1106);
    expect(paramBytesAt(root, "int4", 4)).toBe(553);
  });

  it("keeps non-float parameters as recorded", () => {
    // 1106 float32 params + 20 int32 params (80 bytes)
    const m = { ...root, params: 1126, floatParams: 1106, paramBytes: 4424 + 80 };
    expect(paramBytesAt(m, "bf16", 4)).toBe(2212 + 80);
    expect(paramBytesAt(m, "int4", 4)).toBe(553 + 80);
    // a bf16 model (2 bytes recorded) moved to fp32 doubles its float part only
    const h = { ...root, floatParams: 1106, paramBytes: 2212 + 80 };
    expect(paramBytesAt(h, "fp32", 2)).toBe(4424 + 80);
  });
});

describe("chart data", () => {
  it("finds the first peak of the timeline", () => {
    expect(timelinePeak([1, 5, 3, 5])).toBe(1);
    expect(timelinePeak([])).toBe(-1);
    expect(timelinePeak(a.timeline.bytes)).toBe(3);
  });

  it("steps byte axes by powers of two", () => {
    expect(BYTE_INCRS.slice(0, 3)).toEqual([1, 2, 4]);
    expect(BYTE_INCRS).toContain(256 * 1024);
    expect(BYTE_INCRS).toContain(1024 ** 3);
  });
});
