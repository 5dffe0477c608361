// Bundles the front end into meta_widget/static/ (git-ignored, built at package build time):
//   widget.js      ES module for anywidget (`export default { render }`)
//   standalone.js  IIFE defining window.metaWidget.renderStandalone(el, payload)
//   widget.css     styles for both (uPlot's CSS included)
//   explore.js/css the "what fits", comparison and plan views (meta_widget/explore/view.py)
// `node js/build.mjs --watch` rebuilds on change (use with ANYWIDGET_HMR=1).
import * as esbuild from "esbuild";
import { fileURLToPath } from "node:url";
import path from "node:path";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const outdir = path.join(root, "meta_widget", "static");
const watch = process.argv.includes("--watch");

const common = {
  bundle: true,
  minify: !watch,
  sourcemap: false,
  target: ["es2020"],
  logLevel: "info",
  legalComments: "none",
};

const builds = [
  { ...common, entryPoints: [path.join(root, "js/widget.ts")], format: "esm", outfile: path.join(outdir, "widget.js") },
  { ...common, entryPoints: [path.join(root, "js/standalone.ts")], format: "iife", outfile: path.join(outdir, "standalone.js") },
  { ...common, entryPoints: [path.join(root, "js/widget.css")], outfile: path.join(outdir, "widget.css") },
  { ...common, entryPoints: [path.join(root, "js/explore.ts")], format: "esm", outfile: path.join(outdir, "explore.js") },
  { ...common, entryPoints: [path.join(root, "js/explore.css")], outfile: path.join(outdir, "explore.css") },
];

if (watch) {
  for (const b of builds) await (await esbuild.context(b)).watch();
} else {
  await Promise.all(builds.map((b) => esbuild.build(b)));
}
