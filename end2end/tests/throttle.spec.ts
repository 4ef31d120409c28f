import { test, expect } from "@playwright/test";

import { failOnConsoleErrors, hydrated, login } from "./fixtures";
import { baseURL, owner } from "./support";

// Runs last: it locks logins from this address for the rest of the window.
failOnConsoleErrors();

test("a wrong password shows an error, then repeated failures are throttled", async ({ page, browser }) => {
  // Another browser signs in first, and out again: it keeps its device cookie.
  const laptop = await browser.newContext();
  const trusted = await laptop.newPage();
  await trusted.goto("/login");
  await hydrated(trusted);
  await login(trusted, owner.login, owner.password);
  await expect(trusted.getByRole("heading", { name: "Dashboard" })).toBeVisible();
  await trusted.getByTestId("logout").click();
  await expect(trusted).toHaveURL(/\/login/);

  await page.goto("/login");
  await hydrated(page);
  // One failure came from the no-JavaScript test; four more reach the limit of five within the
  // window. Each answer is awaited before the next.
  for (let i = 2; i <= 5; i++) {
    const answer = page.waitForResponse((r) => r.url().endsWith("/api/login"));
    await login(page, owner.login, `wrong password ${i}`);
    // A plain form post: the answer sends the browser back to the form, the error in its URL.
    expect((await answer).status()).toBe(302);
    await expect(page.getByRole("alert")).toHaveText("Wrong login name or password.");
  }
  // Now even the right password is refused, with the same generic message for any account.
  const answer = page.waitForResponse((r) => r.url().endsWith("/api/login"));
  await login(page, owner.login, owner.password);
  const res = await answer;
  expect(res.status()).toBe(302);
  expect(Number(res.headers()["retry-after"])).toBeGreaterThan(0);
  await expect(page.getByRole("alert")).toContainText("Too many failed attempts");
  await expect(page).toHaveURL(/\/login/);
  // A client that asks for JSON gets the status itself.
  const api = await page.request.post("/api/login", {
    form: { login: owner.login, password: owner.password, next: "/" },
    headers: { Accept: "application/json", Origin: baseURL },
  });
  expect(api.status()).toBe(429);
  expect(Number(api.headers()["retry-after"])).toBeGreaterThan(0);

  // The browser that signed in before is a trusted device: from the same address, it gets in
  // while this one waits.
  await hydrated(trusted);
  await login(trusted, owner.login, owner.password);
  await expect(trusted.getByRole("heading", { name: "Dashboard" })).toBeVisible();
  await laptop.close();
});
