// How long the console takes to hydrate on Chromium's "Slow 4G" network profile: a first
// visit (empty cache) and a repeat visit (same browser, second navigation), the median of
// several runs each, for the login page and the dashboard of a logged-in owner.
//
//   scripts/build --release && node end2end/perf/hydration.mjs
//   node end2end/perf/hydration.mjs --binary target/debug/gatehouse --runs 3 --path /login --site target/site
//
// It starts its own Gatehouse (the shipped config, a fresh SQLite file in a temporary folder,
// no model key) on a free port, adds an owner with the command line and logs in once without
// throttling. Each run then opens a new browser context (empty cache), throttles it through
// CDP (Network.emulateNetworkConditions) and takes the time from the start of the navigation
// to the moment the page marks `<body data-hydrated="true">` (the mark the Playwright tests
// wait for), read in the page with a MutationObserver, so polling adds nothing. The CPU is not
// throttled. This is a measurement, not a test: it prints figures and never fails on them.
import { spawn, execFileSync } from "node:child_process";
import * as fs from "node:fs";
import * as net from "node:net";
import * as os from "node:os";
import * as path from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..");
const targetDir = process.env.CARGO_TARGET_DIR ? path.resolve(process.env.CARGO_TARGET_DIR) : path.join(repo, "target");

const args = process.argv.slice(2);
const option = (name, fallback) => {
  const i = args.indexOf(`--${name}`);
  return i >= 0 && i + 1 < args.length ? args[i + 1] : fallback;
};
const binary = path.resolve(option("binary", path.join(targetDir, "release", "gatehouse")));
const runs = Number(option("runs", "5"));
const paths = option("path", "/login,/").split(",");
// The compiled assets (the folder holding pkg/), as scripts/build writes them.
const site = path.resolve(option("site", path.join(repo, "target", "site")));

// Chromium DevTools' "Slow 4G" preset: 562.5 ms latency, 1.44 Mbit/s down, 675 kbit/s up.
const SLOW_4G = { offline: false, latency: 562.5, downloadThroughput: (1.44e6 / 8) | 0, uploadThroughput: (675e3 / 8) | 0 };

const owner = { login: "perf", name: "Perf Owner", password: "perf measurement password" };

async function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.once("error", reject);
    srv.listen(0, "127.0.0.1", () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

async function startServer() {
  if (!fs.existsSync(binary)) throw new Error(`${binary} is missing: run scripts/build --release first`);
  const port = await freePort();
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "gatehouse-perf-"));
  const env = {
    ...process.env,
    GATEHOUSE__SERVER__ADDR: `127.0.0.1:${port}`,
    GATEHOUSE__SERVER__STRICT_PORT: "true",
    GATEHOUSE__SERVER__SITE_ROOT: site,
    GATEHOUSE__DATABASE__URL: `sqlite://${path.join(dir, "perf.db")}`,
    GATEHOUSE__EVALS__SCAN_EVERY: "0s",
    ANTHROPIC_API_KEY: "",
    OPENAI_API_KEY: "",
    RUST_LOG: "warn",
  };
  const config = ["--config", path.join(repo, "config", "gatehouse.toml")];
  execFileSync(binary, [...config, "migrate"], { env, stdio: ["ignore", "ignore", "inherit"] });
  execFileSync(binary, [...config, "owner", "add", "--login", owner.login, "--name", owner.name, "--password-stdin"], {
    env,
    input: `${owner.password}\n`,
    stdio: ["pipe", "ignore", "inherit"],
  });
  const child = spawn(binary, [...config, "serve"], { env, stdio: "ignore" });
  const base = `http://127.0.0.1:${port}`;
  for (let i = 0; i < 300; i++) {
    if (child.exitCode !== null) throw new Error(`gatehouse exited with ${child.exitCode}`);
    try {
      if ((await fetch(`${base}/healthz`)).ok) return { base, child, dir };
    } catch {
      // not listening yet
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error("gatehouse did not answer /healthz within 30 s");
}

// Runs in the page before its own scripts: records when the body gets the hydrated mark, in
// milliseconds since the navigation started (performance.now()'s origin).
function markHydration() {
  const record = () => {
    if (document.body?.getAttribute("data-hydrated") === "true" && window.__hydratedAt === undefined) {
      window.__hydratedAt = performance.now();
    }
  };
  new MutationObserver(record).observe(document, { subtree: true, attributes: true, attributeFilter: ["data-hydrated"], childList: true });
}

async function visit(page, url) {
  await page.goto(url, { waitUntil: "commit" });
  await page.waitForFunction(() => window.__hydratedAt !== undefined, null, { timeout: 120_000, polling: 50 });
  const at = await page.evaluate(() => window.__hydratedAt);
  const wasm = await page.evaluate(() =>
    performance
      .getEntriesByType("resource")
      .filter((e) => e.name.endsWith(".wasm"))
      .map((e) => ({ transferred: e.transferSize, end: e.responseEnd })),
  );
  return { at, wasm };
}

async function measure(browser, url, storageState) {
  const context = await browser.newContext({ storageState });
  await context.addInitScript(markHydration);
  const page = await context.newPage();
  const cdp = await context.newCDPSession(page);
  await cdp.send("Network.enable");
  await cdp.send("Network.clearBrowserCache");
  await cdp.send("Network.emulateNetworkConditions", SLOW_4G);
  const first = await visit(page, url);
  const repeat = await visit(page, url);
  await context.close();
  return { first, repeat };
}

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};

