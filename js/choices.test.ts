/**
 * The front end's fixed name sets equal Python's (`meta_widget/choices.py`, written to
 * `js/fixtures/choices.json` by `python tests/make_fixtures.py`).
 */
import { describe, expect, it } from "vitest";
import choices from "./fixtures/choices.json";
import { DEVICES, MODES, OPTIMIZERS, PHASES } from "./protocol";
import { DEVICE_LABELS, OPTIMIZER_LABELS } from "./switches";

describe("choices", () => {
  it("match meta_widget.choices, in order", () => {
    expect([...MODES]).toEqual(choices.modes);
    expect([...PHASES]).toEqual(choices.phases);
    expect([...DEVICES]).toEqual(choices.devices);
    expect([...OPTIMIZERS]).toEqual(choices.optimizers);
  });

  it("every optimizer and device has a menu label", () => {
    expect(Object.keys(OPTIMIZER_LABELS).sort()).toEqual([...choices.optimizers, "none"].sort());
    expect(Object.keys(DEVICE_LABELS).sort()).toEqual([...choices.devices].sort());
  });
});
