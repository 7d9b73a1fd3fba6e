let counter = 0;

/**
 * A unique client message id for `publish` (makes retries idempotent). Uses
 * `crypto.randomUUID()` where available, else a random + counter fallback.
 */
export function newMessageId(): string {
  const c = (globalThis as { crypto?: { randomUUID?: () => string } }).crypto;
  if (c?.randomUUID) return c.randomUUID();
  counter += 1;
  return `${Date.now().toString(36)}-${Math.random().toString(36).slice(2)}-${counter}`;
}
