import { afterEach, describe, expect, it, vi } from "vitest";
import { DARK_CLASS, hostIsDark, watchTheme } from "./theme";

const made: Element[] = [];
afterEach(() => {
  for (const el of made.splice(0)) el.remove();
  document.body.removeAttribute("data-theme");
});

/** A page element with `style`, holding a view root (optionally inside a shadow root). */
function place(style: string, shadow = false): HTMLElement {
  const page = document.createElement("div");
  page.setAttribute("style", style);
  document.body.append(page);
  made.push(page);
  const root = document.createElement("div");
  root.className = "mw-root";
  if (shadow) {
    const host = document.createElement("marimo-anywidget");
    page.append(host);
    host.attachShadow({ mode: "open" }).append(root);
  } else {
    page.append(root);
  }
  return root;
}

describe("hostIsDark", () => {
  it("reads the nearest opaque background, across a shadow root to its host", () => {
    expect(hostIsDark(place("background: rgb(20, 20, 24)", true))).toBe(true);
    expect(hostIsDark(place("background: rgb(250, 250, 250)", true))).toBe(false);
    expect(hostIsDark(place("background: rgba(0, 0, 0, 0.1)"))).toBe(false); // see-through
  });

  it("takes an explicit data-theme or JupyterLab's data-jp-theme-light first", () => {
    document.body.setAttribute("data-theme", "dark");
    expect(hostIsDark(place("background: white", true))).toBe(false); // the background is nearer
    expect(hostIsDark(place("", true))).toBe(true);
    const jp = place("");
    jp.parentElement?.setAttribute("data-jp-theme-light", "false");
    expect(hostIsDark(jp)).toBe(true);
  });
});

describe("watchTheme", () => {
  it("sets the dark class, and says when the colors the view draws with change", async () => {
    const root = place("background: rgb(255, 255, 255)");
    const page = root.parentElement as HTMLElement;
    const sheet = document.createElement("style");
    sheet.textContent = ".mw-root { --mw-fg: #111111 } .mw-root.mw-dark-vars { --mw-fg: #eeeeee }";
    document.head.append(sheet);
    made.push(sheet);
    let changes = 0;
    const stop = watchTheme(root, () => changes++);
    expect(root.classList.contains(DARK_CLASS)).toBe(false);
    const first = changes;
    page.setAttribute("style", "background: rgb(10, 10, 10)");
    document.body.setAttribute("data-theme", "dark"); // what a host's theme menu changes
    await vi.waitFor(() => expect(root.classList.contains(DARK_CLASS)).toBe(true));
    await vi.waitFor(() => expect(changes).toBe(first + 1));
    stop();
    document.body.setAttribute("data-theme", "light");
    await Promise.resolve(); // a mutation record would be delivered by now
    expect(root.classList.contains(DARK_CLASS)).toBe(true); // stopped: no longer followed
  });
});
