/** What a room handle is given and what it emits: options, results and events. */
import type { BackoffOptions } from './backoff.js';
import type { PlazaError } from './errors.js';
import type {
  ClientFrame,
  DeliveryPolicy,
  DirectFrame,
  EntityEvent,
  HistoryRequest,
  JoinedFrame,
  LockEvent,
  Member,
  MessageEvent,
  PresenceEvent,
  RoomEvent,
  Snapshot,
  SpaceEvent,
} from './frames.js';

/** How to join a room. */
export interface JoinOptions {
  /** Display name, 1–64 bytes. Required without `ticket`. */
  name?: string;
  /** e.g. `browser` (the server's default), `xr`. */
  platform?: string;
  /** Channels besides `main`. */
  channels?: string[];
  /**
   * A delivery policy: which events this member wants at once, and how long or how many the
   * others may be held (see {@link RoomHandle.updatePolicy}). Sent with every (re)join.
   */
  policy?: DeliveryPolicy;
  /**
   * Past messages of a channel to receive on joining (e.g. `{ last: 100 }`), found in
   * {@link RoomHandle.history} once joined. A resume does not repeat them (the missed events
   * follow instead); a resync does.
   */
  history?: HistoryRequest;
  /**
   * A ticket from `POST /v1/rooms/{id}/tickets` (fixes room, name and platform). A string
   * goes with this handle's first join attempt only (with `restore` too: it resumes the saved
   * session), and is left out after: tickets are single-use, and the session a ticket made
   * (without a token) is resumed by its resume token alone, with its own name and platform. In a
   * ticket-only room every (re)join needs a fresh ticket: pass a function that fetches one,
   * and the client calls it before each join, resumes included.
   */
  ticket?: string | (() => string | Promise<string>);
  /**
   * A session saved by {@link RoomHandle.saveSession} (e.g. before a page reload): the join
   * resumes it (same session id), starting from its saved state and `last_seq`.
   */
  restore?: SavedSession;
}

/**
 * What it takes to resume a session in a new client (e.g. after a page reload), as returned
 * by {@link RoomHandle.saveSession}. Plain JSON; keep it secret (it holds the resume token).
 */
export interface SavedSession {
  /** Format version of this object. */
  v: 1;
  room: string;
  session: string;
  token: string;
  lastSeq: number;
  members: Member[];
  channels: string[];
  snapshot: Snapshot;
  /**
   * Publishes not acknowledged yet, as sent. The new client sends them again after the resume
   * (the server orders each id once), so a message published just before a reload is not
   * lost. Absent in sessions saved by earlier versions.
   */
  publishes?: Extract<ClientFrame, { type: 'publish' }>[];
  /**
   * The delivery policy in force when saved: the restoring join carries it (unless its own
   * options give one), so the new client knows and keeps it. Absent without a policy, and in
   * sessions saved by earlier versions.
   */
  policy?: DeliveryPolicy;
}

/** Options of the entity operations: the expected current version (absent: any). */
export interface EntityOptions {
  version?: number;
}

/** Options of {@link RoomHandle.acquireLock} and {@link RoomHandle.renewLock}. */
export interface LockOptions {
  /** Lease length in ms (server default 30000). */
  ttlMs?: number;
}

/** Options of {@link RoomHandle.publish}. */
export interface PublishOptions {
  /** Channel, default `main`. */
  channel?: string;
  /** Relayed in the event; delivery policies may filter on it (`field: 'topic'`). */
  topic?: string;
  /**
   * The `seq` of an earlier event this message answers (a thread). Its author receives the
   * answer at once, whatever its delivery policy holds.
   */
  replyTo?: number;
  /** `true`: the sender receives the event too. */
  echo?: boolean;
}

/** The acknowledgement of a publish. */
export interface PublishAck {
  /** The message's seq in the room's order. */
  seq: number;
  /** `true` when the server had already ordered this message id (a retry). */
  duplicate: boolean;
}

/** Options of {@link RoomHandle.request}. */
export interface RequestOptions {
  /** Reject with code `timeout` after this many ms (default 10000). */
  timeoutMs?: number;
}

/** Why a room handle ended without a `leave`. */
export interface RoomClosed {
  /**
   * `room_deleted`, `resumed_elsewhere`, `kicked` (an admin removed this member; the session is
   * gone), `client_closed`, or the code of a failed rejoin.
   */
  reason: string;
  /** With `kicked`: the admin's words, if any. */
  message?: string;
  error?: PlazaError;
}

/** Events of a {@link RoomHandle}, with their listener arguments. */
export type RoomEvents = {
  /** Every sequenced event, once, in seq order (the events of a `batch` one by one). */
  event: [RoomEvent];
  /** After the events of a `batch` (held by the delivery policy) were emitted: all of them. */
  batch: [readonly RoomEvent[]];
  message: [MessageEvent];
  presence: [PresenceEvent];
  entity: [EntityEvent];
  lock: [LockEvent];
  /** Spatial rooms: `space.moved`, `interest.*` and `proximity.*` events (already applied to
   * {@link RoomHandle.positionOf} and {@link RoomHandle.proximityPairs}). */
  space: [SpaceEvent];
  direct: [DirectFrame];
  /** The member list changed (join, resync, presence): the new list. */
  members: [readonly Member[]];
  /** Each `joined` (the first join and every successful resume). */
  joined: [JoinedFrame];
  /**
   * A resume could not continue the stream: discard room state, start from this snapshot.
   * `reason` says why; `history_rewritten` after the server closed with 4005 (the client joined
   * afresh: its session and seqs are new).
   */
  resync: [JoinedFrame];
  /** The room handle ended (not by `leave`). */
  closed: [RoomClosed];
  /** A refused frame for this room that no promise was waiting for (e.g. a `direct`). */
  error: [PlazaError];
};

/** What a room needs from its client's connection. */
export interface RoomTransport {
  /** Sends a frame if the socket is open; returns whether it was sent. */
  send(frame: ClientFrame): boolean;
  /** A nonce unique on this client. */
  nextNonce(): number;
  /** Forgets the room (after leave or close). */
  forget(room: string): void;
  /** Hands every sequenced event and direct message to the client's `onEvent`. */
  dispatch(room: string, frame: RoomEvent | DirectFrame): void;
  /** The client's backoff settings, for joins asked again (default: the defaults). */
  readonly backoff?: BackoffOptions;
}
