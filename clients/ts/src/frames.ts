/**
 * Wire frames of Plaza protocol v1 (docs/protocol.md). Only what the client reads or writes
 * is typed; unknown fields are tolerated.
 */

/** Any JSON value (payloads are relayed untouched by the server). */
export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

/** A connected member of a room. */
export interface Member {
  session: string;
  name: string;
  platform: string;
  /** The `sub` of the token it joined with; absent for members without a token. */
  user?: string;
}

/** A server-validated entity of a room's state. */
export interface Entity {
  id: string;
  kind?: string;
  data: Json;
  version: number;
}

/** A lease on an object key. `token` is the fencing token. */
export interface Lock {
  object: string;
  owner: string;
  token: number;
  expires_at: number;
}

/** The room state in `joined` / `resync`. */
export interface Snapshot {
  entities: Entity[];
  locks: Lock[];
}

/** `joined` or `resync`: the answer to a `join`. */
export interface JoinedFrame {
  type: 'joined' | 'resync';
  room: string;
  session: string;
  resume_token: string;
  /** May exceed 2^53: compare as received, never compute with it. */
  epoch: number;
  seq: number;
  members: Member[];
  snapshot?: Snapshot;
  channels: string[];
  resumed: boolean;
  /**
   * Only on `resync`: why the stream could not continue. `history_rewritten` is the client's
   * own: the server closed the connection with 4005 (a cluster's broker failover rewrote the
   * room's history), and the client joined afresh instead of resuming.
   */
  reason?: 'history_truncated' | 'session_expired' | 'epoch_changed' | 'history_rewritten' | (string & {});
  /** Spatial rooms only. */
  space?: SpaceSnapshot;
  /** Only when the join asked for {@link HistoryRequest | history}. */
  history?: JoinHistory;
  /** Only on a connection with compact messages: how they name this room and count its time. */
  compact?: CompactKey;
}

/** How a room's compact messages name it and count time (docs/protocol.md, "Compact messages"). */
export interface CompactKey {
  /** Stands for the room id in its compact messages. */
  alias: number;
  /** A compact message's time is `ts - ts_base`. */
  ts_base: number;
}

/** Which past messages of a channel a join asks for (docs/protocol.md, join). */
export interface HistoryRequest {
  /** Default `main`; must be `main` or one of the join's channels. */
  channel?: string;
  /** The newest this many (1–10000). */
  last?: number;
  /** Only those with a greater seq. */
  since?: number;
}

/** Past messages in a `joined` frame, oldest first, exactly as they were sent live. */
export interface JoinHistory {
  events: MessageEvent[];
  /** False when the room's history no longer reached back as far as asked. */
  complete: boolean;
}

/** Fields common to every sequenced room event. */
interface EventBase {
  type: 'event';
  room: string;
  seq: number;
  ts: number;
  from?: string;
}

/** `message` event: a publish. */
/**
 * A `message` event. Also exported as {@link RoomMessage}, which does not clash with the
 * DOM's `MessageEvent` in browser code.
 */
export interface MessageEvent extends EventBase {
  kind: 'message';
  /** The channel; the server leaves `main` out and the client fills it in. */
  channel: string;
  event: string;
  data?: Json;
  topic?: string;
  reply_to?: number;
  id?: string;
}

/** `presence.join` / `presence.leave` events. */
export type PresenceEvent =
  | (EventBase & { kind: 'presence.join'; member: Member })
  | (EventBase & { kind: 'presence.leave'; session: string; reason: string });

/** `entity.created` / `entity.updated` / `entity.deleted` events. */
export type EntityEvent =
  | (EventBase & { kind: 'entity.created' | 'entity.updated'; entity: Entity })
  | (EventBase & { kind: 'entity.deleted'; id: string; version: number });

/** `lock.acquired` / `lock.released` events. */
export type LockEvent =
  | (EventBase & { kind: 'lock.acquired'; lock: Lock })
  | (EventBase & {
      kind: 'lock.released';
      object: string;
      owner: string;
      token: number;
      reason: string;
    });

/** A point of a spatial room's plane, `[x, y]`. */
export type Point = [number, number];

/**
 * A member's movement in a spatial room: from `from` at `t0` (Unix ms) towards `to` at `speed`
 * units per second, then standing at `to`. See {@link positionAt}.
 */
export interface Movement {
  from: Point;
  to: Point;
  t0: number;
  speed: number;
}

