/**
 * Chat topics and "quiet mode", built on the member's delivery policy (docs/protocol.md,
 * "Delivery policies"). Quiet off: no policy, every event at once. Quiet on: a policy whose
 * filters let through at once the chat messages on the followed topics and everything that is
 * not chat (presence, entities, locks, the highlights on `main`: the plaza stays live); the
 * other chat messages are held for at most {@link QUIET_MAX_DELAY_MS} or until
 * {@link QUIET_MAX_HELD} are held, then arrive together as one `batch`.
 *
 * This module only computes: the policy wanted, the incremental `policy.update` from the one in
 * force to it, and the preferences kept per room in sessionStorage.
 */
import type { DeliveryPolicy, Json, PolicyFilter, PolicyUpdate } from '@plaza/client';

/** The chat's topics (the composer's choice and what a member can follow). */
export const TOPICS = ['general', 'design', 'random'] as const;
export type Topic = (typeof TOPICS)[number];

/** Quiet mode's Time bound: a held message waits at most this long. */
export const QUIET_MAX_DELAY_MS = 10_000;
/** Quiet mode's Volume bound: this many held messages go out at once. */
export const QUIET_MAX_HELD = 5;

/** What a member chose, per room: the composer's topic, the topics followed, quiet mode. */
export interface ChatPrefs {
  topic: Topic;
  follow: Topic[];
  quiet: boolean;
}

export const DEFAULT_PREFS: ChatPrefs = { topic: 'general', follow: ['general'], quiet: false };

export function isTopic(v: unknown): v is Topic {
  return typeof v === 'string' && (TOPICS as readonly string[]).includes(v);
}

/** `follow` without duplicates, in the order of {@link TOPICS}. */
export function normalFollow(follow: readonly Topic[]): Topic[] {
  return TOPICS.filter((t) => follow.includes(t));
}

/** Preferences read back from storage; anything malformed falls back to the defaults. */
export function parsePrefs(raw: unknown): ChatPrefs {
  if (typeof raw !== 'object' || raw === null) return { ...DEFAULT_PREFS };
  const r = raw as Record<string, unknown>;
  return {
    topic: isTopic(r['topic']) ? r['topic'] : DEFAULT_PREFS.topic,
    follow: Array.isArray(r['follow']) ? normalFollow(r['follow'].filter(isTopic)) : [...DEFAULT_PREFS.follow],
    quiet: r['quiet'] === true,
  };
}

/** The id of the filter that follows `topic`. */
const followId = (topic: Topic): string => `follow-${topic}`;

/** The filters of a quiet policy besides the followed topics: what is not chat goes at once. */
const BASE_FILTERS: PolicyFilter[] = [
  {
    id: 'room-state',
    field: 'kind',
    op: {
      in: ['presence.join', 'presence.leave', 'entity.created', 'entity.updated', 'entity.deleted', 'lock.acquired', 'lock.released'],
    },
  },
  // Hover highlights (transient messages on `main`). Spatial events go at once by themselves.
  { id: 'main-channel', field: 'channel', op: { equals: 'main' } },
];

function followFilter(topic: Topic): PolicyFilter {
  return { id: followId(topic), field: 'topic', op: { equals: topic } };
}

/** The policy of quiet mode following `follow`. */
export function quietPolicy(follow: readonly Topic[]): DeliveryPolicy {
  return {
    filters: [...BASE_FILTERS, ...normalFollow(follow).map(followFilter)],
    max_delay_ms: QUIET_MAX_DELAY_MS,
    max_held: QUIET_MAX_HELD,
  };
}

/** The topics a policy in force follows (its enabled `follow-*` filters). */
export function followedBy(policy: DeliveryPolicy): Topic[] {
  const topics = (policy.filters ?? [])
    .filter((f) => f.enabled !== false && f.id.startsWith('follow-'))
    .map((f) => f.id.slice('follow-'.length))
    .filter(isTopic);
  return normalFollow(topics);
}

/** A filter as the server echoes it (`enabled` always set) compared with one as written. */
function sameFilter(a: PolicyFilter, b: PolicyFilter): boolean {
  const norm = (f: PolicyFilter): Json => ({ id: f.id, enabled: f.enabled !== false, field: f.field, op: f.op as Json });
  return JSON.stringify(norm(a)) === JSON.stringify(norm(b));
}

/**
 * The `policy.update` that turns the policy in force into `want` — only the filters added,
 * changed or removed and the bounds that differ — or undefined when they are the same already.
 */
export function policyUpdate(inForce: DeliveryPolicy, want: DeliveryPolicy): PolicyUpdate | undefined {
  const have = inForce.filters ?? [];
  const wanted = want.filters ?? [];
  const add = wanted.filter((w) => !have.some((f) => sameFilter(f, w)));
  const remove = have.filter((f) => !wanted.some((w) => w.id === f.id)).map((f) => f.id);
  const update: PolicyUpdate = {};
  if (add.length > 0) update.add = add;
  if (remove.length > 0) update.remove = remove;
  if (inForce.max_delay_ms !== want.max_delay_ms) update.max_delay_ms = want.max_delay_ms ?? null;
  if (inForce.max_held !== want.max_held) update.max_held = want.max_held ?? null;
  if ((inForce.aggregate ?? true) !== (want.aggregate ?? true)) update.aggregate = want.aggregate ?? true;
  return Object.keys(update).length > 0 ? update : undefined;
}
