// Removes the console's asynchronous hydration code from the wasm before wasm-opt (release
// builds; called by scripts/build with the binaryen package it installs):
//
//   node scripts/wasm-drop-async-hydration.mjs IN.wasm OUT.wasm
//
// Every type-erased view (`AnyView`, made by `.into_any()` in our pages, in the router for each
// route and inside Leptos) stores a pointer to `hydrate_async`, the hydration path of lazy
// routes and `leptos::mount::hydrate_lazy`. The console hydrates synchronously
// (`hydrate_body` in frontend/src/lib.rs) and has no lazy routes, so that code never runs, but
// the stored pointers keep all of it linked: a sixth of the module, a fifth of its brotli
// size. Each such function's body is replaced by `unreachable`, and wasm-opt then drops
// everything only it reached. Should the console ever hydrate asynchronously, the wasm would
// trap on the first call: the release Playwright run (GATEHOUSE_E2E_PROFILE=release,
// DEVELOPERS.md) shows that at once.
//
// Functions are found by their demangled names (wasm-bindgen keeps the name section). A Leptos
// upgrade that renames them only costs size: the count printed drops to zero.
import * as fs from "node:fs";
import * as path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const binaryenPath = path.join(repo, "target", "tools", "node_modules", "binaryen", "index.js");
const { default: binaryen } = await import(pathToFileURL(binaryenPath).href);

// The future that `<T as IntoAny>::into_any::hydrate_async::<T>` boxes, one per view type: its
// poll function holds the whole view's async hydration, inlined. It is reached through the
// function table (the future's vtable), so it stays linked unless its body goes.
const ASYNC_HYDRATION = /^<T as tachys::view::any_view::IntoAny>::into_any::hydrate_async::\{\{closure\}\}::h[0-9a-f]{16}$/;

const [input, output] = process.argv.slice(2);
if (!input || !output) {
  console.error("usage: wasm-drop-async-hydration.mjs IN.wasm OUT.wasm");
  process.exit(2);
}
const module = binaryen.readBinary(fs.readFileSync(input));
let dropped = 0;
for (let i = 0; i < module.getNumFunctions(); i++) {
  const func = module.getFunctionByIndex(i);
  const info = binaryen.getFunctionInfo(func);
  if (info.body && ASYNC_HYDRATION.test(info.name)) {
    binaryen.Function.setBody(func, module.unreachable());
    dropped++;
  }
}
fs.writeFileSync(output, module.emitBinary());
module.dispose();
console.error(`[wasm] async hydration removed from ${dropped} view types`);
