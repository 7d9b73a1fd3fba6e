// The demo's chat topics and quiet mode (web/demo/src/chat.ts, quiet.ts) in Debian's chromium:
// two members in two browser contexts in one room. B follows #design and turns quiet mode on
// (a delivery policy: other topics held for at most 10 s or 5 messages); A talks on #random and
// #design. Every assertion is on the logs' exact contents and order, and on the policy frames B
// sends (read from its WebSocket). Every wait polls the page or those frames, never a fixed
// sleep. Screenshots of both tabs at the end of each scenario go to web/e2e/artifacts/.
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
const room = `quiet-${Date.now().toString(36)}`;

// Quiet mode's policy as the demo sends it (web/demo/src/quiet.ts).
const ROOM_STATE = {
  id: 'room-state',
  field: 'kind',
  op: { in: ['presence.join', 'presence.leave', 'entity.created', 'entity.updated', 'entity.deleted', 'lock.acquired', 'lock.released'] },
};
const MAIN_CHANNEL = { id: 'main-channel', field: 'channel', op: { equals: 'main' } };
const follow = (topic) => ({ id: `follow-${topic}`, field: 'topic', op: { equals: topic } });
const quietPolicy = (...topics) => ({
  filters: [ROOM_STATE, MAIN_CHANNEL, ...topics.map(follow)],
  max_delay_ms: 10_000,
  max_held: 5,
});
/** The same policy as the server confirms it: every filter `enabled`, `aggregate` set. */
const confirmed = (...topics) => {
  const p = quietPolicy(...topics);
  return { ...p, filters: p.filters.map((f) => ({ ...f, enabled: true })), aggregate: true };
};

/** The chat log of `page`: one `{text, topic, batch}` per line, in order (`batch` null if none). */
function chatLog(page) {
  return page.$$eval('[data-testid="chat-log"] > li', (lis) =>
    lis.map((li) => ({ text: li.textContent, topic: li.dataset.topic ?? null, batch: li.dataset.batch ?? null })),
  );
}

/** Waits until `page`'s chat log has a line `text` exactly. */
function waitLine(page, text) {
  return page.waitForFunction(
    (t) => [...document.querySelectorAll('[data-testid="chat-log"] > li')].some((li) => li.textContent === t),
    text,
    WAIT,
  );
}

/** Sends `text` on `topic` from `page`. */
async function say(page, topic, text) {
  await page.getByTestId('chat-topic').selectOption(topic);
  await page.getByTestId('chat-input').fill(text);
  await page.getByTestId('chat-send').click();
}

/** Waits until `page` shows the policy in force: quiet `on`/`off`, the topics followed, nothing pending. */
function waitQuiet(page, quiet, followed) {
  return page.waitForFunction(
    ([q, f]) => {
      const el = document.querySelector('[data-testid="quiet-state"]');
      return el !== null && el.dataset.quiet === q && el.dataset.follow === f && !el.hasAttribute('data-pending');
    },
    [quiet, followed],
    WAIT,
  );
}

/** Lines `ann: <text>` as they should be in a log. */
const lines = (topic, batch, ...texts) => texts.map((t) => ({ text: `ann: ${t}`, topic, batch }));

