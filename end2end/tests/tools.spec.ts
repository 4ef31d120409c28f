import { test, expect, type Page } from "@playwright/test";

import { expectHttpError, failOnConsoleErrors, hydrated, login } from "./fixtures";
import { gatehouse, owner } from "./support";

// The Tools & MCP page shows the shipped catalog (config/tools.toml), filters it, runs a call
// through the checkpoint as the owner and shows the audited decision, and reloads the catalog.
test.describe.configure({ mode: "serial" });

failOnConsoleErrors();

async function open(page: Page, path: string) {
  await page.goto(`/login?next=${encodeURIComponent(path)}`);
  await hydrated(page);
  await login(page, owner.login, owner.password);
  await hydrated(page);
}

const toolRow = (page: Page, name: string) => page.getByTestId("tools-table").locator(`tr[data-tool="${name}"]`);

test("the catalog lists the shipped tools with policy and breaker, and filters", async ({ page }) => {
  await open(page, "/tools");
  await expect(page.getByRole("heading", { name: "Tools & MCP" })).toBeVisible();
  await expect(page.getByTestId("approval-mode")).toHaveText("auto");
  await expect(toolRow(page, "web_fetch")).toContainText("builtin");
  await expect(toolRow(page, "web_fetch")).toContainText("public");
  await expect(toolRow(page, "web_fetch").locator("[data-breaker]")).toHaveAttribute("data-breaker", "closed");
  await expect(toolRow(page, "web_search")).toContainText("disabled");

  await page.getByTestId("tool-filters").getByLabel("Provider").selectOption("connector");
  await page.getByTestId("tool-filters").getByRole("button", { name: "Filter" }).click();
  await expect(page).toHaveURL(/provider=connector/);
  await expect(page.getByTestId("tools-empty")).toContainText("No tool matches these filters (3 in the catalog)");

  await page.goto("/tools?risk=low&audience=public");
  await expect(toolRow(page, "web_fetch")).toBeVisible();
  await expect(toolRow(page, "web_search")).toBeVisible();
});

test("try it runs a call through the checkpoint as the owner, and the audit shows it", async ({ page }) => {
  // A disabled tool's page says so where the phrases would be: no phrase brings it to the lane.
  await open(page, "/tools/web_search");
  await expect(page.getByTestId("tool-disabled")).toContainText("TOOL_DISABLED");
  await expect(page.getByTestId("tool-phrases")).toHaveCount(0);

  await page.goto("/tools/web_fetch");
  await hydrated(page);
  await expect(page.getByRole("heading", { name: /web_fetch/ })).toBeVisible();
  await expect(page.getByTestId("input-schema")).toContainText('"url"');
  await expect(page.getByTestId("owner-policy")).toHaveText("allowed");
  await expect(page.getByTestId("tool-reply")).toHaveText("written by the summarizer from the result");
  // The phrases the lane's detector finds it by, from tools.toml.
  await expect(page.getByTestId("tool-phrases")).toContainText("\u201copen this link\u201d");
  await expect(page.getByTestId("tool-phrases")).toContainText("\u201cread page\u201d");

  // Loopback is refused by the address guard before any connection.
  await page.getByTestId("try-args").fill(JSON.stringify({ url: "http://127.0.0.1:9/" }));
  await page.getByTestId("try-run").click();
  await expect(page.getByTestId("try-result")).toHaveAttribute("data-code", "FETCH_ADDRESS_FORBIDDEN");
  // The form keeps what was typed, to be changed and tried again.
  await expect(page.getByTestId("try-args")).toHaveValue(JSON.stringify({ url: "http://127.0.0.1:9/" }));
  await expect(page.getByTestId("calls-table").locator("tr[data-decision=deny]").first()).toContainText("FETCH_ADDRESS_FORBIDDEN");
  await expect(page.getByTestId("calls-table")).toContainText("owner · direct");

  // Arguments that are not JSON are refused, and left as they were typed, in a group chat.
  await page.getByTestId("try-args").fill('{"url": "https://example.com"');
  await page.getByTestId("try-chat-type").selectOption("group");
  await page.getByTestId("try-run").click();
  await expect(page.getByRole("alert")).toContainText("not valid JSON");
  await expect(page.getByTestId("try-args")).toHaveValue('{"url": "https://example.com"');
  await expect(page.getByTestId("try-chat-type")).toHaveValue("group");
  await page.getByTestId("try-chat-type").selectOption("direct");

  // Arguments the schema does not allow.
  await page.getByTestId("try-args").fill(JSON.stringify({ url: "https://example.com", extra: 1 }));
  await page.getByTestId("try-run").click();
  await expect(page.getByTestId("try-result")).toHaveAttribute("data-code", "TOOL_SCHEMA_INVALID");

  // The CLI goes through the same checkpoint and audit.
  let failed = "";
  try {
    gatehouse("tools", "call", "web_fetch", "--args", JSON.stringify({ url: "http://169.254.169.254/latest" }), "--as", "customer");
  } catch (e) {
    const err = e as { stdout?: string; stderr?: string };
    failed = `${err.stdout ?? ""}${err.stderr ?? ""}`;
  }
  expect(failed).toContain("FETCH_ADDRESS_FORBIDDEN");
  await page.goto("/tools");
  await expect(page.getByTestId("calls-table")).toContainText("customer · direct");
  await expect(page.getByTestId("calls-table").locator("tr[data-decision=deny]")).toHaveCount(3);
});

test("reloading the catalog from the console", async ({ page }) => {
  await open(page, "/tools");
  await page.getByTestId("reload-tools").click();
  await expect(page.getByTestId("reload-result")).toHaveText("Catalog reloaded: 3 tools.");
  // The answer is shown once, on the page the form's post came back to; a reload does not
  // repeat it.
  await page.reload();
  await hydrated(page);
  await expect(page.getByTestId("tools-table")).toBeVisible();
  await expect(page.getByTestId("reload-result")).toHaveCount(0);
});

test("an unknown tool page says so", async ({ page }) => {
  // The page answers with its data's status.
  expectHttpError("/tools/no_such_tool", 404);
  await open(page, "/tools/no_such_tool");
  await expect(page.locator("[data-code=NOT_FOUND]")).toContainText("There is no tool named");
});
