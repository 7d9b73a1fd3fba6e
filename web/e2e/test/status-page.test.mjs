// Opens /status in Debian's chromium (driven by playwright-core, no downloaded browser),
// makes traffic with two WebSocket clients from Node, and checks what the page shows.
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { launchChromium } from './browser.mjs';
import WebSocket from 'ws';


const addr = inject('plazaAddr');

/** Opens a WebSocket, joins `room` as `name`, and resolves once `joined` arrives. */
function joinedClient(room, name) {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(`ws://${addr}/v1/ws`);
    const timer = setTimeout(() => reject(new Error(`${name}: no joined frame`)), 10_000);
    ws.once('error', reject);
    ws.once('open', () => ws.send(JSON.stringify({ type: 'join', room, name })));
    ws.on('message', function onMessage(raw) {
      const frame = JSON.parse(raw.toString());
      if (frame.type === 'joined') {
        clearTimeout(timer);
        ws.off('message', onMessage);
        resolve(ws);
      } else if (frame.type === 'error') {
        clearTimeout(timer);
        reject(new Error(`${name}: ${raw}`));
      }
    });
  });
}

/** Publishes `n` messages and resolves when all `n` acks arrived. */
function publish(ws, room, n) {
  return new Promise((resolve, reject) => {
    let acks = 0;
    const timer = setTimeout(() => reject(new Error(`only ${acks}/${n} acks`)), 10_000);
    ws.on('message', function onMessage(raw) {
      const frame = JSON.parse(raw.toString());
      if (frame.type === 'error') {
        clearTimeout(timer);
        ws.off('message', onMessage);
        reject(new Error(`publish: ${raw}`));
      } else if (frame.type === 'ack' && ++acks === n) {
        clearTimeout(timer);
        ws.off('message', onMessage);
        resolve();
      }
    });
    for (let i = 0; i < n; i++) {
      ws.send(JSON.stringify({ type: 'publish', room, event: 'chat', data: { i } }));
    }
  });
}

/**
 * Pixels of the canvas with this id: `painted` non-transparent ones, and `series` bluish ones
 * (the first series' line is #36c; the axis line and label are grey).
 */
function canvasPixels(page, id) {
  return page.evaluate((canvasId) => {
    const canvas = document.getElementById(canvasId);
    if (!canvas || canvas.width === 0 || canvas.height === 0) return { painted: 0, series: 0 };
    const { data } = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height);
    let painted = 0;
    let series = 0;
    for (let i = 0; i < data.length; i += 4) {
      if (data[i + 3] === 0) continue;
      painted++;
      if (data[i + 2] - data[i] > 60) series++;
    }
    return { painted, series };
  }, id);
}

describe('/status page in a real browser', () => {
  let browser;
  let page;
  const clients = [];
  const pageErrors = [];

  beforeAll(async () => {
    browser = await launchChromium();
    page = await browser.newPage();
    page.on('pageerror', (e) => pageErrors.push(e));
    const response = await page.goto(`http://${addr}/status`);
    expect(response?.status()).toBe(200);
  });

  afterAll(async () => {
    for (const ws of clients) ws.close();
    await browser?.close();
  });

  it('goes live before any client connects', async () => {
    await page.waitForFunction(() => document.getElementById('state')?.textContent === 'live');
    expect(await page.textContent('#connections')).toBe('0');
  });

  it('shows two connections and a positive messages-in rate, and draws the charts', async () => {
    clients.push(await joinedClient('r', 'a'), await joinedClient('r', 'b'));
    await publish(clients[0], 'r', 5);
    await publish(clients[1], 'r', 5);

    // The page polls once a second; wait for it to show the new figures.
    await page.waitForFunction(() => document.getElementById('connections')?.textContent === '2', null, {
      timeout: 10_000,
    });
    await page.waitForFunction(
      () => Number.parseFloat(document.getElementById('in')?.textContent ?? '') > 0,
      null,
      { timeout: 10_000 },
    );
    expect(await page.textContent('#rooms')).toBe('1');
    expect(await page.textContent('#state')).toBe('live');

    for (const id of ['chart-connections', 'chart-rooms', 'chart-messages', 'chart-latency']) {
      expect((await canvasPixels(page, id)).painted, `${id} has painted pixels`).toBeGreaterThan(0);
    }
    // The plotted lines themselves, not just the axis: connections and messages-in have data.
    // A line needs two samples, and the figure above can show before the chart's next redraw:
    // wait for the line (failing after 10 s).
    for (const id of ['chart-connections', 'chart-messages']) {
      await page.waitForFunction(
        (canvasId) => {
          const canvas = document.getElementById(canvasId);
          if (!canvas || canvas.width === 0 || canvas.height === 0) return false;
          const { data } = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height);
          for (let i = 0; i < data.length; i += 4) {
            if (data[i + 3] !== 0 && data[i + 2] - data[i] > 60) return true;
          }
          return false;
        },
        id,
        { timeout: 10_000 },
      );
      expect((await canvasPixels(page, id)).series, `${id} shows its series line`).toBeGreaterThan(0);
    }
    expect(pageErrors).toEqual([]);
  });
});
