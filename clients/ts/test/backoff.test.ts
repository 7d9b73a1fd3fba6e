import { describe, expect, it } from 'vitest';
import { backoffDelay } from '../src/index.js';

describe('backoffDelay', () => {
  it('grows exponentially, is capped, and keeps jitter within [ceiling/2, ceiling]', () => {
    const opts = { initialMs: 100, maxMs: 1000 };
    expect(backoffDelay(0, opts, () => 0)).toBe(50);
    expect(backoffDelay(0, opts, () => 1)).toBe(100);
    expect(backoffDelay(2, opts, () => 1)).toBe(400);
    expect(backoffDelay(10, opts, () => 1)).toBe(1000);
    expect(backoffDelay(10, opts, () => 0)).toBe(500);
    for (let i = 0; i < 100; i++) {
      const d = backoffDelay(3, opts);
      expect(d).toBeGreaterThanOrEqual(400);
      expect(d).toBeLessThanOrEqual(800);
    }
  });
});
