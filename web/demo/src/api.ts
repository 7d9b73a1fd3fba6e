/** The HTTP API of the Plaza server this page came from (docs/protocol.md, "HTTP API"). */
import { OBJECT_COLORS } from './util';

/** A room as `GET /v1/rooms` lists it. */
export interface RoomInfo {
  id: string;
  name: string;
  members: number;
  created_at: number;
  access: 'open' | 'ticket' | string;
}

/** An HTTP API error with the server's error code. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message);
    this.name = 'ApiError';
  }
}

async function call<T>(method: 'GET' | 'POST', path: string, body?: unknown): Promise<T> {
  const init: RequestInit = { method, headers: { accept: 'application/json' } };
  if (body !== undefined) {
    init.headers = { ...init.headers, 'content-type': 'application/json' };
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  const text = await response.text();
  let json: unknown;
  try {
    json = text === '' ? undefined : JSON.parse(text);
  } catch {
    json = undefined;
  }
  if (!response.ok) {
    const err = (json as { error?: { code?: string; message?: string } } | undefined)?.error;
    throw new ApiError(response.status, err?.code ?? `http_${response.status}`, err?.message ?? response.statusText);
  }
  return json as T;
}

/** `GET /v1/rooms`: every room, ordered by id. */
export async function listRooms(): Promise<RoomInfo[]> {
  const { rooms } = await call<{ rooms: RoomInfo[] }>('GET', '/v1/rooms');
  return rooms;
}

/** The shared objects every new room starts with (kind `object`). */
export function initialObjects(): Array<{ kind: string; data: { x: number; y: number; color: string; label: string } }> {
  return [
    { x: 220, y: 160, color: OBJECT_COLORS.crate, label: 'crate' },
    { x: 400, y: 330, color: OBJECT_COLORS.ball, label: 'ball' },
    { x: 590, y: 170, color: OBJECT_COLORS.lamp, label: 'lamp' },
  ].map((data) => ({ kind: 'object', data }));
}

/**
 * The plaza's plane as the server knows it: proximity at 160 units (the size of two avatars'
 * personal space), everyone seeing everyone on this small plaza, WebRTC signalling only between
 * members in proximity.
 */
export const SPACE = {
  width: 800,
  height: 500,
  proximity_radius: 160,
  min_dwell_ms: 1000,
  aoi_radius: 1000,
  direct_in_proximity_only: true,
};

/** `POST /v1/rooms`: creates an open spatial room with the three shared objects. */
export function createRoom(id: string): Promise<RoomInfo> {
  return call<RoomInfo>('POST', '/v1/rooms', { id, entities: initialObjects(), options: { space: SPACE } });
}

/** Whether the server serves `POST /v1/demo/token`, as `GET /v1/status` says; asked once per page. */
let demoTokensServed: Promise<boolean> | undefined;

function servesDemoTokens(): Promise<boolean> {
  demoTokensServed ??= call<{ demo_tokens?: boolean }>('GET', '/v1/status').then(
    (status) => status.demo_tokens === true,
    (err: unknown) => {
      // Asked again next time (the server may be restarting); the client retries the connect.
      demoTokensServed = undefined;
      throw err;
    },
  );
  return demoTokensServed;
}

/**
 * The page's token source: `POST /v1/demo/token` signs one for `name` when the server runs with
 * `demo_tokens` (the stand-in for an application's backend, docs/protocol.md "Identities and
 * rights"); the same user id is asked for again on every refresh, and kept for the tab, so a
 * reload resumes the sessions it saved (a resume needs the same user). A server without the
 * route (development mode, as `scripts/run.sh` runs it) says so in `GET /v1/status`: the route
 * is not asked (a 404 would be a console error on every page), and the client connects without
 * a token.
 */
export function demoTokens(name: string): () => Promise<string | undefined> {
  const USER_KEY = 'plaza-demo-user';
  let user = sessionStorage.getItem(USER_KEY) ?? undefined;
  let available = true;
  return async () => {
    if (!available || !(await servesDemoTokens())) return undefined;
    const response = await fetch('/v1/demo/token', {
      method: 'POST',
      headers: { 'content-type': 'application/json', accept: 'application/json' },
      body: JSON.stringify(user === undefined ? { name } : { name, user }),
    });
    if (response.status === 404) {
      available = false;
      return undefined;
    }
    if (!response.ok) throw new ApiError(response.status, `http_${response.status}`, await response.text());
    const body = (await response.json()) as { token: string; user: string };
    user = body.user;
    sessionStorage.setItem(USER_KEY, user);
    return body.token;
  };
}
