// Proximity video in real browsers: two pages of the demo in a spatial room, with chromium's
// fake camera and microphone. Walking close starts one WebRTC call (the server names the
// initiator), whose remote video really plays on both sides; walking apart closes it on both;
// a reload during a call brings the call back after the resume. Every wait polls the page.
// Screenshots go to web/e2e/artifacts/.
import { mkdirSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { launchChromium, MEDIA_ARGS } from './browser.mjs';
import { openTab, toClient } from './pages.mjs';

const ARTIFACTS = fileURLToPath(new URL('../artifacts/', import.meta.url));
const WAIT = { timeout: 20_000 };

const addr = inject('demoAddr');
const missing = inject('demoMissing');
const base = `http://${addr}`;
const room = `calls-${Date.now().toString(36)}`;

/** Clicks the plaza of `page` at plaza point (x, y): the avatar walks there. */
async function walk(page, x, y) {
  const p = await toClient(page, x, y);
  await page.mouse.click(p.x, p.y);
}

/** Waits until `page` has exactly one call, connected, whose remote video plays. */
function waitCallPlaying(page) {
  return page.waitForFunction(
    () => {
      const calls = window.__plaza.calls();
      const videos = window.__plaza.remoteVideos();
      return (
        calls.length === 1 &&
        calls[0].state === 'connected' &&
        videos.length === 1 &&
        videos[0].currentTime > 0.5 &&
        videos[0].frames > 0
      );
    },
    null,
    WAIT,
  );
}

function waitNoCall(page) {
  return page.waitForFunction(
    () => window.__plaza.calls().length === 0 && window.__plaza.remoteVideos().length === 0,
    null,
    WAIT,
  );
}

describe('proximity video in real browsers', () => {
  let browser;
  let a;
  let b;
  const errors = [];

  const tab = (label) => openTab(browser, label, errors, { width: 1280, height: 1100 });

  beforeAll(async () => {
    if (missing) throw new Error(missing);
    mkdirSync(ARTIFACTS, { recursive: true });
    browser = await launchChromium(MEDIA_ARGS);
    a = await tab('A');
    b = await tab('B');
    // A creates the (spatial) room in the lobby, B follows a deep link.
    await a.goto(`${base}/`);
    await a.getByTestId('name-input').fill('ann');
    await a.getByTestId('create-room-input').fill(room);
    await a.getByTestId('create-room-button').click();
    await a.waitForFunction(() => window.__plaza.session() !== undefined, null, WAIT);
    await b.goto(`${base}/`);
    await b.getByTestId('name-input').fill('bob');
    await b.goto(`${base}/?room=${room}`);
    await b.waitForFunction(() => window.__plaza.session() !== undefined, null, WAIT);
    // Far apart to begin with.
    await walk(a, 60, 60);
    await walk(b, 740, 440);
    await a.waitForFunction(() => {
      const me = window.__plaza.avatar(window.__plaza.session());
      return me && Math.hypot(me.x - 60, me.y - 60) < 2;
    }, null, WAIT);
    await b.waitForFunction(() => {
      const me = window.__plaza.avatar(window.__plaza.session());
      return me && Math.hypot(me.x - 740, me.y - 440) < 2;
    }, null, WAIT);
    await waitNoCall(a);
    await waitNoCall(b);
  });

  afterAll(async () => {
    await browser?.close();
    expect(errors).toEqual([]);
  });

  it('walking close opens one call on both sides whose remote video plays; walking apart closes it', async () => {
    await walk(a, 700, 420);
    await waitCallPlaying(a);
    await waitCallPlaying(b);
    const [ca, cb] = [await a.evaluate(() => window.__plaza.calls()), await b.evaluate(() => window.__plaza.calls())];
    expect(ca[0].pair).toBe(cb[0].pair);
    await a.screenshot({ path: `${ARTIFACTS}proximity-01-call-A.png` });
    await b.screenshot({ path: `${ARTIFACTS}proximity-01-call-B.png` });

    await walk(a, 60, 60);
    await waitNoCall(a);
    await waitNoCall(b);
    await a.screenshot({ path: `${ARTIFACTS}proximity-02-apart-A.png` });
  });

  it('both walking towards each other at once makes exactly one call', async () => {
    await Promise.all([walk(a, 400, 250), walk(b, 420, 250)]);
    await waitCallPlaying(a);
    await waitCallPlaying(b);
    // One pair, one call: both pages connected the same one (two offers would make two).
    const [ca, cb] = [await a.evaluate(() => window.__plaza.calls()), await b.evaluate(() => window.__plaza.calls())];
    expect(ca.map((c) => c.pair)).toEqual(cb.map((c) => c.pair));
    await a.screenshot({ path: `${ARTIFACTS}proximity-03-both-A.png` });
  });

  it('a reload during a call brings the call back after the resume', async () => {
    const before = await b.evaluate(() => window.__plaza.calls()[0].pair);
    await b.reload();
    await b.waitForFunction(() => window.__plaza.session() !== undefined, null, WAIT);
    await waitCallPlaying(b);
    await waitCallPlaying(a);
    const after = await a.evaluate(() => window.__plaza.calls()[0].pair);
    expect(after).not.toBe(before);
    await b.screenshot({ path: `${ARTIFACTS}proximity-04-after-reload-B.png` });
  });
});
