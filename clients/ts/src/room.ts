import { Emitter } from './emitter.js';
import { PlazaError } from './errors.js';
import { backoffDelay } from './backoff.js';
import type {
  AckFrame,
  ClientFrame,
  DeliveryPolicy,
  JoinHistory,
  DirectFrame,
  Entity,
  EntityEvent,
  ErrorFrame,
  JoinedFrame,
  Json,
  Lock,
  LockEvent,
  Member,
  MessageEvent,
  Movement,
  Point,
  PolicyUpdate,
  PresenceEvent,
  ProximityPair,
  ResponseFrame,
  RoomEvent,
  ServerFrame,
  Snapshot,
  SpaceEvent,
} from './frames.js';
import { newMessageId } from './ids.js';
import { UnackedPublishes, type PublishFrame } from './publishes.js';
import { PendingRequests } from './requests.js';
import { RoomReplica, type PendingChange } from './replica.js';
import { positionAt, SpaceView } from './space.js';
import type {
  EntityOptions,
  JoinOptions,
  LockOptions,
  PublishAck,
  PublishOptions,
  RequestOptions,
  RoomClosed,
  RoomEvents,
  RoomTransport,
  SavedSession,
} from './room-options.js';


/** Join errors after which the same join is tried again on the same connection. */
const TRANSIENT_JOIN_ERRORS = new Set(['broker_unavailable']);
/**
 * How many times a first join is tried while the server answers with a transient error
 * before `join()` rejects with it. A resume keeps trying: the membership is alive.
 */
const FIRST_JOIN_ATTEMPTS = 6;
/** How long a ticket function may take before the join counts it as failed. */
const TICKET_TIMEOUT_MS = 10_000;

type Status = 'joining' | 'live' | 'rejoining' | 'ended';

/**
 * One membership of one room, obtained from {@link PlazaClient.join}. It survives reconnects:
 * the client resumes it with `{token, last_seq}`, re-sends unacknowledged publishes with their
 * ids, and delivers every event once, in seq order.
 */
export class RoomHandle extends Emitter<RoomEvents> {
  /** The room id. */
  readonly room: string;
  private readonly options: JoinOptions;
  private readonly transport: RoomTransport;
  private status: Status = 'joining';
  private token: string | undefined;
  private seq = 0;
  private sessionId: string | undefined;
  private memberList: Member[] = [];
  private channelList: string[] = [];
  private lastSnapshot: Snapshot | undefined;
  /** The local replica of the room's state. */
  readonly state = new RoomReplica();
  /** Spatial rooms: the movements and pairs this member knows. */
  private readonly spaceView = new SpaceView();
  /** Optimistically created entities (temporary id) → their server id, once known. */
  private readonly createdIds = new Map<string, Promise<string>>();
  private tempCounter = 0;
  private joinAttempt = 0;
  /** Whether a join of this handle went with its ticket string, which is single-use. */
  private ticketSent = false;
  private joinRetry: ReturnType<typeof setTimeout> | undefined;
  /** Bumped by every join sent and every drop: a ticket fetched for an older one is dropped. */
  private joinGeneration = 0;
  private readonly publishes = new UnackedPublishes();
  private readonly requests = new PendingRequests();
  /** Frames (requests, directs) waiting until the room is live again. */
  private readonly outbox: ClientFrame[] = [];
  /** The connection is moving to another transport: the resume join went on the new one. */
  private moving = false;
  /**
   * The server closed the connection with 4005 (history rewritten) while this handle had a
   * session: the next join is a fresh one, and its answer is told as a `resync`.
   */
  private rewritten = false;
  private joinWaiter: { resolve: (room: RoomHandle) => void; reject: (err: PlazaError) => void } | undefined;
  private leaveWaiter: (() => void) | undefined;
  /** The delivery policy sent with each join (changed by {@link RoomHandle.updatePolicy}). */
  private policy: DeliveryPolicy | undefined;
  /** What the last `joined` with history carried. */
  private joinHistory: JoinHistory | undefined;
  /** Called once when the handle ends, however it ends (see {@link RoomHandle._whenEnded}). */
  private readonly endedCallbacks = new Set<() => void>();
  /**
   * The room's frames that came after the first `joined`, held until the code awaiting
   * `join()` has attached its handlers (see {@link RoomHandle.holdUntilAttached}).
   */
  private held: ServerFrame[] | undefined;

