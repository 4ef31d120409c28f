import { test, expect } from "@playwright/test";

import { accessibilityViolations, expectHttpError, failOnConsoleErrors, hydrated, login, watchConsole } from "./fixtures";
import { owner } from "./support";

// One owner journey, in order, against a fresh database: the steps depend on each other
// (setup closes for good; failed logins count toward the throttle).
test.describe.configure({ mode: "serial" });


const NAV = [
  ["Dashboard", "Dashboard"],
  ["Conversations", "Conversations"],
  ["Traces", "Traces"],
  ["Approvals", "Approvals"],
  ["Jobs", "Jobs"],
  ["Tools & MCP", "Tools & MCP"],
  ["MCP servers", "MCP servers"],
  ["Repairs", "Repairs"],
  ["Settings", "Settings"],
] as const;

failOnConsoleErrors();

test("fresh start redirects to setup, which creates the owner and opens the dashboard", async ({ page }) => {
  await page.goto("/");
  await expect(page).toHaveURL(/\/setup$/);
  await hydrated(page);
  expect(await accessibilityViolations(page), "the setup page meets WCAG 2.1 AA").toEqual([]);
  await page.getByLabel("Display name").fill(owner.name);
  await page.getByLabel("Login name").fill(owner.login);
  await page.getByLabel("Password (at least 12 characters)").fill(owner.password);
  await page.getByLabel("Repeat password").fill(owner.password);
  await page.getByLabel(/WhatsApp numbers/).fill(owner.phone);
  await page.getByRole("button", { name: "Create owner" }).click();

  await expect(page).toHaveURL(/\/$/);
  await expect(page.getByRole("heading", { name: "Dashboard" })).toBeVisible();
  await expect(page.getByTestId("owner-name")).toHaveText(owner.name);
  const facts = page.getByTestId("dashboard-facts");
  await expect(facts).toContainText("sqlite");
  await expect(facts).toContainText("Migrations applied");
  // Every shipped migration is applied: "N of N".
  await expect(facts).toContainText(/Migrations applied(\d+) of \1 /);
  await expect(page.getByTestId("degraded-banner")).toContainText("ANTHROPIC_API_KEY");
  // The shipped config sets no spend budget: the spend is shown, and how to set one.
  await expect(page.getByTestId("dashboard-spend")).toContainText("Model spend today$0.00 (no budget)");
  await expect(page.getByTestId("budget-empty")).toContainText("[budget]");
  // This config's MCP servers are not trusted: their tools wait in quarantine, and the dashboard
  // says so first, linked to where they are approved. No tool call waits yet.
  await expect(page.locator('[data-waiting="mcp-tools"]')).toContainText("MCP tools in quarantine");
  await expect(page.locator('[data-waiting="mcp-tools"] a')).toHaveAttribute("href", "/mcp");
  await expect(page.locator('[data-waiting="approvals"]')).toHaveCount(0);
});

test("setup is closed once an owner exists", async ({ page }) => {
  await page.goto("/setup");
  await expect(page).not.toHaveURL(/\/setup/);
});

test("every console page renders from the navigation, also on a phone-sized screen", async ({ page }) => {
  await page.setViewportSize({ width: 390, height: 844 });
  await page.goto("/login");
  await hydrated(page);
  await login(page, owner.login, owner.password);
  await expect(page.getByRole("heading", { name: "Dashboard" })).toBeVisible();
  for (const [link, heading] of NAV) {
    // A section's link may also say how many things wait there ("MCP servers 3 waiting for you").
    const escaped = link.replace(/[.*+?^$()|[\]\\]/g, "\\$&");
    const name = new RegExp(`^${escaped}( \\d+ waiting for you)?$`);
    await page.getByRole("navigation", { name: "Console" }).getByRole("link", { name }).click();
    await expect(page.getByRole("heading", { level: 1, name: heading, exact: true })).toBeVisible();
    if (link === "Approvals") {
      await expect(page.getByTestId("approvals-empty")).toContainText("No tool call is waiting for an owner");
    } else if (link === "Repairs") {
      await expect(page.getByTestId("repairs-empty")).toContainText("No repair has been proposed");
    }
    const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
    expect(overflow, `${link} fits the screen width`).toBeLessThanOrEqual(1);
  }
  // Settings shows secrets only as set/unset, and the owner's own number.
  await page.getByRole("link", { name: "Settings", exact: true }).click();
  await expect(page.getByTestId("secrets")).toContainText("ANTHROPIC_API_KEY");
  await expect(page.getByTestId("secrets")).toContainText("unset");
  // The shipped tool files name no secret: the page says so, and how one is named.
  await expect(page.getByTestId("tool-secrets-empty")).toContainText("${VAR}");
  await expect(page.getByTestId("phones")).toHaveValue(owner.phone);
  await expect(page.getByTestId("effective-config")).toContainText("database.url");
});

