import { Emitter } from './emitter.js';
import type { Entity, Json, Lock, RoomEvent, Snapshot } from './frames.js';

/** What changed in a {@link RoomReplica}: re-read that part of the state. */
export type ReplicaChange =
  /** Everything may have changed: a new snapshot replaced the state (join, resync, restore). */
  | { type: 'reset' }
  /** The entity with this id was created, changed or deleted (confirmed or optimistically). */
  | { type: 'entity'; id: string }
  /** The lock on this object was granted, renewed or released. */
  | { type: 'lock'; object: string }
  /** An entity this client created got its server id: `from` (`~N`) is now `to`. */
  | { type: 'renamed'; from: string; to: string };

/** Events of a {@link RoomReplica}. */
export type ReplicaEvents = {
  change: [ReplicaChange];
};

/**
 * A change this client made that the server has not answered yet. It is applied on top of
 * the confirmed state until the answer comes: then it is dropped, and the confirmed state
 * has the server's version of it (or, if refused, nothing of it).
 */
export type PendingChange =
  | { op: 'create'; id: string; kind?: string; data: Json }
  | { op: 'set'; id: string; data: Json }
  | { op: 'patch'; id: string; data: { [key: string]: Json } }
  | { op: 'delete'; id: string };

/**
 * The local copy of a room's state: the entities and live locks of the last snapshot, kept up
 * to date by the room's events and by the answers to this client's own requests, in `seq`
 * order. This client's own entity changes show at once (optimistically) and are rolled back if
 * the server refuses them.
 *
 * Read it with {@link entities}, {@link entity}, {@link locks} and {@link lock}; listen to
 * `change` to re-render. Obtained as {@link RoomHandle.state}.
 */
export class RoomReplica extends Emitter<ReplicaEvents> {
  private readonly confirmed = new Map<string, Entity>();
  private readonly lockMap = new Map<string, Lock>();
  private readonly pending = new Map<number, PendingChange>();
  private nextKey = 1;
  /** The optimistic view (confirmed state + pending changes); rebuilt when stale. */
  private view: Map<string, Entity> | undefined;

  /** Every entity, own pending changes applied, ordered by id (as the server orders them). */
  entities(): Entity[] {
    return [...this.current().values()].sort((a, b) => compare(a.id, b.id));
  }

  /** The entity with this id (own pending changes applied), if it exists. */
  entity(id: string): Entity | undefined {
    return this.current().get(id);
  }

  /** Every live lock, ordered by object. */
  locks(): Lock[] {
    return [...this.lockMap.values()].sort((a, b) => compare(a.object, b.object));
  }

  /** The live lock on `object`, if any. */
  lock(object: string): Lock | undefined {
    return this.lockMap.get(object);
  }

  /** Whether this client has changes to the entity that the server has not answered yet. */
  isPending(id: string): boolean {
    for (const change of this.pending.values()) if (change.id === id) return true;
    return false;
  }

  /** The confirmed state (no pending changes) as a snapshot. */
  toSnapshot(): Snapshot {
    return {
      entities: [...this.confirmed.values()].sort((a, b) => compare(a.id, b.id)),
      locks: this.locks(),
    };
  }

  /** @internal Replaces the state with a snapshot; pending changes stay on top. */
  _reset(snapshot: Snapshot): void {
    this.confirmed.clear();
    for (const entity of snapshot.entities) this.confirmed.set(entity.id, entity);
    this.lockMap.clear();
    for (const lock of snapshot.locks) this.lockMap.set(lock.object, lock);
    this.view = undefined;
    this.emit('change', { type: 'reset' });
  }

  /** @internal Applies a sequenced event of the room. */
  _applyEvent(event: RoomEvent): void {
    switch (event.kind) {
      case 'entity.created':
      case 'entity.updated':
        this._confirmEntity(event.entity);
        break;
      case 'entity.deleted':
        this._confirmDelete(event.id);
        break;
      case 'lock.acquired':
        this._confirmLock(event.lock);
        break;
      case 'lock.released':
        this._confirmUnlock(event.object, event.token);
        break;
      default:
        break;
    }
  }

