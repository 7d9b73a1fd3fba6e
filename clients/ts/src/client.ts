import { backoffDelay, type BackoffOptions } from './backoff.js';
import { Emitter } from './emitter.js';
import { PlazaError } from './errors.js';
import type { ClientFrame, CompactKey, DirectFrame, Json, MessageEvent, RoomEvent, ServerFrame } from './frames.js';
import { RoomHandle } from './room.js';
import type { JoinOptions, RoomTransport } from './room-options.js';
import { transportConstructor, type TransportName } from './http-socket.js';
import { messageText, OPEN, resolveWebSocket, type WebSocketConstructor, type WebSocketLike } from './socket.js';
import { SilenceWatch } from './silence.js';

/** Connection states, in the order a client usually goes through them. */
export type ConnectionState = 'idle' | 'connecting' | 'open' | 'reconnecting' | 'closed';

/** Options of {@link PlazaClient}. */
export interface PlazaClientOptions {
  /** The one room this client will join: added to the URL as `?room=<id>` (a load-balancer hint). */
  room?: string;
  /** WebSocket constructor; default the global `WebSocket`. On Node 20 pass `ws`'s `WebSocket`. */
  WebSocket?: WebSocketConstructor;
  /**
   * How the server sends room messages over WebSocket (docs/protocol.md, "Compact messages"):
   * `'compact'` (the default) offers the subprotocol `plaza.v1.compact`, where a message event
   * is an array of its values, about half of v1's bytes; `'json'` asks for nothing and gets v1
   * objects. The application sees the same event objects either way; the HTTP transports are
   * always v1.
   */
  encoding?: 'compact' | 'json';
  /** Reconnect automatically after a drop (default `true`), with these backoff settings. */
  reconnect?: boolean | BackoffOptions;
  /** Called with every sequenced event and direct message of every room, once, in order. */
  onEvent?: (room: string, frame: RoomEvent | DirectFrame) => void;
  /**
   * The transports to try, in order (default `['websocket', 'sse', 'polling']`): when one
   * cannot open (refused, or not open within `openTimeoutMs`) the next is tried at once. Every
   * reconnect starts again from the first, so a client that fell back goes back to WebSocket
   * when it can. One name forces that transport.
   */
  transports?: TransportName[];
  /** How long a transport may take to open before the next is tried (default 5000 ms). */
  openTimeoutMs?: number;
  /**
   * How long the open connection may be silent before the client sends a `ping`; silent as
   * long again, it is taken for dead and the client reconnects and resumes (default 30000 ms; 0:
   * never). A cut path (a partition, a balancer that lost the node) sends no close: this is how
   * the client notices it. Keep it above the worst round trip expected.
   */
  silenceMs?: number;
  /**
   * On a fallback transport, how often to try the first one again (default 30000 ms; 0: never).
   * When it opens, the rooms move over at a quiet moment (no request waiting for its answer):
   * each resumes on the new connection, which takes its session over on the server, and the old
   * connection is closed once the server has let go of it. The app sees the same events, once,
   * in order; {@link PlazaClient.transportName} and the `transport` event tell, and each room
   * is briefly not `live` and emits `joined` (resumed) and `members` again, as after a
   * reconnect.
   */
  upgradeProbeMs?: number;
  /**
   * The identity token (a JWT from the application's backend; docs/protocol.md, "Identities
   * and rights"), or a function that fetches one. It goes with every connect (`?token=`); a
   * function is also called again before the token expires, and the fresh token is sent on the
   * open connection (`auth`), so the connection never lapses. A token is reused while it has
   * more than 30 s left. When the server closed the connection because the token expired
   * (4004), the reconnect fetches a fresh one and every room resumes. A function may give
   * `undefined`: connect without a token (a server in development mode).
   */
  token?: string | (() => string | undefined | Promise<string | undefined>);
}

/** Who the server says this client is (from its token). */
export interface Identity {
  user: string;
  name?: string;
  /** When the token expires (Unix ms). */
  expiresAt: number;
}

