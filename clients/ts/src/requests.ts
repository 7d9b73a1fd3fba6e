/** Requests of one room handle waiting for their `response`, matched by nonce. */
import { PlazaError } from './errors.js';
import type { Json, ResponseFrame } from './frames.js';

interface PendingRequest {
  resolve: (result: { [key: string]: Json }) => void;
  reject: (err: PlazaError) => void;
  /** Unset once timed out: the entry then only waits to apply a late answer. */
  timer: ReturnType<typeof setTimeout> | undefined;
}

/** @internal */
export class PendingRequests {
  private readonly pending = new Map<number, PendingRequest>();

  /** Waits for the response to `nonce`; `timer` is its timeout, cleared by the answer. */
  wait(
    nonce: number,
    resolve: (result: { [key: string]: Json }) => void,
    reject: (err: PlazaError) => void,
    timer: ReturnType<typeof setTimeout>,
  ): void {
    this.pending.set(nonce, { resolve, reject, timer });
  }

  /**
   * A sent request timed out: its answer may still come, and a change the server made must
   * still reach `late` (no event will tell: the requester is excluded). Until the connection
   * drops.
   */
  awaitLateAnswer(nonce: number, late: (result: { [key: string]: Json }) => void): void {
    this.pending.set(nonce, { resolve: late, reject: () => undefined, timer: undefined });
  }

  /** Requests waiting for their answer within their timeout. */
  inFlight(): number {
    let n = 0;
    for (const pending of this.pending.values()) if (pending.timer !== undefined) n += 1;
    return n;
  }

  /** Stops waiting for `nonce` (a request that was never sent). */
  forget(nonce: number): void {
    this.pending.delete(nonce);
  }

  /** A response: settles the request with its nonce. */
  answer(frame: ResponseFrame): void {
    if (typeof frame.nonce !== 'number') return;
    const pending = this.pending.get(frame.nonce);
    if (!pending) return;
    this.pending.delete(frame.nonce);
    clearTimeout(pending.timer);
    if (frame.ok) pending.resolve(frame.result ?? {});
    else pending.reject(new PlazaError(frame.error?.code ?? 'internal', frame.error?.message ?? 'request failed'));
  }

  /**
   * The connection dropped: every request already sent fails with `disconnected` (its outcome
   * is unknown; requests are not sent again). Those `queued(nonce)` says were not sent yet
   * keep waiting.
   */
  dropSent(queued: (nonce: number) => boolean): void {
    for (const [nonce, pending] of this.pending) {
      if (queued(nonce)) continue;
      if (pending.timer !== undefined) clearTimeout(pending.timer);
      this.pending.delete(nonce);
      pending.reject(new PlazaError('disconnected', 'the connection dropped before the response'));
    }
  }

  /** Rejects every waiting request (the handle ended). */
  rejectAll(error: PlazaError): void {
    for (const pending of this.pending.values()) {
      clearTimeout(pending.timer);
      pending.reject(error);
    }
    this.pending.clear();
  }
}