describe('demo chat: topics and quiet mode', () => {
  let browser;
  const tabs = new Map();
  const pageErrors = [];
  /** The `join` and `policy.*` request frames B sent, in order (across its reload). */
  const sentByB = [];
  /** What B received, one line per frame (for failure messages). */
  const receivedByB = [];
  let a;
  let b;
  let step = 0;

  const policyFrames = () => sentByB.filter((f) => f.type === 'request').map(({ op, args }) => ({ op, args }));

  beforeAll(async () => {
    if (missing) throw new Error(missing);
    mkdirSync(ARTIFACTS, { recursive: true });
    browser = await launchChromium();
    a = await openTab(browser, 'A', pageErrors);
    b = await openTab(browser, 'B', pageErrors);
    tabs.set('A', a).set('B', b);
    b.on('websocket', (ws) => {
      ws.on('framereceived', ({ payload }) => {
        if (typeof payload !== 'string') return;
        const f = JSON.parse(payload);
        const show = (e) => `${e.type}:${e.kind ?? ''}:${e.channel ?? ''}:${e.topic ?? ''}:${e.seq ?? ''}`;
        receivedByB.push(f.type === 'batch' ? `batch[${f.events.map(show).join(' ')}]` : show(f));
      });
      ws.on('framesent', ({ payload }) => {
        if (typeof payload !== 'string') return;
        const frame = JSON.parse(payload);
        if (frame.type === 'join' || (frame.type === 'request' && String(frame.op).startsWith('policy.'))) sentByB.push(frame);
      });
    });
  });

  beforeEach(() => {
    step += 1;
  });

  afterEach(async (ctx) => {
    const slug = ctx.task.name.replace(/[^a-z0-9]+/gi, '-').replace(/^-|-$/g, '').toLowerCase().slice(0, 60);
    for (const [label, page] of tabs) {
      await page.screenshot({ path: `${ARTIFACTS}chat-${String(step).padStart(2, '0')}-${slug}-${label}.png` });
    }
  });

  afterAll(async () => {
    await browser?.close();
  });

  it('A and B are in one room; B follows #design and turns quiet mode on', async () => {
    await a.goto(`${base}/`);
    await a.getByTestId('name-input').fill('ann');
    await a.getByTestId('create-room-input').fill(room);
    await a.getByTestId('create-room-button').click();
    await a.waitForFunction(() => window.__plaza.session() !== undefined, null, WAIT);
    await b.goto(`${base}/`);
    await b.getByTestId('name-input').fill('bob');
    await b.goto(`${base}/?room=${room}`);
    await b.waitForFunction(() => window.__plaza.session() !== undefined, null, WAIT);
    const sessions = [await a.evaluate(() => window.__plaza.session()), await b.evaluate(() => window.__plaza.session())];
    // Both joined, with both avatars placed: nothing of the join is still on its way.
    for (const page of [a, b]) {
      await page.waitForFunction(
        ([sa, sb]) =>
          document.querySelectorAll('[data-testid="member-list"] > li').length === 2 &&
          document.querySelector('[data-testid="connection-state"]')?.textContent === 'open' &&
          window.__plaza.avatar(sa) !== undefined &&
          window.__plaza.avatar(sb) !== undefined,
        sessions,
        WAIT,
      );
    }
    // The room is spatial: a proximity event goes to its pair at once, and so flushes what a
    // policy holds before it (ordering). Both avatars walk far apart and come to rest, and any
    // call their spawn points started has ended, before the policies below are tested.
    for (const [page, x] of [[a, 60], [b, 740]]) {
      const p = await toClient(page, x, 250);
      await page.mouse.click(p.x, p.y);
    }
    for (const page of [a, b]) {
      await page.waitForFunction(
        ([sa, sb, ta, tb]) =>
          [
            [sa, ta],
            [sb, tb],
          ].every(([s, tx]) => {
            const v = window.__plaza.avatar(s);
            return v !== undefined && Math.abs(v.tx - tx) < 2 && Math.hypot(v.x - v.tx, v.y - v.ty) < 0.5;
          }) && window.__plaza.calls().length === 0,
        [...sessions, 60, 740],
        WAIT,
      );
    }
    // By default: quiet off, #general followed; the join carried no policy.
    await waitQuiet(b, 'off', 'general');
    expect(sentByB).toHaveLength(1);
    expect(sentByB[0]).toMatchObject({ type: 'join', room, name: 'bob' });
    expect(sentByB[0].policy).toBeUndefined();
    expect(await b.evaluate(() => window.__plaza.policy())).toBeUndefined();

    // Choosing the topics with quiet mode off sends nothing; turning it on sends the policy.
    await b.getByTestId('follow-general').uncheck();
    await b.getByTestId('follow-design').check();
    await waitQuiet(b, 'off', 'design');
    await b.getByTestId('quiet-toggle').check();
    await waitQuiet(b, 'on', 'design');
    await expect.poll(() => policyFrames(), WAIT).toEqual([{ op: 'policy.update', args: quietPolicy('design') }]);
    expect(await b.evaluate(() => window.__plaza.policy())).toEqual(confirmed('design'));
    expect(await b.getByTestId('quiet-state').textContent()).toContain('#design at once');
  });

  it('#random is held for B (A shows it at once); a #design message brings it along, in order, as one batch', async () => {
    await say(a, 'random', 'r1');
    await say(a, 'random', 'r2');
    await waitLine(a, 'ann: r2');
    expect(await chatLog(a)).toEqual(lines('random', null, 'r1', 'r2'));
    expect(await chatLog(b)).toEqual([]);

    // At once for B: and the server sends the two held before it, in seq order, in its batch.
    await say(a, 'design', 'd1');
    await waitLine(b, 'ann: d1');
    const log = await chatLog(b);
    const batch = log[0].batch;
    expect(batch).not.toBeNull();
    expect(log).toEqual([...lines('random', batch, 'r1', 'r2'), ...lines('design', batch, 'd1')]);
    await waitLine(a, 'ann: d1');
    expect(await chatLog(a)).toEqual([...lines('random', null, 'r1', 'r2'), ...lines('design', null, 'd1')]);
  });

  it('Volume: B shows nothing of a run of #random until the fifth, then all five at once', async () => {
    const before = await chatLog(b);
    const start = receivedByB.length;
    for (const t of ['r3', 'r4', 'r5', 'r6']) await say(a, 'random', t);
    await waitLine(a, 'ann: r6');
    expect(await chatLog(b), `B received: ${receivedByB.slice(start).join(' | ')}`).toEqual(before);

    const from = receivedByB.length;
    await say(a, 'random', 'r7');
    await waitLine(b, 'ann: r7').catch((e) => {
      throw new Error(`${e.message}; B received: ${receivedByB.slice(from - 8).join(' | ')}`);
    });
    const log = await chatLog(b);
    const batch = log[3].batch;
    expect(batch).not.toBeNull();
    expect(batch).not.toBe(before[0].batch);
    expect(log).toEqual([...before, ...lines('random', batch, 'r3', 'r4', 'r5', 'r6', 'r7')]);
  });

  it('following #random too is one incremental policy.update; then #random arrives at once', async () => {
    const before = await chatLog(b);
    await b.getByTestId('follow-random').check();
    await waitQuiet(b, 'on', 'design random');
    await expect.poll(() => policyFrames().slice(1), WAIT).toEqual([{ op: 'policy.update', args: { add: [follow('random')] } }]);
    expect(await b.evaluate(() => window.__plaza.policy())).toEqual(confirmed('design', 'random'));

    await say(a, 'random', 'r8');
    await waitLine(b, 'ann: r8');
    expect(await chatLog(b)).toEqual([...before, ...lines('random', null, 'r8')]);

    await b.getByTestId('follow-random').uncheck();
    await waitQuiet(b, 'on', 'design');
    await expect.poll(() => policyFrames().slice(2), WAIT).toEqual([{ op: 'policy.update', args: { remove: ['follow-random'] } }]);
    expect(await b.evaluate(() => window.__plaza.policy())).toEqual(confirmed('design'));
  });

  it('reload: B resumes with the policy in its join, shows quiet mode on, and #random is held again', async () => {
    const session = await b.evaluate(() => window.__plaza.session());
    const joinsBefore = sentByB.filter((f) => f.type === 'join').length;
    await b.reload();
    await b.waitForFunction(() => window.__plaza.session() !== undefined, null, WAIT);
    expect(await b.evaluate(() => window.__plaza.session())).toBe(session);
    await waitQuiet(b, 'on', 'design');
    const joins = sentByB.filter((f) => f.type === 'join');
    expect(joins).toHaveLength(joinsBefore + 1);
    expect(joins.at(-1).resume?.token).toEqual(expect.any(String));
    expect(joins.at(-1).policy).toEqual(quietPolicy('design'));
    // The choices are shown as they were, and the rejoin needed no policy request.
    expect(await b.getByTestId('quiet-toggle').isChecked()).toBe(true);
    expect(await b.getByTestId('follow-design').isChecked()).toBe(true);
    expect(await b.getByTestId('follow-general').isChecked()).toBe(false);
    expect(await b.getByTestId('follow-random').isChecked()).toBe(false);
    expect(policyFrames()).toHaveLength(3);
    await b.waitForFunction(() => document.querySelector('[data-testid="connection-state"]')?.textContent === 'open', null, WAIT);

    await say(a, 'random', 'r9');
    await say(a, 'random', 'r10');
    await waitLine(a, 'ann: r10');
    expect(await chatLog(b)).toEqual([]);
  });

  it('quiet mode off: policy.clear, and what was held arrives at once, in order; then #random comes at once', async () => {
    await b.getByTestId('quiet-toggle').uncheck();
    await waitLine(b, 'ann: r10');
    await waitQuiet(b, 'off', 'design');
    await expect.poll(() => policyFrames().slice(3), WAIT).toEqual([{ op: 'policy.clear', args: {} }]);
    expect(await b.evaluate(() => window.__plaza.policy())).toBeUndefined();
    const log = await chatLog(b);
    const batch = log[0].batch;
    expect(batch).not.toBeNull();
    expect(log).toEqual(lines('random', batch, 'r9', 'r10'));

    await say(a, 'random', 'r11');
    await waitLine(b, 'ann: r11');
    expect(await chatLog(b)).toEqual([...lines('random', batch, 'r9', 'r10'), ...lines('random', null, 'r11')]);
    expect(pageErrors).toEqual([]);
  });
});