  /** @internal Created by {@link PlazaClient.join}. */
  constructor(room: string, options: JoinOptions, transport: RoomTransport) {
    super();
    this.room = room;
    this.options = options;
    this.policy = options.policy;
    this.transport = transport;
    const saved = options.restore;
    if (saved && saved.v === 1 && saved.room === room) {
      this.token = saved.token;
      this.seq = saved.lastSeq;
      this.sessionId = saved.session;
      this.memberList = [...saved.members];
      this.channelList = [...saved.channels];
      this.lastSnapshot = saved.snapshot;
      this.state._reset(saved.snapshot);
      if (options.policy === undefined && saved.policy !== undefined) this.policy = saved.policy;
      // Nobody awaits these any more: they are only delivered.
      const settled = () => undefined;
      for (const frame of saved.publishes ?? []) {
        if (typeof frame.id === 'string') this.publishes.add({ ...frame, id: frame.id }, settled, settled);
      }
    }
  }

  /** This member's session id (the address of `direct` messages); set once joined. */
  get session(): string | undefined {
    return this.sessionId;
  }

  /** The highest seq seen in this room (what a resume asks to continue from). */
  get lastSeq(): number {
    return this.seq;
  }

  /** Connected members, kept up to date from presence events. */
  get members(): readonly Member[] {
    return this.memberList;
  }

  /** This session's channels as of the last `joined`/`resync`. */
  get channels(): readonly string[] {
    return this.channelList;
  }

  /**
   * The last snapshot received (`joined`/`resync`), as it was then. For the current state use
   * {@link state}, which events keep up to date.
   */
  get snapshot(): Snapshot | undefined {
    return this.lastSnapshot;
  }

  /**
   * What a new client needs to resume this session ({@link JoinOptions.restore}), e.g. saved
   * to `sessionStorage` on `pagehide`. Undefined until joined.
   */
  saveSession(): SavedSession | undefined {
    if (this.status === 'ended' || this.token === undefined || this.sessionId === undefined) return undefined;
    return {
      v: 1,
      room: this.room,
      session: this.sessionId,
      token: this.token,
      lastSeq: this.seq,
      members: [...this.memberList],
      channels: [...this.channelList],
      snapshot: this.state.toSnapshot(),
      publishes: this.publishes.frames(),
      ...(this.policy === undefined ? {} : { policy: this.policy }),
    };
  }

  /** Whether the room is joined and the connection open. */
  get live(): boolean {
    return this.status === 'live';
  }

  /**
   * Publishes a message on a channel. Every publish carries a fresh client message id, so
   * re-sending it after a reconnect is idempotent. While disconnected the publish waits and is
   * sent after the resume. Resolves with the ack; rejects with a {@link PlazaError}.
   */
  publish(event: string, data?: Json, options: PublishOptions = {}): Promise<PublishAck> {
    if (this.status === 'ended') return Promise.reject(this.endedError());
    const frame: PublishFrame & { id: string } = { type: 'publish', room: this.room, event, id: newMessageId() };
    if (data !== undefined) frame.data = data;
    if (options.channel !== undefined) frame.channel = options.channel;
    if (options.topic !== undefined) frame.topic = options.topic;
    if (options.replyTo !== undefined) frame.reply_to = options.replyTo;
    if (options.echo !== undefined) frame.echo = options.echo;
    return new Promise<PublishAck>((resolve, reject) => {
      this.publishes.add(frame, resolve, reject);
      if (this.status === 'live') this.transport.send(frame);
    });
  }

  /**
   * Sends a request (`entity.create`, `lock.acquire`, `channel.subscribe`, …) and resolves with
   * its `result`, or rejects with the response's error, with code `timeout` after `timeoutMs`,
   * or with code `disconnected` if the connection dropped before the response (the outcome is
   * then unknown; requests are not re-sent).
   */
  request<R = { [key: string]: Json }>(op: string, args: { [key: string]: Json } = {}, options: RequestOptions = {}): Promise<R> {
    return this.requestWith<R>(op, args, options);
  }

