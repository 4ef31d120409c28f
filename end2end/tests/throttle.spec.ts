import { test, expect } from "@playwright/test";

import { expectHttpError, failOnConsoleErrors, hydrated, login } from "./fixtures";
import { owner } from "./support";

// Runs last: it locks logins from this address for the rest of the window.
failOnConsoleErrors();

test("a wrong password shows an error, then repeated failures are throttled", async ({ page }) => {
  expectHttpError("/api/login", 401);
  expectHttpError("/api/login", 429);
  await page.goto("/login");
  await hydrated(page);
  // One failure came from the no-JavaScript test; four more reach the limit of five within the
  // window. Each answer is awaited before the next.
  for (let i = 2; i <= 5; i++) {
    const answer = page.waitForResponse((r) => r.url().endsWith("/api/login"));
    await login(page, owner.login, `wrong password ${i}`);
    expect((await answer).status()).toBe(401);
    await expect(page.getByRole("alert")).toHaveText("Wrong login name or password.");
  }
  // Now even the right password is refused, with the same generic message for any account.
  const answer = page.waitForResponse((r) => r.url().endsWith("/api/login"));
  await login(page, owner.login, owner.password);
  const res = await answer;
  expect(res.status()).toBe(429);
  expect(Number(res.headers()["retry-after"])).toBeGreaterThan(0);
  await expect(page.getByRole("alert")).toContainText("Too many failed attempts");
  await expect(page).toHaveURL(/\/login/);
});
