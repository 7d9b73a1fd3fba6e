/**
 * Plaza's HTTP transports (docs/protocol.md, "HTTP transports") behind the {@link WebSocketLike}
 * interface, so that the client runs the same protocol over server-sent events or long polling
 * where WebSocket is blocked: a transport session is opened with `POST /v1/sessions`, frames go
 * by `POST .../send` (in order; what queues while one is in flight goes as one array), and
 * frames come from an event stream or polls, each numbered so that a dropped stream or a lost
 * poll answer loses nothing. The socket "closes" when the transport session ends; the client
 * then opens a new one and resumes its rooms, as after a WebSocket drop.
 *
 * Both read with `fetch` (an event stream's body is parsed here), so they work in browsers and
 * in Node ≥ 18 alike and can send `Last-Event-ID` themselves.
 */
import type { Handler, WebSocketConstructor, WebSocketLike } from './socket.js';

/** The transports a client can use, in the default order of preference. */
export type TransportName = 'websocket' | 'sse' | 'polling';

/**
 * A session still read by a request the client gave up (409), or a request a full node refused
 * (503, `server_full`: the session's node holds as many connections as it may, and one comes
 * free soon), is retried this often, this far apart.
 */
const BUSY_RETRIES = 40;
const BUSY_PAUSE_MS = 250;

