import { defineConfig } from "@playwright/test";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";

// The console is tested against the real binary, on a fresh SQLite file, in Debian's Chromium
// (Playwright cannot download its own browsers here).
const repo = path.resolve(__dirname, "..");
const targetDir = process.env.CARGO_TARGET_DIR ? path.resolve(process.env.CARGO_TARGET_DIR) : path.join(repo, "target");
const binary = path.join(targetDir, "debug", "gatehouse");
const port = Number(process.env.GATEHOUSE_E2E_PORT ?? 3917);
const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "gatehouse-e2e-"));

export const baseURL = `http://127.0.0.1:${port}`;

export default defineConfig({
  testDir: "./tests",
  fullyParallel: false,
  workers: 1,
  retries: 0,
  timeout: 60_000,
  expect: { timeout: 15_000 },
  reporter: [["list"]],
  use: {
    baseURL,
    trace: "retain-on-failure",
    launchOptions: {
      executablePath: process.env.CHROMIUM_PATH ?? "/usr/bin/chromium",
      args: [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
      ],
    },
  },
  webServer: {
    command: `${binary} --config ${path.join(repo, "config", "gatehouse.toml")} serve`,
    url: `${baseURL}/healthz`,
    reuseExistingServer: false,
    timeout: 60_000,
    // The server's log is shown with GATEHOUSE_E2E_LOGS=1.
    stdout: process.env.GATEHOUSE_E2E_LOGS ? "pipe" : "ignore",
    stderr: process.env.GATEHOUSE_E2E_LOGS ? "pipe" : "ignore",
    env: {
      GATEHOUSE__SERVER__ADDR: `127.0.0.1:${port}`,
      GATEHOUSE__SERVER__STRICT_PORT: "true",
      GATEHOUSE__SERVER__SITE_ROOT: path.join(repo, "target", "site"),
      GATEHOUSE__DATABASE__URL: `sqlite://${path.join(dataDir, "e2e.db")}`,
      // No LLM key: the console must show the degraded-mode banner.
      ANTHROPIC_API_KEY: "",
      OPENAI_API_KEY: "",
      RUST_LOG: "info",
    },
  },
});
