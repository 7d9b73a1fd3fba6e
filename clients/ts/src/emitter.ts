/** A stored listener (typed at the `on`/`emit` boundary). */
type Listener = (...args: unknown[]) => void;

/** A listener map: event name → listener arguments. */
export type EventMap = { [event: string]: unknown[] };

/** A minimal typed event emitter (works in browsers and Node alike). */
export class Emitter<E extends EventMap> {
  private readonly listeners = new Map<keyof E, Set<Listener>>();

  /** Adds `handler` for `event`; returns a function that removes it. */
  on<K extends keyof E>(event: K, handler: (...args: E[K]) => void): () => void {
    let set = this.listeners.get(event);
    if (!set) {
      set = new Set();
      this.listeners.set(event, set);
    }
    set.add(handler as unknown as Listener);
    return () => this.off(event, handler);
  }

  /** Removes `handler` from `event`. */
  off<K extends keyof E>(event: K, handler: (...args: E[K]) => void): void {
    this.listeners.get(event)?.delete(handler as unknown as Listener);
  }

  /** Calls every handler of `event`; a throwing handler does not stop the others. */
  protected emit<K extends keyof E>(event: K, ...args: E[K]): void {
    const set = this.listeners.get(event);
    if (!set) return;
    for (const handler of [...set]) {
      try {
        handler(...args);
      } catch (err) {
        // A bug in one handler must not break the client's own bookkeeping.
        console.error('plaza: an event handler threw', err);
      }
    }
  }
}