function pause(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

const CONNECTING = 0;
const OPEN = 1;
const CLOSED = 3;

/** The HTTP base (`http(s)://host:port`) and query of a `ws(s)://…/v1/ws` URL. */
function sessionsUrl(wsUrl: string): URL {
  const url = new URL(wsUrl);
  url.protocol = url.protocol === 'wss:' ? 'https:' : 'http:';
  url.pathname = url.pathname.replace(/\/v1\/ws\/?$/, '') + '/v1/sessions';
  return url;
}

/** What both HTTP transports share: the session, sending, closing. */
abstract class HttpSocket implements WebSocketLike {
  readyState = CONNECTING;
  onopen: Handler<never> | null = null;
  onclose: Handler<{ code?: number }> | null = null;
  onerror: Handler<never> | null = null;
  onmessage: Handler<{ data: unknown }> | null = null;

  /** `…/v1/sessions/{id}` once open. */
  protected base: URL | undefined;
  /** The last frame position received. */
  protected position = 0;
  protected readonly stop = new AbortController();
  /** The close code the server said the session ended with, if it said. */
  protected closeCode: number | undefined;
  private queued: string[] = [];
  private sending = false;

  constructor(url: string) {
    void this.start(sessionsUrl(url));
  }

  private async start(sessions: URL): Promise<void> {
    try {
      const res = await fetch(sessions, { method: 'POST', signal: this.stop.signal });
      if (res.status !== 201) throw new Error(`POST ${sessions.pathname}: ${res.status}`);
      const body = (await res.json()) as { session: string };
      const base = new URL(sessions);
      // The query (the `room` hint) stays on every request: a balancer routes on it.
      base.pathname = `${sessions.pathname}/${encodeURIComponent(body.session)}`;
      this.base = base;
    } catch {
      this.end();
      return;
    }
    if (this.readyState !== CONNECTING) return;
    this.readyState = OPEN;
    this.onopen?.(undefined as never);
    void this.read();
  }

  /** Reads frames until the session ends, handing each to `onmessage`. */
  protected abstract read(): Promise<void>;

  /** Hands one frame (JSON text) to the client, and notes its position. */
  protected deliver(position: number, frame: string): void {
    if (this.readyState !== OPEN || position <= this.position) return;
    this.position = position;
    this.onmessage?.({ data: frame });
  }

  protected url(path: string, query: Record<string, string> = {}): URL {
    const url = new URL(this.base!);
    url.pathname += path;
    for (const [k, v] of Object.entries(query)) url.searchParams.set(k, v);
    return url;
  }

  /** Frames queued or being posted. */
  get bufferedAmount(): number {
    return this.queued.length + (this.sending ? 1 : 0);
  }

  send(data: string): void {
    if (this.readyState !== OPEN) return;
    this.queued.push(data);
    if (!this.sending) void this.flush();
  }

  /** Posts what is queued, in order, one request at a time. */
  private async flush(): Promise<void> {
    this.sending = true;
    let full = 0;
    while (this.queued.length > 0 && this.readyState === OPEN) {
      const batch = this.queued.splice(0);
      const body = batch.length === 1 ? batch[0]! : `[${batch.join(',')}]`;
      try {
        const res = await fetch(this.url('/send'), {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body,
          signal: this.stop.signal,
        });
        if (res.status === 503 && ++full <= BUSY_RETRIES) {
          // Refused whole, before anything was handled: the same frames again, first.
          this.queued.unshift(...batch);
          await pause(BUSY_PAUSE_MS);
          continue;
        }
        if (res.status !== 202) {
          this.end();
          break;
        }
        full = 0;
      } catch {
        this.end();
        break;
      }
    }
    this.sending = false;
  }

  close(): void {
    if (this.readyState === CLOSED) return;
    const base = this.base;
    this.end();
    // The server disconnects the rooms (resumable) at once rather than at its idle timeout.
    if (base) void fetch(base, { method: 'DELETE' }).catch(() => undefined);
  }

  /** Ends the socket: `onclose` once. */
  protected end(): void {
    if (this.readyState === CLOSED) return;
    this.readyState = CLOSED;
    this.stop.abort();
    this.onclose?.({ code: this.closeCode });
  }
}

/** Server-sent events: one long `GET …/events`, reopened from the last event id if it drops. */
export class SseSocket extends HttpSocket {
  protected async read(): Promise<void> {
    let failures = 0;
    while (this.readyState === OPEN) {
      try {
        const res = await fetch(this.url('/events'), {
          headers: { 'last-event-id': String(this.position), accept: 'text/event-stream' },
          signal: this.stop.signal,
        });
        if ((res.status === 409 || res.status === 503) && ++failures <= BUSY_RETRIES) {
          // The stream that dropped is still reading on the server until it notices.
          await pause(BUSY_PAUSE_MS);
          continue;
        }
        if (res.status !== 200 || !res.body) break;
        failures = 0;
        if (await this.parse(res.body)) break;
      } catch {
        if (this.readyState !== OPEN || ++failures > 3) break;
      }
    }
    this.end();
  }

  /** Reads one stream; true when the server said the session ended. */
  private async parse(body: ReadableStream<Uint8Array>): Promise<boolean> {
    const reader = body.getReader();
    const decoder = new TextDecoder();
    let text = '';
    for (;;) {
      const { done, value } = await reader.read();
      if (done) return false;
      text += decoder.decode(value, { stream: true });
      let end: number;
      while ((end = text.indexOf('\n\n')) >= 0) {
        const event = text.slice(0, end);
        text = text.slice(end + 2);
        let id: number | undefined;
        let name = 'message';
        const data: string[] = [];
        for (const line of event.split('\n')) {
          if (line.startsWith('id: ')) id = Number(line.slice(4));
          else if (line.startsWith('event: ')) name = line.slice(7);
          else if (line.startsWith('data: ')) data.push(line.slice(6));
        }
        if (name === 'closed') {
          this.closeCode = closedCode(data.join('\n'));
          return true;
        }
        if (id !== undefined && data.length > 0) this.deliver(id, data.join('\n'));
      }
    }
  }
}

/** Long polling: `GET …/poll?ack=N`, answered as soon as there are frames after `N`. */
export class PollSocket extends HttpSocket {
  protected async read(): Promise<void> {
    let failures = 0;
    while (this.readyState === OPEN) {
      try {
        const res = await fetch(this.url('/poll', { ack: String(this.position) }), { signal: this.stop.signal });
        if ((res.status === 409 || res.status === 503) && ++failures <= BUSY_RETRIES) {
          // A poll whose answer was lost is still waiting on the server until it notices.
          await pause(BUSY_PAUSE_MS);
          continue;
        }
        if (res.status !== 200) break;
        const body = (await res.json()) as { frames: unknown[]; last: number; closed?: number };
        failures = 0;
        const first = body.last - body.frames.length + 1;
        body.frames.forEach((frame, i) => this.deliver(first + i, JSON.stringify(frame)));
        if (body.closed !== undefined) {
          this.closeCode = body.closed;
          break;
        }
      } catch {
        // A lost answer: the same poll again gets the same frames.
        if (this.readyState !== OPEN || ++failures > 3) break;
      }
    }
    this.end();
  }
}

/** The `code` of an event stream's `closed` event (`{"code": <close code>}`). */
function closedCode(data: string): number | undefined {
  try {
    const code = (JSON.parse(data) as { code?: unknown }).code;
    return typeof code === 'number' ? code : undefined;
  } catch {
    return undefined;
  }
}

/** The constructor of a transport (WebSocket's is the client's `WebSocket` option). */
export function transportConstructor(name: TransportName, ws: WebSocketConstructor): WebSocketConstructor {
  switch (name) {
    case 'websocket':
      return ws;
    case 'sse':
      return SseSocket;
    case 'polling':
      return PollSocket;
  }
}
