/**
 * The chat: messages are published on their own channel with `echo`, and a message is shown
 * when its event arrives — the own one too, so that it appears once.
 */
import type { RoomMessage as PlazaMessage, RoomHandle } from '@plaza/client';
import { isObj } from './entities';
import { h, toast } from './util';

/** The channel chat messages go on (joined at `join`, besides `main`). */
export const CHAT_CHANNEL = 'chat';

export class Chat {
  /** The "Chat" card: the log and the form. */
  readonly element: HTMLElement;
  private readonly log: HTMLElement;
  private readonly input: HTMLInputElement;
  private readonly room: () => RoomHandle | undefined;
  private readonly nameOf: (session: string | undefined) => string;

  /** `room`: the room once joined; `nameOf`: the name to show for a sender. */
  constructor(room: () => RoomHandle | undefined, nameOf: (session: string | undefined) => string) {
    this.room = room;
    this.nameOf = nameOf;
    this.log = h('ol', { class: 'chat-log', 'data-testid': 'chat-log', 'aria-live': 'polite' });
    this.input = h('input', {
      'data-testid': 'chat-input',
      placeholder: 'Say something…',
      maxlength: 500,
      autocomplete: 'off',
      'aria-label': 'Chat message',
    });
    const send = h('button', { type: 'submit', 'data-testid': 'chat-send' }, 'Send');
    const form = h('form', { class: 'chat-form' }, this.input, send);
    form.addEventListener('submit', (ev) => {
      ev.preventDefault();
      this.send();
    });
    this.element = h('section', { class: 'card chat' }, h('h2', {}, 'Chat'), this.log, form);
  }

  private send(): void {
    const text = this.input.value.trim();
    const room = this.room();
    if (!text || !room) return;
    this.input.value = '';
    // Echoed back: the own message is shown once, when its event arrives.
    room.publish('chat', { text }, { channel: CHAT_CHANNEL, echo: true }).catch((err: unknown) => {
      toast(`Message not sent: ${String(err)}`, 'error');
    });
  }

  /** Shows `m` if it is a chat message (others are not the chat's). */
  onMessage(m: PlazaMessage): void {
    if (m.channel !== CHAT_CHANNEL || m.event !== 'chat' || !isObj(m.data) || typeof m.data['text'] !== 'string') return;
    const mine = m.from !== undefined && m.from === this.room()?.session;
    const line = h(
      'li',
      { 'data-seq': m.seq, 'data-from': m.from ?? '', class: mine ? 'self' : '' },
      h('b', {}, `${this.nameOf(m.from)}: `),
      m.data['text'],
    );
    const atBottom = this.log.scrollTop + this.log.clientHeight >= this.log.scrollHeight - 8;
    this.log.append(line);
    if (atBottom) this.log.scrollTop = this.log.scrollHeight;
  }
}
