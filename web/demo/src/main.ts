/**
 * Plaza demo: a lobby (`/`) and a room view (`/?room=<id>`). The page talks to the Plaza
 * server it was served by: `GET/POST /v1/rooms` and the WebSocket at `/v1/ws`.
 */
import './style.css';
import { showLobby } from './lobby';
import { RoomView } from './room-view';
import { store } from './util';

const app = document.getElementById('app') as HTMLElement;

let stopLobby: (() => void) | undefined;
let view: RoomView | undefined;

function roomFromUrl(): string | undefined {
  const room = new URL(location.href).searchParams.get('room');
  return room === null || room === '' ? undefined : room;
}

function setUrl(room: string | undefined): void {
  const url = new URL(location.href);
  if (room === undefined) url.searchParams.delete('room');
  else url.searchParams.set('room', room);
  if (url.href !== location.href) history.pushState(null, '', url);
}

function route(): void {
  const room = roomFromUrl();
  if (room !== undefined && view?.roomId === room) return;
  stopLobby?.();
  stopLobby = undefined;
  if (view) {
    const old = view;
    view = undefined;
    void old.leave();
  }
  if (room === undefined) {
    document.title = 'Plaza demo';
    stopLobby = showLobby(app, {
      join(id) {
        setUrl(id);
        route();
      },
    });
    return;
  }
  document.title = `${room} · Plaza demo`;
  const current = new RoomView(app, room, store.name(), {
    exit() {
      if (view !== current) return;
      view = undefined;
      setUrl(undefined);
      route();
    },
  });
  view = current;
  void current.start();
}

window.addEventListener('popstate', route);

/** Read-only state for browser tests; see README.md ("Test hooks"). */
window.__plaza = {
  session: () => view?.session(),
  user: () => view?.user(),
  policy: () => view?.policy(),
  transport: () => view?.transport(),
  avatar: (session) => view?.avatar(session),
  objects: () => view?.objects() ?? [],
  highlights: () => view?.highlightList() ?? [],
  toClient: (x, y) => view?.toClient(x, y),
  calls: () => view?.calls() ?? [],
  remoteVideos: () =>
    [...document.querySelectorAll<HTMLVideoElement>('[data-testid="remote-video"]')].map((v) => ({
      peer: v.dataset['peer'] ?? '',
      currentTime: v.currentTime,
      frames: v.getVideoPlaybackQuality?.().totalVideoFrames ?? 0,
    })),
};

route();
