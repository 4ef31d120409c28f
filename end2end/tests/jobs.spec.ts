import { test, expect, type Page } from "@playwright/test";

import { expectHttpError, failOnConsoleErrors, hydrated, login } from "./fixtures";
import { gatehouse, owner } from "./support";

// Jobs created through the app (the `gatehouse jobs enqueue` command, writing to the same
// database) appear, run and fail on the open page without a reload; an owner retries one and
// cancels another.
test.describe.configure({ mode: "serial" });

failOnConsoleErrors();

function enqueue(...args: string[]): number {
  const out = gatehouse("jobs", "enqueue", "system.echo", ...args);
  const id = /job (\d+) enqueued/.exec(out);
  expect(id, out).not.toBeNull();
  return Number(id![1]);
}

async function openJobs(page: Page) {
  await page.goto("/login?next=%2Fjobs");
  await hydrated(page);
  await login(page, owner.login, owner.password);
  await expect(page.getByRole("heading", { name: "Jobs", exact: true })).toBeVisible();
  await hydrated(page);
}

const count = (page: Page, state: string) => page.getByTestId("job-counts").locator(`a[data-state="${state}"] strong`);
const row = (page: Page, id: number) => page.locator(`tr[data-job-id="${id}"]`);

test("an empty queue says how to get a job there", async ({ page }) => {
  await openJobs(page);
  await expect(page.getByTestId("jobs-empty")).toContainText("No jobs yet");
  await expect(page.getByTestId("jobs-empty")).toContainText("gatehouse jobs enqueue");
});

test("jobs move to completed and discarded live; retry one, cancel one", async ({ page }) => {
  test.setTimeout(90_000);
  await openJobs(page);

  const ok = enqueue("--args", JSON.stringify({ message: "hello from the end-to-end test" }));
  const failing = enqueue("--args", JSON.stringify({ fail_with: "asked to fail" }), "--max-attempts", "1");
  const later = enqueue("--args", JSON.stringify({ message: "later", token: "s3cr3t-value" }), "--delay", "1h");

  // No reload: the server pushes a change event and the page re-fetches.
  await expect(row(page, ok)).toContainText("completed", { timeout: 20_000 });
  await expect(row(page, failing)).toContainText("discarded");
  await expect(row(page, failing)).toContainText("JOB_ECHO_FAILED");
  await expect(row(page, later)).toContainText("scheduled");
  await expect(count(page, "completed")).toHaveText("1");
  await expect(count(page, "discarded")).toHaveText("1");
  await expect(count(page, "scheduled")).toHaveText("1");

  // Filter by state.
  await page.goto("/jobs?state=completed");
  await expect(row(page, ok)).toBeVisible();
  await expect(row(page, failing)).toHaveCount(0);

  // Detail of the scheduled job: secret-looking args are redacted; cancel it.
  await page.goto(`/jobs/${later}`);
  await hydrated(page);
  await expect(page.getByTestId("job-args")).toContainText("[REDACTED]");
  await expect(page.getByTestId("job-args")).not.toContainText("s3cr3t-value");
  await page.getByTestId("cancel-job").click();
  await expect(page.getByRole("heading", { level: 1 })).toContainText("cancelled");
  await expect(page.getByTestId("job-timeline")).toContainText("JOB_CANCELLED");

  // Detail of the failed job: the error with its code, then retry now; it runs again and
  // fails again, live.
  await page.goto(`/jobs/${failing}`);
  await hydrated(page);
  await expect(page.getByTestId("job-error")).toContainText("JOB_ECHO_FAILED");
  await expect(page.getByTestId("job-error")).toContainText("asked to fail");
  await page.getByTestId("retry-job").click();
  await expect(page.getByRole("cell", { name: "2 of 2" })).toBeVisible({ timeout: 20_000 });
  await expect(page.getByRole("heading", { level: 1 })).toContainText("discarded");
  const timeline = page.getByTestId("job-timeline");
  // available, running, discarded, then after the retry: available, running, discarded.
  await expect(timeline.locator("li")).toHaveCount(6);
});

test("an unknown job id says so", async ({ page }) => {
  await openJobs(page);
  // The page answers with its data's status: a job that is not there is a 404.
  expectHttpError("/jobs/999999", 404);
  const response = await page.goto("/jobs/999999");
  expect(response?.status()).toBe(404);
  await expect(page.getByRole("alert")).toContainText("There is no job #999999");
});
