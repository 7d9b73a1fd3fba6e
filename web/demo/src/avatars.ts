/**
 * The avatars: one entity of kind `avatar` per member, created on join (a resumed session
 * reuses its own). Only targets travel, never frames: every tab moves every avatar itself
 * (motion.ts). An avatar outlives a disconnect for a while, so that a reload or a network drop
 * resumes with it, and is deleted after that, or at once when its member left.
 */
import type { Entity, Json, Member, RoomHandle } from '@plaza/client';
import { avatarData, type AvatarData } from './entities';
import { Motion, SPEED, type Point } from './motion';
import { AVATAR_RADIUS, HEIGHT, WIDTH, type AvatarView } from './scene';
import { clamp, errorCode, now, PALETTE, pick } from './util';

/**
 * How long an avatar stays after its member disconnected (not left) before it is removed:
 * a reload or a network drop resumes the same session well within it.
 */
const ABSENT_GRACE_MS = 10_000;

/** The avatars at one moment, as the scene draws them. */
export interface AvatarFrame {
  views: AvatarView[];
  /** Whether any avatar is still walking. */
  moving: boolean;
}

/** What {@link Avatars} needs from the view. */
export interface AvatarsHost {
  /** The room once joined. */
  room(): RoomHandle | undefined;
  /** Whether the view has ended. */
  ended(): boolean;
  /** This member's name, for its avatar. */
  name: string;
  /** Told the name on each avatar seen (for chat lines of members who have gone). */
  seen(session: string, name: string): void;
  /** Told when an avatar is to be drawn anew. */
  changed(): void;
}

export class Avatars {
  private readonly host: AvatarsHost;
  /** Avatar entity id → its movement. */
  private readonly motions = new Map<string, Motion>();
  /** This member's avatar entity id. */
  private avatarId: string | undefined;
  private creating = false;
  /** Session → when this tab first saw it absent while it still had an avatar. */
  private readonly absentSince = new Map<string, number>();
  /** Sessions that left for good (their avatars go at once). */
  private readonly leftSessions = new Set<string>();
  private readonly deleting = new Set<string>();

  constructor(host: AvatarsHost) {
    this.host = host;
  }

  /** This member's avatar entity id, once it has one. */
  get mine(): string | undefined {
    return this.avatarId;
  }

  /** The avatar entity of `session`. */
  entityOf(session: string): Entity | undefined {
    return this.host.room()?.state.entities().find((e) => avatarData(e)?.session === session);
  }

  /** The colour of `session`'s avatar. */
  colorOf(session: string): string | undefined {
    return avatarData(this.entityOf(session))?.color;
  }

  /** The drawn position and target of `session`'s avatar. */
  position(session: string): { x: number; y: number; tx: number; ty: number } | undefined {
    const entity = this.entityOf(session);
    if (!entity) return undefined;
    const motion = this.motions.get(entity.id);
    if (!motion) return undefined;
    const p = motion.at(now());
    return { x: p.x, y: p.y, tx: motion.target.x, ty: motion.target.y };
  }

  /** After a resync: follows the avatars among `entities`, forgets the movements of the rest. */
  reset(entities: readonly Entity[], t: number): void {
    const ids = new Set(entities.map((e) => e.id));
    for (const id of this.motions.keys()) if (!ids.has(id)) this.motions.delete(id);
    for (const entity of entities) this.sync(entity, t, true);
  }

  /** Follows an avatar entity: a new target starts a movement from where it is drawn now. */
  sync(entity: Entity, t: number, fromSnapshot: boolean): void {
    const data = avatarData(entity);
    if (!data) return;
    this.host.seen(data.session, data.name);
    if (data.session === this.host.room()?.session) this.avatarId = entity.id;
    const motion = this.motions.get(entity.id);
    if (motion) {
      motion.retarget(data.tx, data.ty, t);
    } else if (fromSnapshot) {
      // Seen for the first time in a snapshot: it most likely arrived long ago.
      this.motions.set(entity.id, new Motion(data.tx, data.ty, t));
    } else {
      const m = new Motion(data.x, data.y, t);
      m.retarget(data.tx, data.ty, t);
      this.motions.set(entity.id, m);
    }
  }

  /** After entity `id` was removed (a new avatar is made if it was this member's). */
  removed(id: string): void {
    this.motions.delete(id);
    if (id === this.avatarId) {
      this.avatarId = undefined;
      this.ensure();
    }
  }