/** Events of a {@link PlazaClient}, with their listener arguments. */
export type ClientEvents = {
  /** Every state change. */
  state: [ConnectionState];
  connecting: [];
  open: [];
  reconnecting: [{ attempt: number; delayMs: number }];
  closed: [];
  /** The connection moved to another transport without dropping (an upgrade). */
  transport: [TransportName];
  /** The server verified the token (on connect and after every refresh). */
  authed: [Identity];
  /** An `error` frame not about a room (e.g. `rate_limited`, `bad_json`). */
  error: [PlazaError];
};

/**
 * A connection to a Plaza server (`ws://HOST:PORT/v1/ws`), shared by the rooms it joins.
 * Reconnects on its own with exponential backoff and jitter, and resumes every room — except
 * after close code 4005 (a cluster rewrote a room's history after a broker failover): then every
 * room joins afresh, and emits `resync` with reason `history_rewritten`.
 *
 * ```ts
 * const client = new PlazaClient('ws://127.0.0.1:7700/v1/ws', { room: 'lobby' });
 * const lobby = await client.join('lobby', { name: 'ann' });
 * lobby.on('message', (m) => console.log(m.event, m.data));
 * await lobby.publish('chat', { text: 'hi' });
 * ```
 */
export class PlazaClient extends Emitter<ClientEvents> {
  /** The WebSocket URL (with the room hint, if any). */
  readonly url: string;
  private readonly WebSocketImpl: WebSocketConstructor;
  private readonly encoding: 'compact' | 'json';
  private readonly compactKeys = new WeakMap<WebSocketLike, CompactKeys>();
  private readonly backoff: BackoffOptions | undefined;
  private readonly onEvent: PlazaClientOptions['onEvent'];
  private readonly rooms = new Map<string, RoomHandle>();
  private socket: WebSocketLike | undefined;
  private currentState: ConnectionState = 'idle';
  private attempt = 0;
  private reconnectTimer: ReturnType<typeof setTimeout> | undefined;
  private nonce = 0;
  private openWaiters: Array<{ resolve: () => void; reject: (err: PlazaError) => void }> = [];
  private readonly transport: RoomTransport;
  private readonly transports: TransportName[];
  private readonly openTimeoutMs: number;
  private readonly silenceMs: number;
  private silence: SilenceWatch | undefined;
  /** The transport being tried or used (an index into `transports`). */
  private transportIndex = 0;
  private openTimer: ReturnType<typeof setTimeout> | undefined;
  private readonly upgradeProbeMs: number;
  /** Trying the first transport again while on a fallback (see `upgradeProbeMs`). */
  private upgrade: Upgrade | undefined;
  private upgradeTimer: ReturnType<typeof setTimeout> | undefined;
  /** The connection rooms moved away from, read until the server lets go of it. */
  private retiring: Retiring | undefined;
  private readonly tokenSource: PlazaClientOptions['token'];
  /** The last token fetched and its `exp` (Unix ms; 0 when unknown). */
  private token: { value: string; expiresAt: number } | undefined;
  /** Bumped by every fetch, so only the latest one's result is used. */
  private tokenFetch = 0;
  private refreshTimer: ReturnType<typeof setTimeout> | undefined;
  private currentIdentity: Identity | undefined;

  constructor(url: string, options: PlazaClientOptions = {}) {
    super();
    const parsed = new URL(url);
    if (options.room !== undefined) parsed.searchParams.set('room', options.room);
    this.url = parsed.toString();
    this.transports = options.transports?.length ? [...options.transports] : ['websocket', 'sse', 'polling'];
    this.openTimeoutMs = options.openTimeoutMs ?? 5000;
    this.silenceMs = options.silenceMs ?? 30_000;
    this.upgradeProbeMs = options.upgradeProbeMs ?? 30_000;
    this.encoding = options.encoding ?? 'compact';
    // Without WebSocket (and none given) only the HTTP transports can work.
    this.WebSocketImpl = this.transports.includes('websocket')
      ? resolveWebSocket(options.WebSocket)
      : (undefined as unknown as WebSocketConstructor);
    const reconnect = options.reconnect ?? true;
    this.backoff = reconnect === false ? undefined : reconnect === true ? {} : reconnect;
    this.onEvent = options.onEvent;
    this.tokenSource = options.token;
    this.transport = {
      send: (frame) => this.send(frame),
      nextNonce: () => ++this.nonce,
      forget: (room) => {
        this.rooms.delete(room);
      },
      dispatch: (room, frame) => this.onEvent?.(room, frame),
      backoff: this.backoff,
    };
  }