function assetSizes() {
  const pkg = path.join(site, "pkg");
  const hash = fs.existsSync(path.join(pkg, "hash.txt")) ? fs.readFileSync(path.join(pkg, "hash.txt"), "utf8").trim() : "";
  const name = hash ? `gatehouse.${hash}` : "gatehouse";
  const size = (f) => (fs.existsSync(path.join(pkg, f)) ? fs.statSync(path.join(pkg, f)).size : NaN);
  return ["js", "wasm"].map((ext) => `${name}.${ext}: ${size(`${name}.${ext}`)} B, br ${size(`${name}.${ext}.br`)} B, gzip ${size(`${name}.${ext}.gz`)} B`);
}

const { base, child, dir } = await startServer();
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM_PATH ?? "/usr/bin/chromium",
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
try {
  // Log in once, unthrottled; every run starts from these cookies.
  const context = await browser.newContext();
  const page = await context.newPage();
  await page.goto(`${base}/login`);
  await page.getByLabel("Login name").fill(owner.login);
  await page.getByLabel("Password").fill(owner.password);
  await page.getByRole("button", { name: "Log in" }).click();
  await page.waitForURL((u) => !u.pathname.startsWith("/login"));
  const loggedIn = await context.storageState();
  await context.close();

  console.log(`binary: ${binary}`);
  for (const line of assetSizes()) console.log(line);
  console.log(`network: latency ${SLOW_4G.latency} ms, down ${SLOW_4G.downloadThroughput} B/s, up ${SLOW_4G.uploadThroughput} B/s; ${runs} runs`);
  for (const p of paths) {
    // The login page as a visitor sees it; every other page as the logged-in owner.
    const state = p === "/login" ? undefined : loggedIn;
    const results = [];
    for (let i = 0; i < runs; i++) results.push(await measure(browser, `${base}${p}`, state));
    const first = results.map((r) => r.first.at);
    const repeat = results.map((r) => r.repeat.at);
    const repeatWasmBytes = results.flatMap((r) => r.repeat.wasm.map((w) => w.transferred));
    // More than one means the preload in the page's head was not reused by the script's fetch.
    const firstWasmRequests = Math.max(...results.map((r) => r.first.wasm.length));
    const fmt = (xs) => `median ${Math.round(median(xs))} ms (runs: ${xs.map(Math.round).join(", ")})`;
    console.log(`${p}  first visit: ${fmt(first)}; wasm requests: ${firstWasmRequests}`);
    console.log(`${p}  repeat visit: ${fmt(repeat)}; wasm bytes over the network on repeat: ${repeatWasmBytes.length ? Math.max(...repeatWasmBytes) : 0}`);
  }
} finally {
  await browser.close();
  child.kill("SIGTERM");
  fs.rmSync(dir, { recursive: true, force: true });
}