  /** Creates this member's avatar unless it has one (after a resume it reuses it). */
  ensure(): void {
    const room = this.host.room();
    const me = room?.session;
    if (!room || me === undefined || this.host.ended() || this.creating) return;
    const existing = this.entityOf(me);
    if (existing) {
      this.avatarId = existing.id;
      // The server's plane follows the avatar (a resume already stands where it dropped).
      const d = avatarData(existing);
      if (d) this.placeInSpace(room, d.tx, d.ty);
      return;
    }
    this.creating = true;
    const x = Math.round(80 + Math.random() * (WIDTH - 160));
    const y = Math.round(80 + Math.random() * (HEIGHT - 160));
    // A colour nobody in the room wears yet, while there is one.
    const worn = new Set(room.state.entities().map((e) => avatarData(e)?.color));
    const free = PALETTE.filter((c) => !worn.has(c));
    const color = pick(free.length > 0 ? free : PALETTE);
    const data: AvatarData = { session: me, name: this.host.name, x, y, tx: x, ty: y, color };
    room
      .createEntity('avatar', { ...data })
      .then((entity) => {
        this.avatarId = entity.id;
        this.placeInSpace(room, x, y);
        this.sync(entity, now(), false);
        this.host.changed();
      })
      .catch((err: unknown) => {
        if (!this.host.ended()) console.warn('plaza demo: creating the avatar failed', err);
      })
      .finally(() => {
        this.creating = false;
        // The session may have changed meanwhile (a resync with a new session).
        if (!this.host.ended() && this.host.room()?.session !== me) this.ensure();
      });
  }

  /** A member joined (or came back): its avatar stays. */
  joined(member: Member): void {
    this.absentSince.delete(member.session);
    this.leftSessions.delete(member.session);
  }

  /** A member went: for good (`left`) or disconnected. */
  went(session: string, left: boolean): void {
    if (!this.absentSince.has(session)) this.absentSince.set(session, now());
    if (left) this.leftSessions.add(session);
    this.collect();
  }

  /**
   * Removes the avatars of members who left (at once) or stayed disconnected longer than
   * {@link ABSENT_GRACE_MS}. Only the present member with the smallest session id does it, so
   * that one request per avatar reaches the server.
   */
  collect(): void {
    const room = this.host.room();
    const me = room?.session;
    if (!room || me === undefined || !room.live || this.host.ended()) return;
    const present = new Set(room.members.map((m) => m.session));
    if (!present.has(me)) return;
    const smallest = [...present].sort()[0];
    const t = now();
    for (const entity of room.state.entities()) {
      const data = avatarData(entity);
      if (!data) continue;
      if (present.has(data.session)) {
        this.absentSince.delete(data.session);
        continue;
      }
      const since = this.absentSince.get(data.session) ?? t;
      this.absentSince.set(data.session, since);
      const due = this.leftSessions.has(data.session) || t - since >= ABSENT_GRACE_MS;
      if (!due || smallest !== me || this.deleting.has(entity.id)) continue;
      this.deleting.add(entity.id);
      room
        .deleteEntity(entity.id)
        .catch((err: unknown) => {
          if (errorCode(err) !== 'entity_not_found') console.warn('plaza demo: removing an avatar failed', err);
        })
        .finally(() => this.deleting.delete(entity.id));
    }
  }

  /** Sends only the new target: every tab animates the walk itself. */
  walkTo(p: Point): void {
    const room = this.host.room();
    const id = this.avatarId;
    if (!room || id === undefined) return;
    const tx = Math.round(clamp(p.x, AVATAR_RADIUS, WIDTH - AVATAR_RADIUS));
    const ty = Math.round(clamp(p.y, AVATAR_RADIUS, HEIGHT - AVATAR_RADIUS));
    const from = this.motions.get(id)?.at(now());
    const patch: { [k: string]: Json } = { tx, ty };
    if (from) {
      patch['x'] = Math.round(from.x);
      patch['y'] = Math.round(from.y);
    }
    room.patchEntity(id, patch).catch((err: unknown) => console.warn('plaza demo: move refused', err));
    // In a spatial room the server walks with the avatar, at the same speed, and decides
    // who is in proximity (calls start and end on its word).
    if (this.spatial(room)) room.moveTo([tx, ty], SPEED).catch(() => undefined);
  }

  private spatial(room: RoomHandle): boolean {
    return room.session !== undefined && room.movements.has(room.session);
  }

  private placeInSpace(room: RoomHandle, x: number, y: number): void {
    if (this.spatial(room)) room.jumpTo([x, y]).catch(() => undefined);
  }

  /** Where every avatar is at `t`. */
  frame(t: number): AvatarFrame {
    const frame: AvatarFrame = { views: [], moving: false };
    const room = this.host.room();
    if (!room) return frame;
    const me = room.session;
    const present = new Set(room.members.map((m) => m.session));
    for (const entity of room.state.entities()) {
      const data = avatarData(entity);
      const motion = this.motions.get(entity.id);
      if (!data || !motion) continue;
      const p = motion.at(t);
      const arrived = motion.arrived(t);
      frame.moving ||= !arrived;
      const view: AvatarView = {
        id: entity.id,
        session: data.session,
        name: data.name,
        color: data.color,
        x: p.x,
        y: p.y,
        self: data.session === me,
        absent: !present.has(data.session),
      };
      if (!arrived) view.target = motion.target;
      frame.views.push(view);
    }
    return frame;
  }
}
