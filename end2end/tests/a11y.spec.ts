import { test, expect, type Page } from "@playwright/test";

import { accessibilityViolations, failOnConsoleErrors, hydrated, login } from "./fixtures";
import { owner } from "./support";

// Every console page, with the data the journeys before this one left (chats, traces, jobs,
// tools, MCP servers, repairs), checked with axe-core against WCAG 2.1 A and AA. The lane
// journey checks the pages only it fills: a trace of the tool lane and a waiting approval.
test.describe.configure({ mode: "serial" });

failOnConsoleErrors();

async function signIn(page: Page) {
  await page.goto("/login");
  await hydrated(page);
  await login(page, owner.login, owner.password);
  await page.waitForURL((url) => url.pathname === "/");
  await hydrated(page);
}

/** The first link on `list` whose address starts with `prefix` and has more after it. */
async function firstDetail(page: Page, list: string, prefix: string): Promise<string | null> {
  await page.goto(list);
  await hydrated(page);
  const hrefs = await page.locator(`a[href^="${prefix}"]`).evaluateAll((links) => links.map((a) => a.getAttribute("href") ?? ""));
  return hrefs.find((h) => h.length > prefix.length && !h.includes("?")) ?? null;
}

test("the login page meets WCAG 2.1 AA", async ({ page }) => {
  await page.goto("/login");
  await hydrated(page);
  expect(await accessibilityViolations(page)).toEqual([]);
});

test("every console page meets WCAG 2.1 AA and reflows at 320 px", async ({ page }) => {
  await signIn(page);
  const pages = ["/", "/conversations", "/traces", "/approvals", "/jobs", "/tools", "/mcp", "/repairs", "/settings"];
  for (const [list, prefix] of [
    ["/conversations", "/conversations/"],
    ["/traces", "/traces/"],
    ["/jobs", "/jobs/"],
    ["/tools", "/tools/"],
  ]) {
    const detail = await firstDetail(page, list, prefix);
    expect(detail, `a detail page linked from ${list}`).not.toBeNull();
    pages.push(detail!);
  }
  const found: string[] = [];
  for (const path of pages) {
    const response = await page.goto(path);
    expect(response?.status(), path).toBe(200);
    await hydrated(page);
    found.push(...(await accessibilityViolations(page)).map((v) => `${path}: ${v}`));
  }
  // Reflow (WCAG 1.4.10, which axe does not check): at 320 CSS pixels no page scrolls
  // sideways; long values (hashes, keys, codes) and wide choices wrap or shrink instead.
  await page.setViewportSize({ width: 320, height: 640 });
  for (const path of pages) {
    await page.goto(path);
    await hydrated(page);
    const { scroll, width } = await page.evaluate(() => ({ scroll: document.documentElement.scrollWidth, width: document.documentElement.clientWidth }));
    if (scroll > width) found.push(`${path}: scrolls sideways at 320 px (${scroll} px wide)`);
  }
  expect(found).toEqual([]);
});