  /** Who the server says this client is, once a token was verified. */
  get identity(): Identity | undefined {
    return this.currentIdentity;
  }

  /** The current connection state. */
  get state(): ConnectionState {
    return this.currentState;
  }

  /** The transport of the open connection (or the one being tried). */
  get transportName(): TransportName {
    return this.transports[this.transportIndex]!;
  }

  /** Opens the connection (if not open yet); resolves once it is open. */
  connect(): Promise<void> {
    if (this.currentState === 'closed') return Promise.reject(new PlazaError('closed', 'the client was closed'));
    if (this.currentState === 'open') return Promise.resolve();
    const opened = new Promise<void>((resolve, reject) => this.openWaiters.push({ resolve, reject }));
    if (this.currentState === 'idle') this.openSocket();
    return opened;
  }

  /**
   * Joins a room; resolves with its {@link RoomHandle} on `joined`, rejects with a
   * {@link PlazaError} on `error` (e.g. `room_not_found`, `ticket_used`). Connects if needed.
   * The room's events after the snapshot wait for the next macrotask: handlers attached where
   * the `await` resumes (before awaiting anything else) get every one of them.
   */
  async join(room: string, options: JoinOptions): Promise<RoomHandle> {
    if (this.rooms.has(room)) throw new PlazaError('already_joined', `already in room ${room}`);
    const handle = new RoomHandle(room, options, this.transport);
    this.rooms.set(room, handle);
    const joined = handle._waitJoined();
    if (this.currentState === 'open') handle._sendJoin();
    else void this.connect().catch(() => undefined);
    return joined;
  }

  /** The handle of a joined room, if any. */
  room(room: string): RoomHandle | undefined {
    return this.rooms.get(room);
  }

  /** Sends an application `ping`; the server answers `pong` (not surfaced yet). */
  ping(ts?: number): void {
    this.send(ts === undefined ? { type: 'ping' } : { type: 'ping', ts });
  }

  /**
   * Closes the connection for good: no reconnect. Sessions are disconnected, not left (call
   * {@link RoomHandle.leave} first to end them); pending operations reject with `closed`.
   */
  close(): void {
    if (this.currentState === 'closed') return;
    clearTimeout(this.reconnectTimer);
    clearTimeout(this.openTimer);
    clearTimeout(this.refreshTimer);
    this.watchSilence(undefined);
    this.tokenFetch += 1;
    this.stopUpgrade();
    this.finishRetiring();
    const socket = this.socket;
    this.socket = undefined;
    if (socket) {
      detach(socket);
      socket.close(1000);
    }
    for (const room of [...this.rooms.values()]) room._onClientClosed();
    this.rooms.clear();
    for (const waiter of this.openWaiters.splice(0)) waiter.reject(new PlazaError('closed', 'the client was closed'));
    this.setState('closed');
  }

  /**
   * Test hook: drops the socket without a `leave`, as a network failure would, and reconnects
   * as usual — after `gate` settles, when given.
   * @internal
   */
  _dropConnection(gate?: Promise<unknown>): void {
    const socket = this.socket;
    if (!socket) return;
    detach(socket);
    socket.close(1000);
    this.onSocketLost(socket, gate);
  }

  private send(frame: ClientFrame): boolean {
    const socket = this.socket;
    if (!socket || socket.readyState !== OPEN || this.currentState !== 'open') return false;
    socket.send(JSON.stringify(frame));
    return true;
  }