  /**
   * Creates an entity; it shows in {@link state} at once under a temporary id (`~1`, `~2`, …)
   * and gets its server id when the server answers. Operations on the temporary id wait for
   * it. Resolves with the created entity.
   */
  createEntity(kind: string | undefined, data: Json = null, options: RequestOptions = {}): Promise<Entity> {
    if (this.status === 'ended') return Promise.reject(this.endedError());
    const tempId = `~${++this.tempCounter}`;
    const change: PendingChange = { op: 'create', id: tempId, data };
    if (kind !== undefined) change.kind = kind;
    const key = this.state._addPending(change);
    const args: { [key: string]: Json } = { data };
    if (kind !== undefined) args['kind'] = kind;
    const created = this.requestWith<{ entity: Entity }>('entity.create', args, options, {
      ok: (result) => this.state._completeCreate(key, tempId, result.entity),
      failed: () => {
        this.state._settlePending(key);
        this.createdIds.delete(tempId);
      },
    }).then((r) => r.entity);
    this.createdIds.set(
      tempId,
      created.then((e) => e.id),
    );
    // Operations waiting on the id report the failure themselves.
    created.catch(() => undefined);
    return created;
  }

  /** Replaces an entity's data (optimistically). Resolves with the entity after the change. */
  setEntity(id: string, data: Json, options: EntityOptions & RequestOptions = {}): Promise<Entity> {
    return this.changeEntity({ op: 'set', id, data }, 'entity.set', { id, data }, options).then((r) => r.entity);
  }

  /**
   * Merges top-level fields into an entity's data (optimistically; `null` removes a field).
   * Resolves with the entity after the change.
   */
  patchEntity(id: string, data: { [key: string]: Json }, options: EntityOptions & RequestOptions = {}): Promise<Entity> {
    return this.changeEntity({ op: 'patch', id, data }, 'entity.patch', { id, data }, options).then((r) => r.entity);
  }

  /** Deletes an entity (optimistically). */
  deleteEntity(id: string, options: EntityOptions & RequestOptions = {}): Promise<void> {
    return this.changeEntity({ op: 'delete', id }, 'entity.delete', { id }, options).then(() => undefined);
  }

  /**
   * Takes a lease on `object` (usually an entity id: then others cannot change the entity
   * while it is held). Not optimistic: rejects with `lock_held` if another member holds it.
   */
  async acquireLock(object: string, options: LockOptions & RequestOptions = {}): Promise<Lock> {
    const args: { [key: string]: Json } = { object: await this.serverIdOf(object) };
    if (options.ttlMs !== undefined) args['ttl_ms'] = options.ttlMs;
    const r = await this.requestWith<{ lock: Lock }>('lock.acquire', args, options, {
      ok: (result) => this.state._confirmLock(result.lock),
    });
    return r.lock;
  }

  /** Extends this member's lease on `object` by `ttlMs` from now. */
  async renewLock(object: string, options: LockOptions & RequestOptions = {}): Promise<Lock> {
    const args: { [key: string]: Json } = { object: await this.serverIdOf(object) };
    if (options.ttlMs !== undefined) args['ttl_ms'] = options.ttlMs;
    const r = await this.requestWith<{ lock: Lock }>('lock.renew', args, options, {
      ok: (result) => this.state._confirmLock(result.lock),
    });
    return r.lock;
  }

  /** Releases this member's lease on `object`. */
  async releaseLock(object: string, options: RequestOptions = {}): Promise<void> {
    const key = await this.serverIdOf(object);
    await this.requestWith<{ token: number }>('lock.release', { object: key }, options, {
      ok: (result) => this.state._confirmUnlock(key, result.token),
    });
  }

  /** The server's id for `id`: itself, or for a temporary `~N` the id its create got. */
  private serverIdOf(id: string): Promise<string> {
    return this.createdIds.get(id) ?? Promise.resolve(id);
  }

  /** Subscribes this session to a channel; resolves with its channels afterwards. */
  subscribe(channel: string, options: RequestOptions = {}): Promise<readonly string[]> {
    return this.channelRequest('channel.subscribe', channel, options);
  }

  /**
   * Changes this member's delivery policy (or sets one): only what `update` names changes.
   * Resolves with the whole policy afterwards; held events it now wants arrive first.
   */
  async updatePolicy(update: PolicyUpdate, options: RequestOptions = {}): Promise<DeliveryPolicy> {
    const r = await this.requestWith<{ policy: DeliveryPolicy }>('policy.update', update as { [key: string]: Json }, options, {
      ok: (result) => {
        this.policy = result.policy;
      },
    });
    return r.policy;
  }

