import { test, expect, type Page } from "@playwright/test";

import { expectHttpError, failOnConsoleErrors, hydrated, login } from "./fixtures";
import { owner } from "./support";

// Self-improvement in the browser: a simulated message the shipped configuration misroutes is
// marked wrong on its trace, the Repairs page proposes a change to tools.toml with its diff and
// before/after replay, a proposal that breaks a passing case asks twice, and approve, reject and
// roll back each work. Nothing changes until the owner decides.
test.describe.configure({ mode: "serial" });

failOnConsoleErrors();

// Asks what a page says, but shares too little with web_fetch's description for the detector.
const MISROUTED = "what does the menu on bistro-example.com say";

async function open(page: Page, path: string) {
  await page.goto(`/login?next=${encodeURIComponent(path)}`);
  await hydrated(page);
  await login(page, owner.login, owner.password);
  await hydrated(page);
}

/** Sends `text` from `from` in the simulator and marks its trace with `expect`. */
async function sendAndMark(page: Page, from: string, text: string, expectation: string, note: string) {
  await page.goto("/conversations");
  await hydrated(page);
  await page.getByTestId("sim-from").fill(from);
  await page.getByTestId("sim-text").fill(text);
  await page.getByTestId("sim-send").click();
  await expect(page.getByTestId("sim-result")).toHaveAttribute("data-route", "degraded");
  await page.getByTestId("sim-trace").click();
  await hydrated(page);
  // An expectation that does not parse is refused, and what was typed stays in the form.
  await page.getByTestId("mark-expect").fill("sometimes");
  await page.getByTestId("mark-note").fill(note);
  await page.getByTestId("mark-wrong").click();
  await expect(page.getByRole("alert")).toBeVisible();
  await expect(page.getByTestId("mark-expect")).toHaveValue("sometimes");
  await expect(page.getByTestId("mark-note")).toHaveValue(note);
  await page.getByTestId("mark-expect").fill(expectation);
  await page.getByTestId("mark-wrong").click();
  await expect(page.getByTestId("mark-result")).toContainText("eval case");
  await expect(page.getByTestId("trace-findings")).toContainText(expectation);
}

test("a marked trace becomes a proposal; a regression asks twice; approve, reject and roll back work", async ({ page }) => {
  await open(page, "/repairs");
  await expect(page.getByTestId("repairs-empty")).toContainText("No repair has been proposed");

  // Two cases that pull against each other: the same words, two expectations.
  await sendAndMark(page, "+15550100071", MISROUTED, "tool:web_fetch", "it asks what a page says");
  await sendAndMark(page, "+15550100072", `${MISROUTED}!!`, "normal_chat", "just chatting about it");

  await page.goto("/repairs");
  await hydrated(page);
  await page.getByTestId("run-cycle").click();
  await expect(page.getByTestId("cycle-result")).toContainText("1 new proposal(s)");
  const first = page.getByTestId("repair").first();
  await expect(first).toHaveAttribute("data-state", "proposed");
  await expect(first.getByTestId("repair-diff")).toContainText("tools.toml");
  await expect(first.getByTestId("repair-diff").locator("tr.diff-changed")).toHaveCount(1);
  await expect(first.getByTestId("repair-counts")).toContainText("1 case(s) fixed, 1 regressed");
  await expect(first.locator("tr.regression")).toHaveCount(1);
  await expect(first.locator("tr.fixed")).toHaveCount(1);

  // Approve without confirming the regression: refused (409), nothing applied.
  expectHttpError("/api/decide_repair", 409);
  await first.getByTestId("approve-repair").click();
  await expect(page.getByRole("alert")).toHaveAttribute("data-code", "REPAIR_NEEDS_CONFIRMATION");
  await expect(first).toHaveAttribute("data-state", "proposed");
  // The second, explicit confirmation applies it.
  await first.getByTestId("confirm-regressions").locator("input").check();
  await first.getByTestId("approve-repair").click();
  await expect(page.getByTestId("repair-result")).toContainText("applied");
  await expect(first).toHaveAttribute("data-state", "applied");
  await expect(first.getByTestId("repair-decided")).toContainText(owner.name);

  // Rolled back: the file is as it was.
  await first.getByTestId("rollback-repair").click();
  await expect(page.getByTestId("repair-result")).toContainText("rolled back");
  await expect(first).toHaveAttribute("data-state", "rolled_back");
  // Who applied it and who rolled it back, each with its own time.
  await expect(first.getByTestId("repair-decided")).toContainText(`applied by ${owner.name} at`);
  await expect(first.getByTestId("repair-decided")).toContainText(`Rolled back by ${owner.name} at`);

  // The page case fails again, so the next scan proposes the same change; the owner rejects it,
  // with a reason, and a rejected change is not proposed again.
  await page.getByTestId("run-cycle").click();
  await expect(page.getByTestId("cycle-result")).toContainText("1 new proposal(s)");
  const second = page.locator('[data-testid="repair"][data-state="proposed"]');
  await expect(second).toHaveCount(1);
  await second.getByTestId("reject-repair-reason").fill("the page question matters less");
  await second.getByTestId("reject-repair").click();
  await expect(page.getByTestId("repair-result")).toContainText("rejected");
  await expect(page.locator('[data-testid="repair"][data-state="rejected"]')).toContainText("the page question matters less");
  await page.getByTestId("run-cycle").click();
  await expect(page.getByTestId("cycle-result")).toContainText("0 new proposal(s)");

  // The findings list the marks, each with its trace and what should have been.
  await expect(page.getByTestId("findings-table").locator('tr[data-pattern="TOOL_NOT_CALLED"]')).toContainText("tool:web_fetch");
});
