/**
 * Dragging a shared object, guarded by its lock: pointer-down asks for the lock, and only
 * once it is granted do position patches go out (throttled), so that nobody else moves the
 * object meanwhile and everyone sees who holds it. The drop sends the last position, then
 * releases the lock. Losing the lock (expired, taken, the object removed) stops the drag.
 */
import type { RoomHandle } from '@plaza/client';
import { objectData } from './entities';
import type { Highlights } from './highlights';
import type { Point } from './motion';
import { HEIGHT, OBJECT_HALF, WIDTH, type Scene } from './scene';
import { clamp, errorCode, now, toast } from './util';

/** Lease of an object's lock while it is dragged; renewed every {@link RENEW_MS}. */
const LOCK_TTL_MS = 15_000;
const RENEW_MS = 5_000;
/** At most one position patch per this many ms while dragging (≤ 20/s). */
const PATCH_INTERVAL_MS = 50;

interface Drag {
  id: string;
  pointerId: number;
  /** Pointer minus object centre at pointer-down. */
  offX: number;
  offY: number;
  /** Where the object is being dragged to. */
  x: number;
  y: number;
  /** `acquiring`: lock requested; `held`: dragging; `ending`: released before the lock came. */
  phase: 'acquiring' | 'held' | 'ending';
  /** Moved since the last patch sent. */
  dirty: boolean;
  lastSent: number;
  timer?: ReturnType<typeof setTimeout>;
  renew?: ReturnType<typeof setInterval>;
}

/** This member's drag of a shared object (one at a time). */
export class ObjectDrag {
  private drag: Drag | undefined;
  private readonly room: () => RoomHandle | undefined;
  private readonly scene: Scene;
  private readonly highlights: Highlights;
  private readonly nameOf: (session: string | undefined) => string;
  private readonly changed: () => void;

  /**
   * `room`: the room once joined; `scene`: where the pointer is on the plaza; `highlights`:
   * the dragged object is highlighted; `nameOf`: a lock holder's name; `changed`: told when
   * the drawing of the objects changed.
   */
  constructor(
    room: () => RoomHandle | undefined,
    scene: Scene,
    highlights: Highlights,
    nameOf: (session: string | undefined) => string,
    changed: () => void,
  ) {
    this.room = room;
    this.scene = scene;
    this.highlights = highlights;
    this.nameOf = nameOf;
    this.changed = changed;
  }

  /** Whether an object is grabbed (from pointer-down until the drop or the end of the drag). */
  get active(): boolean {
    return this.drag !== undefined;
  }

  /** Where object `id` is drawn while it is dragged under the lock (ahead of the room state). */
  position(id: string): Point | undefined {
    const drag = this.drag;
    return drag?.id === id && drag.phase === 'held' ? { x: drag.x, y: drag.y } : undefined;
  }

  /** Pointer-down on object `id` at plaza point `p`: asks for its lock. */
  start(id: string, pointerId: number, p: Point): void {
    const room = this.room();
    const data = objectData(room?.state.entity(id));
    if (!room || !data || this.drag) return;
    const drag: Drag = {
      id,
      pointerId,
      offX: p.x - data.x,
      offY: p.y - data.y,
      x: data.x,
      y: data.y,
      phase: 'acquiring',
      dirty: false,
      lastSent: 0,
    };
    this.drag = drag;
    this.highlights.set(id);
    room.acquireLock(id, { ttlMs: LOCK_TTL_MS }).then(
      () => {
        if (this.drag !== drag) {
          // Cancelled while the lock was on its way.
          room.releaseLock(id).catch(() => undefined);
          return;
        }
        if (drag.phase === 'ending') {
          this.finish(drag);
          return;
        }
        drag.phase = 'held';
        drag.renew = setInterval(() => {
          room.renewLock(id, { ttlMs: LOCK_TTL_MS }).catch((err: unknown) => {
            if (this.drag === drag) this.cancel(`the lock was lost (${errorCode(err) ?? String(err)})`);
          });
        }, RENEW_MS);
        if (drag.dirty) this.schedulePatch(drag);
        this.changed();
      },
      (err: unknown) => {
        if (this.drag === drag) this.drag = undefined;
        this.highlights.setHovered();
        if (errorCode(err) === 'lock_held') {
          toast(`${this.labelOf(id)} is held by ${this.nameOf(room.state.lock(id)?.owner)}`);
        } else {
          toast(`Cannot grab ${this.labelOf(id)}: ${String(err)}`, 'error');
        }
      },
    );
  }

