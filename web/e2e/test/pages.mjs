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
