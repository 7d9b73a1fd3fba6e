/// <reference types="node" />
/**
 * `@plaza/client/server`: for the application's backend, in Node (≥ 20). A typed client of
 * Plaza's management calls and server API (docs/protocol.md, "HTTP API" and "Server API"),
 * and {@link verifyWebhook} for the webhooks Plaza sends (Standard Webhooks signatures).
 *
 * A separate entry from `@plaza/client`, which stays free of `node:` modules for browsers.
 * @packageDocumentation
 */
import { createHmac, timingSafeEqual } from 'node:crypto';
import type { ServerErrorCode } from './errors.js';
import type { Entity, Json, Lock, Member, MessageEvent } from './frames.js';

export type { Entity, Json, Lock, Member, MessageEvent } from './frames.js';

/** How to reach Plaza. */
export interface PlazaServerOptions {
  /** The node's HTTP base URL, e.g. `http://127.0.0.1:7700` (a path prefix is kept). */
  url: string;
  /** The node's `api_key` (sent as `Authorization: Bearer <key>`), or an admin token. */
  apiKey?: string;
  /** A `fetch` to use instead of the global one (tests, proxies, instrumentation). */
  fetch?: typeof fetch;
}

/** An error answered by Plaza's HTTP API: its status and the error body's code and message. */
export class PlazaApiError extends Error {
  /** The HTTP status, e.g. 404. */
  readonly status: number;
  /** The error body's code, e.g. `room_not_found` (`http_<status>` when the body had none). */
  readonly code: ServerErrorCode | (string & {});

  constructor(status: number, code: string, message: string) {
    super(message);
    this.name = 'PlazaApiError';
    this.status = status;
    this.code = code;
  }
}

/** A room as `POST /v1/rooms` and `GET /v1/rooms/{id}` show it. */
export interface Room {
  id: string;
  name: string;
  /** Connected members. */
  members: number;
  created_at: number;
  access: 'open' | 'ticket';
  history_size: number;
  max_members: number;
  presence: boolean;
  /** Spatial rooms only: their settings. */
  space?: { [key: string]: Json };
}

/** The body of `POST /v1/rooms`. */
export interface CreateRoomOptions {
  /** 1–64 ASCII letters, digits, `-`, `_`, `.`; default `r-` + a random id. */
  id?: string;
  name?: string;
  /** Initial entities (ids `e1`, `e2`, …, version 1, no events). */
  entities?: { kind?: string; data?: Json }[];
  options?: {
    history_size?: number;
    max_members?: number;
    access?: 'open' | 'ticket';
    presence?: boolean;
    space?: { [key: string]: Json };
  };
}

/** A single-use ticket admitting one member. */
export interface Ticket {
  ticket: string;
  /** Unix ms. */
  expires_at: number;
}

/** A message published by the backend (`POST /v1/rooms/{id}/publish`). */
export interface ServerPublish {
  /** 1–64 bytes. */
  event: string;
  /** Default `main`. */
  channel?: string;
  data?: Json;
  topic?: string;
  /** The seq of an earlier message this one answers. */
  replyTo?: number;
  /** 1–128 bytes: a retry with the same key and message is ordered once (the event's `id`). */
  idempotencyKey?: string;
}

/** The answer to a publish. */
export interface PublishResult {
  room: string;
  seq: number;
  /** `true`: the key was seen with this message before; nobody got it again. */
  duplicate: boolean;
}

/** A message for many rooms: as {@link ServerPublish}, without `replyTo`. */
export type BroadcastMessage = Omit<ServerPublish, 'replyTo'>;

/** One room's outcome in a broadcast: published, or refused with an error. */
export type BroadcastResult =
  | { room: string; seq: number; duplicate: boolean; error?: undefined }
  | { room: string; error: { code: ServerErrorCode | (string & {}); message: string }; seq?: undefined };

/** A direct message from `@server`. */
export interface ServerDirect {
  event: string;
  data?: Json;
}

/** `GET /v1/rooms/{id}/state`. */
export interface RoomState {
  room: string;
  /** May exceed 2^53: compare as received. */
  epoch: number;
  seq: number;
  entities: Entity[];
  locks: Lock[];
  members: Member[];
}

/** Which messages `history` reads. */
export interface HistoryQuery {
  /** Default `main`. */
  channel?: string;
  /** The newest this many (1–10000); default all held. */
  last?: number;
  /** Only those with a greater seq. */
  since?: number;
}