  private openSocket(): void {
    if (this.currentState === 'closed') return;
    if (this.currentState !== 'reconnecting') this.setState('connecting');
    if (this.tokenSource === undefined) {
      this.openSocketAt(this.url);
      return;
    }
    const fetch = ++this.tokenFetch;
    this.currentToken(false).then(
      (token) => {
        if (fetch !== this.tokenFetch || this.currentState === 'closed' || this.socket) return;
        this.openSocketAt(token === undefined ? this.url : withToken(this.url, token));
      },
      (err: unknown) => {
        if (fetch !== this.tokenFetch || this.currentState === 'closed') return;
        this.emit('error', new PlazaError('token_unavailable', `the token could not be fetched: ${String(err)}`));
        this.retryLater();
      },
    );
  }

  /**
   * The token to connect with: the last one while it has over 30 s left (unless `fresh`),
   * else a new one from the source.
   */
  private async currentToken(fresh: boolean): Promise<string | undefined> {
    const source = this.tokenSource!;
    const held = this.token;
    if (!fresh && held && (held.expiresAt === 0 || held.expiresAt - Date.now() > TOKEN_REUSE_MARGIN_MS)) {
      return held.value;
    }
    const value = typeof source === 'string' ? source : await source();
    this.token = value === undefined ? undefined : { value, expiresAt: tokenExpiry(value) };
    return value;
  }

  /** After `authed`: fetches a fresh token before this one expires and sends it in `auth`. */
  private scheduleRefresh(expiresAt: number): void {
    clearTimeout(this.refreshTimer);
    if (typeof this.tokenSource !== 'function') return;
    // At 80 % of what is left, so a slow backend still answers in time.
    const delay = Math.max(1000, (expiresAt - Date.now()) * 0.8);
    this.refreshTimer = setTimeout(() => {
      const fetch = ++this.tokenFetch;
      this.currentToken(true).then(
        (token) => {
          if (fetch === this.tokenFetch && token !== undefined) this.send({ type: 'auth', token });
        },
        (err: unknown) => {
          // The server closes at expiry (4004); the reconnect tries the source again.
          this.emit('error', new PlazaError('token_unavailable', `the token could not be refreshed: ${String(err)}`));
        },
      );
    }, delay);
  }

  /** A socket of transport `name` at `url`; over WebSocket it offers the chosen encoding. */
  private newSocket(name: TransportName, url: string): WebSocketLike {
    const Impl = transportConstructor(name, this.WebSocketImpl);
    return name === 'websocket' && this.encoding === 'compact' ? new Impl(url, [COMPACT_SUBPROTOCOL]) : new Impl(url);
  }

  private openSocketAt(url: string): void {
    let socket: WebSocketLike;
    try {
      socket = this.newSocket(this.transportName, url);
    } catch (err) {
      const error = new PlazaError('invalid_request', `cannot open ${this.url}: ${String(err)}`);
      for (const waiter of this.openWaiters.splice(0)) waiter.reject(error);
      this.setState('closed');
      return;
    }
    this.socket = socket;
    let opened = false;
    clearTimeout(this.openTimer);
    this.openTimer = setTimeout(() => {
      if (this.socket !== socket || opened) return;
      detach(socket);
      socket.close();
      this.onNotOpened(socket);
    }, this.openTimeoutMs);
    socket.onopen = () => {
      if (this.socket !== socket) return;
      opened = true;
      clearTimeout(this.openTimer);
      this.attempt = 0;
      this.setState('open');
      this.watchSilence(socket);
      for (const waiter of this.openWaiters.splice(0)) waiter.resolve();
      for (const room of this.rooms.values()) room._sendJoin();
      this.scheduleUpgrade();
    };
    this.attach(socket, () => opened);
  }

