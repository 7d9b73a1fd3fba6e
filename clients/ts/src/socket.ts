/**
 * The subset of the WHATWG WebSocket API the client uses. The global `WebSocket` of browsers
 * and Node ≥ 22 fits it, and so does the `ws` package's `WebSocket` (for Node 20).
 */
export interface WebSocketLike {
  readonly readyState: number;
  /** Bytes (or, for the HTTP transports, frames) given to `send` and not handed on yet. */
  readonly bufferedAmount?: number;
  send(data: string): void;
  close(code?: number, reason?: string): void;
  onopen: Handler<never> | null;
  /** Called once the socket ended, with the close code the server sent (when it sent one). */
  onclose: Handler<{ code?: number }> | null;
  onerror: Handler<never> | null;
  onmessage: Handler<{ data: unknown }> | null;
}

/**
 * An event handler property, checked bivariantly so that implementations with richer event
 * types (DOM's, `ws`'s) fit.
 */
export type Handler<T> = { bivarianceHack(ev: T): void }['bivarianceHack'];

/**
 * A WebSocket constructor, e.g. `globalThis.WebSocket` or `import { WebSocket } from 'ws'`.
 * `protocols` are the subprotocols to offer (`Sec-WebSocket-Protocol`).
 */
export type WebSocketConstructor = new (url: string, protocols?: string[]) => WebSocketLike;

/** `readyState` of an open socket. */
export const OPEN = 1;

/** The injected constructor, else the global `WebSocket`; throws if there is neither. */
export function resolveWebSocket(injected?: WebSocketConstructor): WebSocketConstructor {
  if (injected) return injected;
  const global = (globalThis as { WebSocket?: WebSocketConstructor }).WebSocket;
  if (!global) {
    throw new Error(
      'no global WebSocket: on Node < 22 pass the `WebSocket` option (e.g. from the `ws` package)',
    );
  }
  return global;
}

/** The text of a message event's data (text frames are strings; binary ones are decoded). */
export function messageText(data: unknown): string | undefined {
  if (typeof data === 'string') return data;
  if (data instanceof ArrayBuffer) return new TextDecoder().decode(data);
  if (ArrayBuffer.isView(data)) return new TextDecoder().decode(data);
  return undefined;
}
