import { execFile } from "node:child_process";

import { test, expect, type Page } from "@playwright/test";

import { accessibilityViolations, expectHttpError, failOnConsoleErrors, hydrated, login } from "./fixtures";
import { binary, configPath, gatehouse, owner, serverEnv } from "./support";

// The MCP servers page against a real MCP server (the npm reference memory server over stdio,
// declared untrusted in the test config): its tools wait for approval; an owner approves one,
// which then joins the catalog; disabling the server withdraws it, live.
test.describe.configure({ mode: "serial" });

failOnConsoleErrors();

async function open(page: Page, path: string) {
  await page.goto(`/login?next=${encodeURIComponent(path)}`);
  await hydrated(page);
  await login(page, owner.login, owner.password);
  await hydrated(page);
}

const card = (page: Page) => page.locator('section[data-server="memory"]');
const toolRow = (page: Page, name: string) => card(page).locator(`tr[data-tool="${name}"]`);

test("an untrusted server's tools wait for approval; approving one offers it", async ({ page }) => {
  await open(page, "/mcp");
  await expect(page.getByRole("heading", { name: "MCP servers", level: 1 })).toBeVisible();
  await expect(card(page)).toHaveAttribute("data-health", "connected", { timeout: 30_000 });
  await expect(card(page)).toContainText("untrusted");
  await expect(toolRow(page, "memory__read_graph")).toHaveAttribute("data-state", "pending");
  // What the owner approves is said in the row: the server's own description, as text.
  await expect(toolRow(page, "memory__read_graph").getByTestId("mcp-tool-description")).toHaveText("Read the entire knowledge graph");
  await expect(card(page).getByTestId("tool-count")).toContainText("waiting for approval");

  // A waiting tool cannot be called, not even by an owner.
  let refused = "";
  try {
    gatehouse("tools", "call", "memory__read_graph", "--args", "{}", "--as", "owner");
  } catch (e) {
    const err = e as { stdout?: string; stderr?: string };
    refused = `${err.stdout ?? ""}${err.stderr ?? ""}`;
  }
  expect(refused).toContain("TOOL_");

  await toolRow(page, "memory__read_graph").getByTestId("approve-tool").click();
  await expect(toolRow(page, "memory__read_graph")).toHaveAttribute("data-state", "approved");
  await expect(toolRow(page, "memory__create_entities")).toHaveAttribute("data-state", "pending");

  await page.goto("/tools?provider=mcp");
  await expect(page.getByTestId("tools-table").locator('tr[data-tool="memory__read_graph"]')).toBeVisible();
  await expect(page.getByTestId("tools-table").locator('tr[data-tool="memory__create_entities"]')).toHaveCount(0);
});

test("disabling a server withdraws its tools; enabling brings it back", async ({ page }) => {
  await open(page, "/mcp");
  await expect(card(page)).toHaveAttribute("data-health", "connected", { timeout: 30_000 });
  await card(page).getByTestId("toggle-server").click();
  await expect(card(page)).toHaveAttribute("data-health", "disabled");
  await expect(card(page).getByTestId("toggle-server")).toHaveText("Enable");

  await page.goto("/tools?provider=mcp");
  await expect(page.getByTestId("tools-empty")).toBeVisible();

  await page.goto("/mcp");
  await card(page).getByTestId("toggle-server").click();
  await expect(card(page)).toHaveAttribute("data-health", "connected", { timeout: 30_000 });
  await card(page).getByTestId("refresh-server").click();
  await expect(page.getByTestId("refresh-result")).toContainText("memory:");
});

test("a server's form waits for an owner, who answers it in the console", async ({ page }) => {
  // The fixture's `ask` tool asks for a form during its call; the call runs in its own process
  // (the CLI), the owner answers in the console's process: the form goes through the database.
  gatehouse("mcp", "approve", "asker__ask");
  const call = new Promise<string>((resolve) => {
    execFile(
      binary,
      ["--config", configPath, "tools", "call", "asker__ask", "--as", "owner", "--args", JSON.stringify({ message: "<b>Which</b> seat?" })],
      { env: { ...process.env, ...serverEnv, RUST_LOG: "warn" }, encoding: "utf8" },
      (_err, stdout, stderr) => resolve(`${stdout}${stderr}`),
    );
  });
  try {
    await open(page, "/mcp");
    const form = page.getByTestId("mcp-form");
    await expect(form).toBeVisible({ timeout: 30_000 });
    await expect(form).toHaveAttribute("data-server", "asker");
    // The server's words are text, labelled as the server's.
    await expect(form).toContainText("Message from the server asker (untrusted");
    await expect(form.getByTestId("form-message")).toHaveText("<b>Which</b> seat?");
    // Defaults filled in; a required field without one is for the owner to fill.
    await expect(form.locator('input[data-field="seats"]')).toHaveValue("2");
    expect(await accessibilityViolations(page), "a server's form meets WCAG 2.1 AA").toEqual([]);
    // An answer the schema refuses (the required choice not given) keeps what was filled in.
    expectHttpError("/api/mcp_answer_form", 400);
    await form.locator('input[data-field="seats"]').fill("3");
    await form.getByTestId("form-accept").click();
    await expect(page.getByRole("alert")).toBeVisible();
    await expect(page.getByTestId("mcp-form").locator('input[data-field="seats"]')).toHaveValue("3");
    await form.locator('select[data-field="confirm"]').selectOption("true");
    await form.getByTestId("form-accept").click();
    await expect(page.getByTestId("form-result")).toContainText("accepted");
    await expect(page.getByTestId("mcp-form")).toHaveCount(0);
    const out = await call;
    // The server got the owner's values: its answer is in the call's result (JSON inside JSON).
    expect(out).toMatch(/action\\*":\\*"accept/);
    expect(out).toMatch(/confirm\\*":true/);
  } finally {
    gatehouse("mcp", "reject", "asker__ask");
  }
});
