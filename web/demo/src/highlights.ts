/**
 * Highlights: hovering a shared object highlights it for everyone, with the highlighter's
 * name. A highlight is a transient message (`highlight` `{object, on}` on channel `main`), not
 * room state: it matters only while the pointer is there.
 */
import type { RoomMessage as PlazaMessage, RoomHandle } from '@plaza/client';
import type { DebugHighlight } from './debug';
import { isObj } from './entities';

export class Highlights {
  /** The object under the pointer (highlighted again when a drag ends). */
  hovered: string | undefined;
  /** Session → the object it highlights (transient, from `highlight` messages). */
  private readonly bySession = new Map<string, string>();
  /** The object this member highlights. */
  private mine: string | undefined;
  private readonly room: () => RoomHandle | undefined;
  private readonly nameOf: (session: string) => string;
  private readonly changed: () => void;

  /** `room`: the room once joined; `nameOf`: a member's name; `changed`: told when a highlight changed. */
  constructor(room: () => RoomHandle | undefined, nameOf: (session: string) => string, changed: () => void) {
    this.room = room;
    this.nameOf = nameOf;
    this.changed = changed;
  }

  /** Highlights `object` (or nothing) for everyone: a transient message, not room state. */
  set(object: string | undefined): void {
    const room = this.room();
    const me = room?.session;
    if (!room || me === undefined || object === this.mine) return;
    const previous = this.mine;
    this.mine = object;
    const fail = (err: unknown) => console.warn('plaza demo: highlight not sent', err);
    if (previous !== undefined) {
      this.bySession.delete(me);
      room.publish('highlight', { object: previous, on: false }, { channel: 'main' }).catch(fail);
    }
    if (object !== undefined) {
      this.bySession.set(me, object);
      room.publish('highlight', { object, on: true }, { channel: 'main' }).catch(fail);
    }
    this.changed();
  }

  /** Highlights the hovered object (or nothing) again. */
  setHovered(): void {
    this.set(this.hovered);
  }

  /** Follows `m` if it is someone's highlight (others are not the highlights'). */
  onMessage(m: PlazaMessage): void {
    if (m.channel !== 'main' || m.event !== 'highlight' || m.from === undefined || !isObj(m.data)) return;
    const object = m.data['object'];
    if (typeof object !== 'string') return;
    if (m.data['on'] === true) this.bySession.set(m.from, object);
    else if (this.bySession.get(m.from) === object) this.bySession.delete(m.from);
    this.changed();
  }

  /** Drops the highlight of a member who went. */
  dropSession(session: string): void {
    if (this.bySession.delete(session)) this.changed();
  }

  /** Drops the highlights of objects that are gone (`keep`: whether an object is still there). */
  dropObjects(keep: (object: string) => boolean): void {
    for (const [session, object] of this.bySession) if (!keep(object)) this.bySession.delete(session);
  }

  /** Object → the names of the members highlighting it (`you` for this member). */
  byObject(): Map<string, string[]> {
    const me = this.room()?.session;
    const byObject = new Map<string, string[]>();
    for (const [session, object] of this.bySession) {
      const names = byObject.get(object) ?? [];
      names.push(session === me ? 'you' : this.nameOf(session));
      byObject.set(object, names);
    }
    return byObject;
  }

  /** Who highlights which object (`window.__plaza.highlights()`). */
  list(): DebugHighlight[] {
    return [...this.bySession].map(([by, object]) => ({ object, by, name: this.nameOf(by) }));
  }
}
