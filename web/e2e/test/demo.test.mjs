// The demo app (web/demo, served by `plaza serve --web-dir web/demo/dist`) in Debian's
// chromium, driven by playwright-core: two members in two browser contexts (separate
// sessionStorage, as two tabs of two users) play in one room, and a third context watches
// /status. The scenarios run in order and build on each other. Every wait polls the page
// (`waitForFunction` on the DOM or on the test hook `window.__plaza`), never a fixed sleep.
// Screenshots of every tab at the end of each scenario go to web/e2e/artifacts/.
import { mkdirSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, inject, it } from 'vitest';
import { launchChromium } from './browser.mjs';
import { openTab, toClient } from './pages.mjs';

const ARTIFACTS = fileURLToPath(new URL('../artifacts/', import.meta.url));
const WAIT = { timeout: 10_000 };

const addr = inject('demoAddr');
const missing = inject('demoMissing');
const base = `http://${addr}`;
const room = `demo-${Date.now().toString(36)}`;

/** A clear place in the plaza, away from the three initial objects. */
const SPOT = { x: 660, y: 410 };

/** The object `id` as `page` draws it: {id, x, y, holder}. */
function objectIn(page, id) {
  return page.evaluate((oid) => window.__plaza.objects().find((o) => o.id === oid), id);
}

/**
 * Waits until `page` draws object `id` as wanted: `holder` (a session id, or null for none)
 * and/or at `x`, `y` (within two units: mouse positions are whole pixels).
 */
function waitObject(page, id, want) {
  return page.waitForFunction(
    ([oid, w]) => {
      const o = window.__plaza.objects().find((x) => x.id === oid);
      if (o === undefined) return false;
      if ('holder' in w && o.holder !== w.holder) return false;
      if ('x' in w && Math.hypot(o.x - w.x, o.y - w.y) > 2) return false;
      return true;
    },
    [id, want],
    WAIT,
  );
}

/** The text of the members listed in `page`. */
function memberNames(page) {
  return page.$$eval('[data-testid="member-list"] > li', (lis) => lis.map((li) => li.textContent ?? ''));
}

