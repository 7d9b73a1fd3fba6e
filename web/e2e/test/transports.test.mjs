// The demo over each transport in Debian's chromium: a page forced to SSE and one forced to long
// polling chat with each other, and a page whose WebSocket cannot connect (every WebSocket to
// /v1/ws is sent to a closed port, as a blocking proxy would leave it) falls back to SSE by
// itself and chats with them. Waits poll the pages, never a fixed sleep.
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { launchChromium } from './browser.mjs';
import { enterDemo, openTab, sayInChat, waitChatLine } from './pages.mjs';

const WAIT = { timeout: 15_000 };
const addr = inject('demoAddr');
const missing = inject('demoMissing');
const base = `http://${addr}`;
const room = `transports-${Date.now().toString(36)}`;

const enter = (page, name, transport) => enterDemo(page, base, room, name, { transport, timeout: WAIT.timeout });
const say = sayInChat;
const waitLine = (page, text) => waitChatLine(page, text, WAIT.timeout);

describe('demo over HTTP transports', () => {
  let browser;
  const errors = [];
  let sse;
  let polling;
  let blocked;

  beforeAll(async () => {
    if (missing) throw new Error(missing);
    const created = await fetch(`${base}/v1/rooms`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ id: room }),
    });
    expect(created.status).toBe(201);
    browser = await launchChromium();
    sse = await openTab(browser, 'sse', errors);
    polling = await openTab(browser, 'polling', errors);
    blocked = await openTab(browser, 'blocked', errors);
    await blocked.addInitScript(() => {
      const Native = window.WebSocket;
      // A WebSocket to Plaza goes nowhere (port 9 on loopback refuses it) until the test lets
      // it through, as a proxy that starts allowing WebSocket would.
      window.__blockWebSocket = true;
      window.WebSocket = function (url, protocols) {
        const target = window.__blockWebSocket && String(url).includes('/v1/ws') ? 'ws://127.0.0.1:9/' : url;
        return new Native(target, protocols);
      };
      window.WebSocket.prototype = Native.prototype;
      Object.assign(window.WebSocket, { CONNECTING: 0, OPEN: 1, CLOSING: 2, CLOSED: 3 });
    });
  });

  afterAll(async () => {
    await browser?.close();
  });

  it('a page on SSE and a page on long polling chat with each other', async () => {
    await enter(sse, 'sam', 'sse');
    await enter(polling, 'pol', 'polling');
    expect(await sse.evaluate(() => window.__plaza.transport())).toBe('sse');
    expect(await polling.evaluate(() => window.__plaza.transport())).toBe('polling');
    await say(sse, 'over events');
    await waitLine(polling, 'sam: over events');
    await say(polling, 'over polls');
    await waitLine(sse, 'pol: over polls');
    await waitLine(sse, 'sam: over events');
  });

  it('a page whose WebSocket is blocked falls back to SSE by itself, and moves back when it can', async () => {
    await enterDemo(blocked, base, room, 'bea', { query: 'upgrade_ms=300', timeout: WAIT.timeout });
    expect(await blocked.evaluate(() => window.__plaza.transport())).toBe('sse');
    await say(blocked, 'no websocket here');
    await waitLine(sse, 'bea: no websocket here');
    await waitLine(polling, 'bea: no websocket here');
    await say(polling, 'welcome');
    await waitLine(blocked, 'pol: welcome');

    // WebSocket gets through: the page moves back to it by itself and chats on.
    await blocked.evaluate(() => {
      window.__blockWebSocket = false;
    });
    await blocked.waitForFunction(() => window.__plaza.transport() === 'websocket', null, WAIT);
    await say(blocked, 'websocket again');
    await waitLine(sse, 'bea: websocket again');
    await say(sse, 'seen that');
    await waitLine(blocked, 'sam: seen that');
    // The browser itself reports each refused WebSocket on the console; nothing else may fail.
    expect(errors.filter((e) => !e.startsWith("blocked console: WebSocket connection to 'ws://127.0.0.1:9/' failed"))).toEqual([]);
  });
});
