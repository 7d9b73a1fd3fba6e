// The demo as `scripts/run.sh` serves it: a server in development mode (no token keys, so no
// `POST /v1/demo/token`). The page learns that from `GET /v1/status` and connects without a
// token: loading the lobby and entering a room logs no console error and gets no 4xx or 5xx.
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { launchChromium } from './browser.mjs';
import { enterDemo, openTab } from './pages.mjs';

// A server of its own: the status page test counts its server's connections and rooms exactly.
const addr = inject('devAddr');
const missing = inject('demoMissing');
const base = `http://${addr}`;
const room = `dev-${Date.now().toString(36)}`;

describe('demo on a server in development mode', () => {
  let browser;
  const errors = [];
  /** Every response of 400 or more the page got, as `status url`. */
  const failed = [];
  /** Every request of the page to the demo token route. */
  const tokenAsks = [];

  beforeAll(async () => {
    if (missing) throw new Error(missing);
    const status = await (await fetch(`${base}/v1/status`)).json();
    expect(status.demo_tokens).toBe(false);
    // As in the lobby (the server, like `scripts/run.sh`'s, creates no room on a join).
    const created = await fetch(`${base}/v1/rooms`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ id: room }),
    });
    expect(created.status).toBe(201);
    browser = await launchChromium();
  });

  afterAll(async () => {
    await browser?.close();
  });

  it('loads the lobby and enters a room without an error or a failed request', async () => {
    const page = await openTab(browser, 'dev', errors);
    page.on('response', (r) => {
      if (r.status() >= 400) failed.push(`${r.status()} ${r.url()}`);
    });
    page.on('request', (r) => {
      if (new URL(r.url()).pathname === '/v1/demo/token') tokenAsks.push(r.url());
    });
    await enterDemo(page, base, room, 'Dee');
    // Joined as the development-mode server admits it: no user, no token.
    expect(await page.evaluate(() => window.__plaza.session())).toBeTruthy();
    expect(errors).toEqual([]);
    expect(failed).toEqual([]);
    expect(tokenAsks).toEqual([]);
  });
});
