// The demo's first impression, at 1280x800 and at a 420 px width: the header counts "1 member"
// and "2 members"; the chat input is wide enough for its placeholder; an open proximity call's
// video panel is in view without scrolling; and no avatar wears a shared object's colour (ten
// members, more than there are avatar colours). Every wait polls the page. Screenshots go to
// web/e2e/artifacts/.
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

/** Clicks the plaza of `page` at plaza point (x, y): the avatar walks there. */
async function walk(page, x, y) {
  const p = await toClient(page, x, y);
  await page.mouse.click(p.x, p.y);
}

/** Opens the lobby of `page` as `name` and creates (and joins) the spatial room `room`. */
async function createRoom(page, name, room) {
  await page.goto(`${base}/`);
  await page.getByTestId('name-input').fill(name);
  await page.getByTestId('create-room-input').fill(room);
  await page.getByTestId('create-room-button').click();
  await page.waitForFunction(() => window.__plaza.session() !== undefined, null, WAIT);
}

/** Opens `room` in `page` as `name` (a deep link) and waits for the join. */
async function joinRoom(page, name, room) {
  await page.goto(`${base}/`);
  await page.getByTestId('name-input').fill(name);
  await page.goto(`${base}/?room=${room}`);
  await page.waitForFunction(() => window.__plaza.session() !== undefined, null, WAIT);
}

/** The header's member count as shown, e.g. "2 members" (the pill around the number). */
function headerCount(page) {
  return page.evaluate(() => document.querySelector('[data-testid="member-count"]').parentElement.closest('.pill').textContent.trim());
}

/** The box of the element `testId` and the viewport, in CSS pixels, as the page is scrolled now. */
function boxInViewport(page, testId) {
  return page.evaluate((id) => {
    const r = document.querySelector(`[data-testid="${id}"]`).getBoundingClientRect();
    return { top: r.top, left: r.left, bottom: r.bottom, right: r.right, width: innerWidth, height: innerHeight };
  }, testId);
}

const VIEWPORTS = [
  { width: 1280, height: 800 },
  { width: 420, height: 800 },
];

describe('the demo at first sight', () => {
  let browser;
  const errors = [];

  beforeAll(async () => {
    if (missing) throw new Error(missing);
    mkdirSync(ARTIFACTS, { recursive: true });
    browser = await launchChromium(MEDIA_ARGS);
  });

  afterAll(async () => {
    await browser?.close();
    expect(errors).toEqual([]);
  });

  for (const viewport of VIEWPORTS) {
    const size = `${viewport.width}x${viewport.height}`;

    it(`at ${size}: "1 member", "2 members", a chat input wide enough for its placeholder, an open call in view`, async () => {
      const room = `look-${viewport.width}-${Date.now().toString(36)}`;
      const a = await openTab(browser, `A ${size}`, errors, viewport);
      const b = await openTab(browser, `B ${size}`, errors, viewport);
      try {
        await createRoom(a, 'ann', room);
        await a.waitForFunction(() => document.querySelector('[data-testid="member-count"]')?.textContent === '1', null, WAIT);
        expect.soft(await headerCount(a)).toBe('1 member');

        // The placeholder, in the input's own font, fits inside its padding box.
        const input = await a.getByTestId('chat-input').evaluate((el) => {
          const style = getComputedStyle(el);
          const context = document.createElement('canvas').getContext('2d');
          context.font = style.font;
          const text = context.measureText(el.placeholder).width;
          return { text, inner: el.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight), placeholder: el.placeholder };
        });
        expect(input.placeholder).toBe('Say something…');
        expect.soft(input.inner).toBeGreaterThanOrEqual(input.text);

        // B joins far from A, then walks up to A: a call opens.
        await walk(a, 80, 440);
        await joinRoom(b, 'bob', room);
        await a.waitForFunction(() => document.querySelector('[data-testid="member-count"]')?.textContent === '2', null, WAIT);
        expect.soft(await headerCount(a)).toBe('2 members');
        await walk(b, 140, 440);
        await a.waitForFunction(() => window.__plaza.calls().length === 1 && window.__plaza.remoteVideos().length === 1, null, WAIT);

        // The panel with the call is in view, unscrolled. (Soft checks: each of them is reported.)
        expect(await a.evaluate(() => scrollY)).toBe(0);
        const video = await boxInViewport(a, 'video');
        expect.soft(video.top).toBeGreaterThanOrEqual(0);
        expect.soft(video.left).toBeGreaterThanOrEqual(0);
        expect.soft(video.bottom).toBeLessThanOrEqual(video.height);
        expect.soft(video.right).toBeLessThanOrEqual(video.width);
        const remote = await boxInViewport(a, 'remote-video');
        expect.soft(remote.bottom).toBeLessThanOrEqual(remote.height);
        await a.screenshot({ path: `${ARTIFACTS}first-look-${size}-call.png` });
      } finally {
        await a.context().close();
        await b.context().close();
      }
    });
  }

  it('no avatar wears a shared object\'s colour (ten members: every avatar colour taken, and more)', async () => {
    const room = `colours-${Date.now().toString(36)}`;
    const viewport = { width: 420, height: 800 };
    const pages = [];
    try {
      for (let i = 0; i < 10; i++) pages.push(await openTab(browser, `member ${i}`, errors, viewport));
      await createRoom(pages[0], 'm0', room);
      await Promise.all(pages.slice(1).map((page, i) => joinRoom(page, `m${i + 1}`, room)));
      const sessions = await Promise.all(pages.map((p) => p.evaluate(() => window.__plaza.session())));
      const first = pages[0];
      // Every avatar is drawn in the first page.
      await first.waitForFunction((ss) => ss.every((s) => window.__plaza.avatar(s) !== undefined), sessions, WAIT);
      const objectColours = (await first.evaluate(() => window.__plaza.objects())).map((o) => o.color.toLowerCase());
      expect(objectColours).toHaveLength(3);
      const avatarColours = await first.evaluate((ss) => ss.map((s) => window.__plaza.avatar(s).color.toLowerCase()), sessions);
      for (const colour of avatarColours) expect(objectColours).not.toContain(colour);
      await first.screenshot({ path: `${ARTIFACTS}first-look-colours.png` });
    } finally {
      for (const page of pages) await page.context().close();
    }
  }, 90_000);
});