  /** Routes `socket`'s messages and its end (`opened()`: whether it had opened). */
  private attach(socket: WebSocketLike, opened: () => boolean): void {
    socket.onmessage = (ev) => {
      if (this.socket !== socket) return;
      this.silence?.heardNow();
      this.onMessage(socket, ev.data);
    };
    socket.onerror = () => {
      // A `close` follows; nothing to do here.
    };
    socket.onclose = (ev) => {
      if (this.socket !== socket) return;
      if (opened()) this.onSocketLost(socket, undefined, ev?.code);
      else this.onNotOpened(socket);
    };
  }

  /** On a fallback transport: tries the first one again in `upgradeProbeMs`. */
  private scheduleUpgrade(): void {
    clearTimeout(this.upgradeTimer);
    if (this.transportIndex === 0 || this.upgradeProbeMs <= 0 || this.currentState !== 'open') return;
    this.upgradeTimer = setTimeout(() => this.probeUpgrade(), this.upgradeProbeMs);
  }

  private probeUpgrade(): void {
    if (this.currentState !== 'open' || this.transportIndex === 0 || this.upgrade) return;
    let probe: WebSocketLike;
    try {
      const url = this.token ? withToken(this.url, this.token.value) : this.url;
      probe = this.newSocket(this.transports[0]!, url);
    } catch {
      this.scheduleUpgrade();
      return;
    }
    const upgrade: Upgrade = { socket: probe, timer: undefined, waits: 0 };
    this.upgrade = upgrade;
    const fail = () => {
      if (this.upgrade !== upgrade) return;
      this.stopUpgrade();
      this.scheduleUpgrade();
    };
    upgrade.timer = setTimeout(fail, this.openTimeoutMs);
    probe.onmessage = () => undefined;
    probe.onerror = () => undefined;
    probe.onclose = fail;
    probe.onopen = () => {
      if (this.upgrade !== upgrade) return;
      clearTimeout(upgrade.timer);
      this.moveWhenQuiet(upgrade);
    };
  }

  /**
   * Moves the rooms to the probe once nothing waits for an answer on the current connection
   * (a request in flight could be answered on either); gives up after ~10 s of traffic.
   */
  private moveWhenQuiet(upgrade: Upgrade): void {
    if (this.upgrade !== upgrade) return;
    const old = this.socket;
    const busy =
      old === undefined ||
      (old.bufferedAmount ?? 0) > 0 ||
      [...this.rooms.values()].some((room) => room._busy());
    if (!busy) {
      this.upgrade = undefined;
      this.move(old, upgrade.socket);
      return;
    }
    if (++upgrade.waits > UPGRADE_QUIET_WAITS) {
      this.stopUpgrade();
      this.scheduleUpgrade();
      return;
    }
    upgrade.timer = setTimeout(() => this.moveWhenQuiet(upgrade), UPGRADE_QUIET_PAUSE_MS);
  }

  /** The rooms resume on `next`; `old` is read until the server has taken every room from it. */
  private move(old: WebSocketLike, next: WebSocketLike): void {
    this.finishRetiring();
    const rooms = [...this.rooms.values()];
    // Rooms that ended (a leave waiting for `left`) are not taken over: not waited for.
    const moving = rooms.filter((room) => !room._ended()).length;
    const retiring: Retiring = { socket: old, rooms: moving, timer: undefined };
    this.retiring = retiring;
    old.onopen = () => undefined;
    old.onerror = () => undefined;
    old.onclose = () => {
      if (this.retiring !== retiring) return;
      clearTimeout(retiring.timer);
      this.retiring = undefined;
    };
    old.onmessage = (ev) => this.onRetiringMessage(retiring, ev.data);
    retiring.timer = setTimeout(() => {
      if (this.retiring === retiring) this.finishRetiring();
    }, RETIRE_TIMEOUT_MS);
    this.socket = next;
    this.transportIndex = 0;
    this.attach(next, () => true);
    this.watchSilence(next);
    for (const room of rooms) room._beginMove();
    for (const room of rooms) room._sendJoin();
    this.emit('transport', this.transportName);
    if (moving === 0) this.finishRetiring();
  }