describe('demo app in real browsers', () => {
  let browser;
  /** name → page; screenshots are taken of each. */
  const tabs = new Map();
  const pageErrors = [];
  let a;
  let b;
  let sessionA;
  let sessionB;
  let userB;
  let step = 0;

  async function newTab(label) {
    const page = await openTab(browser, label, pageErrors);
    tabs.set(label, page);
    return page;
  }

  beforeAll(async () => {
    if (missing) throw new Error(missing);
    mkdirSync(ARTIFACTS, { recursive: true });
    browser = await launchChromium();
    a = await newTab('A');
    b = await newTab('B');
  });

  /** Screenshots of every open tab, named after the scenario (and `suffix`). */
  async function snap(name, suffix = '') {
    const slug = name.replace(/[^a-z0-9]+/gi, '-').replace(/^-|-$/g, '').toLowerCase().slice(0, 60);
    for (const [label, page] of tabs) {
      if (page.isClosed()) continue;
      await page.screenshot({ path: `${ARTIFACTS}demo-${String(step).padStart(2, '0')}-${slug}${suffix}-${label}.png` });
    }
  }

  beforeEach(() => {
    step += 1;
  });

  afterEach(async (ctx) => {
    await snap(ctx.task.name);
  });

  afterAll(async () => {
    await browser?.close();
  });

  it('A creates a room in the lobby and joins it, B joins by /?room=, both see each other', async () => {
    await a.goto(`${base}/`);
    await a.getByTestId('name-input').fill('ann');
    await a.getByTestId('create-room-input').fill(room);
    await a.getByTestId('create-room-button').click(); // creates and joins
    await a.waitForFunction(() => window.__plaza.session() !== undefined, null, WAIT);
    expect(new URL(a.url()).searchParams.get('room')).toBe(room);

    // B sets its name in the lobby (kept in sessionStorage), then follows a deep link.
    await b.goto(`${base}/`);
    await b.getByTestId('name-input').fill('bob');
    await b.goto(`${base}/?room=${room}`);
    await b.waitForFunction(() => window.__plaza.session() !== undefined, null, WAIT);

    sessionA = await a.evaluate(() => window.__plaza.session());
    sessionB = await b.evaluate(() => window.__plaza.session());
    expect(sessionA).not.toBe(sessionB);
    // Each tab is a user the server verified, from a token the demo token route signed.
    userB = await b.evaluate(() => window.__plaza.user());
    expect(userB).toMatch(/^demo-/);
    expect(await a.evaluate(() => window.__plaza.user())).toMatch(/^demo-/);
    expect(await a.evaluate(() => window.__plaza.user())).not.toBe(userB);

    for (const page of [a, b]) {
      await page.waitForFunction(
        () => document.querySelectorAll('[data-testid="member-list"] > li').length === 2,
        null,
        WAIT,
      );
      const names = await memberNames(page);
      expect(names.some((n) => n.startsWith('ann'))).toBe(true);
      expect(names.some((n) => n.startsWith('bob'))).toBe(true);
      await page.waitForFunction(
        () => document.querySelector('[data-testid="connection-state"]')?.textContent === 'open',
        null,
        WAIT,
      );
      // Both avatars are there in both tabs, and the room's three objects.
      await page.waitForFunction(
        ([sa, sb]) => window.__plaza.avatar(sa) !== undefined && window.__plaza.avatar(sb) !== undefined,
        [sessionA, sessionB],
        WAIT,
      );
      expect((await page.evaluate(() => window.__plaza.objects())).length).toBe(3);
    }
    expect(await b.getByTestId('video').textContent()).toContain('Proximity video');
  });

  it("A clicks the plaza: A's avatar walks there in both tabs", async () => {
    const p = await toClient(a, SPOT.x, SPOT.y);
    await a.mouse.click(p.x, p.y);
    for (const page of [a, b]) {
      await page.waitForFunction(
        ([s, x, y]) => {
          const av = window.__plaza.avatar(s);
          return av !== undefined && Math.hypot(av.x - x, av.y - y) < 3;
        },
        [sessionA, SPOT.x, SPOT.y],
        WAIT,
      );
    }
    // Only the target travels: B knows it, and draws the avatar there once arrived.
    const seenByB = await b.evaluate((s) => window.__plaza.avatar(s), sessionA);
    expect(Math.abs(seenByB.tx - SPOT.x)).toBeLessThanOrEqual(1);
    expect(Math.abs(seenByB.ty - SPOT.y)).toBeLessThanOrEqual(1);
  });

  it("chat: A's message shows in B's log, and once in A's", async () => {
    const text = `hello from ann ${Date.now()}`;
    await a.getByTestId('chat-input').fill(text);
    await a.getByTestId('chat-send').click();
    for (const page of [b, a]) {
      await page.waitForFunction(
        (t) => [...document.querySelectorAll('[data-testid="chat-log"] > li')].some((li) => li.textContent?.includes(t)),
        text,
        WAIT,
      );
    }
    const count = (page) =>
      page.$$eval('[data-testid="chat-log"] > li', (lis, t) => lis.filter((li) => li.textContent?.includes(t)).length, text);
    expect(await count(a)).toBe(1);
    expect(await count(b)).toBe(1);
    expect(await b.$eval('[data-testid="chat-log"] > li:last-child', (li) => li.textContent)).toBe(`ann: ${text}`);
  });

  it('highlight: A hovers an object, B sees it highlighted by A; it goes when A moves away', async () => {
    const [object] = await a.evaluate(() => window.__plaza.objects());
    const p = await toClient(a, object.x, object.y);
    await a.mouse.move(p.x, p.y, { steps: 3 });
    await b.waitForFunction(
      ([id, s]) => window.__plaza.highlights().some((h) => h.object === id && h.by === s && h.name === 'ann'),
      [object.id, sessionA],
      WAIT,
    );
    // B draws the ring with A's name (in its next animation frame).
    await b.waitForFunction(
      (id) => {
        const g = document.querySelector(`[data-object-id="${id}"]`);
        return g?.classList.contains('highlighted') && g.querySelector('.highlighters')?.textContent?.includes('ann');
      },
      object.id,
      WAIT,
    );

    const away = await toClient(a, SPOT.x, SPOT.y - 60);
    await a.mouse.move(away.x, away.y, { steps: 3 });
    await b.waitForFunction((s) => !window.__plaza.highlights().some((h) => h.by === s), sessionA, WAIT);
  });

  it("lock: while A drags an object B cannot move it and is told who holds it; after A's release B can", async (ctx) => {
    const start = await objectIn(a, 'e2');
    expect(start).toBeTruthy();

    // A grabs e2, drags it 40 units right and 10 down, and holds the button down.
    const grab = await toClient(a, start.x, start.y);
    await a.mouse.move(grab.x, grab.y);
    await a.mouse.down();
    await waitObject(a, 'e2', { holder: sessionA });
    const held = { x: start.x + 40, y: start.y + 10 };
    const to = await toClient(a, held.x, held.y);
    await a.mouse.move(to.x, to.y, { steps: 5 });
    // Both tabs: held by A, at the dragged place (once the last throttled patch arrived).
    for (const page of [a, b]) await waitObject(page, 'e2', { holder: sessionA, ...held });
    await b.waitForFunction(
      () => document.querySelector('[data-object-id="e2"]')?.getAttribute('data-holder') === 'ann',
      null,
      WAIT,
    );
    const beforeA = await objectIn(a, 'e2');
    const beforeB = await objectIn(b, 'e2');

    // B tries to drag it away: refused, with a toast naming the holder.
    const bGrab = await toClient(b, beforeB.x, beforeB.y);
    await b.mouse.move(bGrab.x, bGrab.y);
    await b.mouse.down();
    await b.waitForFunction(
      () => {
        const t = document.querySelector('[data-testid="toast"]');
        return t !== null && !t.hidden && (t.textContent ?? '').includes('held by ann');
      },
      null,
      WAIT,
    );
    await snap(ctx.task.name, '-refused');
    const bTo = await toClient(b, beforeB.x + 120, beforeB.y + 80);
    await b.mouse.move(bTo.x, bTo.y, { steps: 5 });
    await b.mouse.up();
    // A barrier: the room orders B's frames, so once A shows a chat line B sent after the
    // drag, any change B's drag made would have reached A too.
    await b.getByTestId('chat-input').fill('after the refused drag');
    await b.getByTestId('chat-send').click();
    await a.waitForFunction(
      () => (document.querySelector('[data-testid="chat-log"]')?.textContent ?? '').includes('after the refused drag'),
      null,
      WAIT,
    );
    // Nothing moved, in B's view nor in A's, and A still holds it.
    expect(await objectIn(b, 'e2')).toEqual(beforeB);
    expect(await objectIn(a, 'e2')).toEqual(beforeA);

    // A drops it: the lock goes, in both tabs.
    await a.mouse.up();
    for (const page of [a, b]) await waitObject(page, 'e2', { holder: null });

    // Now B can grab and move it; A sees B holding it, then its new place.
    await b.mouse.move(bGrab.x, bGrab.y);
    await b.mouse.down();
    await waitObject(b, 'e2', { holder: sessionB });
    const moved = { x: beforeB.x - 60, y: beforeB.y + 50 };
    const bTo2 = await toClient(b, moved.x, moved.y);
    await b.mouse.move(bTo2.x, bTo2.y, { steps: 5 });
    await waitObject(a, 'e2', { holder: sessionB });
    await b.mouse.up();
    for (const page of [a, b]) await waitObject(page, 'e2', { holder: null, ...moved });
    // Both tabs agree on where it ended.
    const endA = await objectIn(a, 'e2');
    expect(await objectIn(b, 'e2')).toEqual(endA);
  });

  it('reload: B reloads and continues the same session; A still sees two members', async () => {
    expect(await b.evaluate((s) => window.__plaza.avatar(s), sessionB)).toBeTruthy();
    const avatarIdOfB = (page) => page.$eval(`.avatar[data-session="${sessionB}"]`, (g) => g.getAttribute('data-avatar-id'));
    const avatarBefore = await avatarIdOfB(a);
    await b.reload();
    await b.waitForFunction(() => window.__plaza.session() !== undefined, null, WAIT);
    expect(await b.evaluate(() => window.__plaza.session())).toBe(sessionB);
    // The same user (kept for the tab): a resume needs it.
    expect(await b.evaluate(() => window.__plaza.user())).toBe(userB);
    await b.waitForFunction(
      () => document.querySelector('[data-testid="connection-state"]')?.textContent === 'open',
      null,
      WAIT,
    );

    // B's own avatar is the one it had (not a new one), in B's and in A's view.
    await b.waitForFunction((s) => window.__plaza.avatar(s) !== undefined, sessionB, WAIT);
    for (const page of [a, b]) {
      await page.waitForFunction(
        (s) =>
          document.querySelectorAll('[data-testid="member-list"] > li').length === 2 &&
          document.querySelector(`[data-testid="member-list"] > li[data-session="${s}"]`) !== null &&
          document.querySelectorAll(`.avatar[data-session="${s}"]`).length === 1,
        sessionB,
        WAIT,
      );
      expect(await page.locator('.avatar').count()).toBe(2);
      expect(await avatarIdOfB(page)).toBe(avatarBefore);
    }
    expect(await memberNames(a)).toHaveLength(2);

    // And it is still live: B's chat reaches A.
    await b.getByTestId('chat-input').fill('back again');
    await b.getByTestId('chat-send').click();
    await a.waitForFunction(
      () => [...document.querySelectorAll('[data-testid="chat-log"] > li')].some((li) => li.textContent === 'bob: back again'),
      null,
      WAIT,
    );
    // A has handled every presence event up to that message: still one member and one avatar for B.
    await a.waitForFunction(
      (s) =>
        document.querySelectorAll('[data-testid="member-list"] > li').length === 2 &&
        document.querySelectorAll(`.avatar[data-session="${s}"]`).length === 1,
      sessionB,
      WAIT,
    );
    expect(await avatarIdOfB(a)).toBe(avatarBefore);
  });

  it('the status page shows the connections and rooms', async () => {
    const status = await newTab('status');
    const response = await status.goto(`${base}/status`);
    expect(response?.status()).toBe(200);
    await status.waitForFunction(
      () =>
        Number(document.getElementById('connections')?.textContent) >= 2 &&
        Number(document.getElementById('rooms')?.textContent) >= 1,
      null,
      WAIT,
    );
  });

  it('leave: B leaves and is back in the lobby; A sees one member and no avatar of B', async () => {
    await b.getByTestId('leave').click();
    await b.getByTestId('room-list').waitFor(WAIT);
    expect(new URL(b.url()).searchParams.get('room')).toBeNull();
    await a.waitForFunction(
      (s) =>
        document.querySelectorAll('[data-testid="member-list"] > li').length === 1 &&
        window.__plaza.avatar(s) === undefined,
      sessionB,
      WAIT,
    );
    // The lobby lists the room with A alone in it.
    await b.waitForFunction(
      (r) => document.querySelector(`[data-testid="members-${r}"]`)?.textContent === '1 member',
      room,
      WAIT,
    );
    expect(pageErrors).toEqual([]);
  });
});