/** `GET /v1/rooms/{id}/history`: whole event frames, oldest first. */
export interface RoomHistory {
  room: string;
  seq: number;
  /** As sent live; the server leaves `channel` out for `main`. */
  events: (Omit<MessageEvent, 'channel'> & { channel?: string })[];
  /** `false` when the history no longer reaches back as far as asked. */
  complete: boolean;
}

/** An entity change's answer. */
export interface EntityResult {
  room: string;
  entity: Entity;
  seq: number;
}

/** An entity deletion's answer. */
export interface EntityDeleted {
  room: string;
  id: string;
  version: number;
  seq: number;
}

/** Conditional entity changes: `ifVersion` is sent as `If-Match` (another version: 412). */
export interface IfVersion {
  ifVersion?: number;
}

/**
 * Plaza's HTTP API for the application's backend: management calls (rooms, tickets, members,
 * kicks) and the server API (publish, broadcast, direct, state, history, entities, users).
 * Every call throws {@link PlazaApiError} when Plaza refuses it.
 */
export class PlazaServer {
  private readonly base: string;
  private readonly apiKey: string | undefined;
  private readonly fetchFn: typeof fetch;

  constructor(options: PlazaServerOptions) {
    this.base = options.url.replace(/\/+$/, '');
    this.apiKey = options.apiKey;
    this.fetchFn = options.fetch ?? ((input, init) => fetch(input, init));
  }

  /** `POST /v1/rooms`: creates a room. */
  createRoom(options: CreateRoomOptions = {}): Promise<Room> {
    return this.call<Room>('POST', '/v1/rooms', options);
  }

  /** `GET /v1/rooms/{id}`. */
  room(room: string): Promise<Room> {
    return this.call<Room>('GET', `/v1/rooms/${seg(room)}`);
  }

  /** `GET /v1/rooms`: every room, ordered by id. */
  async rooms(): Promise<Room[]> {
    return (await this.call<{ rooms: Room[] }>('GET', '/v1/rooms')).rooms;
  }

  /** `DELETE /v1/rooms/{id}`: members get `closed` (`room_deleted`); everything is gone. */
  async deleteRoom(room: string): Promise<void> {
    await this.call<undefined>('DELETE', `/v1/rooms/${seg(room)}`);
  }

  /** `POST /v1/rooms/{id}/tickets`: a single-use ticket for one member. */
  ticket(room: string, member: { name: string; platform?: string }): Promise<Ticket> {
    return this.call<Ticket>('POST', `/v1/rooms/${seg(room)}/tickets`, member);
  }

  /** `GET /v1/rooms/{id}/members`: the connected members, ordered by session id. */
  async members(room: string): Promise<Member[]> {
    return (await this.call<{ room: string; members: Member[] }>('GET', `/v1/rooms/${seg(room)}/members`)).members;
  }

  /** `POST /v1/rooms/{id}/members/{session}/kick`: removes the member for good. */
  async kick(room: string, session: string, message?: string): Promise<void> {
    const body = message === undefined ? {} : { message };
    await this.call<undefined>('POST', `/v1/rooms/${seg(room)}/members/${seg(session)}/kick`, body);
  }

  /** `POST /v1/rooms/{id}/publish`: a message from `@server`, ordered as a member's. */
  publish(room: string, message: ServerPublish): Promise<PublishResult> {
    return this.call<PublishResult>('POST', `/v1/rooms/${seg(room)}/publish`, publishBody(message));
  }

  /** `POST /v1/broadcast`: one message into 1–1000 rooms; one result per room, in order. */
  async broadcast(rooms: string[], message: BroadcastMessage): Promise<BroadcastResult[]> {
    const body = { rooms, ...publishBody(message) };
    return (await this.call<{ results: BroadcastResult[] }>('POST', '/v1/broadcast', body)).results;
  }

  /** `POST /v1/rooms/{id}/members/{session}/direct`: a `direct` to one connected session. */
  direct(room: string, session: string, message: ServerDirect): Promise<{ room: string; session: string }> {
    return this.call('POST', `/v1/rooms/${seg(room)}/members/${seg(session)}/direct`, directBody(message));
  }

  /** `POST /v1/users/{user}/direct`: a `direct` to every connected session of the user (202). */
  directUser(user: string, message: ServerDirect): Promise<{ user: string }> {
    return this.call('POST', `/v1/users/${seg(user)}/direct`, directBody(message));
  }