  /**
   * A frame on the connection the rooms left: what it still carries from before the move
   * (events, acks, answers) counts, once (rooms drop what they already have by seq); the
   * server's `closed` with `resumed_elsewhere` marks a room taken over; errors are about what
   * the resume does again.
   */
  private onRetiringMessage(retiring: Retiring, data: unknown): void {
    if (this.retiring !== retiring) return;
    const frame = parseFrame(data, this.keysOf(retiring.socket));
    if (frame === undefined) return;
    switch (frame.type) {
      case 'closed':
        // `resumed_elsewhere` marks a room taken over; another end (`room_deleted`) is news.
        if (frame.reason !== 'resumed_elsewhere') this.onFrame(frame);
        if (--retiring.rooms <= 0) this.finishRetiring();
        return;
      case 'error':
      case 'joined':
      case 'resync':
        return;
      default:
        this.onFrame(frame);
    }
  }

  private finishRetiring(): void {
    const retiring = this.retiring;
    if (!retiring) return;
    this.retiring = undefined;
    clearTimeout(retiring.timer);
    detach(retiring.socket);
    retiring.socket.close(1000);
  }

  private stopUpgrade(): void {
    clearTimeout(this.upgradeTimer);
    const upgrade = this.upgrade;
    if (!upgrade) return;
    this.upgrade = undefined;
    clearTimeout(upgrade.timer);
    detach(upgrade.socket);
    upgrade.socket.close(1000);
  }

  /** `socket` could not open: the next transport at once, or after the last a backoff. */
  private onNotOpened(socket: WebSocketLike): void {
    if (this.socket !== socket) return;
    clearTimeout(this.openTimer);
    if (this.transportIndex + 1 < this.transports.length) {
      this.transportIndex += 1;
      this.socket = undefined;
      this.openSocket();
      return;
    }
    this.onSocketLost(socket);
  }

  /** The open socket ended (`code`: the server's close code, when known); reconnects. */
  private onSocketLost(socket: WebSocketLike, gate?: Promise<unknown>, code?: number): void {
    if (this.socket !== socket) return;
    this.socket = undefined;
    clearTimeout(this.refreshTimer);
    this.watchSilence(undefined);
    this.stopUpgrade();
    this.finishRetiring();
    for (const room of [...this.rooms.values()]) {
      room._onDisconnect();
      // The history a room showed may not be the room's any more: join afresh, no resume.
      if (code === HISTORY_REWRITTEN) room._onHistoryRewritten();
    }
    this.retryLater(gate);
  }

  /** Watches `socket` (the open one) for silence, or nothing when `undefined`. */
  private watchSilence(socket: WebSocketLike | undefined): void {
    this.silence?.stop();
    this.silence = undefined;
    if (!socket || this.silenceMs <= 0) return;
    this.silence = new SilenceWatch(
      this.silenceMs,
      () => this.send({ type: 'ping' }),
      () => {
        // Nothing came back: the path is gone, though no close said so.
        if (this.socket !== socket) return;
        detach(socket);
        socket.close(1000);
        this.onSocketLost(socket);
      },
    );
  }

  /** Connects again after a backoff (once `gate` settles, when given), or closes without one. */
  private retryLater(gate?: Promise<unknown>): void {
    if (this.currentState === 'closed') return;
    if (!this.backoff) {
      this.close();
      return;
    }
    const delayMs = backoffDelay(this.attempt, this.backoff);
    this.attempt += 1;
    this.setState('reconnecting');
    this.emit('reconnecting', { attempt: this.attempt, delayMs });
    const reopen = () => {
      this.reconnectTimer = setTimeout(() => {
        // Every reconnect tries the preferred transport first.
        this.transportIndex = 0;
        this.openSocket();
      }, delayMs);
    };
    if (gate) void gate.then(reopen, reopen);
    else reopen();
  }

  private onMessage(socket: WebSocketLike, data: unknown): void {
    const frame = parseFrame(data, this.keysOf(socket));
    if (frame !== undefined) this.onFrame(frame);
  }