/** Spatial room events (docs/protocol.md, "Spatial rooms"). */
export type SpaceEvent =
  | (EventBase & { kind: 'space.moved'; session: string; movement: Movement })
  | (EventBase & { kind: 'interest.enter'; a: string; b: string; movements: { [session: string]: Movement } })
  | (EventBase & { kind: 'interest.leave'; a: string; b: string })
  | (EventBase & { kind: 'proximity.enter'; pair: number; a: string; b: string; initiator: string })
  | (EventBase & { kind: 'proximity.leave'; pair: number; a: string; b: string });

/** A pair in proximity, as `joined` lists it. */
export interface ProximityPair {
  pair: number;
  a: string;
  b: string;
  initiator: string;
}

/** The `space` of a spatial room's `joined`: settings, movements, this member's pairs. */
export interface SpaceSnapshot {
  width: number;
  height: number;
  proximity_radius: number;
  hysteresis: number;
  min_dwell_ms: number;
  aoi_radius: number;
  tick_ms: number;
  direct_in_proximity_only: boolean;
  movements: { [session: string]: Movement };
  pairs: ProximityPair[];
}

/** Any sequenced room event. */
export type RoomEvent = MessageEvent | PresenceEvent | EntityEvent | LockEvent | SpaceEvent;

/** A direct message from one session. Not sequenced. */
export interface DirectFrame {
  type: 'direct';
  room: string;
  from: string;
  event: string;
  data?: Json;
}

/** Acknowledgement of a publish. */
export interface AckFrame {
  type: 'ack';
  room: string;
  seq: number;
  id?: string;
  duplicate?: true;
}

/** The answer to a request, matched by nonce. */
export interface ResponseFrame {
  type: 'response';
  room: string;
  nonce: string | number;
  ok: boolean;
  result?: { [key: string]: Json };
  error?: { code: string; message: string };
}

/** A refused client frame. */
export interface ErrorFrame {
  type: 'error';
  code: string;
  message: string;
  ref?: { frame?: string; room?: string; id?: string };
}

/** Which part of an event a policy filter tests (docs/protocol.md, Delivery policies). */
export type PolicyField = 'kind' | 'channel' | 'event' | 'topic' | 'sender' | { payload: string };

/** How a policy filter tests its field. */
export type PolicyMatch = { equals: Json } | { in: Json[] } | 'exists';

/** A filter of a delivery policy: a matching event is delivered at once. */
export interface PolicyFilter {
  id: string;
  enabled?: boolean;
  field: PolicyField;
  op: PolicyMatch;
}

/** A member's delivery policy: filters at once, the rest held by time and/or volume. */
export interface DeliveryPolicy {
  filters?: PolicyFilter[];
  max_delay_ms?: number;
  max_held?: number;
  aggregate?: boolean;
}

/** A change to a delivery policy (`policy.update`): only what it names changes. */
export interface PolicyUpdate {
  filters?: PolicyFilter[];
  add?: PolicyFilter[];
  remove?: string[];
  enable?: string[];
  disable?: string[];
  max_delay_ms?: number | null;
  max_held?: number | null;
  aggregate?: boolean;
}

/** Events a delivery policy held, flushed together, oldest first. */
export interface BatchFrame {
  type: 'batch';
  room: string;
  events: RoomEvent[];
}

/** Any frame the server sends. */
export type ServerFrame =
  | JoinedFrame
  | RoomEvent
  | BatchFrame
  | DirectFrame
  | AckFrame
  | ResponseFrame
  | ErrorFrame
  | { type: 'left'; room: string }
  | { type: 'closed'; room: string; reason: string; message?: string }
  | { type: 'pong'; ts?: number }
  | AuthedFrame;

/** The connection's identity, from a verified token. */
export interface AuthedFrame {
  type: 'authed';
  user: string;
  name?: string;
  /** When the token expires (Unix ms). */
  expires_at: number;
}

/** Any frame the client sends. */
export type ClientFrame =
  | {
      type: 'join';
      room?: string;
      ticket?: string;
      name?: string;
      platform?: string;
      channels?: string[];
      resume?: { token: string; last_seq: number };
      policy?: DeliveryPolicy;
      history?: HistoryRequest;
    }
  | { type: 'leave'; room: string }
  | {
      type: 'publish';
      room: string;
      event: string;
      data?: Json;
      id: string;
      channel?: string;
      topic?: string;
      reply_to?: number;
      echo?: boolean;
    }
  | { type: 'request'; room: string; nonce: number; op: string; args: Json }
  | { type: 'direct'; room: string; to: string; event: string; data?: Json }
  | { type: 'ping'; ts?: number }
  | { type: 'auth'; token: string };

/** The DOM-safe name of {@link MessageEvent}. */
export type RoomMessage = MessageEvent;
