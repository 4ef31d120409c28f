import { defineConfig } from "@playwright/test";
import * as fs from "node:fs";

// The console is tested against the real binary, on a fresh SQLite file, in Debian's Chromium
// (Playwright cannot download its own browsers here).
import { baseURL, binary, configPath, dataDir, serverEnv, writeConfig } from "./tests/support";

// Only the runner starts from a clean database; worker processes load this file too.
if (process.env.TEST_WORKER_INDEX === undefined) {
  fs.rmSync(dataDir, { recursive: true, force: true });
  fs.mkdirSync(dataDir, { recursive: true });
  writeConfig();
}

export default defineConfig({
  testDir: "./tests",
  // The journey has an order: setup creates the owner, the jobs and tools tests use it, and the
  // throttling test locks logins from this address last; before it, the accessibility check
  // reads every page with the data the journeys left (so a failure there skips the throttling
  // test, which must come after every login). The conversations test starts from no
  // chats, so the live test (which simulates messages) runs after it. The lane test runs a
  // Gatehouse of its own (with fake model, Graph and shop APIs) on the next port.
  projects: [
    { name: "console", testMatch: "console.spec.ts" },
    { name: "jobs", testMatch: "jobs.spec.ts", dependencies: ["console"] },
    { name: "tools", testMatch: "tools.spec.ts", dependencies: ["jobs"] },
    { name: "mcp", testMatch: "mcp.spec.ts", dependencies: ["tools"] },
    { name: "conversations", testMatch: "conversations.spec.ts", dependencies: ["mcp"] },
    { name: "repairs", testMatch: "repairs.spec.ts", dependencies: ["conversations"] },
    { name: "lane", testMatch: "lane.spec.ts", dependencies: ["repairs"] },
    { name: "live", testMatch: "live.spec.ts", dependencies: ["repairs"] },
    { name: "a11y", testMatch: "a11y.spec.ts", dependencies: ["lane", "live"] },
    { name: "throttle", testMatch: "throttle.spec.ts", dependencies: ["a11y"] },
  ],
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
    command: `${binary} --config ${configPath} serve`,
    url: `${baseURL}/healthz`,
    reuseExistingServer: false,
    timeout: 60_000,
    // The server's log is shown with GATEHOUSE_E2E_LOGS=1.
    stdout: process.env.GATEHOUSE_E2E_LOGS ? "pipe" : "ignore",
    stderr: process.env.GATEHOUSE_E2E_LOGS ? "pipe" : "ignore",
    env: serverEnv,
  },
});