  /** The compact keys `socket`'s rooms were given: each connection has its own. */
  private keysOf(socket: WebSocketLike): CompactKeys {
    let keys = this.compactKeys.get(socket);
    if (keys === undefined) {
      keys = new CompactKeys();
      this.compactKeys.set(socket, keys);
    }
    return keys;
  }

  private onFrame(frame: ServerFrame): void {
    if (frame.type === 'authed') {
      const identity: Identity = { user: frame.user, expiresAt: frame.expires_at };
      if (frame.name !== undefined) identity.name = frame.name;
      this.currentIdentity = identity;
      this.scheduleRefresh(frame.expires_at);
      this.emit('authed', identity);
      return;
    }
    // The server's clock says the token is over, whatever ours says: fetch anew next time.
    if (frame.type === 'error' && frame.code === 'token_expired') this.token = undefined;
    const roomId = 'room' in frame ? frame.room : frame.type === 'error' ? frame.ref?.room : undefined;
    const room = roomId === undefined ? undefined : this.rooms.get(roomId);
    if (room) room._handle(frame);
    else if (frame.type === 'error') this.emit('error', new PlazaError(frame.code, frame.message));
  }

  private setState(state: ConnectionState): void {
    if (this.currentState === state) return;
    this.currentState = state;
    this.emit('state', state);
    // `reconnecting` is emitted with its attempt and delay by onSocketLost.
    if (state === 'connecting' || state === 'open' || state === 'closed') this.emit(state);
  }
}

/** A probe of the first transport, open or opening. */
interface Upgrade {
  socket: WebSocketLike;
  timer: ReturnType<typeof setTimeout> | undefined;
  /** Pauses waited for a quiet moment. */
  waits: number;
}

/** A connection the rooms moved away from. */
interface Retiring {
  socket: WebSocketLike;
  /** Rooms the server has not reported taken over yet. */
  rooms: number;
  timer: ReturnType<typeof setTimeout> | undefined;
}

/** An upgrade waits for a quiet moment this often, this far apart, then tries later. */
const UPGRADE_QUIET_WAITS = 40;
const UPGRADE_QUIET_PAUSE_MS = 250;
/** The longest a left connection is read after a move. */
const RETIRE_TIMEOUT_MS = 10_000;
/** A token with less than this left is not used for a new connection. */
const TOKEN_REUSE_MARGIN_MS = 30_000;
/**
 * The close code of a rewritten room history (docs/protocol.md, "Close codes"): every room
 * joins again without resuming.
 */
const HISTORY_REWRITTEN = 4005;

/** `url` with `token` as its `token` parameter. */
function withToken(url: string, token: string): string {
  const u = new URL(url);
  u.searchParams.set('token', token);
  return u.toString();
}

/** A JWT's `exp` in Unix ms, read without checking anything (the server checks); 0 if none. */
function tokenExpiry(token: string): number {
  try {
    const payload = token.split('.')[1] ?? '';
    const text = atob(payload.replace(/-/g, '+').replace(/_/g, '/'));
    const exp = (JSON.parse(text) as { exp?: unknown }).exp;
    return typeof exp === 'number' ? exp * 1000 : 0;
  } catch {
    return 0;
  }
}

/**
 * A message's server frame: a JSON object, or a compact message (an array) expanded into the
 * same `event` object under the connection's `keys`; `undefined` for anything else. A
 * `joined` or `resync` that carries a room's compact key teaches it to `keys`.
 */
function parseFrame(data: unknown, keys: CompactKeys): ServerFrame | undefined {
  const text = messageText(data);
  if (text === undefined) return undefined;
  try {
    const frame = JSON.parse(text) as unknown;
    if (Array.isArray(frame)) return expandCompact(frame, keys);
    if (typeof frame !== 'object' || frame === null) return undefined;
    const f = withDefaults(frame as ServerFrame);
    if ((f.type === 'joined' || f.type === 'resync') && f.compact !== undefined) keys.learn(f.room, f.compact);
    // Every message of the room came before; its alias may name another room later.
    if (f.type === 'left' || f.type === 'closed') keys.forget(f.room);
    return f;
  } catch {
    return undefined;
  }
}