  /** `POST /v1/users/{user}/disconnect`: kicks every session of the user, everywhere (202). */
  disconnectUser(user: string, reason?: string): Promise<{ user: string }> {
    return this.call('POST', `/v1/users/${seg(user)}/disconnect`, reason === undefined ? {} : { reason });
  }

  /** `GET /v1/rooms/{id}/state`: entities, locks and members as of `seq`. */
  state(room: string): Promise<RoomState> {
    return this.call<RoomState>('GET', `/v1/rooms/${seg(room)}/state`);
  }

  /** `GET /v1/rooms/{id}/history`: a channel's messages, oldest first. */
  history(room: string, query: HistoryQuery = {}): Promise<RoomHistory> {
    const params = new URLSearchParams();
    if (query.channel !== undefined) params.set('channel', query.channel);
    if (query.last !== undefined) params.set('last', String(query.last));
    if (query.since !== undefined) params.set('since', String(query.since));
    const q = params.size > 0 ? `?${params.toString()}` : '';
    return this.call<RoomHistory>('GET', `/v1/rooms/${seg(room)}/history${q}`);
  }

  /** `POST /v1/rooms/{id}/entities`: members see `entity.created` from `@server`. */
  createEntity(room: string, entity: { kind?: string; data: Json }): Promise<EntityResult> {
    return this.call<EntityResult>('POST', `/v1/rooms/${seg(room)}/entities`, entity);
  }

  /** `PUT /v1/rooms/{id}/entities/{entity}`: replaces the data (412 `version_conflict` with another version). */
  setEntity(room: string, id: string, data: Json, options: IfVersion = {}): Promise<EntityResult> {
    return this.call<EntityResult>('PUT', `/v1/rooms/${seg(room)}/entities/${seg(id)}`, { data }, ifMatch(options));
  }

  /** `DELETE /v1/rooms/{id}/entities/{entity}`. */
  deleteEntity(room: string, id: string, options: IfVersion = {}): Promise<EntityDeleted> {
    return this.call<EntityDeleted>('DELETE', `/v1/rooms/${seg(room)}/entities/${seg(id)}`, undefined, ifMatch(options));
  }