  /** @internal The server's state of an entity (from an event or a response). */
  _confirmEntity(entity: Entity): void {
    this.confirmed.set(entity.id, entity);
    this.changed(entity.id);
  }

  /** @internal The entity is gone. */
  _confirmDelete(id: string): void {
    this.confirmed.delete(id);
    this.changed(id);
  }

  /** @internal A lock was granted or renewed. */
  _confirmLock(lock: Lock): void {
    this.lockMap.set(lock.object, lock);
    this.emit('change', { type: 'lock', object: lock.object });
  }

  /** @internal A lock ended; `token` (when known) guards against removing a later grant. */
  _confirmUnlock(object: string, token?: number): void {
    const lock = this.lockMap.get(object);
    if (!lock || (token !== undefined && lock.token !== token)) return;
    this.lockMap.delete(object);
    this.emit('change', { type: 'lock', object });
  }

  /** @internal Shows a change of this client at once; returns the key to settle it with. */
  _addPending(change: PendingChange): number {
    const key = this.nextKey++;
    this.pending.set(key, change);
    this.changed(change.id);
    return key;
  }

  /** @internal The server answered (or the answer is lost): the change is no longer shown. */
  _settlePending(key: number): void {
    const change = this.pending.get(key);
    if (!change) return;
    this.pending.delete(key);
    this.changed(change.id);
  }

  /**
   * @internal The create with `key` got its answer: the entity (server id) replaces `from`,
   * and pending changes to `from` follow it. Listeners hear `renamed` first, with the view
   * already final.
   */
  _completeCreate(key: number, from: string, entity: Entity): void {
    this.pending.delete(key);
    for (const [k, change] of this.pending) {
      if (change.id === from) this.pending.set(k, { ...change, id: entity.id });
    }
    this.confirmed.set(entity.id, entity);
    this.view = undefined;
    this.emit('change', { type: 'renamed', from, to: entity.id });
    this.emit('change', { type: 'entity', id: from });
    this.emit('change', { type: 'entity', id: entity.id });
  }

  private changed(id: string): void {
    this.view = undefined;
    this.emit('change', { type: 'entity', id });
  }

  private current(): Map<string, Entity> {
    if (this.view) return this.view;
    const view = new Map(this.confirmed);
    for (const change of this.pending.values()) applyPending(view, change);
    this.view = view;
    return view;
  }
}

/** Applies one pending change to the optimistic view, as the server would if it accepts it. */
function applyPending(view: Map<string, Entity>, change: PendingChange): void {
  const entity = view.get(change.id);
  switch (change.op) {
    case 'create': {
      const created: Entity = { id: change.id, data: change.data, version: 0 };
      if (change.kind !== undefined) created.kind = change.kind;
      view.set(change.id, created);
      break;
    }
    case 'set':
      if (entity) view.set(change.id, { ...entity, data: change.data, version: entity.version + 1 });
      break;
    case 'patch':
      if (entity) view.set(change.id, { ...entity, data: merge(entity.data, change.data), version: entity.version + 1 });
      break;
    case 'delete':
      view.delete(change.id);
      break;
  }
}

/** `entity.patch`'s merge: top-level fields replace, `null` removes, a non-object becomes `{}`. */
export function merge(data: Json, patch: { [key: string]: Json }): Json {
  const base: { [key: string]: Json } = isObject(data) ? { ...data } : {};
  for (const [key, value] of Object.entries(patch)) {
    if (value === null) delete base[key];
    else base[key] = value;
  }
  return base;
}

function isObject(value: Json): value is { [key: string]: Json } {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/** Orders ids as the server does: by their UTF-8 bytes, which for these ids is code units. */
function compare(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}
