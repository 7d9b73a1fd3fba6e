// Shared helpers: clients wired to the test server, unique rooms, awaiting events.
import { randomUUID } from 'node:crypto';
import { createServer } from 'node:net';
import { inject, onTestFinished } from 'vitest';
import { WebSocket } from 'ws';
import { PlazaClient, type PlazaClientOptions, type RoomEvents, type RoomHandle } from '../src/index.js';

/** A fresh room id, so tests never share state. */
export function uniqueRoom(): string {
  return `t-${randomUUID()}`;
}

/** A client of the test server, closed when the test ends. */
export function newClient(options: PlazaClientOptions = {}): PlazaClient {
  const client = new PlazaClient(inject('plazaWsUrl'), {
    WebSocket,
    reconnect: { initialMs: 20, maxMs: 200 },
    ...options,
  });
  onTestFinished(() => client.close());
  return client;
}

/** Resolves with the first `event` of `room` whose argument satisfies `pred`. */
export function next<K extends keyof RoomEvents>(
  room: RoomHandle,
  event: K,
  pred: (arg: RoomEvents[K][0]) => boolean = () => true,
): Promise<RoomEvents[K][0]> {
  return new Promise((resolve) => {
    const off = room.on(event, (...args: RoomEvents[K]) => {
      if (pred(args[0])) {
        off();
        resolve(args[0]);
      }
    });
  });
}

/** A promise with its resolver, to open a gate from outside. */
export function gate(): { promise: Promise<void>; open: () => void } {
  let open!: () => void;
  const promise = new Promise<void>((resolve) => {
    open = resolve;
  });
  return { promise, open };
}

/** Calls the test server's HTTP API; resolves with the status and the parsed JSON body (if any). */
export async function api(method: string, path: string, body?: unknown): Promise<{ status: number; body: any }> {
  const base = new URL(inject('plazaWsUrl'));
  base.protocol = 'http:';
  base.pathname = path;
  const init: RequestInit = { method };
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers = { 'content-type': 'application/json' };
  }
  const res = await fetch(base, init);
  const text = await res.text();
  return { status: res.status, body: text ? JSON.parse(text) : undefined };
}

/** Creates a room over the HTTP API (`POST /v1/rooms`) and returns its id. */
export async function createRoom(options: { entities?: unknown[]; options?: unknown } = {}): Promise<string> {
  const id = uniqueRoom();
  const res = await api('POST', '/v1/rooms', { id, ...options });
  if (res.status !== 201) throw new Error(`creating ${id}: ${res.status} ${JSON.stringify(res.body)}`);
  return id;
}

/** Resolves once `pred` holds, checked now and after every `change` of the room's replica. */
export function replicaUntil(room: RoomHandle, pred: () => boolean): Promise<void> {
  if (pred()) return Promise.resolve();
  return new Promise((resolve) => {
    const off = room.state.on('change', () => {
      if (pred()) {
        off();
        resolve();
      }
    });
  });
}

/** A loopback port free now (for a process that must be told its port before it starts). */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const addr = s.address();
      const port = typeof addr === 'object' && addr ? addr.port : 0;
      s.close(() => resolve(port));
    });
  });
}