test("owners edit their WhatsApp numbers", async ({ page }) => {
  await page.goto("/login?next=%2Fsettings");
  await hydrated(page);
  await login(page, owner.login, owner.password);
  await expect(page.getByRole("heading", { name: "Settings" })).toBeVisible();
  await page.getByTestId("phones").fill(`${owner.phone}\n+447700900123`);
  await page.getByRole("button", { name: "Save numbers" }).click();
  await expect(page.getByText("Saved.")).toBeVisible();
  await page.reload();
  await expect(page.getByTestId("phones")).toHaveValue(`${owner.phone}\n+447700900123`);

  // With no owner number, the simulator says where to add one, and links there.
  await page.getByTestId("phones").fill("");
  await page.getByRole("button", { name: "Save numbers" }).click();
  await expect(page.getByText("Saved.")).toBeVisible();
  await page.goto("/conversations");
  await hydrated(page);
  await page.getByTestId("sim-settings").click();
  await expect(page.getByRole("heading", { name: "Settings" })).toBeVisible();
  await page.getByTestId("phones").fill(`${owner.phone}\n+447700900123`);
  await page.getByRole("button", { name: "Save numbers" }).click();
  await expect(page.getByText("Saved.")).toBeVisible();

  expectHttpError("/api/update_phones", 400);
  await page.getByTestId("phones").fill("not-a-number");
  await page.getByRole("button", { name: "Save numbers" }).click();
  await expect(page.getByRole("alert")).toContainText("E.164");
  // What was typed stays, to be corrected.
  await expect(page.getByTestId("phones")).toHaveValue("not-a-number");
});

test("logout ends the session and protected pages redirect to login", async ({ page }) => {
  await page.goto("/login");
  await hydrated(page);
  await login(page, owner.login, owner.password);
  await expect(page.getByRole("heading", { name: "Dashboard" })).toBeVisible();
  await page.getByTestId("logout").click();
  await expect(page).toHaveURL(/\/login/);
  await page.goto("/jobs");
  await expect(page).toHaveURL(/\/login\?next=%2Fjobs$/);
  await expect(page.getByRole("button", { name: "Log in" })).toBeVisible();
});

test("without JavaScript, login works as a plain form and shows errors", async ({ browser }) => {
  const context = await browser.newContext({ javaScriptEnabled: false });
  const page = await context.newPage();
  const noJsErrors = watchConsole(page);
  await page.goto("/jobs");
  await expect(page).toHaveURL(/\/login/);
  await login(page, owner.login, "not the password");
  await expect(page.getByRole("alert")).toHaveText("Wrong login name or password.");
  await login(page, owner.login, owner.password);
  await expect(page.getByRole("heading", { name: "Jobs" })).toBeVisible();
  await context.close();
  expect(noJsErrors).toEqual([]);
});

