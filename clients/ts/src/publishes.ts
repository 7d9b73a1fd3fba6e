/** Publishes not acknowledged yet, by client message id: sent again after every resume. */
import type { PlazaError } from './errors.js';
import type { ClientFrame } from './frames.js';
import type { PublishAck } from './room-options.js';

/** A publish frame as sent. */
export type PublishFrame = Extract<ClientFrame, { type: 'publish' }>;

interface PendingPublish {
  frame: PublishFrame;
  resolve: (ack: PublishAck) => void;
  reject: (err: PlazaError) => void;
}

/** @internal The publishes of one room handle that wait for their `ack`. */
export class UnackedPublishes {
  private readonly pending = new Map<string, PendingPublish>();

  /** Waits for the ack of `frame` (which has an id). */
  add(frame: PublishFrame & { id: string }, resolve: (ack: PublishAck) => void, reject: (err: PlazaError) => void): void {
    this.pending.set(frame.id, { frame, resolve, reject });
  }

  /** The frames still unacknowledged, in the order they were published. */
  frames(): PublishFrame[] {
    return [...this.pending.values()].map((p) => p.frame);
  }

  /** An `ack` for `id`: resolves its publish. */
  ack(id: string, ack: PublishAck): void {
    const pending = this.pending.get(id);
    if (!pending) return;
    this.pending.delete(id);
    pending.resolve(ack);
  }

  /** A refusal of `id`; false if no publish waited for it. */
  refuse(id: string, error: PlazaError): boolean {
    const pending = this.pending.get(id);
    if (!pending) return false;
    this.pending.delete(id);
    pending.reject(error);
    return true;
  }

  /** Rejects every waiting publish (the handle ended). */
  rejectAll(error: PlazaError): void {
    for (const pending of this.pending.values()) pending.reject(error);
    this.pending.clear();
  }
}