  /** Back to every event at once; held events arrive first. */
  async clearPolicy(options: RequestOptions = {}): Promise<void> {
    await this.requestWith('policy.clear', {}, options, {
      ok: () => {
        this.policy = undefined;
      },
    });
  }

  /**
   * The past messages the join's `history` option asked for, oldest first, as of the last
   * `joined` or `resync` that carried them; `complete` is false when the room no longer held
   * all that was asked. Undefined without the option. Live events never appear here.
   */
  get history(): JoinHistory | undefined {
    return this.joinHistory;
  }

  /** The delivery policy in force, as joined with or as the server last confirmed it. */
  get deliveryPolicy(): DeliveryPolicy | undefined {
    return this.policy;
  }

  /** Unsubscribes this session from a channel (`main` too); resolves with its channels afterwards. */
  unsubscribe(channel: string, options: RequestOptions = {}): Promise<readonly string[]> {
    return this.channelRequest('channel.unsubscribe', channel, options);
  }

  /**
   * Spatial rooms: walks towards `to` at `speed` units per second. Resolves with the movement the
   * server stored (its target clamped into the plane); others see it as a `space.moved` event.
   */
  async moveTo(to: Point, speed: number, options: RequestOptions = {}): Promise<Movement> {
    const r = await this.requestWith<{ movement: Movement }>('space.move', { to, speed }, options, {
      ok: (result) => this.ownMovement(result.movement),
    });
    return r.movement;
  }

  /** Spatial rooms: be at `to` at once (a teleport). Resolves with the stored movement. */
  async jumpTo(to: Point, options: RequestOptions = {}): Promise<Movement> {
    const r = await this.requestWith<{ movement: Movement }>('space.jump', { to }, options, {
      ok: (result) => this.ownMovement(result.movement),
    });
    return r.movement;
  }

  /**
   * Spatial rooms: where `session` is at `t` (Unix ms, default now), interpolated from its last
   * movement; undefined for a member this one does not see.
   */
  positionOf(session: string, t: number = Date.now()): Point | undefined {
    const m = this.spaceView.movements.get(session);
    return m && positionAt(m, t);
  }

  /** Spatial rooms: the movements this member knows (its own and those of members it sees). */
  get movements(): ReadonlyMap<string, Movement> {
    return this.spaceView.movements;
  }

  /** Spatial rooms: the pairs in proximity this member is in, by pair id. */
  get proximityPairs(): ReadonlyMap<number, ProximityPair> {
    return this.spaceView.pairs;
  }

  private ownMovement(m: Movement): void {
    if (this.sessionId !== undefined) this.spaceView.movements.set(this.sessionId, m);
  }

  private channelRequest(op: string, channel: string, options: RequestOptions): Promise<readonly string[]> {
    return this.requestWith<{ channels: string[] }>(op, { channel }, options, {
      ok: (result) => {
        this.channelList = [...result.channels];
      },
    }).then(() => this.channelList);
  }

  /**
   * An entity change shown at once in {@link state}: settled when the server answers, kept
   * (as the server's version) if it accepted, gone if it refused or the answer was lost (a
   * resume then replays the change if it happened).
   */
  private async changeEntity(
    change: PendingChange,
    op: string,
    args: { [key: string]: Json },
    options: EntityOptions & RequestOptions,
  ): Promise<{ entity: Entity }> {
    if (this.status === 'ended') throw this.endedError();
    if (options.version !== undefined) args['version'] = options.version;
    const key = this.state._addPending(change);
    let id = change.id;
    const serverId = this.createdIds.get(id);
    if (serverId) {
      try {
        id = await serverId;
      } catch (err) {
        this.state._settlePending(key);
        throw err;
      }
      args['id'] = id;
    }
    return this.requestWith<{ entity: Entity }>(op, args, options, {
      ok: (result) => {
        this.state._settlePending(key);
        if (op === 'entity.delete') this.state._confirmDelete(id);
        else this.state._confirmEntity(result.entity);
      },
      failed: () => this.state._settlePending(key),
    });
  }

