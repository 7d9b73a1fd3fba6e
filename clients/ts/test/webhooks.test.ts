// Webhooks checked by the Standard Webhooks reference library (npm `standardwebhooks`), not by
// Plaza's own code: a real `plaza serve` with a [[webhooks]] target POSTs to a receiver here.
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Webhook, WebhookVerificationError } from 'standardwebhooks';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startPlaza, type PlazaProcess } from './plaza-process.js';

const SECRET = `whsec_${randomBytes(32).toString('base64')}`;

/** One request the receiver got. */
interface Hook {
  headers: Record<string, string>;
  body: string;
}

const received: Hook[] = [];
const waiting: ((h: Hook) => void)[] = [];

/** The next webhook request, in arrival order. */
function nextHook(): Promise<Hook> {
  const h = received.shift();
  if (h) return Promise.resolve(h);
  return new Promise((resolve) => waiting.push(resolve));
}

let receiver: Server;
let plaza: PlazaProcess;
let dir: string;

beforeAll(async () => {
  receiver = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const headers: Record<string, string> = {};
      for (const [k, v] of Object.entries(req.headers)) {
        if (typeof v === 'string') headers[k] = v;
      }
      const hook = { headers, body: Buffer.concat(chunks).toString('utf8') };
      const w = waiting.shift();
      if (w) w(hook);
      else received.push(hook);
      res.writeHead(204).end();
    });
  });
  await new Promise<void>((resolve) => receiver.listen(0, '127.0.0.1', resolve));
  const { port } = receiver.address() as AddressInfo;
  dir = mkdtempSync(join(tmpdir(), 'plaza-webhooks-'));
  const config = join(dir, 'plaza.toml');
  writeFileSync(
    config,
    [
      '[[webhooks]]',
      'name = "backend"',
      `url = "http://127.0.0.1:${port}/plaza"`,
      `secret = "${SECRET}"`,
      'events = ["room.created", "room.deleted"]',
      '',
    ].join('\n'),
  );
  plaza = await startPlaza(['--config', config]);
});

afterAll(async () => {
  await plaza?.stop();
  await new Promise((resolve) => receiver?.close(resolve));
  if (dir) rmSync(dir, { recursive: true, force: true });
});

describe('webhooks', () => {
  it('are signed as the Standard Webhooks library verifies, and a tampered one fails', async () => {
    const room = `wh-${randomBytes(4).toString('hex')}`;
    const res = await fetch(`http://${plaza.addr}/v1/rooms`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ id: room, name: 'Webhook room' }),
    });
    expect(res.status).toBe(201);
    const summary = (await res.json()) as { created_at: number };

    const created = await nextHook();
    expect(created.headers['content-type']).toBe('application/json');
    expect(created.headers['webhook-id']).toBe(`${room}:created:${summary.created_at}`);
    const wh = new Webhook(SECRET);
    const payload = wh.verify(created.body, created.headers) as {
      type: string;
      timestamp: string;
      data: Record<string, unknown>;
    };
    expect(payload.type).toBe('room.created');
    expect(payload.data['room']).toBe(room);
    expect(payload.data['name']).toBe('Webhook room');
    expect(new Date(payload.timestamp).getTime()).toBe(summary.created_at);
    expect(payload.timestamp).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);

    // A changed body, id or timestamp, or another secret, does not verify.
    const tampered = created.body.replace('Webhook room', 'Webhook r00m');
    expect(tampered).not.toBe(created.body);
    expect(() => wh.verify(tampered, created.headers)).toThrow(WebhookVerificationError);
    expect(() => wh.verify(created.body, { ...created.headers, 'webhook-id': `${room}:x` })).toThrow(
      WebhookVerificationError,
    );
    const ts = Number(created.headers['webhook-timestamp']);
    expect(() =>
      wh.verify(created.body, { ...created.headers, 'webhook-timestamp': String(ts + 1) }),
    ).toThrow(WebhookVerificationError);
    const other = new Webhook(`whsec_${randomBytes(32).toString('base64')}`);
    expect(() => other.verify(created.body, created.headers)).toThrow(WebhookVerificationError);

    const del = await fetch(`http://${plaza.addr}/v1/rooms/${room}`, { method: 'DELETE' });
    expect(del.status).toBe(204);
    const deleted = await nextHook();
    const gone = wh.verify(deleted.body, deleted.headers) as { type: string; data: unknown };
    expect(gone.type).toBe('room.deleted');
    expect(gone.data).toEqual({ room });
    expect(deleted.headers['webhook-id']).toMatch(new RegExp(`^${room}:deleted:\\d+$`));
  });
});
