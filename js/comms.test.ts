import { describe, expect, it } from "vitest";
import { commTotals, decodeComms, renderComms } from "./comms";
import { type Analysis } from "./protocol";
import { decodePayload } from "./decode";
import { tiny } from "./testdata";

const wire = {
  point: [0, 5, 9],
  collective: ["all_gather", "all_gather", "reduce_scatter"],
  bytes: [100, 200, 200],
  group: ["fsdp", "fsdp", "fsdp"],
  module: ["", "layers.0", "<img src=x onerror=alert(1)>"],
  phase: ["forward", "forward", "backward"],
};

describe("a parallel trace's collectives", () => {
  it("decodes the payload's columns, and nothing from a payload without them", () => {
    const comms = decodeComms(wire);
    expect(comms).toHaveLength(3);
    expect(comms[1]).toEqual({
      point: 5,
      collective: "all_gather",
      bytes: 200,
      group: "fsdp",
      module: "layers.0",
      phase: "forward",
    });
    expect(decodeComms(undefined)).toEqual([]);
    expect(decodeComms({ point: "x" })).toEqual([]);
    const a = decodePayload({ ...(tiny().payload as object), comms: wire }) as Analysis;
    expect(a.comms).toHaveLength(3);
    expect((decodePayload(tiny().payload) as Analysis).comms).toEqual([]);
  });

  it("sums them by phase, collective and group", () => {
    expect(commTotals(decodeComms(wire))).toEqual([
      { phase: "forward", collective: "all_gather", group: "fsdp", calls: 2, bytes: 300 },
      { phase: "backward", collective: "reduce_scatter", group: "fsdp", calls: 1, bytes: 200 },
    ]);
  });

  it("marks each at its point of the timeline, names as text", () => {
    const el = document.createElement("div");
    renderComms(el, decodeComms(wire), 11, 400, (b) => `${b} B`);
    const marks = [...el.querySelectorAll<HTMLElement>(".mw-comm")];
    expect(marks.map((m) => m.style.left)).toEqual(["0%", "50%", "90%"]);
    expect(marks[2]?.title).toContain("<img src=x onerror=alert(1)>");
    expect(el.querySelector("img")).toBeNull();
    expect(el.querySelectorAll("tr")).toHaveLength(3);
    renderComms(el, [], 11, 400, (b) => `${b} B`);
    expect(el.style.display).toBe("none");
    expect(el.textContent).toBe("");
  });
});
