/**
 * The front end's fixed name sets equal Python's (`meta_widget/choices.py`, written to
 * `js/fixtures/choices.json` by `python tests/make_fixtures.py`), and each is used where it
 * matters: a label per name, a decoder per kernel message, a column per compared number.
 */
import { describe, expect, it } from "vitest";
import choices from "./fixtures/choices.json";
import { DTYPE_CHOICES } from "./charts";
import { COMPARE_COLUMNS } from "./compare";
import { decodeMessage } from "./decode";
import {
  COMPARE_NUMBERS,
  DEVICES,
  EXPLORE_KINDS,
  KERNEL_MESSAGE_TYPES,
  MEMORY_CATEGORIES,
  MODES,
  OPTIMIZERS,
  PHASES,
  PRECISIONS,
  STATUSES,
  VIEW_MESSAGE_TYPES,
  WAIT_STATES,
  type Message,
  type ViewMessage,
} from "./protocol";
import { DEVICE_LABELS, OPTIMIZER_LABELS } from "./switches";

/** `true` only where the two unions hold the same names (checked by `tsc --noEmit`). */
type Same<A, B> = [A] extends [B] ? ([B] extends [A] ? true : false) : false;
const kernelTypesTyped: Same<Message["type"], (typeof KERNEL_MESSAGE_TYPES)[number]> = true;
const viewTypesTyped: Same<ViewMessage["type"], (typeof VIEW_MESSAGE_TYPES)[number]> = true;

describe("choices", () => {
  it("match meta_widget.choices, in order", () => {
    expect([...MODES]).toEqual(choices.modes);
    expect([...PHASES]).toEqual(choices.phases);
    expect([...DEVICES]).toEqual(choices.devices);
    expect([...OPTIMIZERS]).toEqual(choices.optimizers);
    expect([...MEMORY_CATEGORIES]).toEqual(choices.memory_categories);
    expect([...PRECISIONS]).toEqual(choices.precisions);
    expect([...STATUSES]).toEqual(choices.statuses);
    expect([...EXPLORE_KINDS]).toEqual(choices.explore_kinds);
    expect([...KERNEL_MESSAGE_TYPES]).toEqual(choices.kernel_messages);
    expect([...VIEW_MESSAGE_TYPES]).toEqual(choices.view_messages);
    expect([...WAIT_STATES]).toEqual(choices.wait_states);
    expect([...COMPARE_NUMBERS]).toEqual(choices.compare_numbers);
  });

  it("every optimizer and device has a menu label", () => {
    expect(Object.keys(OPTIMIZER_LABELS).sort()).toEqual([...choices.optimizers, "none"].sort());
    expect(Object.keys(DEVICE_LABELS).sort()).toEqual([...choices.devices].sort());
  });

  it("the precision switch offers every precision, after the recorded one", () => {
    expect(DTYPE_CHOICES).toEqual(["recorded", ...choices.precisions]);
  });

  it("the comparison has a column for every compared number", () => {
    expect(Object.keys(COMPARE_COLUMNS).sort()).toEqual([...choices.compare_numbers].sort());
  });

  it("every message type the kernel sends decodes", () => {
    expect(kernelTypesTyped && viewTypesTyped).toBe(true);
    const samples: Record<string, unknown> = {
      start: { type: "start", expected_calls: 3, payload: {} },
      calls: { type: "calls", strings: [], shapes: [], tensors: [], calls: { index: [] } },
      phase: { type: "phase", phase: "backward" },
      done: { type: "done", elapsed_s: 1 },
      error: { type: "error", error: { type: "RuntimeError", message: "boom" } },
      ready: { type: "ready" },
      waiting: { type: "waiting", state: "build", text: "building the model", elapsed_s: 0 },
    };
    expect(Object.keys(samples).sort()).toEqual([...choices.kernel_messages].sort());
    for (const type of choices.kernel_messages) expect(decodeMessage(samples[type])?.type).toBe(type);
    expect(decodeMessage({ type: "nonsense" })).toBeNull();
    // a state this front end does not know (a newer kernel's) is left out, not shown wrong
    expect(decodeMessage({ type: "waiting", state: "dreaming", text: "", elapsed_s: 0 })).toBeNull();
  });
});
