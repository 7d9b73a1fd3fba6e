// An application backend for Plaza (Node >= 20, no dependencies, no build step):
//  - POST /login {name}  -> {token}: an HS256 JWT that Plaza verifies with its jwt_secret;
//  - POST /hooks         <- Plaza's webhooks (Standard Webhooks signatures), deduplicated by
//    webhook-id: welcomes each member.joined with a message from @server, and mirrors each
//    room's entities into DATA_DIR/<room>.json (written atomically).
// Config by environment: PLAZA_URL, PLAZA_API_KEY, JWT_SECRET, WEBHOOK_SECRET, PORT, DATA_DIR.
import { createHmac, timingSafeEqual } from 'node:crypto';
import { mkdir, readFile, rename, rm, writeFile } from 'node:fs/promises';
import { createServer } from 'node:http';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const env = (name, fallback) => {
  const v = process.env[name] ?? fallback;
  if (v === undefined) throw new Error(`${name} is required`);
  return v;
};
const PLAZA_URL = env('PLAZA_URL', 'http://127.0.0.1:7700').replace(/\/+$/, '');
const PLAZA_API_KEY = env('PLAZA_API_KEY');
const JWT_SECRET = env('JWT_SECRET');
const WEBHOOK_KEY = Buffer.from(env('WEBHOOK_SECRET').replace(/^whsec_/, ''), 'base64');
const PORT = Number(env('PORT', '3000'));
// Beside this file by default: not ./data, where scripts/run.sh keeps Plaza's own store.
const DATA_DIR = env('DATA_DIR', fileURLToPath(new URL('./mirrors', import.meta.url)));
const TOLERANCE_S = 5 * 60;

// --- Tokens -------------------------------------------------------------------------------

const b64url = (v) => Buffer.from(JSON.stringify(v)).toString('base64url');

/** @param {string} name @returns {string} an HS256 JWT for this user, valid 10 minutes */
function mintToken(name) {
  const head = b64url({ alg: 'HS256', typ: 'JWT' });
  const body = b64url({
    sub: `user-${Buffer.from(name).toString('hex')}`, // a stable id per name (a real app has its users' ids)
    name,
    exp: Math.floor(Date.now() / 1000) + 600,
    rooms: { '*': ['join', 'publish', 'entities'] },
  });
  const sig = createHmac('sha256', JWT_SECRET).update(`${head}.${body}`).digest('base64url');
  return `${head}.${body}.${sig}`;
}

// --- Webhooks -------------------------------------------------------------------------------

/**
 * Standard Webhooks: `v1,<base64 HMAC-SHA256("{id}.{ts}.{body}")>`, any of several
 * space-separated signatures, timestamp within 5 minutes.
 * @param {Buffer} raw @param {import('node:http').IncomingHttpHeaders} headers
 * @returns {string | null} the webhook id when the delivery is authentic
 */
function verify(raw, headers) {
  const id = headers['webhook-id'], ts = headers['webhook-timestamp'], sigs = headers['webhook-signature'];
  if (typeof id !== 'string' || typeof ts !== 'string' || typeof sigs !== 'string') return null;
  if (!/^\d+$/.test(ts) || Math.abs(Date.now() / 1000 - Number(ts)) > TOLERANCE_S) return null;
  const expected = createHmac('sha256', WEBHOOK_KEY).update(`${id}.${ts}.`).update(raw).digest();
  let ok = false;
  for (const s of sigs.split(' ')) {
    const [version, b64] = s.split(',');
    const given = Buffer.from(b64 ?? '', 'base64');
    if (version === 'v1' && given.length === expected.length && timingSafeEqual(given, expected)) ok = true;
  }
  return ok ? id : null;
}

/** Ids handled lately (deliveries are at least once): oldest first, at most 10,000. */
const seen = new Set();
function remember(id) {
  seen.add(id);
  if (seen.size > 10_000) seen.delete(seen.values().next().value);
}

/** @param {string} method @param {string} path @param {unknown} [body] */
async function plaza(method, path, body) {
  const res = await fetch(`${PLAZA_URL}${path}`, {
    method,
    headers: { authorization: `Bearer ${PLAZA_API_KEY}`, ...(body ? { 'content-type': 'application/json' } : {}) },
    body: body ? JSON.stringify(body) : undefined,
  });
  const answer = await res.json().catch(() => null);
  if (!res.ok) throw new Error(`${method} ${path}: ${res.status} ${JSON.stringify(answer)}`);
  return answer;
}

