import * as fs from "node:fs";

import { expect, test, type ConsoleMessage, type Page } from "@playwright/test";

/** HTTP error answers a test provokes on purpose (a wrong password, invalid input). Chromium
 *  logs every 4xx response as a console error; only these declared ones are tolerated. */
let expectedHttpErrors: Array<{ path: string; status: number }> = [];
export function resetExpectedHttpErrors() {
  expectedHttpErrors = [];
}
export function expectHttpError(path: string, status: number) {
  expectedHttpErrors.push({ path, status });
}

/** Fails the test on any browser console error or uncaught exception, except the declared
 *  HTTP error answers above. */
export function watchConsole(page: Page): string[] {
  const errors: string[] = [];
  page.on("console", (msg: ConsoleMessage) => {
    if (msg.type() !== "error") return;
    const status = /Failed to load resource: the server responded with a status of (\d{3})/.exec(msg.text());
    const declared =
      status !== null &&
      expectedHttpErrors.some((e) => msg.location().url.endsWith(e.path) && Number(status[1]) === e.status);
    if (!declared) errors.push(`${msg.text()} @ ${msg.location().url}`);
  });
  page.on("pageerror", (err) => errors.push(`pageerror: ${err.message}`));
  return errors;
}

export async function hydrated(page: Page) {
  await expect(page.locator("body")).toHaveAttribute("data-hydrated", "true");
}

export async function login(page: Page, login: string, password: string) {
  await page.getByLabel("Login name").fill(login);
  await page.getByLabel("Password").fill(password);
  await page.getByRole("button", { name: "Log in" }).click();
}


/** Registers hooks that fail each test of the file on any undeclared browser console error. */
export function failOnConsoleErrors() {
  let errors: string[] = [];
  test.beforeEach(({ page }) => {
    resetExpectedHttpErrors();
    errors = watchConsole(page);
  });
  test.afterEach(() => {
    expect(errors, "browser console errors").toEqual([]);
  });
}

let axeSource: string | undefined;

type Violation = { id: string; impact: string | null; help: string; nodes: { target: unknown[] }[] };

/** The page's WCAG 2.1 A and AA violations as axe-core finds them (names for every control and
 *  link, labels for every field, contrast, landmarks, valid ARIA), one line each with the
 *  elements concerned. axe runs inside the page through Playwright's evaluate, which the page's
 *  Content-Security-Policy does not apply to. */
export async function accessibilityViolations(page: Page): Promise<string[]> {
  axeSource ??= fs.readFileSync(require.resolve("axe-core/axe.min.js"), "utf8");
  await page.evaluate(axeSource);
  const found: Violation[] = await page.evaluate(async () => {
    // @ts-expect-error: axe is the global the source above defines.
    const result = await window.axe.run(document, { runOnly: { type: "tag", values: ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"] } });
    return result.violations;
  });
  return found.map((v) => `${v.impact} ${v.id}: ${v.help} at ${v.nodes.map((n) => JSON.stringify(n.target)).join(", ")}`);
}
