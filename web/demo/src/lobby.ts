/** The lobby: name, the room list (`GET /v1/rooms`), creating a room, joining one. */
import { ApiError, createRoom, listRooms, type RoomInfo } from './api';
import { h, randomRoomId, store, toast, validName, validRoomId } from './util';

const REFRESH_MS = 5000;

export interface LobbyCallbacks {
  /** The user chose a room to join. */
  join(room: string): void;
}

/** Renders the lobby into `root`; returns a function that stops it (timers, listeners). */
export function showLobby(root: HTMLElement, callbacks: LobbyCallbacks): () => void {
  const nameInput = h('input', {
    'data-testid': 'name-input',
    id: 'name',
    maxlength: 64,
    autocomplete: 'off',
    value: store.name(),
  });
  store.setName(nameInput.value);
  nameInput.addEventListener('input', () => {
    const name = nameInput.value.trim();
    if (validName(name)) store.setName(name);
  });

  const list = h('ul', { 'data-testid': 'room-list', class: 'room-list' });
  const status = h('p', { class: 'muted', 'data-testid': 'room-list-status' }, 'Loading rooms…');
  const refreshButton = h('button', { type: 'button', 'data-testid': 'refresh-rooms' }, 'Refresh');

  const createInput = h('input', {
    'data-testid': 'create-room-input',
    id: 'create-room',
    placeholder: randomRoomId(),
    maxlength: 64,
    autocomplete: 'off',
    pattern: '[A-Za-z0-9_.\\-]{1,64}',
  });
  const createButton = h('button', { type: 'submit', 'data-testid': 'create-room-button' }, 'Create and join');
  const createForm = h(
    'form',
    { class: 'create-room', 'data-testid': 'create-room-form' },
    h('label', { for: 'create-room' }, 'New room id'),
    createInput,
    createButton,
  );

  root.replaceChildren(
    h(
      'main',
      { class: 'lobby', 'data-testid': 'lobby' },
      h('h1', {}, 'Plaza demo'),
      h(
        'p',
        { class: 'muted' },
        'Join a room, open it in a second tab, and move around: avatars, chat and shared objects are live across tabs.',
      ),
      h('section', { class: 'card' }, h('label', { for: 'name' }, 'Your name'), nameInput),
      h(
        'section',
        { class: 'card' },
        h('div', { class: 'row' }, h('h2', {}, 'Rooms'), refreshButton),
        status,
        list,
      ),
      h('section', { class: 'card' }, h('h2', {}, 'Create a room'), createForm),
    ),
  );

  let stopped = false;

  function currentName(): string | undefined {
    const name = nameInput.value.trim();
    if (!validName(name)) {
      toast('Enter a name of 1–64 bytes first', 'error');
      nameInput.focus();
      return undefined;
    }
    store.setName(name);
    return name;
  }

  function render(rooms: RoomInfo[]): void {
    status.textContent = rooms.length === 0 ? 'No rooms yet: create one below.' : '';
    list.replaceChildren(
      ...rooms.map((room) => {
        const join = h('button', { type: 'button', 'data-testid': `join-${room.id}` }, 'Join');
        join.addEventListener('click', () => {
          if (currentName() !== undefined) callbacks.join(room.id);
        });
        const members = `${room.members} member${room.members === 1 ? '' : 's'}`;
        return h(
          'li',
          { 'data-room': room.id },
          h('span', { class: 'room-id' }, room.id),
          h('span', { class: 'muted', 'data-testid': `members-${room.id}` }, members),
          room.access === 'ticket' ? h('span', { class: 'muted' }, 'ticket only') : '',
          join,
        );
      }),
    );
  }

  let inflight: Promise<void> | undefined;
  let again = false;

  /** Reloads the list; a call while one is loading makes it load once more after. */
  function refresh(): Promise<void> {
    if (stopped) return Promise.resolve();
    if (inflight) {
      again = true;
      return inflight;
    }
    inflight = (async () => {
      do {
        again = false;
        try {
          const rooms = await listRooms();
          if (!stopped) render(rooms);
        } catch (err) {
          if (!stopped) status.textContent = `Cannot list rooms: ${String(err)}`;
        }
      } while (again && !stopped);
      inflight = undefined;
    })();
    return inflight;
  }

  refreshButton.addEventListener('click', () => void refresh());
  const timer = setInterval(() => void refresh(), REFRESH_MS);

  createForm.addEventListener('submit', (ev) => {
    ev.preventDefault();
    const id = createInput.value.trim() || createInput.placeholder;
    if (!validRoomId(id)) {
      toast('A room id is 1–64 letters, digits, "-", "_" or "."', 'error');
      return;
    }
    if (currentName() === undefined) return;
    createButton.disabled = true;
    createRoom(id)
      .then(() => {
        toast(`Room ${id} created`);
        // Creating a room is for using it: go straight in.
        callbacks.join(id);
      })
      .catch((err: unknown) => {
        const text =
          err instanceof ApiError && err.code === 'room_exists'
            ? `Room ${id} exists already`
            : err instanceof ApiError && err.code === 'unauthorized'
              ? 'This server creates rooms only with its API key (api_key): join an existing room'
              : String(err);
        toast(text, 'error');
      })
      .finally(() => {
        createButton.disabled = false;
      });
  });

  void refresh();
  return () => {
    stopped = true;
    clearInterval(timer);
  };
}