  /**
   * Sends a request; `hooks` run synchronously with the answer, before any later frame of the
   * room is handled (so the replica stays in seq order).
   */
  private requestWith<R>(
    op: string,
    args: { [key: string]: Json },
    options: RequestOptions,
    hooks: { ok?: (result: R) => void; failed?: () => void } = {},
  ): Promise<R> {
    if (this.status === 'ended') {
      hooks.failed?.();
      return Promise.reject(this.endedError());
    }
    const nonce = this.transport.nextNonce();
    const timeoutMs = options.timeoutMs ?? 10_000;
    return new Promise<R>((resolve, reject) => {
      const fail = (err: PlazaError) => {
        hooks.failed?.();
        reject(err);
      };
      const timer = setTimeout(() => {
        const index = this.outbox.findIndex((f) => f.type === 'request' && f.nonce === nonce);
        if (index >= 0) {
          // Never sent: it never will be.
          this.outbox.splice(index, 1);
          this.requests.forget(nonce);
        } else {
          this.requests.awaitLateAnswer(nonce, (result) => hooks.ok?.(result as R));
        }
        fail(new PlazaError('timeout', `request ${op} got no response within ${timeoutMs} ms`));
      }, timeoutMs);
      const succeed = (result: { [key: string]: Json }) => {
        hooks.ok?.(result as R);
        resolve(result as R);
      };
      this.requests.wait(nonce, succeed, fail, timer);
      this.sendOrQueue({ type: 'request', room: this.room, nonce, op, args });
    });
  }

  /** Sends a direct message to one session of the room (not sequenced, not acknowledged). */
  direct(to: string, event: string, data?: Json): void {
    if (this.status === 'ended') throw this.endedError();
    const frame: ClientFrame = { type: 'direct', room: this.room, to, event };
    if (data !== undefined) frame.data = data;
    this.sendOrQueue(frame);
  }

  /**
   * Leaves the room for good (the session and its resume token end). Pending publishes and
   * requests are rejected with code `closed`.
   */
  leave(): Promise<void> {
    if (this.status === 'ended') return Promise.resolve();
    // During a move the resume join is on its way on the new connection: a leave sent after
    // it is handled after it, and answered `left`.
    const wasLive = this.status === 'live' || this.moving;
    this.end(new PlazaError('closed', 'left the room'));
    if (!wasLive || !this.transport.send({ type: 'leave', room: this.room })) {
      this.transport.forget(this.room);
      return Promise.resolve();
    }
    return new Promise<void>((resolve) => {
      this.leaveWaiter = () => {
        this.transport.forget(this.room);
        resolve();
      };
    });
  }

  /** @internal Resolves when the first join is answered. */
  _waitJoined(): Promise<RoomHandle> {
    return new Promise((resolve, reject) => {
      this.joinWaiter = { resolve, reject };
    });
  }

