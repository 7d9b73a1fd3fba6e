// What the browser tests do with a page of the demo, written once.
import { expect } from 'vitest';

/**
 * A new tab in its own browser context (its own sessionStorage, as another user's browser).
 * Uncaught errors and `console.error` (the client reports a throwing event handler of the app
 * with it) are pushed to `errors`, prefixed with `label`, for the test to assert empty.
 */
export async function openTab(browser, label, errors, viewport = { width: 1280, height: 900 }) {
  const context = await browser.newContext({ viewport });
  const page = await context.newPage();
  page.on('pageerror', (e) => errors.push(`${label}: ${e.message}`));
  page.on('console', (m) => {
    if (m.type() === 'error') errors.push(`${label} console: ${m.text()}`);
  });
  return page;
}

/** Client coordinates of a plaza point in `page`. */
export async function toClient(page, x, y) {
  const p = await page.evaluate(([px, py]) => window.__plaza.toClient(px, py), [x, y]);
  expect(p, 'the room view is shown').toBeTruthy();
  return p;
}

/**
 * Opens the demo at `base` (http://host:port) in `room` as `name`, with `?transport=` when
 * `transport` is given and `query` (e.g. `upgrade_ms=300`) added, and resolves once the page has
 * joined.
 */
export async function enterDemo(page, base, room, name, { transport, query, timeout = 15_000 } = {}) {
  await page.goto(`${base}/`);
  await page.getByTestId('name-input').fill(name);
  const extra = (transport === undefined ? '' : `&transport=${transport}`) + (query === undefined ? '' : `&${query}`);
  await page.goto(`${base}/?room=${room}${extra}`);
  await page.waitForFunction(() => window.__plaza.session() !== undefined, null, { timeout });
}

/** Sends `text` from `page`'s chat, as a user types and clicks Send. */
export async function sayInChat(page, text) {
  await page.getByTestId('chat-input').fill(text);
  await page.getByTestId('chat-send').click();
}

/** Waits until `page`'s chat log shows the line `text` exactly. */
export function waitChatLine(page, text, timeout = 15_000) {
  return page.waitForFunction(
    (t) => [...document.querySelectorAll('[data-testid="chat-log"] > li')].some((li) => li.textContent === t),
    text,
    { timeout },
  );
}
