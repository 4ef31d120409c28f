import { test, expect, type Page } from "@playwright/test";

import { failOnConsoleErrors, hydrated, login } from "./fixtures";
import { gatehouse, owner } from "./support";

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