/**
 * Fills in what the server leaves out because it is the default: a `message` event names its
 * `channel` only when it is not `main` (docs/protocol.md, event). Done once here, so every
 * listener sees `channel` set, as with servers that always sent it.
 */
export function withDefaults(frame: ServerFrame): ServerFrame {
  switch (frame.type) {
    case 'event':
      defaultChannel(frame);
      break;
    case 'batch':
      if (Array.isArray(frame.events)) frame.events.forEach(defaultChannel);
      break;
    case 'joined':
    case 'resync':
      if (Array.isArray(frame.history?.events)) frame.history.events.forEach(defaultChannel);
      break;
    default:
      break;
  }
  return frame;
}

/** The subprotocol of compact messages (docs/protocol.md, "Compact messages"). */
export const COMPACT_SUBPROTOCOL = 'plaza.v1.compact';

/**
 * The compact keys of one connection's rooms, by alias: each `joined` or `resync` on a compact
 * connection gives its room's key, which replaces the room's earlier one (a resume on another
 * node brings that node's key).
 */
export class CompactKeys {
  private readonly byAlias = new Map<number, { room: string; tsBase: number }>();

  /** Takes `key` as `room`'s, in place of any key the room or the alias had. */
  learn(room: string, key: CompactKey): void {
    this.forget(room);
    this.byAlias.set(key.alias, { room, tsBase: key.ts_base });
  }

  /** Forgets `room`'s key (it was left or closed). */
  forget(room: string): void {
    for (const [alias, known] of this.byAlias) {
      if (known.room === room) this.byAlias.delete(alias);
    }
  }

  /** The room `alias` stands for and its time base, if a `joined` gave it. */
  room(alias: number): { room: string; tsBase: number } | undefined {
    return this.byAlias.get(alias);
  }
}

/**
 * The `message` event a compact message stands for, under the keys its connection was given:
 * `[alias, seq, ts - ts_base, from, event, data, rest?]`, where `from` and `data` are `null`
 * for none and `rest` holds `channel`, `topic`, `reply_to` and `id` when present. `undefined`
 * for an array of another shape or of an alias no `joined` gave.
 */
export function expandCompact(a: unknown[], keys: CompactKeys): MessageEvent | undefined {
  const [alias, seq, relTs, from, event, data, rest] = a;
  if (a.length < 6 || a.length > 7 || typeof alias !== 'number' || typeof seq !== 'number' || typeof relTs !== 'number' || typeof event !== 'string') {
    return undefined;
  }
  const known = keys.room(alias);
  if (known === undefined) return undefined;
  if (rest !== undefined && (typeof rest !== 'object' || rest === null || Array.isArray(rest))) return undefined;
  const more = (rest ?? {}) as { channel?: string; topic?: string; reply_to?: number; id?: string };
  const m: MessageEvent = { type: 'event', room: known.room, seq, ts: known.tsBase + relTs, kind: 'message', channel: more.channel ?? 'main', event };
  if (typeof from === 'string') m.from = from;
  if (data !== null && data !== undefined) m.data = data as Json;
  if (more.topic !== undefined) m.topic = more.topic;
  if (more.reply_to !== undefined) m.reply_to = more.reply_to;
  if (more.id !== undefined) m.id = more.id;
  return m;
}

function defaultChannel(e: RoomEvent): void {
  if (typeof e === 'object' && e !== null && e.kind === 'message' && (e as { channel?: unknown }).channel === undefined) {
    e.channel = 'main';
  }
}

function detach(socket: WebSocketLike): void {
  const noop = () => undefined;
  socket.onopen = noop;
  socket.onmessage = noop;
  socket.onclose = noop;
  socket.onerror = noop;
}
