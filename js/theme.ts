/**
 * Follow the host's light or dark theme where its CSS cannot reach the view.
 *
 * JupyterLab and Notebook 7 give the widget their `--jp-*` variables, and the stylesheet follows
 * them. Other hosts draw the widget inside a shadow root (marimo's `<marimo-anywidget>`) or have
 * no `--jp-*` variables at all (VS Code, a plain page): there `[data-theme="dark"] .mw-root` cannot
 * match across the shadow boundary. So the view looks at the page it sits on: the first ancestor
 * with a background (crossing shadow roots to their hosts), or an explicit `data-theme`, and puts
 * the class `mw-dark-vars` on the root when that is dark (the stylesheet's dark fallbacks).
 *
 * Canvas charts read their colors when they draw, so `watchTheme` also says when the theme
 * changed (JupyterLab's theme menu, marimo's, the OS's dark mode) for them to draw again.
 */

/** The class that switches the stylesheet's fallbacks to their dark values. */
export const DARK_CLASS = "mw-dark-vars";

/** The element above `el`, crossing from a shadow root to its host. */
function parentOf(el: Element): Element | null {
  if (el.parentElement) return el.parentElement;
  const root = el.getRootNode();
  return root instanceof ShadowRoot ? root.host : null;
}

/** Relative luminance (0 black .. 1 white) and alpha of a CSS `rgb()`/`rgba()` color. */
function rgba(css: string): { lum: number; alpha: number } | null {
  const m = css.match(/rgba?\(([^)]+)\)/);
  if (!m || !m[1]) return null;
  const [r = 0, g = 0, b = 0, a = 1] = m[1].split(/[\s,/]+/).filter(Boolean).map(Number);
  return { lum: (0.2126 * r + 0.7152 * g + 0.0722 * b) / 255, alpha: a };
}

/**
 * Whether the page around `root` is dark: the nearest ancestor that says so (`data-theme`,
 * JupyterLab's `data-jp-theme-light`), else the nearest ancestor with an opaque background.
 * Nothing found (a transparent page): light.
 */
export function hostIsDark(root: Element): boolean {
  for (let el = parentOf(root); el; el = parentOf(el)) {
    const said = el.getAttribute("data-theme") ?? "";
    if (said === "dark" || said === "light") return said === "dark";
    const jp = el.getAttribute("data-jp-theme-light");
    if (jp === "true" || jp === "false") return jp === "false";
    const bg = rgba(getComputedStyle(el).backgroundColor);
    if (bg && bg.alpha > 0.5) return bg.lum < 0.5;
  }
  return false;
}

/**
 * Keep `root`'s dark class in step with its host, now and on every theme change; `onChange` is
 * called after a change of the colors the view draws with. Returns the cleanup.
 */
export function watchTheme(root: HTMLElement, onChange: () => void): () => void {
  let last = "";
  let frame = 0;
  const check = (): void => {
    frame = 0;
    if (!root.isConnected) return;
    root.classList.toggle(DARK_CLASS, hostIsDark(root));
    const style = getComputedStyle(root);
    const now = ["--mw-fg", "--mw-bg", "--mw-params"].map((v) => style.getPropertyValue(v)).join("|");
    if (now === last) return;
    last = now;
    onChange();
  };
  const later = (): void => {
    if (frame) return;
    frame = typeof requestAnimationFrame === "function" ? requestAnimationFrame(check) : 0;
    if (!frame) check();
  };
  check();
  // the host attaches the view after it is made (anywidget renders into a detached element):
  // a first size is the sign that it is on the page
  const sized = typeof ResizeObserver !== "undefined" ? new ResizeObserver(later) : null;
  sized?.observe(root);
  const observer = typeof MutationObserver !== "undefined" ? new MutationObserver(later) : null;
  const watch = { attributes: true, attributeFilter: ["class", "style", "data-theme", "data-jp-theme-light"] };
  if (observer) {
    observer.observe(document.documentElement, watch);
    if (document.body) observer.observe(document.body, watch);
    // JupyterLab switches themes by swapping a stylesheet in <head>
    if (document.head) observer.observe(document.head, { childList: true });
  }
  const media = typeof matchMedia === "function" ? matchMedia("(prefers-color-scheme: dark)") : null;
  media?.addEventListener?.("change", later);
  return () => {
    if (frame && typeof cancelAnimationFrame === "function") cancelAnimationFrame(frame);
    sized?.disconnect();
    observer?.disconnect();
    media?.removeEventListener?.("change", later);
  };
}
