import { expect, test, type Page } from "@playwright/test";
import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import * as crypto from "node:crypto";
import * as fs from "node:fs";
import * as http from "node:http";
import type { AddressInfo } from "node:net";
import * as path from "node:path";

import { accessibilityViolations, failOnConsoleErrors, hydrated, login } from "./fixtures";
import { binary, dataDir, port, repo } from "./support";

// The tool lane and owner approvals in the browser, against a Gatehouse of its own with a model:
// the lane's planner and summarizer are a fake Anthropic Messages API, WhatsApp is a fake Graph
// API and the business system a fake shop, all served by this test on loopback.
// - A simulated chat asks where an order is: the answer comes from the shop's tool, and the
//   trace shows the lane's steps.
// - A follow-up ("and what about order 4822?") is planned with the chat's tool context.
// - The answer to the planner's clarifying question is planned with the request it answers.
// - A customer asks on WhatsApp (a signed webhook) for a refund, which needs an owner; the owner
//   approves in the console, the row updates live, the call reaches the shop once and the fake
//   Graph API receives the answer for the customer. A second request is rejected with a reason,
//   and the customer is told.
// - A lookup the shop failed is run again by an owner from its job's page: the new job answers,
//   and the message's trace shows the run again and the answer's delivery.

const APP_SECRET = "e2e-app-secret";
const ACCESS_TOKEN = "e2e-access-token";
const PHONE_NUMBER_ID = "106540352242922";
const CUSTOMER = "16505550100";
const owner = { login: "olga", name: "Olga Owner", password: "approvals are the heart", phone: "+16505550001" };
const SUMMARY = "Your refund for order 4821 is done.";
const STATUS = "Order 4821 has shipped with Parcel Co.";
const QUESTION = "Which order number do you mean?";

type Sent = { to: string; type: string; text?: { body: string }; interactive?: unknown };

/** The network edge on one loopback port: the Anthropic Messages API (planner and summarizer),
 *  the Graph API's messages endpoint, and the shop's refunds. */
class Edge {
  sent: Sent[] = [];
  refunds: string[] = [];
  /** Orders the shop does not know (yet): their lookups are answered 404. */
  missing = new Set<string>();
  server = http.createServer((req, res) => {
    let body = "";
    req.on("data", (chunk) => (body += chunk));
    req.on("end", () => this.answer(req, body, res));
  });

  answer(req: http.IncomingMessage, body: string, res: http.ServerResponse) {
    const json = (status: number, value: unknown) => {
      res.writeHead(status, { "content-type": "application/json" });
      res.end(JSON.stringify(value));
    };
    const url = req.url ?? "";
    if (url === "/v1/messages") {
      const request = JSON.parse(body);
      const text = JSON.stringify(request.messages);
      const message = (content: unknown[], stop: string) =>
        json(200, {
          id: "msg_e2e",
          type: "message",
          role: "assistant",
          model: request.model,
          content,
          stop_reason: stop,
          stop_sequence: null,
          usage: { input_tokens: 20, output_tokens: 5 },
        });
      const order = /order (\d{4})/.exec(text)?.[1];
      // No order number: the planner asks which one (and the answer brings it).
      if (request.model === "e2e-planner" && !order && /where is my order/i.test(text)) {
        const respond = { decision: "clarify", reply: QUESTION, reason: "no number", requires_async: false, requires_owner_approval: false };
        return message([{ type: "tool_use", id: "r1", name: "respond_without_tool", input: respond }], "tool_use");
      }
      if (request.model === "e2e-planner" && order) {
        const tool = text.includes("refund") ? "refund_order" : "order_status";
        return message([{ type: "tool_use", id: "t1", name: tool, input: { order_id: order } }], "tool_use");
      }
      if (request.model === "e2e-summarizer") {
        const id = text.includes("4822") ? "4822" : "4821";
        return message([{ type: "text", text: text.includes("refunded") ? SUMMARY : STATUS.replace("4821", id) }], "end_turn");
      }
      return message([{ type: "text", text: "a chat reply" }], "end_turn");
    }
    if (url.endsWith(`/${PHONE_NUMBER_ID}/messages`)) {
      const sent = JSON.parse(body);
      if (sent.status === "read") return json(200, { success: true });
      this.sent.push(sent);
      return json(200, { messaging_product: "whatsapp", contacts: [{ input: sent.to, wa_id: sent.to }], messages: [{ id: `wamid.out.${this.sent.length}` }] });
    }
    const status = /^\/api\/orders\/(\w+)$/.exec(url);
    if (status && req.method === "GET" && this.missing.has(status[1])) return json(404, { error: "no such order" });
    if (status && req.method === "GET") return json(200, { id: status[1], status: "shipped", carrier: "Parcel Co" });
    const refund = /^\/api\/refunds\/(\w+)$/.exec(url);
    if (refund && req.method === "POST") {
      this.refunds.push(refund[1]);
      return json(200, { id: refund[1], refunded: true });
    }
    json(404, { error: "not here" });
  }