  /** @internal The connection is open: (re)join, resuming if a session exists. */
  _sendJoin(): void {
    if (this.status === 'ended') return;
    clearTimeout(this.joinRetry);
    const generation = ++this.joinGeneration;
    const { ticket } = this.options;
    if (typeof ticket !== 'function') {
      // A ticket is single-use: a string goes with the handle's first join attempt only (also
      // one that resumes a `restore`d session), and is left out after. The session it made has
      // no user, so its resume token alone resumes it (docs/protocol.md, "Identities and
      // rights"); a ticket-only room wants a fresh ticket every time: pass a function there.
      const fresh = this.ticketSent ? undefined : ticket;
      if (ticket !== undefined) this.ticketSent = true;
      this.transport.send(this.joinFrame(fresh));
      return;
    }
    // A fresh ticket for every join: tickets are single-use. A fetch that outlives its
    // connection (or a newer join) is dropped, so that one join goes per connection.
    const current = () => this.status !== 'ended' && generation === this.joinGeneration;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(
        () => reject(new PlazaError('timeout', `the ticket function took over ${TICKET_TIMEOUT_MS} ms`)),
        TICKET_TIMEOUT_MS,
      );
    });
    Promise.race([Promise.resolve().then(ticket), timeout])
      .finally(() => clearTimeout(timer))
      .then(
        (fresh) => {
          if (current()) this.transport.send(this.joinFrame(fresh));
        },
        (err: unknown) => {
          if (!current()) return;
          const error = err instanceof PlazaError ? err : new PlazaError('ticket_invalid', `getting a ticket failed: ${String(err)}`);
          if (this.joinWaiter) {
            this.failJoin(error);
          } else {
            // A resume: the fetch may fail for a while (a network blip); keep trying.
            this.retryJoin();
          }
        },
      );
  }

  /** Sends the join again after a backoff delay. */
  private retryJoin(): void {
    const delayMs = backoffDelay(this.joinAttempt++, this.transport.backoff ?? {});
    clearTimeout(this.joinRetry);
    this.joinRetry = setTimeout(() => this._sendJoin(), delayMs);
  }

  private joinFrame(ticket: string | undefined): ClientFrame {
    const { channels } = this.options;
    let { name, platform } = this.options;
    if (ticket === undefined && this.options.ticket !== undefined && this.token !== undefined) {
      // Resuming a session a ticket made, without one: the session's own name and platform
      // (a server without keys wants a name, and a resync makes a session of them).
      const me = this.memberList.find((m) => m.session === this.sessionId);
      name ??= me?.name;
      platform ??= me?.platform;
    }
    const frame: ClientFrame = { type: 'join', room: this.room };
    if (ticket !== undefined) frame.ticket = ticket;
    if (name !== undefined) frame.name = name;
    if (platform !== undefined) frame.platform = platform;
    if (channels !== undefined) frame.channels = channels;
    if (this.token !== undefined) frame.resume = { token: this.token, last_seq: this.seq };
    if (this.policy !== undefined) frame.policy = this.policy;
    if (this.options.history !== undefined) frame.history = this.options.history;
    return frame;
  }

  /** @internal The connection dropped: in-flight requests fail, publishes wait for the resume. */
  _onDisconnect(): void {
    this.releaseHeld();
    if (this.status === 'ended') {
      this.leaveWaiter?.();
      return;
    }
    if (this.status === 'live') this.status = 'rejoining';
    this.moving = false;
    clearTimeout(this.joinRetry);
    this.joinGeneration++;
    this.requests.dropSent((nonce) => this.outbox.some((f) => f.type === 'request' && f.nonce === nonce));
  }

  /**
   * @internal The server closed the connection with 4005: the room's history was rewritten (a
   * cluster's broker failover lost events this client may have seen, and the room went on with
   * others under the same seqs). The session is not resumed: the next join is a fresh one,
   * whose answer the app gets as a `resync` with reason `history_rewritten` (discard the room
   * state held). Unacknowledged publishes are sent again, as after any resync: the new session
   * does not know their ids, so one the room kept may be ordered twice.
   */
  _onHistoryRewritten(): void {
    if (this.status === 'ended' || this.token === undefined) return;
    this.token = undefined;
    this.rewritten = true;
  }

  /**
   * @internal The connection is moving to another transport: what the app sends waits for the
   * resume on the new one (nothing waits for an answer: see {@link _busy}).
   */
  _beginMove(): void {
    this.releaseHeld();
    if (this.status === 'ended') return;
    this.moving = true;
    if (this.status === 'live') this.status = 'rejoining';
    clearTimeout(this.joinRetry);
    this.joinGeneration++;
  }

  /**
   * @internal Whether the room waits for something a move could lose: a join, an answer, or
   * the `left` of a leave.
   */
  _busy(): boolean {
    return (
      this.status === 'joining' ||
      this.status === 'rejoining' ||
      this.requests.inFlight() > 0 ||
      this.leaveWaiter !== undefined
    );
  }

  /** @internal Whether the handle has ended (left, closed). */
  _ended(): boolean {
    return this.status === 'ended';
  }

  /** @internal The client was closed. */
  _onClientClosed(): void {
    this.releaseHeld();
    if (this.status === 'ended') {
      this.leaveWaiter?.();
      return;
    }
    const error = new PlazaError('closed', 'the client was closed');
    this.end(error);
    this.emit('closed', { reason: 'client_closed', error });
  }

  /** @internal A frame for this room. */
  _handle(frame: ServerFrame): void {
    if (this.held) this.held.push(frame);
    else this.handleNow(frame);
  }

  /**
   * Holds the room's frames from the first `joined` on until the next macrotask. `join()`
   * resolves on `joined`, but the code awaiting it resumes only after the current task's
   * microtasks: frames that came in the same chunk as `joined` (a backend's instant welcome,
   * read together by a busy client) would be handled before it attached its handlers, and
   * missed. A macrotask runs after every microtask, however many `await`s stand between.
   * Holding whole frames, acks and responses included, keeps their order and `lastSeq`'s.
   */
  private holdUntilAttached(): void {
    this.held = [];
    const release = () => this.releaseHeld();
    // setImmediate where there is one (Node): a timer may be clamped or throttled.
    const { setImmediate } = globalThis as { setImmediate?: (callback: () => void) => unknown };
    if (setImmediate) setImmediate(release);
    else setTimeout(release, 0);
  }

  /** Handles the held frames, in the order they came (before anything that comes after). */
  private releaseHeld(): void {
    const held = this.held;
    if (!held) return;
    this.held = undefined;
    for (const frame of held) this.handleNow(frame);
  }

  private handleNow(frame: ServerFrame): void {
    switch (frame.type) {
      case 'joined':
      case 'resync':
        this.onJoined(frame);
        break;
      case 'event':
        this.onEvent(frame);
        break;
      case 'batch': {
        // Held by the delivery policy: each event as if it had come alone, then the boundary;
        // what already came (on the other connection, during a move) is not told again.
        const fresh = frame.events.filter((e) => e.seq > this.seq);
        for (const e of fresh) this.onEvent(e);
        if (fresh.length > 0) this.emit('batch', fresh);
        break;
      }
      case 'ack':
        this.onAck(frame);
        break;
      case 'response':
        this.onResponse(frame);
        break;
      case 'direct':
        this.transport.dispatch(this.room, frame);
        this.emit('direct', frame);
        break;
      case 'error':
        this.onError(frame);
        break;
      case 'left':
        this.leaveWaiter?.();
        break;
      case 'closed': {
        const said = frame.message === undefined ? '' : ` (${frame.message})`;
        this.end(new PlazaError('closed', `room closed: ${frame.reason}${said}`));
        this.transport.forget(this.room);
        const closed: RoomClosed = { reason: frame.reason };
        if (frame.message !== undefined) closed.message = frame.message;
        this.emit('closed', closed);
        break;
      }
      default:
        break;
    }
  }

  private onJoined(frame: JoinedFrame): void {
    this.moving = false;
    if (this.status === 'ended') return;
    this.token = frame.resume_token;
    this.sessionId = frame.session;
    this.memberList = [...frame.members];
    this.channelList = [...frame.channels];
    this.joinAttempt = 0;
    // On a resumed `joined` the missed events (seq ≤ frame.seq) follow: keep last_seq.
    if (!frame.resumed) this.seq = frame.seq;
    if (frame.snapshot) {
      this.lastSnapshot = frame.snapshot;
      this.state._reset(frame.snapshot);
    }
    if (frame.space) this.spaceView.reset(frame.space);
    if (frame.history) this.joinHistory = frame.history;
    this.status = 'live';
    // What waited goes first, so that what listeners send below cannot overtake it.
    // Unacknowledged publishes go again, with their ids: the server orders each id once.
    for (const frame of this.publishes.frames()) this.transport.send(frame);
    for (const queued of this.outbox.splice(0)) this.transport.send(queued);
    if (this.rewritten) {
      // A fresh join after 4005: to the app, a resync (its room state is void).
      this.rewritten = false;
      this.emit('resync', { ...frame, type: 'resync', reason: 'history_rewritten' });
    } else if (frame.type === 'resync') this.emit('resync', frame);
    else this.emit('joined', frame);
    this.emit('members', this.memberList);
    const waiter = this.joinWaiter;
    this.joinWaiter = undefined;
    if (waiter) {
      this.holdUntilAttached();
      waiter.resolve(this);
    }
  }

  private onEvent(frame: RoomEvent): void {
    if (this.status === 'ended' || frame.seq <= this.seq) return;
    this.seq = frame.seq;
    if (frame.kind === 'presence.join') {
      this.memberList = [...this.memberList.filter((m) => m.session !== frame.member.session), frame.member].sort(
        (a, b) => (a.session < b.session ? -1 : a.session > b.session ? 1 : 0),
      );
    } else if (frame.kind === 'presence.leave') {
      this.memberList = this.memberList.filter((m) => m.session !== frame.session);
    }
    this.state._applyEvent(frame);
    const spatial = isSpaceEvent(frame);
    if (spatial) this.spaceView.apply(frame, this.sessionId);
    // `joined` lists every member's movement, but only those in the area of interest send
    // `interest.leave`: a departure drops the others'.
    else if (frame.kind === 'presence.leave') this.spaceView.movements.delete(frame.session);
    if (frame.kind === 'presence.join' || frame.kind === 'presence.leave') this.emit('members', this.memberList);
    this.transport.dispatch(this.room, frame);
    this.emit('event', frame);
    if (frame.kind === 'message') this.emit('message', frame);
    else if (frame.kind.startsWith('presence.')) this.emit('presence', frame as PresenceEvent);
    else if (frame.kind.startsWith('entity.')) this.emit('entity', frame as EntityEvent);
    else if (frame.kind.startsWith('lock.')) this.emit('lock', frame as LockEvent);
    else if (spatial) this.emit('space', frame);
  }

  private onAck(frame: AckFrame): void {
    this.seq = Math.max(this.seq, frame.seq);
    if (frame.id === undefined) return;
    this.publishes.ack(frame.id, { seq: frame.seq, duplicate: frame.duplicate === true });
  }

  private onResponse(frame: ResponseFrame): void {
    const resultSeq = frame.result?.['seq'];
    if (typeof resultSeq === 'number') this.seq = Math.max(this.seq, resultSeq);
    this.requests.answer(frame);
  }

  private onError(frame: ErrorFrame): void {
    const error = new PlazaError(frame.code, frame.message);
    const ref = frame.ref ?? {};
    if (ref.frame === 'join') {
      // Joined already: the answer to a join that was sent twice (never meant to happen).
      if (this.status === 'live') return;
      const firstJoinGivesUp = this.joinWaiter !== undefined && this.joinAttempt + 1 >= FIRST_JOIN_ATTEMPTS;
      if (TRANSIENT_JOIN_ERRORS.has(frame.code) && this.status !== 'ended' && !firstJoinGivesUp) {
        // The server cannot reach its cluster right now: ask again, backing off.
        this.retryJoin();
        return;
      }
      this.failJoin(error);
      return;
    }
    if (ref.frame === 'publish' && ref.id !== undefined && this.publishes.refuse(ref.id, error)) return;
    if (ref.frame === 'leave') {
      this.leaveWaiter?.();
      return;
    }
    this.emit('error', error);
  }

  /** The join was refused for good: the first join rejects, a rejoin closes the handle. */
  private failJoin(error: PlazaError): void {
    if (this.joinWaiter) {
      const waiter = this.joinWaiter;
      this.joinWaiter = undefined;
      this.end(error);
      this.transport.forget(this.room);
      waiter.reject(error);
    } else if (this.status !== 'ended') {
      // A resume was refused (e.g. the room is gone): this membership is over.
      this.end(error);
      this.transport.forget(this.room);
      this.emit('closed', { reason: error.code, error });
    }
  }

  private sendOrQueue(frame: ClientFrame): void {
    if (this.status !== 'live' || !this.transport.send(frame)) this.outbox.push(frame);
  }

  /**
   * @internal Runs `callback` once when this handle ends: a leave, a deletion, a failed rejoin
   * or the client closed — unlike `closed`, which a `leave` does not emit. Returns its removal.
   * Runs at once if the handle has already ended.
   */
  _whenEnded(callback: () => void): () => void {
    if (this.status === 'ended') {
      callback();
      return () => undefined;
    }
    this.endedCallbacks.add(callback);
    return () => this.endedCallbacks.delete(callback);
  }

  private end(error: PlazaError): void {
    if (this.status === 'ended') return;
    this.status = 'ended';
    clearTimeout(this.joinRetry);
    this.joinWaiter?.reject(error);
    this.joinWaiter = undefined;
    this.publishes.rejectAll(error);
    this.requests.rejectAll(error);
    this.outbox.length = 0;
    const callbacks = [...this.endedCallbacks];
    this.endedCallbacks.clear();
    for (const callback of callbacks) callback();
  }

  private endedError(): PlazaError {
    return new PlazaError('closed', `room ${this.room} is no longer joined`);
  }
}

function isSpaceEvent(e: RoomEvent): e is SpaceEvent {
  return e.kind === 'space.moved' || e.kind.startsWith('interest.') || e.kind.startsWith('proximity.');
}