test("the header and the banner keep their height on a short page of a tall screen", async ({ browser, page }) => {
  const heights = async (p: typeof page) =>
    p.evaluate(() => {
      const height = (selector: string) => document.querySelector(selector)?.getBoundingClientRect().height ?? -1;
      return { header: height("header.topbar"), banner: height("[data-testid=degraded-banner]") };
    });
  // As the server renders it (before hydration, or without JavaScript): the spare height of
  // the screen belongs to the page's content, not to the header and the banner (the header
  // was 180 px tall here).
  const context = await browser.newContext({ javaScriptEnabled: false, viewport: { width: 1280, height: 900 } });
  const plain = await context.newPage();
  await plain.goto("/login?next=%2Fapprovals");
  await login(plain, owner.login, owner.password);
  await expect(plain.getByRole("heading", { level: 1, name: "Approvals", exact: true })).toBeVisible();
  const short = await heights(plain);
  expect(short.header, "header height on Approvals").toBeGreaterThan(20);
  expect(short.header, "header height on Approvals").toBeLessThan(80);
  expect(short.banner, "banner height on Approvals").toBeLessThan(120);
  for (const path of ["/repairs", "/conversations"]) {
    await plain.goto(path);
    expect((await heights(plain)).header, `header height on ${path}`).toBeLessThan(80);
  }
  await plain.setViewportSize({ width: 390, height: 1400 });
  await plain.goto("/approvals");
  expect((await heights(plain)).header, "header height on a tall phone screen").toBeLessThan(80);
  await context.close();

  // And once hydrated.
  await page.setViewportSize({ width: 1280, height: 900 });
  await page.goto("/login?next=%2Fapprovals");
  await hydrated(page);
  await login(page, owner.login, owner.password);
  await expect(page.getByRole("heading", { level: 1, name: "Approvals", exact: true })).toBeVisible();
  expect((await heights(page)).header, "hydrated header height on Approvals").toBeLessThan(80);
});

test("the console's wasm comes compressed once and from the browser's cache on a repeat visit", async ({ page, context }) => {
  const cdp = await context.newCDPSession(page);
  await cdp.send("Network.enable");
  const wasm: { url: string; fromCache: boolean; encoding: string }[] = [];
  cdp.on("Network.responseReceived", (e) => {
    if (e.response.url.endsWith(".wasm")) {
      const encoding = Object.entries(e.response.headers).find(([k]) => k.toLowerCase() === "content-encoding")?.[1] ?? "";
      wasm.push({ url: e.response.url, fromCache: Boolean(e.response.fromDiskCache || e.response.fromPrefetchCache), encoding });
    }
  });
  await page.goto("/login");
  await hydrated(page);
  await page.goto("/login");
  await hydrated(page);
  expect(wasm.length, JSON.stringify(wasm)).toBeGreaterThanOrEqual(2);
  // A content-hashed name, sent brotli-compressed the first time...
  expect(wasm[0].url).toMatch(/\/pkg\/gatehouse\.[0-9a-f]{16}\.wasm$/);
  expect(wasm[0].fromCache).toBe(false);
  expect(wasm[0].encoding).toBe("br");
  // ...and never fetched again while the build is the same.
  expect(wasm.slice(1).every((w) => w.fromCache && w.url === wasm[0].url), JSON.stringify(wasm)).toBe(true);
});

test("a console page runs its own scripts only (Content-Security-Policy)", async ({ page, context }) => {
  // Hydrating under the policy raises no violation: the hooks fail the test on any console error.
  const answer = await page.goto("/login?next=%2Fjobs");
  const policy = answer?.headers()["content-security-policy"] ?? "";
  const nonce = /'nonce-([^']+)'/.exec(policy)?.[1] ?? "";
  expect(nonce, policy).not.toBe("");
  expect(policy).not.toContain("unsafe-inline");
  await hydrated(page);
  await login(page, owner.login, owner.password);
  await expect(page.getByRole("heading", { name: "Jobs" })).toBeVisible();
  await hydrated(page);

  // A script that found its way into a page does not run. Another tab of the same browser,
  // whose console is not watched: the browser logs the refusal there as an error, on purpose.
  const probe = await context.newPage();
  await probe.goto("/jobs");
  await hydrated(probe);
  const refused = await probe.evaluate(
    () =>
      new Promise<{ directive: string; ran: boolean }>((resolve) => {
        document.addEventListener(
          "securitypolicyviolation",
          (e) => resolve({ directive: e.effectiveDirective, ran: (window as unknown as { injected?: boolean }).injected === true }),
          { once: true },
        );
        const script = document.createElement("script");
        script.textContent = "window.injected = true";
        document.body.appendChild(script);
      }),
  );
  expect(refused).toEqual({ directive: "script-src-elem", ran: false });
  await probe.close();
});