  async start(): Promise<string> {
    await new Promise<void>((ok) => this.server.listen(0, "127.0.0.1", ok));
    return `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
  }

  textsTo(to: string): string[] {
    return this.sent.filter((m) => m.to === to && m.type === "text").map((m) => m.text?.body ?? "");
  }
}

const edge = new Edge();
const ownPort = port + 1;
const base = `http://127.0.0.1:${ownPort}`;
const dir = path.join(dataDir, "approvals");
const configPath = path.join(dir, "gatehouse.toml");
let env: Record<string, string> = {};
let server: ChildProcess | undefined;

const TOOLS = `
approval_mode = "auto"

[[tool]]
name = "order_status"
title = "Order status"
description = "Looks up where an order is: its status and carrier."
triggers = ["where is my order", "order status", "track my order"]
provider = "connector"
operation = "read"
audience = "public"
risk = "low"
input_schema = { type = "object", additionalProperties = false, required = ["order_id"], properties = { order_id = { type = "string", maxLength = 40 } } }

[[tool]]
name = "refund_order"
title = "Refund an order"
description = "Refunds an order in full."
triggers = ["refund my order", "refund order"]
provider = "connector"
operation = "write"
audience = "public"
risk = "high"
input_schema = { type = "object", additionalProperties = false, required = ["order_id"], properties = { order_id = { type = "string", maxLength = 40 } } }
`;

function gatehouse(args: string[], input?: string): string {
  return execFileSync(binary, ["--config", configPath, ...args], { env: { ...process.env, ...env, RUST_LOG: "warn" }, input, encoding: "utf8" });
}

async function webhook(wamid: string, text: string) {
  const body = JSON.stringify({
    object: "whatsapp_business_account",
    entry: [{ id: "102290129340398", changes: [{ field: "messages", value: {
      messaging_product: "whatsapp",
      metadata: { display_phone_number: "15550783881", phone_number_id: PHONE_NUMBER_ID },
      contacts: [{ profile: { name: "Test Customer" }, wa_id: CUSTOMER }],
      messages: [{ from: CUSTOMER, id: wamid, timestamp: `${Math.floor(Date.now() / 1000)}`, type: "text", text: { body: text } }],
    } }] }],
  });
  const signature = `sha256=${crypto.createHmac("sha256", APP_SECRET).update(body).digest("hex")}`;
  const res = await fetch(`${base}/webhooks/whatsapp`, { method: "POST", body, headers: { "content-type": "application/json", "x-hub-signature-256": signature } });
  expect(res.status).toBe(200);
}

test.beforeAll(async () => {
  const edgeUrl = await edge.start();
  fs.rmSync(dir, { recursive: true, force: true });
  fs.mkdirSync(dir, { recursive: true });
  fs.copyFileSync(path.join(repo, "config", "gatehouse.toml"), configPath);
  fs.writeFileSync(path.join(dir, "tools.toml"), TOOLS);
  fs.writeFileSync(
    path.join(dir, "connectors.toml"),
    `[[connector]]\nid = "shop"\nbase_url = "${edgeUrl}/api"\nallowed_urls = ["${edgeUrl}/api/refunds/*", "${edgeUrl}/api/orders/*"]\n\n` +
      `[[connector.action]]\ntool = "refund_order"\nmethod = "POST"\npath = "refunds/{order_id}"\n\n` +
      `[[connector.action]]\ntool = "order_status"\nmethod = "GET"\npath = "orders/{order_id}"\n`,
  );
  env = {
    GATEHOUSE__SERVER__ADDR: `127.0.0.1:${ownPort}`,
    GATEHOUSE__SERVER__STRICT_PORT: "true",
    GATEHOUSE__SERVER__SITE_ROOT: path.join(repo, "target", "site"),
    GATEHOUSE__DATABASE__URL: `sqlite://${path.join(dir, "gatehouse.db")}`,
    GATEHOUSE__JOBS__POLL_INTERVAL: "200ms",
    GATEHOUSE__LLM__ANTHROPIC__BASE_URL: edgeUrl,
    GATEHOUSE__LLM__MAX_RETRIES: "0",
    GATEHOUSE__MODELS__CHAT: "e2e-chat",
    GATEHOUSE__MODELS__PLANNER: "e2e-planner",
    GATEHOUSE__MODELS__SUMMARIZER: "e2e-summarizer",
    GATEHOUSE__LANE__CUSTOMER_MAX_RISK: "high",
    GATEHOUSE__WHATSAPP__GRAPH_BASE_URL: edgeUrl,
    GATEHOUSE__WHATSAPP__PHONE_NUMBER_ID: PHONE_NUMBER_ID,
    GATEHOUSE__WHATSAPP__MARK_READ: "false",
    GATEHOUSE__WHATSAPP__TYPING_INDICATOR: "false",
    ANTHROPIC_API_KEY: "e2e-llm-key",
    OPENAI_API_KEY: "",
    WHATSAPP_APP_SECRET: APP_SECRET,
    WHATSAPP_ACCESS_TOKEN: ACCESS_TOKEN,
    WHATSAPP_VERIFY_TOKEN: "e2e-verify-token",
  };
  gatehouse(["migrate"]);
  gatehouse(["owner", "add", "--login", owner.login, "--name", owner.name, "--whatsapp", owner.phone, "--password-stdin"], `${owner.password}\n`);
  const log = fs.openSync(path.join(dir, "serve.log"), "a");
  server = spawn(binary, ["--config", configPath, "serve"], { env: { ...process.env, ...env, RUST_LOG: "info" }, stdio: ["ignore", log, log] });
  await expect.poll(async () => (await fetch(`${base}/healthz`).catch(() => undefined))?.status, { timeout: 60_000 }).toBe(200);
});

test.afterAll(async () => {
  server?.kill("SIGTERM");
  await new Promise<void>((ok) => edge.server.close(() => ok()));
});

failOnConsoleErrors();
test.describe.configure({ mode: "serial" });

async function open(page: Page, path: string) {
  await page.goto(`${base}/login?next=${encodeURIComponent(path)}`);
  await hydrated(page);
  await login(page, owner.login, owner.password);
  await hydrated(page);
  await expect(page).toHaveURL(`${base}${path}`);
}

test("a simulated chat gets a tool's answer, and its trace shows the lane", async ({ page }) => {
  await open(page, "/conversations");
  await page.getByTestId("sim-from").fill("+15550100077");
  await page.getByTestId("sim-text").fill("Hi, where is my order 4821?");
  await page.getByTestId("sim-send").click();
  await expect(page.getByTestId("sim-result")).toHaveAttribute("data-route", "tool_lane");
  await expect(page.getByTestId("sim-reply")).toHaveText(STATUS);

  await page.getByTestId("sim-trace").click();
  await expect(page.getByTestId("trace-route")).toHaveText("tool_lane");
  const timeline = page.getByTestId("trace-timeline");
  await expect(timeline.locator('li[data-step="AgentToolCandidate"]').getByTestId("step-candidates")).toContainText("order_status");
  await expect(timeline.locator('li[data-step="AgentToolPlanAccepted"]')).toBeVisible();
  await expect(timeline.locator('li[data-step="AgentToolExecutionSucceeded"]')).toBeVisible();
  await expect(timeline.getByTestId("step-job").first()).toBeVisible();
  expect(await accessibilityViolations(page), "the lane's trace meets WCAG 2.1 AA").toEqual([]);
});

test("a follow-up in the simulator reuses the chat's tool context", async ({ page }) => {
  await open(page, "/conversations");
  await page.getByTestId("sim-from").fill("+15550100078");
  await page.getByTestId("sim-text").fill("Where is my order 4821?");
  await page.getByTestId("sim-send").click();
  await expect(page.getByTestId("sim-reply")).toHaveText(STATUS);
  await page.getByTestId("sim-text").fill("And what about order 4822?");
  await page.getByTestId("sim-send").click();
  await expect(page.getByTestId("sim-reply")).toHaveText(STATUS.replace("4821", "4822"));
  await page.getByTestId("sim-trace").click();
  const timeline = page.getByTestId("trace-timeline");
  await expect(timeline.locator('li[data-step="AgentToolFollowupResolved"]')).toContainText("FOLLOWUP_CONTEXT");
  await expect(timeline.locator('li[data-step="AgentToolExecutionSucceeded"]')).toBeVisible();
});

test("the answer to a clarifying question in the simulator is planned with the request", async ({ page }) => {
  await open(page, "/conversations");
  await page.getByTestId("sim-from").fill("+15550100079");
  await page.getByTestId("sim-text").fill("Where is my order?");
  await page.getByTestId("sim-send").click();
  await expect(page.getByTestId("sim-reply")).toHaveText(QUESTION);
  await page.getByTestId("sim-text").fill("It's order 4822");
  await page.getByTestId("sim-send").click();
  await expect(page.getByTestId("sim-reply")).toHaveText(STATUS.replace("4821", "4822"));
  await page.getByTestId("sim-trace").click();
  const timeline = page.getByTestId("trace-timeline");
  await expect(timeline.locator('li[data-step="AgentToolCandidate"]')).toContainText("CLARIFICATION_ANSWER");
  await expect(timeline.locator('li[data-step="AgentToolExecutionSucceeded"]')).toBeVisible();
});

test("an owner runs a failed lookup again from its job's page; the chat gets the answer", async ({ page }) => {
  test.setTimeout(90_000);
  edge.missing.add("4829");
  await open(page, "/conversations");
  await page.getByTestId("sim-from").fill("+15550100080");
  await page.getByTestId("sim-text").fill("Where is my order 4829?");
  await page.getByTestId("sim-send").click();
  await expect(page.getByTestId("sim-result")).toHaveAttribute("data-route", "tool_lane");
  await expect(page.getByTestId("sim-reply")).not.toHaveText(STATUS);
  await page.getByTestId("sim-trace").click();
  await expect(page.getByTestId("trace-route")).toHaveText("tool_lane");
  const trace = page.url();
  await page.getByTestId("step-job").first().click();
  await hydrated(page);
  await expect(page.getByRole("heading", { level: 1 })).toContainText("discarded");
  await expect(page.getByTestId("run-again-hint")).toBeVisible();
  await expect(page.getByTestId("run-again-warning")).toHaveCount(0);

  // The shop knows the order now: the owner runs the call again.
  edge.missing.delete("4829");
  await page.getByTestId("run-job-again").click();
  const again = page.getByTestId("ran-again-as").getByRole("link");
  await expect(again).toBeVisible();
  await again.click();
  await hydrated(page);
  await expect(page.getByRole("heading", { level: 1 })).toContainText("completed", { timeout: 20_000 });
  await expect(page.getByTestId("again-of")).toBeVisible();
  await expect(page.getByTestId("run-job-again")).toHaveCount(0);
  expect(await accessibilityViolations(page), "the job page meets WCAG 2.1 AA").toEqual([]);

  await page.goto(trace);
  await hydrated(page);
  const timeline = page.getByTestId("trace-timeline");
  await expect(timeline.locator('li[data-step="AgentToolRunAgain"]')).toBeVisible();
  await expect(timeline.locator('li[data-step="later_delivery"]')).toContainText("delivered");
});

test("an owner approves a customer's refund in the browser; the customer gets the answer once", async ({ page }) => {
  // On a phone, where owners decide: the waiting call, why it waits and both buttons are in view.
  await page.setViewportSize({ width: 390, height: 844 });
  await open(page, "/approvals");
  await expect(page.getByTestId("approvals-empty")).toBeVisible();

  // The request arrives while the page is open: it appears without a reload.
  await webhook("wamid.E2E.REFUND", "Please refund my order 4821");
  const row = page.getByTestId("approvals-pending").getByTestId("approval-row");
  await expect(row).toHaveCount(1);
  await expect(row).toContainText("refund_order");
  await expect(row).toContainText("4821");
  await expect(row).toContainText("high");
  await expect(row.getByTestId("approval-reason")).toContainText("a customer asked for a high-risk change");
  await expect(row.getByTestId("approval-reason")).toContainText("APPROVAL_CUSTOMER_HIGH_RISK_WRITE");
  await expect(row.getByTestId("approve-approval")).toBeInViewport({ ratio: 1 });
  await expect(row.getByTestId("reject-approval")).toBeInViewport({ ratio: 1 });
  expect(await accessibilityViolations(page), "a waiting approval meets WCAG 2.1 AA").toEqual([]);
  // Every page's navigation counts what waits, and a live page keeps the count current.
  const navCount = page.locator('nav a[href="/approvals"]').getByTestId("nav-count");
  await expect(navCount).toHaveText("1");
  // The dashboard says first that a call waits, and links to where it is decided.
  const dashboard = await page.context().newPage();
  await dashboard.goto(`${base}/`);
  await expect(dashboard.getByTestId("dashboard-waiting").locator('[data-waiting="approvals"]')).toContainText("1 tool call waiting for your approval");
  await dashboard.getByTestId("dashboard-waiting").getByRole("link", { name: /waiting for your approval/ }).click();
  await expect(dashboard).toHaveURL(`${base}/approvals`);
  await dashboard.close();
  expect(edge.refunds, "nothing runs before the decision").toEqual([]);
  // The customer was told an owner must approve; the owner's number got the buttons.
  await expect.poll(() => edge.sent.filter((m) => m.to === owner.phone.slice(1) && m.type === "interactive").length).toBe(1);
  await expect.poll(() => edge.textsTo(CUSTOMER).length).toBe(1);

  await row.getByTestId("approve-approval").click();
  await expect(page.getByTestId("decision-result")).toContainText("Approved");
  const decided = page.getByTestId("approvals-decided").getByTestId("approval-row");
  await expect(decided.first()).toHaveAttribute("data-state", "approved");
  await expect(decided.first().getByTestId("approval-outcome")).toHaveText("OK");
  await expect(page.getByTestId("approvals-empty")).toBeVisible();
  await expect(navCount).toHaveCount(0);

  await expect.poll(() => edge.textsTo(CUSTOMER)).toContain(SUMMARY);
  expect(edge.refunds).toEqual(["4821"]);
  expect(edge.textsTo(CUSTOMER).filter((t) => t === SUMMARY)).toHaveLength(1);
  await page.goto(`${base}/`);
  await hydrated(page);
  await expect(page.locator('[data-waiting="approvals"]')).toHaveCount(0);
});

test("an owner rejects a request with a reason; the customer is told and nothing runs", async ({ page }) => {
  await open(page, "/approvals");

  await webhook("wamid.E2E.REJECT", "Please refund my order 9000");
  const row = page.getByTestId("approvals-pending").getByTestId("approval-row");
  await expect(row).toHaveCount(1);
  await expect(row).toContainText("9000");
  await row.getByTestId("reject-reason").fill("Order 9000 was a gift");
  // The owner looks elsewhere before deciding (the field loses the focus).
  await page.getByRole("heading", { level: 1 }).click();
  await expect(row.getByTestId("reject-reason")).not.toBeFocused();
  // Another request arrives meanwhile: the live update leaves the list holding the typed reason
  // as it is, so the reason is not lost.
  const updates = async () => Number((await page.locator("html").getAttribute("data-live-updates")) ?? "0");
  const before = await updates();
  await webhook("wamid.E2E.REJECT.NEXT", "Please refund my order 9001");
  await expect.poll(updates).toBeGreaterThan(before);
  await expect(row).toHaveCount(1);
  await expect(row.getByTestId("reject-reason")).toHaveValue("Order 9000 was a gift");
  await row.getByTestId("reject-approval").click();
  await expect(page.getByTestId("decision-result")).toContainText("Rejected");
  const rejected = page.locator('[data-testid="approvals-decided"] [data-testid="approval-row"][data-state="rejected"]');
  await expect(rejected).toHaveCount(1);
  await expect(rejected.getByTestId("approval-note")).toHaveText("Reason: Order 9000 was a gift");
  // The page the browser comes back to shows the request that came meanwhile.
  await expect(row).toHaveCount(1);
  await expect(row).toContainText("9001");

  await expect.poll(() => edge.textsTo(CUSTOMER)).toContain("The owner did not approve that request, so it was not done.");
  expect(edge.refunds, "the rejected call never reached the shop").toEqual(["4821"]);
});
