/**
 * The shared objects as the scene draws them: at their position in the room state — or, while
 * this member drags one under its lock, where the drag is (ahead of the patches) — with who
 * holds each one's lock and who highlights it.
 */
import type { RoomHandle } from '@plaza/client';
import { objectData } from './entities';
import type { Point } from './motion';
import type { ObjectView } from './scene';

/**
 * `highlightedBy`: object → the names of the members highlighting it; `dragged`: where the own
 * drag puts an object, if it does; `nameOf`: a lock holder's name.
 */
export function objectViews(
  room: RoomHandle,
  highlightedBy: ReadonlyMap<string, string[]>,
  dragged: (id: string) => Point | undefined,
  nameOf: (session: string) => string,
): ObjectView[] {
  const me = room.session;
  const views: ObjectView[] = [];
  for (const entity of room.state.entities()) {
    const data = objectData(entity);
    if (!data) continue;
    const lock = room.state.lock(entity.id);
    const at = dragged(entity.id) ?? data;
    const view: ObjectView = {
      id: entity.id,
      label: data.label,
      color: data.color,
      x: at.x,
      y: at.y,
      highlightedBy: highlightedBy.get(entity.id) ?? [],
    };
    if (lock) view.holder = { name: nameOf(lock.owner), self: lock.owner === me };
    views.push(view);
  }
  return views;
}
