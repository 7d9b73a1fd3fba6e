/**
 * Reloads continue the session: before the page goes away, `room.saveSession()` is kept in
 * sessionStorage, and the reloaded page joins with `restore` — the same session and avatar,
 * and the others see no new member.
 */
import type { JoinOptions, PlazaClient, RoomHandle } from '@plaza/client';
import { errorCode, listen, store } from './util';

/** What `room.saveSession()` returns and `join({restore})` takes. */
type SavedSession = ReturnType<RoomHandle['saveSession']>;

/**
 * Joins `roomId`, resuming the session saved before a reload if there is one (`restored`: it
 * did). `ended`: whether the view has ended meanwhile (then a failed restore is not retried).
 * The options (the delivery policy among them) go with the resume too.
 */
export async function joinResuming(
  client: PlazaClient,
  roomId: string,
  options: JoinOptions,
  ended: () => boolean,
): Promise<{ room: RoomHandle; restored: boolean }> {
  const saved = store.takeSession(roomId) as SavedSession | undefined;
  try {
    const room = await client.join(roomId, saved === undefined ? options : { ...options, restore: saved });
    return { room, restored: saved !== undefined };
  } catch (err) {
    // A saved session that cannot be restored (malformed, another server): join afresh.
    if (saved === undefined || ended() || errorCode(err) === 'room_not_found') throw err;
    console.warn('plaza demo: restoring the saved session failed, joining afresh', err);
    return { room: await client.join(roomId, options), restored: false };
  }
}

/**
 * Before the page goes away (`pagehide`, `beforeunload`): keeps `room()`'s session so that the
 * reloaded page resumes it. Returns what stops it.
 */
export function saveOnUnload(roomId: string, room: () => RoomHandle | undefined): () => void {
  const save = () => {
    const current = room();
    if (!current) return;
    try {
      store.saveSession(roomId, current.saveSession());
    } catch (err) {
      console.warn('plaza demo: cannot save the session', err);
    }
  };
  const stops = [listen(window, 'pagehide', save), listen(window, 'beforeunload', save)];
  return () => {
    for (const stop of stops) stop();
  };
}
