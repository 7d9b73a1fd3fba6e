/** Small helpers shared by the views: DOM, time, errors, storage. */
import { PlazaError } from '@plaza/client';

type Attrs = Record<string, string | number | boolean | undefined>;

function setAttrs(el: Element, attrs: Attrs): void {
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === false) continue;
    el.setAttribute(key, value === true ? '' : String(value));
  }
}

/** Creates an HTML element with attributes and children. */
export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: Attrs = {},
  ...children: Array<Node | string>
): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  setAttrs(el, attrs);
  el.append(...children);
  return el;
}

const SVG_NS = 'http://www.w3.org/2000/svg';

/** Creates an SVG element with attributes and children. */
export function s<K extends keyof SVGElementTagNameMap>(
  tag: K,
  attrs: Attrs = {},
  ...children: Array<Node | string>
): SVGElementTagNameMap[K] {
  const el = document.createElementNS(SVG_NS, tag);
  setAttrs(el, attrs);
  el.append(...children);
  return el;
}

/** Adds a window event listener; returns what removes it. */
export function listen<K extends keyof WindowEventMap>(target: Window, type: K, handler: (ev: WindowEventMap[K]) => void): () => void {
  target.addEventListener(type, handler);
  return () => target.removeEventListener(type, handler);
}

/** The clock of movements and throttles (ms, monotonic). */
export const now = (): number => performance.now();

export const clamp = (v: number, lo: number, hi: number): number => Math.min(hi, Math.max(lo, v));

/** The Plaza error code of `err` (`lock_held`, `room_not_found`, …), if it is a PlazaError. */
export function errorCode(err: unknown): string | undefined {
  return err instanceof PlazaError ? err.code : undefined;
}

let toastTimer: ReturnType<typeof setTimeout> | undefined;

/** Shows a short message in the toast (`data-testid="toast"`) for a few seconds. */
export function toast(text: string, kind: 'info' | 'error' = 'info'): void {
  const el = document.getElementById('toast');
  if (!el) return;
  el.textContent = text;
  el.className = `toast ${kind}`;
  el.hidden = false;
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => {
    el.hidden = true;
  }, 4000);
}

/** A random display name such as `guest-123`. */
export function randomName(): string {
  return `guest-${100 + Math.floor(Math.random() * 900)}`;
}

/** A random room id such as `plaza-4821`. */
export function randomRoomId(): string {
  return `plaza-${1000 + Math.floor(Math.random() * 9000)}`;
}

/** The avatars' colours. */
export const PALETTE = ['#d62839', '#ffc914', '#76b041', '#2e86ab', '#7b2cbf', '#3d405b', '#ff5d8f', '#6f4e37'];

/**
 * The shared objects' colours, none of them an avatar's ({@link PALETTE}): an avatar the colour
 * of the crate would read as part of it.
 */
export const OBJECT_COLORS = { crate: '#17bebb', ball: '#8e6c8a', lamp: '#f18f01' } as const;

export function pick<T>(items: readonly T[]): T {
  return items[Math.floor(Math.random() * items.length)] as T;
}

const NAME_KEY = 'plaza.name';
const sessionKey = (room: string) => `plaza.session.${room}`;
const chatKey = (room: string) => `plaza.chat.${room}`;

/**
 * Per-tab storage (sessionStorage): the display name, saved sessions for reloads, and each
 * room's chat choices (topic, topics followed, quiet mode).
 */
export const store = {
  /** The name chosen in this tab; a random one (kept from now on) if none was. */
  name(): string {
    let name = sessionStorage.getItem(NAME_KEY);
    if (!name) {
      name = randomName();
      sessionStorage.setItem(NAME_KEY, name);
    }
    return name;
  },
  setName(name: string): void {
    sessionStorage.setItem(NAME_KEY, name);
  },
  /** Saves a room's session (from `room.saveSession()`) so that a reload resumes it. */
  saveSession(room: string, saved: unknown): void {
    if (saved === undefined) return;
    sessionStorage.setItem(sessionKey(room), JSON.stringify(saved));
  },
  /** The saved session of a room, if any (removed from storage: it is used once). */
  takeSession(room: string): unknown {
    const raw = sessionStorage.getItem(sessionKey(room));
    sessionStorage.removeItem(sessionKey(room));
    if (raw === null) return undefined;
    try {
      return JSON.parse(raw) as unknown;
    } catch {
      return undefined;
    }
  },
  forgetSession(room: string): void {
    sessionStorage.removeItem(sessionKey(room));
  },
  /** A room's chat choices as saved (unchecked: the chat validates them), if any. */
  chatPrefs(room: string): unknown {
    const raw = sessionStorage.getItem(chatKey(room));
    if (raw === null) return undefined;
    try {
      return JSON.parse(raw) as unknown;
    } catch {
      return undefined;
    }
  },
  saveChatPrefs(room: string, prefs: unknown): void {
    sessionStorage.setItem(chatKey(room), JSON.stringify(prefs));
  },
};

/** Whether `id` is a valid room id (docs/protocol.md, POST /v1/rooms). */
export function validRoomId(id: string): boolean {
  return /^[A-Za-z0-9_.-]{1,64}$/.test(id);
}

/** Whether `name` is a valid display name (1–64 UTF-8 bytes). */
export function validName(name: string): boolean {
  const bytes = new TextEncoder().encode(name).length;
  return bytes >= 1 && bytes <= 64;
}
