/** Reconnect backoff settings. */
export interface BackoffOptions {
  /** First delay in ms (default 250). */
  initialMs?: number;
  /** Largest delay in ms (default 10000). */
  maxMs?: number;
}

/**
 * Delay before reconnect attempt `attempt` (0-based): exponential growth capped at `maxMs`,
 * with "equal jitter" (half fixed, half random) so that many clients dropped together do not
 * reconnect in lockstep.
 */
export function backoffDelay(attempt: number, options: BackoffOptions = {}, random = Math.random): number {
  const initial = options.initialMs ?? 250;
  const max = options.maxMs ?? 10_000;
  const ceiling = Math.min(max, initial * 2 ** Math.min(attempt, 30));
  return ceiling / 2 + random() * (ceiling / 2);
}
