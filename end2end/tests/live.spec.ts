import { test, expect, type Page } from "@playwright/test";

import { expectHttpError, failOnConsoleErrors, hydrated, login } from "./fixtures";
import { owner } from "./support";

// Live pages follow the server's events (server-sent events) instead of being reloaded; the
// dashboard's charts show what a simulated conversation did. This server has no model key, so
// the simulator's customers get the degraded-mode reply, which is still delivered.
test.describe.configure({ mode: "serial" });

failOnConsoleErrors();

async function open(page: Page, path: string) {
  await page.goto(`/login?next=${encodeURIComponent(path)}`);
  await hydrated(page);
  await login(page, owner.login, owner.password);
  await page.waitForURL((url) => url.pathname === path);
  await hydrated(page);
}

/** Sends a message from the Conversations page's simulator as `from`. */
async function simulate(page: Page, from: string, text: string) {
  await page.getByTestId("sim-from").fill(from);
  await page.getByTestId("sim-text").fill(text);
  await page.getByTestId("sim-send").click();
  await expect(page.getByTestId("sim-trace")).toBeVisible();
}

test("a Traces page open in one tab shows a new simulated message without reloading", async ({ page, context }) => {
  await open(page, "/traces");
  await expect(page.locator("html")).toHaveAttribute("data-live", "open");
  // A reload would lose this.
  await page.evaluate(() => ((window as unknown as { stillHere: boolean }).stillHere = true));
  // And this: a filter being typed stays as it is while the list beside it moves.
  const chatFilter = page.getByTestId("trace-filters").locator('input[name="chat"]');
  await chatFilter.fill("sim-1555");

  // Another tab of the same session sends a message from the Conversations page.
  const other = await context.newPage();
  await other.goto("/conversations");
  await hydrated(other);
  await other.getByTestId("sim-from").fill("+15550100777");
  await other.getByTestId("sim-text").fill("Is the shop open today?");
  await other.getByTestId("sim-send").click();
  const link = other.getByTestId("sim-trace");
  await expect(link).toBeVisible();
  const id = (await link.getAttribute("href"))?.split("/").pop();
  await other.close();

  const row = page.locator(`tr[data-trace-id="${id}"]`);
  await expect(row).toBeVisible();
  await expect(row).toContainText("sim-15550100777");
  expect(await page.evaluate(() => (window as unknown as { stillHere?: boolean }).stillHere)).toBe(true);
  await expect(chatFilter).toHaveValue("sim-1555");
});

test("the dashboard's charts show a simulated conversation, each linked to its list, on a phone", async ({ page }) => {
  await page.setViewportSize({ width: 390, height: 844 });
  await open(page, "/conversations");
  await simulate(page, "+15550100778", "Hello, do you deliver?");
  await page.goto("/");
  await hydrated(page);

  const replies = page.getByTestId("chart-replies");
  await expect(replies.locator('rect[data-series="delivered"]').first()).toBeVisible();
  await expect(replies.getByRole("link", { name: /^delivered \(\d+\)$/ })).toHaveAttribute("href", "/conversations");
  await expect(replies.locator("figcaption a")).toHaveAttribute("href", "/conversations");

  // Each new chart is there, with data or with what would put data in it.
  for (const [id, link] of [
    ["tool_outcomes", "/tools"],
    ["job_wait", "/jobs?since_minutes=1440"],
    ["approvals_waiting", "/approvals"],
    ["mcp_health", "/mcp"],
  ]) {
    const chart = page.getByTestId(`chart-${id}`);
    await expect(chart).toBeVisible();
    await expect(chart.locator("figcaption a")).toHaveAttribute("href", link);
  }
  // A chart of groups gives its scale alone on its axis (its legend names the bars); one over
  // time names its first and last hour.
  await expect(page.getByTestId("chart-mcp_health").locator(".chart-axis")).toHaveText(/^\s*max \d+\s*$/);
  await expect(page.getByTestId("chart-replies").locator(".chart-axis")).toHaveText(/^\s*\d{1,2}h.*max \d+.*\d{1,2}h\s*$/);

  // Readable on a phone: every chart fits the screen's width.
  const widest = await page
    .locator("figure.chart")
    .evaluateAll((figures) => Math.max(...figures.map((f) => f.getBoundingClientRect().right)));
  expect(widest).toBeLessThanOrEqual(390);
});

test("every list reads as cards on a phone, each value beside its column's name, nothing to scroll sideways", async ({ page }) => {
  await page.setViewportSize({ width: 390, height: 844 });
  await open(page, "/traces");
  // The tests before this one left traces, chats and jobs; the shipped catalog has tools.
  for (const [path, table] of [
    ["/traces", "traces-table"],
    ["/jobs", "jobs-table"],
    ["/conversations", "chats-table"],
    ["/tools", "tools-table"],
  ]) {
    await page.goto(path);
    await hydrated(page);
    const list = page.getByTestId(table);
    await expect(list.locator("tbody tr").first()).toBeVisible();
    // Read again until it holds: a live page may swap its rows in while they are measured.
    await expect(async () => {
      const seen = await list.evaluate((t) => {
        const headers = [...t.querySelectorAll("thead th")].map((th) => th.textContent ?? "");
        const rows = [...t.querySelectorAll("tbody tr")];
        return {
          headers,
          headerHeight: t.querySelector("thead")!.getBoundingClientRect().height,
          labels: rows.map((tr) => [...tr.children].map((td) => td.getAttribute("data-label"))),
          cellTops: rows.map((tr) => [...tr.children].map((td) => Math.round(td.getBoundingClientRect().top))),
          pageWidth: document.documentElement.scrollWidth,
        };
      });
      for (const labels of seen.labels) expect(labels, path).toEqual(seen.headers);
      // Cards: the header row is out of sight, and a row's cells are stacked, not side by side.
      expect(seen.headerHeight, path).toBeLessThanOrEqual(1);
      for (const tops of seen.cellTops) expect(new Set(tops).size, path).toBe(tops.length);
      expect(seen.pageWidth, path).toBeLessThanOrEqual(390);
    }).toPass({ timeout: 10_000 });
  }
});

test("a live page whose session ended goes to the login page instead of going quiet", async ({ page }) => {
  // The stream's reconnect is refused once the session is gone: the browser closes it for good.
  expectHttpError("/api/events?topics=message", 401);
  // A page whose topic stays quiet here (no message comes), so no event's refresh finds the
  // session gone: only the refused stream can tell.
  await open(page, "/conversations");
  await expect(page.locator("html")).toHaveAttribute("data-live", "open");
  await expect(page.getByTestId("live-paused")).toBeHidden();
  // The session ends elsewhere (here a logout from this tab's own script; an idle timeout alike).
  await page.evaluate(() =>
    fetch("/api/logout", { method: "POST", headers: { "content-type": "application/x-www-form-urlencoded" }, body: "" }),
  );
  await page.waitForURL((url) => url.pathname === "/login", { timeout: 30_000 });
  expect(new URL(page.url()).searchParams.get("next")).toBe("/conversations");
});