// --- The mirror: DATA_DIR/<room>.json = {room, seq, entities: {id: entity}} ---------------------

/** Room ids are [A-Za-z0-9._-]; refuse '.' and '..' too, so a file name never leaves DATA_DIR. */
const mirrorPath = (room) => (/^[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}$/.test(room) ? join(DATA_DIR, `${room}.json`) : null);

/** One change at a time per room (a read-modify-write). */
const queues = new Map();
function inOrder(room, task) {
  const run = (queues.get(room) ?? Promise.resolve()).then(task);
  queues.set(room, run.catch(() => undefined));
  return run;
}

/** @param {string} room @param {(m: {room: string, seq: number, entities: Record<string, unknown>}) => boolean | void} change */
function updateMirror(room, change) {
  const file = mirrorPath(room);
  if (!file) return Promise.resolve();
  return inOrder(room, async () => {
    const text = await readFile(file, 'utf8').catch(() => null);
    const mirror = text ? JSON.parse(text) : { room, seq: 0, entities: {} };
    if (change(mirror) === false) return;
    const tmp = `${file}.${process.pid}.tmp`;
    await writeFile(tmp, JSON.stringify(mirror, null, 2));
    await rename(tmp, file); // atomic: readers see the old file or the new one
  });
}

/** @param {{type: string, data: any}} event @param {string} id */
async function handle(event, id) {
  const d = event.data;
  switch (event.type) {
    case 'member.joined':
      await plaza('POST', `/v1/rooms/${encodeURIComponent(d.room)}/publish`, {
        event: 'welcome',
        data: { text: `Welcome, ${d.name}` },
        idempotency_key: `welcome-${id}`, // a redelivery after a restart is not welcomed twice
      });
      break;
    case 'room.created': {
      // Initial entities cause no events: start the mirror from the room's state.
      const state = await plaza('GET', `/v1/rooms/${encodeURIComponent(d.room)}/state`);
      await updateMirror(d.room, (m) => {
        if (state.seq < m.seq) return false;
        m.seq = state.seq;
        m.entities = Object.fromEntries(state.entities.map((e) => [e.id, e]));
      });
      break;
    }
    case 'entity.created':
    case 'entity.updated':
    case 'entity.deleted':
      await updateMirror(d.room, (m) => {
        if (d.seq <= m.seq) return false; // already applied
        m.seq = d.seq;
        if (event.type === 'entity.deleted') delete m.entities[d.id];
        else m.entities[d.entity.id] = d.entity;
      });
      break;
    case 'room.deleted': {
      const file = mirrorPath(d.room);
      if (file) await inOrder(d.room, () => rm(file, { force: true }));
      break;
    }
  }
}

// --- HTTP -------------------------------------------------------------------------------------

/** @param {import('node:http').ServerResponse} res @param {number} status @param {unknown} [body] */
function reply(res, status, body) {
  res.writeHead(status, body === undefined ? {} : { 'content-type': 'application/json' });
  res.end(body === undefined ? undefined : JSON.stringify(body));
}

const server = createServer(async (req, res) => {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  const raw = Buffer.concat(chunks);
  try {
    if (req.method === 'POST' && req.url === '/login') {
      const { name } = JSON.parse(raw.toString('utf8') || '{}');
      if (typeof name !== 'string' || name.length < 1 || Buffer.byteLength(name) > 64) {
        return reply(res, 400, { error: 'name: 1 to 64 bytes' });
      }
      return reply(res, 200, { token: mintToken(name) });
    }
    if (req.method === 'POST' && req.url === '/hooks') {
      const id = verify(raw, req.headers);
      if (!id) return reply(res, 401, { error: 'bad signature' });
      if (!seen.has(id)) {
        await handle(JSON.parse(raw.toString('utf8')), id); // throws: 500, and Plaza retries
        remember(id);
      }
      return reply(res, 204);
    }
    reply(res, 404, { error: 'not found' });
  } catch (e) {
    console.error(`${req.method} ${req.url}:`, e);
    reply(res, 500, { error: 'internal' });
  }
});

await mkdir(DATA_DIR, { recursive: true });
server.listen(PORT, '127.0.0.1', () => {
  console.log(`backend listening on http://127.0.0.1:${server.address().port}`);
});
for (const signal of ['SIGTERM', 'SIGINT']) {
  process.on(signal, () => {
    server.close(() => process.exit(0));
    server.closeAllConnections(); // Plaza keeps its webhook connections alive
  });
}
