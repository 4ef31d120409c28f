import { test, expect, type Page } from "@playwright/test";

import { failOnConsoleErrors, hydrated, login } from "./fixtures";
import { owner } from "./support";

// The simulator talks to the bot through the same runtime as WhatsApp. This server runs without
// an LLM key (degraded mode), so a customer gets the configured fallback reply and an owner the
// one-line instruction; each reply shows its delivery state and links to its trace.
test.describe.configure({ mode: "serial" });

failOnConsoleErrors();

async function open(page: Page, path: string) {
  await page.goto(`/login?next=${encodeURIComponent(path)}`);
  await hydrated(page);
  await login(page, owner.login, owner.password);
  await hydrated(page);
}

test("a simulated conversation shows the reply, its delivery state and its trace", async ({ page }) => {
  await open(page, "/conversations");
  await expect(page.getByTestId("chats-empty")).toContainText("No conversations yet");

  await page.getByTestId("sim-from").fill("+15550100042");
  await page.getByTestId("sim-text").fill("Hello! Are you open on Sunday?");
  await page.getByTestId("sim-send").click();
  await expect(page.getByTestId("sim-result")).toHaveAttribute("data-route", "degraded");
  await expect(page.getByTestId("sim-reply")).not.toHaveText("(no reply)");

  // The chat: the message and the bot's reply, delivered, with the trace.
  await expect(page.getByTestId("chats-table").locator('tr[data-chat="sim-15550100042"]')).toBeVisible();
  await page.getByTestId("chats-table").getByRole("link", { name: "sim-15550100042" }).click();
  const messages = page.getByTestId("chat-messages");
  await expect(messages.locator('li[data-direction="in"]')).toContainText("Are you open on Sunday?");
  await expect(messages.locator('li[data-direction="out"]')).toHaveAttribute("data-state", "delivered");

  // The chat goes on from its own page, as the same number, in the same kind of chat.
  await expect(page.getByTestId("compose-from")).toHaveValue("+15550100042");
  await expect(page.getByTestId("compose-group")).not.toBeChecked();
  await expect(page.getByTestId("chat-group")).toHaveCount(0);
  await page.getByTestId("compose-text").fill("And on Monday?");
  await page.getByTestId("compose-send").click();
  await expect(messages.locator('li[data-direction="in"]')).toHaveCount(2);
  await expect(messages.locator('li[data-direction="in"]').last()).toContainText("And on Monday?");
  await expect(messages.locator('li[data-direction="out"]')).toHaveCount(2);

  await messages.locator('li[data-direction="in"]').first().getByRole("link", { name: "trace" }).click();
  await expect(page.getByTestId("trace-route")).toHaveText("degraded");
  await expect(page.getByTestId("trace-text")).toHaveText("Hello! Are you open on Sunday?");
  const steps = page.getByTestId("trace-timeline").locator("li");
  await expect(steps.first()).toHaveAttribute("data-step", "dedupe");
  await expect(page.getByTestId("trace-timeline").locator('li[data-step="delivery"]')).toContainText("delivered");

  // And back from the trace to its conversation.
  await page.getByTestId("trace-chat").click();
  await expect(page.getByTestId("chat-messages").locator('li[data-direction="in"]')).toHaveCount(2);

  // The chat's traces, newest first, each with the start of its message.
  await page.goto("/traces?chat=sim-15550100042");
  const previews = page.getByTestId("traces-table").getByTestId("trace-preview");
  await expect(previews).toHaveText(["And on Monday?", "Hello! Are you open on Sunday?"]);
});

test("a simulated group chat goes on as a group from its own page", async ({ page }) => {
  await open(page, "/conversations");
  await page.getByTestId("sim-from").fill("+15550100077");
  await page.getByTestId("sim-text").fill("Hello everyone, is the shop open?");
  await page.getByTestId("sim-group").check();
  await page.getByTestId("sim-send").click();
  await expect(page.getByTestId("sim-result")).toBeVisible();

  await page.goto("/conversations/simulator/sim-group");
  await hydrated(page);
  await expect(page.getByTestId("chat-group")).toHaveText("group");
  await expect(page.getByTestId("compose-group")).toBeChecked();
  await page.getByTestId("compose-from").fill("+15550100078");
  await page.getByTestId("compose-text").fill("And tomorrow?");
  await page.getByTestId("compose-send").click();
  const messages = page.getByTestId("chat-messages");
  await expect(messages.locator('li[data-direction="in"]').last()).toContainText("And tomorrow?");
  await expect(messages.locator('li[data-direction="in"]')).toHaveCount(2);

  // Read again from the server, the chat is still a group's.
  await page.reload();
  await hydrated(page);
  await expect(page.getByTestId("compose-group")).toBeChecked();
  await expect(page.getByTestId("chat-group")).toHaveText("group");
});

test("a refused simulated message leaves what was typed; a sent one empties the message box", async ({ page }) => {
  await open(page, "/conversations");
  await page.getByTestId("sim-from").fill("not a number");
  await page.getByTestId("sim-text").fill("Please keep this text");
  await page.getByTestId("sim-send").click();
  await expect(page.getByRole("alert")).toContainText("The sender must be a phone number");
  await expect(page.getByTestId("sim-from")).toHaveValue("not a number");
  await expect(page.getByTestId("sim-text")).toHaveValue("Please keep this text");

  await page.getByTestId("sim-from").fill("+15550100042");
  await page.getByTestId("sim-send").click();
  await expect(page.getByTestId("sim-result")).toBeVisible();
  await expect(page.getByTestId("sim-text")).toHaveValue("");
  await expect(page.getByTestId("sim-from")).toHaveValue("+15550100042");
});

test("the owner's own number talks as the owner; customers cannot reach owner commands", async ({ page }) => {
  await open(page, "/conversations");
  await page.getByTestId("sim-from").fill(owner.phone);
  await page.getByTestId("sim-text").fill("/status");
  await page.getByTestId("sim-send").click();
  await expect(page.getByTestId("sim-result")).toHaveAttribute("data-route", "owner_command");
  await expect(page.getByTestId("sim-reply")).toContainText("is running");

  await page.getByTestId("sim-from").fill("+15550100042");
  await page.getByTestId("sim-text").fill("/status");
  await page.getByTestId("sim-send").click();
  await expect(page.getByTestId("sim-result")).toHaveAttribute("data-route", "customer_command");

  await page.goto("/traces?route=customer_command");
  await expect(page.getByTestId("traces-table").locator("tr[data-route=customer_command]")).toHaveCount(1);
});

test("the dashboard charts the simulated messages by route, each route linked to its traces", async ({ page }) => {
  await open(page, "/");
  const chart = page.getByTestId("chart-messages");
  // The conversations above: customers in degraded mode, the owner's commands.
  await expect(chart.locator('rect[data-series="degraded"]').first()).toBeVisible();
  await expect(chart.locator('rect[data-series="owner_command"]').first()).toBeVisible();
  const degraded = chart.getByRole("link", { name: /^degraded \(\d+\)$/ });
  await expect(degraded).toHaveAttribute("href", "/traces?route=degraded&since_minutes=1440");
  await expect(page.getByTestId("chart-jobs").locator("rect").first()).toBeVisible();
  await degraded.click();
  await expect(page).toHaveURL(/\/traces\?route=degraded/);
  const rows = page.locator("tr[data-trace-id]");
  await expect(rows.first()).toHaveAttribute("data-route", "degraded");
  expect(await rows.evaluateAll((trs) => trs.every((tr) => tr.getAttribute("data-route") === "degraded"))).toBe(true);
});