  private async call<T>(method: string, path: string, body?: object, extra: Record<string, string> = {}): Promise<T> {
    const headers: Record<string, string> = { ...extra };
    if (this.apiKey !== undefined) headers['authorization'] = `Bearer ${this.apiKey}`;
    const init: RequestInit = { method, headers };
    if (body !== undefined) {
      headers['content-type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
    const res = await this.fetchFn(`${this.base}${path}`, init);
    const text = await res.text();
    let parsed: unknown;
    if (text !== '') {
      try {
        parsed = JSON.parse(text);
      } catch {
        parsed = undefined;
      }
    }
    if (!res.ok) {
      const error = isObject(parsed) && isObject(parsed['error']) ? parsed['error'] : undefined;
      const code = typeof error?.['code'] === 'string' ? error['code'] : `http_${res.status}`;
      const message = typeof error?.['message'] === 'string' ? error['message'] : `${method} ${path}: HTTP ${res.status}`;
      throw new PlazaApiError(res.status, code, message);
    }
    if (text !== '' && parsed === undefined) {
      throw new PlazaApiError(res.status, 'invalid_response', `${method} ${path}: the answer is not JSON`);
    }
    return parsed as T;
  }
}

function seg(part: string): string {
  return encodeURIComponent(part);
}

function ifMatch(options: IfVersion): Record<string, string> {
  return options.ifVersion === undefined ? {} : { 'if-match': `"${options.ifVersion}"` };
}

function publishBody(m: ServerPublish): { [key: string]: Json } {
  const body: { [key: string]: Json } = { event: m.event };
  if (m.channel !== undefined) body['channel'] = m.channel;
  if (m.data !== undefined) body['data'] = m.data;
  if (m.topic !== undefined) body['topic'] = m.topic;
  if (m.replyTo !== undefined) body['reply_to'] = m.replyTo;
  if (m.idempotencyKey !== undefined) body['idempotency_key'] = m.idempotencyKey;
  return body;
}

function directBody(m: ServerDirect): { [key: string]: Json } {
  const body: { [key: string]: Json } = { event: m.event };
  if (m.data !== undefined) body['data'] = m.data;
  return body;
}

function isObject(v: unknown): v is { [key: string]: unknown } {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

// ---------------------------------------------------------------------------------------------
// Webhooks

/** Every event type Plaza sends to a webhook. */
export const WEBHOOK_EVENT_TYPES = [
  'room.created',
  'room.deleted',
  'member.joined',
  'member.left',
  'message.published',
  'entity.created',
  'entity.updated',
  'entity.deleted',
  'lock.acquired',
  'lock.released',
] as const;

/** A webhook event's type. */
export type WebhookEventType = (typeof WEBHOOK_EVENT_TYPES)[number];

/** The data of each webhook event type. */
export interface WebhookEventData {
  /** The room's summary as `POST /v1/rooms` answers it, with `id` as `room`. */
  'room.created': Omit<Room, 'id'> & { room: string };
  'room.deleted': { room: string };
  /** A member joined or resumed (as `presence.join` shows it). */
  'member.joined': { room: string; seq: number; session: string; name: string; platform: string; user?: string };
  'member.left': {
    room: string;
    seq: number;
    session: string;
    user?: string;
    reason: 'left' | 'disconnected' | 'expired' | 'kicked' | 'room_closed' | (string & {});
  };
  'message.published': {
    room: string;
    seq: number;
    channel: string;
    /** A session id, or `@server`. */
    from: string;
    event: string;
    data?: Json;
    topic?: string;
    reply_to?: number;
    /** The idempotency key or message id, when it had one. */
    id?: string;
  };
  'entity.created': { room: string; seq: number; from?: string; entity: Entity };
  'entity.updated': { room: string; seq: number; from?: string; entity: Entity };
  'entity.deleted': { room: string; seq: number; from?: string; id: string; version: number };
  'lock.acquired': { room: string; seq: number; from?: string; lock: Lock };
  'lock.released': { room: string; seq: number; object: string; owner: string; token: number; reason: string };
}

/** A webhook event: narrow it with `switch (event.type)`. */
export type WebhookEvent = {
  [T in WebhookEventType]: {
    type: T;
    /** When it happened, RFC 3339. */
    timestamp: string;
    data: WebhookEventData[T];
  };
}[WebhookEventType];

/** The event of one type, e.g. `WebhookEventOf<'member.joined'>`. */
export type WebhookEventOf<T extends WebhookEventType> = Extract<WebhookEvent, { type: T }>;

/** Why {@link verifyWebhook} refused a delivery. */
export type WebhookErrorReason =
  | 'missing_header'
  | 'bad_timestamp'
  | 'stale_timestamp'
  | 'bad_signature'
  | 'bad_secret'
  | 'bad_body'
  | 'unknown_type';

/**
 * A delivery {@link verifyWebhook} refused. With `unknown_type` the signature was good: the
 * event is of a type this version does not know (the receiver may acknowledge and ignore it).
 */
export class WebhookVerificationError extends Error {
  readonly reason: WebhookErrorReason;

  constructor(reason: WebhookErrorReason, message: string) {
    super(message);
    this.name = 'WebhookVerificationError';
    this.reason = reason;
  }
}

/** Request headers: Node's `req.headers`, a fetch `Headers`, or a plain record. */
export type WebhookHeaders =
  | { get(name: string): string | null }
  | Record<string, string | string[] | undefined>;

/** Options of {@link verifyWebhook}. */
export interface VerifyWebhookOptions {
  /** How far `webhook-timestamp` may be from now, in seconds (default 300). */
  toleranceSeconds?: number;
  /** The current time in Unix ms (default `Date.now()`): for tests. */
  now?: number;
}

/** The headers of a signed delivery. */
export type WebhookSignatureHeaders = {
  'webhook-id': string;
  'webhook-timestamp': string;
  'webhook-signature': string;
};

const SECRET_PREFIX = 'whsec_';

/** The HMAC key of a secret: `whsec_<base64>` (or bare base64), or the raw key bytes. */
function secretKey(secret: string | Uint8Array): Buffer {
  if (typeof secret !== 'string') return Buffer.from(secret);
  const b64 = secret.startsWith(SECRET_PREFIX) ? secret.slice(SECRET_PREFIX.length) : secret;
  const key = Buffer.from(b64, 'base64');
  if (key.length === 0) throw new WebhookVerificationError('bad_secret', 'the webhook secret is empty or not base64');
  return key;
}

function header(headers: WebhookHeaders, name: string): string | undefined {
  if (isHeaders(headers)) return headers.get(name) ?? undefined;
  const record = headers as Record<string, string | string[] | undefined>;
  let v = record[name];
  if (v === undefined) {
    const key = Object.keys(record).find((k) => k.toLowerCase() === name);
    v = key === undefined ? undefined : record[key];
  }
  return Array.isArray(v) ? v.join(' ') : v;
}

function isHeaders(h: WebhookHeaders): h is { get(name: string): string | null } {
  return typeof h['get'] === 'function';
}

function signature(key: Buffer, id: string, timestamp: string, body: string | Buffer): Buffer {
  const hmac = createHmac('sha256', key);
  hmac.update(`${id}.${timestamp}.`);
  hmac.update(body);
  return hmac.digest();
}

/**
 * Signs a delivery as Plaza does (Standard Webhooks, `v1`): the three headers. For tests of a
 * receiver, and for relaying events onwards.
 */
export function signWebhook(
  secret: string | Uint8Array,
  id: string,
  timestamp: Date | number,
  body: string | Buffer,
): WebhookSignatureHeaders {
  const seconds = String(Math.floor((typeof timestamp === 'number' ? timestamp : timestamp.getTime()) / 1000));
  const sig = signature(secretKey(secret), id, seconds, body).toString('base64');
  return { 'webhook-id': id, 'webhook-timestamp': seconds, 'webhook-signature': `v1,${sig}` };
}

/**
 * Verifies a webhook delivery (Standard Webhooks): the `webhook-signature` header must hold a
 * `v1` HMAC-SHA256 of `{id}.{timestamp}.{rawBody}` under the secret (any one of several
 * space-separated signatures, compared in constant time), and `webhook-timestamp` must be
 * within 5 minutes of now. Pass the body exactly as received (not re-serialized JSON).
 *
 * Returns the parsed event. Deliveries are at least once: dedupe by the `webhook-id` header
 * (stable across retries). Throws {@link WebhookVerificationError}.
 */
export function verifyWebhook(
  secret: string | Uint8Array,
  rawBody: string | Buffer,
  headers: WebhookHeaders,
  options: VerifyWebhookOptions = {},
): WebhookEvent {
  const id = header(headers, 'webhook-id');
  const timestamp = header(headers, 'webhook-timestamp');
  const signatures = header(headers, 'webhook-signature');
  if (!id || !timestamp || !signatures) {
    throw new WebhookVerificationError('missing_header', 'a webhook-id, webhook-timestamp or webhook-signature header is missing');
  }
  if (!/^\d+$/.test(timestamp)) {
    throw new WebhookVerificationError('bad_timestamp', `webhook-timestamp is not Unix seconds: ${JSON.stringify(timestamp)}`);
  }
  const now = Math.floor((options.now ?? Date.now()) / 1000);
  const tolerance = options.toleranceSeconds ?? 300;
  if (Math.abs(now - Number(timestamp)) > tolerance) {
    throw new WebhookVerificationError('stale_timestamp', `webhook-timestamp is more than ${tolerance} s from now`);
  }
  const expected = signature(secretKey(secret), id, timestamp, rawBody);
  let good = false;
  for (const versioned of signatures.split(' ')) {
    const comma = versioned.indexOf(',');
    if (comma < 0 || versioned.slice(0, comma) !== 'v1') continue;
    const given = Buffer.from(versioned.slice(comma + 1), 'base64');
    // Every candidate is compared (no early exit): the time taken says nothing of which matched.
    if (given.length === expected.length && timingSafeEqual(given, expected)) good = true;
  }
  if (!good) throw new WebhookVerificationError('bad_signature', 'no webhook-signature matches the body');

  let event: unknown;
  try {
    event = JSON.parse(typeof rawBody === 'string' ? rawBody : rawBody.toString('utf8'));
  } catch {
    throw new WebhookVerificationError('bad_body', 'the webhook body is not JSON');
  }
  if (!isObject(event) || typeof event['type'] !== 'string' || !isObject(event['data'])) {
    throw new WebhookVerificationError('bad_body', 'the webhook body is not an event {type, timestamp, data}');
  }
  if (!(WEBHOOK_EVENT_TYPES as readonly string[]).includes(event['type'])) {
    throw new WebhookVerificationError('unknown_type', `unknown webhook event type ${JSON.stringify(event['type'])}`);
  }
  return event as WebhookEvent;
}
