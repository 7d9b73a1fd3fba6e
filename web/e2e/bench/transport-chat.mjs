// Source document 004's transport experiment with real browsers, as the document ran it: two
// chromium pages of the demo chat in one room, each typing "this is a chat message!" and
// clicking Send every 2,500 ms (the document's automate()), for 60 s, over one transport. The
// traffic is the loopback interface's counters over that minute (both ways, IP and TCP headers
// and ACKs included, as the document's Wireshark capture counted; nothing else may use loopback
// meanwhile), plus the HTTP requests the pages made. `plaza bench`'s transport-chat scenario
// measures the same with a lean client; this is the figure for a browser's requests and headers.
//
//   node bench/transport-chat.mjs --transport websocket|sse|polling [--seconds 60] [--every 2500]
//        [--plaza ../../target/release/plaza]
//
// Needs the demo built (npm --prefix ../demo run build). Prints one JSON line. Exits 1 when a
// message is missing from a page's chat.
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { startPlaza, stopPlaza } from '../plaza-process.mjs';
import { launchChromium } from '../test/browser.mjs';
import { enterDemo, openTab } from '../test/pages.mjs';

const { values: opts } = parseArgs({
  options: {
    transport: { type: 'string', default: 'websocket' },
    seconds: { type: 'string', default: '60' },
    every: { type: 'string', default: '2500' },
    plaza: { type: 'string', default: fileURLToPath(new URL('../../../target/release/plaza', import.meta.url)) },
  },
});
const MESSAGE = 'this is a chat message!';
const seconds = Number(opts.seconds);
const every = Number(opts.every);
const perPage = Math.floor((seconds * 1000) / every);
const demoDist = fileURLToPath(new URL('../../demo/dist', import.meta.url));

/** Bytes and packets the loopback interface has carried (received side: each packet once). */
function loopback() {
  const line = readFileSync('/proc/net/dev', 'utf8')
    .split('\n')
    .find((l) => l.trim().startsWith('lo:'));
  const fields = line.split(':')[1].trim().split(/\s+/).map(Number);
  return { bytes: fields[0], packets: fields[1] };
}

const { addr, child } = await startPlaza(opts.plaza, ['--web-dir', demoDist]);
const base = `http://${addr}`;
const room = `transport-chat-${Date.now().toString(36)}`;
let browser;
try {
  const created = await fetch(`${base}/v1/rooms`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ id: room }),
  });
  if (created.status !== 201) throw new Error(`room not created: ${created.status}`);
  browser = await launchChromium();
  const errors = [];
  const pages = [await openTab(browser, 'a', errors), await openTab(browser, 'b', errors)];
  await enterDemo(pages[0], base, room, 'ann', { transport: opts.transport });
  await enterDemo(pages[1], base, room, 'bob', { transport: opts.transport });
  const used = await Promise.all(pages.map((p) => p.evaluate(() => window.__plaza.transport())));
  if (used.some((t) => t !== opts.transport)) throw new Error(`pages run over ${used.join(', ')}`);
  // Let joining settle (presence, the first polls) before the minute starts.
  await new Promise((r) => setTimeout(r, 2000));

  let requests = 0;
  let counting = false;
  for (const p of pages) {
    p.on('request', () => {
      if (counting) requests += 1;
    });
  }
  const before = loopback();
  counting = true;
  const started = Date.now();
  // The document's automate(): fill the input, click Send, again in `every` ms.
  await Promise.all(
    pages.map((p) =>
      p.evaluate(
        ([text, ms, count]) =>
          new Promise((done) => {
            let sent = 0;
            const automate = () => {
              const input = document.querySelector('[data-testid="chat-input"]');
              input.value = text;
              document.querySelector('[data-testid="chat-send"]').click();
              sent += 1;
              if (sent < count) setTimeout(automate, ms);
              else done();
            };
            automate();
          }),
        [MESSAGE, every, perPage],
      ),
    ),
  );
  // The last messages arrive; then the minute is over.
  const lines = (p) => p.$$eval('[data-testid="chat-log"] > li', (lis) => lis.map((li) => li.textContent));
  for (const p of pages) {
    await p.waitForFunction(
      ([text, want]) =>
        [...document.querySelectorAll('[data-testid="chat-log"] > li')].filter((li) => li.textContent.endsWith(text))
          .length >= want,
      [`: ${MESSAGE}`, 2 * perPage],
      { timeout: 15_000 },
    );
  }
  const left = seconds * 1000 - (Date.now() - started);
  if (left > 0) await new Promise((r) => setTimeout(r, left));
  counting = false;
  const after = loopback();
  const got = await Promise.all(pages.map(lines));
  const each = got.map((l) => l.filter((t) => t.endsWith(`: ${MESSAGE}`)).length);
  const result = {
    transport: opts.transport,
    messages: 2 * perPage,
    received_per_page: each,
    seconds: (Date.now() - started) / 1000,
    loopback_bytes: after.bytes - before.bytes,
    loopback_packets: after.packets - before.packets,
    http_requests: requests,
    errors,
  };
  console.log(JSON.stringify(result));
  if (each.some((n) => n !== 2 * perPage) || errors.length > 0) process.exitCode = 1;
} finally {
  await browser?.close();
  await stopPlaza(child);
}
