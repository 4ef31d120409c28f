import { execFileSync } from "node:child_process";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";

// Shared by the Playwright config and the tests (which run in worker processes): every path is
// derived, never random, so both sides agree.
export const repo = path.resolve(__dirname, "..", "..");
const targetDir = process.env.CARGO_TARGET_DIR ? path.resolve(process.env.CARGO_TARGET_DIR) : path.join(repo, "target");
// GATEHOUSE_E2E_PROFILE=release runs the suite against `scripts/build --release` (its wasm is
// post-processed for size, so it is worth a run of its own).
export const binary = path.join(targetDir, process.env.GATEHOUSE_E2E_PROFILE === "release" ? "release" : "debug", "gatehouse");
export const port = Number(process.env.GATEHOUSE_E2E_PORT ?? 3917);
export const baseURL = `http://127.0.0.1:${port}`;
export const dataDir = path.join(os.tmpdir(), `gatehouse-e2e-${port}`);
/** The shipped config, copied by the runner with one MCP server added (see writeConfig). */
export const configDir = path.join(dataDir, "config");
export const configPath = path.join(configDir, "gatehouse.toml");
export const databaseUrl = `sqlite://${path.join(dataDir, "e2e.db")}`;

export const serverEnv: Record<string, string> = {
  GATEHOUSE__SERVER__ADDR: `127.0.0.1:${port}`,
  GATEHOUSE__SERVER__STRICT_PORT: "true",
  GATEHOUSE__SERVER__SITE_ROOT: path.join(repo, "target", "site"),
  GATEHOUSE__DATABASE__URL: databaseUrl,
  // Quick pickup of jobs enqueued by another process (the CLI) on SQLite.
  GATEHOUSE__JOBS__POLL_INTERVAL: "200ms",
  // The periodic self-improvement cycle is a job; the jobs journey starts from an empty queue,
  // and the repairs journey runs the cycle from its page.
  GATEHOUSE__EVALS__SCAN_EVERY: "0s",
  // So is the retention prune; nothing here is old enough for it.
  GATEHOUSE__RETENTION__EVERY: "0s",
  // A form of the MCP fixture (the mcp journey) is told to the owners in the console only: on
  // WhatsApp it would open chats with the owners' numbers before the conversations journey,
  // which starts from none.
  GATEHOUSE__MCP__NOTICES_ON_WHATSAPP: "false",
  // No LLM key: the console must show the degraded-mode banner.
  ANTHROPIC_API_KEY: "",
  OPENAI_API_KEY: "",
  RUST_LOG: "info",
};

export const owner = { name: "Ada Owner", login: "ada", password: "correct horse battery staple", phone: "+15550001111" };

/** Runs the gatehouse command line against the test server's database. */
export function gatehouse(...args: string[]): string {
  return execFileSync(binary, ["--config", configPath, ...args], {
    env: { ...process.env, ...serverEnv, RUST_LOG: "warn" },
    encoding: "utf8",
  });
}

/** Copies the shipped config files into `configDir` and declares two MCP servers, both
 *  untrusted (their tools wait for an owner's approval): the npm reference memory server
 *  (installed by scripts/test in mcp-test-servers/), and our fixture with its `ask` tool, whose
 *  forms (elicitation) go to the owners. */
export function writeConfig() {
  fs.mkdirSync(configDir, { recursive: true });
  for (const file of ["gatehouse.toml", "tools.toml", "connectors.toml"]) {
    fs.copyFileSync(path.join(repo, "config", file), path.join(configDir, file));
  }
  const memoryServer = path.join(repo, "mcp-test-servers", "node_modules", "@modelcontextprotocol", "server-memory", "dist", "index.js");
  fs.writeFileSync(
    path.join(configDir, "mcp.toml"),
    [
      "[[server]]",
      'id = "memory"',
      'trust = "untrusted"',
      "[server.transport]",
      'type = "stdio"',
      'command = "node"',
      `args = [${JSON.stringify(memoryServer)}]`,
      `env = { MEMORY_FILE_PATH = ${JSON.stringify(path.join(dataDir, "memory.jsonl"))} }`,
      "",
      "[[server]]",
      'id = "asker"',
      'trust = "untrusted"',
      'default_risk = "low"',
      'approval = "never"',
      'elicitation = "owner"',
      // call_timeout (30s) + this + a second, with the reply's reserve, fits jobs.timeouts.tool_call.
      'elicitation_ttl = "80s"',
      "[server.transport]",
      'type = "stdio"',
      'command = "node"',
      `args = [${JSON.stringify(path.join(repo, "mcp-test-servers", "fixture.mjs"))}]`,
      'env = { FIXTURE_ELICIT = "1" }',
      "",
    ].join("\n"),
  );
}