  /** A pointer moved anywhere in the window. */
  move(ev: PointerEvent): void {
    const drag = this.drag;
    if (!drag || ev.pointerId !== drag.pointerId || drag.phase === 'ending') return;
    const p = this.scene.toPlaza(ev.clientX, ev.clientY);
    drag.x = Math.round(clamp(p.x - drag.offX, OBJECT_HALF, WIDTH - OBJECT_HALF));
    drag.y = Math.round(clamp(p.y - drag.offY, OBJECT_HALF, HEIGHT - OBJECT_HALF));
    drag.dirty = true;
    if (drag.phase === 'held') this.schedulePatch(drag);
    this.changed();
  }

  /** A pointer went up (or was cancelled) anywhere in the window. */
  end(ev: PointerEvent): void {
    const drag = this.drag;
    if (!drag || ev.pointerId !== drag.pointerId) return;
    if (drag.phase === 'acquiring') drag.phase = 'ending';
    else if (drag.phase === 'held') this.finish(drag);
  }

  /** After a resync: stops if the lock did not survive it. */
  resynced(): void {
    const room = this.room();
    if (!room) return;
    if (this.drag?.phase === 'held' && room.state.lock(this.drag.id)?.owner !== room.session) {
      this.cancel('the lock was lost');
    }
  }

  /** After a change of `object`'s lock. */
  lockChanged(object: string): void {
    const room = this.room();
    if (!room) return;
    const lock = room.state.lock(object);
    const drag = this.drag;
    if (drag?.id === object && drag.phase === 'held' && lock?.owner !== room.session) {
      // Expired, or released by a disconnect: stop before moving it unlocked.
      this.cancel(lock ? `taken by ${this.nameOf(lock.owner)}` : 'the lock was lost');
    }
  }

  /** After object `id` was removed. */
  removed(id: string): void {
    if (this.drag?.id === id) this.cancel('the object was removed');
  }

  /** Throttles position patches to one per {@link PATCH_INTERVAL_MS}. */
  private schedulePatch(drag: Drag): void {
    if (drag.timer !== undefined) return;
    const wait = Math.max(0, drag.lastSent + PATCH_INTERVAL_MS - now());
    drag.timer = setTimeout(() => {
      drag.timer = undefined;
      if (this.drag === drag && drag.phase === 'held') this.sendPatch(drag);
    }, wait);
  }

  private sendPatch(drag: Drag): void {
    const room = this.room();
    if (!room || !drag.dirty) return;
    drag.dirty = false;
    drag.lastSent = now();
    room.patchEntity(drag.id, { x: drag.x, y: drag.y }).catch((err: unknown) => {
      // The replica has rolled the optimistic change back.
      const code = errorCode(err);
      if (code === 'lock_held') toast(`${this.labelOf(drag.id)} is held by ${this.nameOf(room.state.lock(drag.id)?.owner)}`);
      else if (code !== 'entity_not_found') console.warn('plaza demo: object move refused', err);
      if (this.drag === drag) this.cancel();
    });
  }

  /** Drop: the last position, then the lock goes. */
  private finish(drag: Drag): void {
    const room = this.room();
    clearTimeout(drag.timer);
    clearInterval(drag.renew);
    drag.timer = undefined;
    if (room) {
      this.sendPatch(drag);
      room.releaseLock(drag.id).catch((err: unknown) => {
        if (errorCode(err) !== 'lock_not_held') console.warn('plaza demo: releasing the lock failed', err);
      });
    }
    if (this.drag === drag) this.drag = undefined;
    this.highlights.setHovered();
    this.changed();
  }

  /** Stops dragging without a final patch (the lock is lost, or the object gone). */
  private cancel(reason?: string): void {
    const drag = this.drag;
    if (!drag) return;
    this.stop();
    if (reason !== undefined) toast(`Dropped ${this.labelOf(drag.id)}: ${reason}`);
    this.highlights.setHovered();
  }

  /** Stops dragging, sending nothing (the view ends, or this member leaves). */
  stop(): void {
    const drag = this.drag;
    if (!drag) return;
    clearTimeout(drag.timer);
    clearInterval(drag.renew);
    this.drag = undefined;
    this.changed();
  }

  private labelOf(id: string): string {
    return objectData(this.room()?.state.entity(id))?.label ?? id;
  }
}
