// Shared helpers: clients wired to the test server, unique rooms, awaiting events.
import { randomUUID } from 'node:crypto';
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
