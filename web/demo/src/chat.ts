/**
 * The chat: messages are published on their own channel with `echo` and a topic, and a message
 * is shown when its event arrives — the own one too, so that it appears once. The member picks
 * the topics it follows and can turn on "quiet mode" (see quiet.ts): then chat messages on other
 * topics are held by the server and arrive together, as one `batch`, marked so in the log.
 */
import type { DeliveryPolicy, RoomEvent, RoomMessage as PlazaMessage, RoomHandle } from '@plaza/client';
import { isObj } from './entities';
import {
  followedBy,
  normalFollow,
  parsePrefs,
  policyUpdate,
  QUIET_MAX_DELAY_MS,
  QUIET_MAX_HELD,
  quietPolicy,
  TOPICS,
  type ChatPrefs,
  type Topic,
} from './quiet';
import { h, store, toast } from './util';

/** The channel chat messages go on (joined at `join`, besides `main`). */
export const CHAT_CHANNEL = 'chat';

export class Chat {
  /** The "Chat" card: quiet mode and the topics followed, the log and the form. */
  readonly element: HTMLElement;
  private readonly roomId: string;
  private readonly log: HTMLElement;
  private readonly input: HTMLInputElement;
  private readonly topicSelect: HTMLSelectElement;
  private readonly followBoxes = new Map<Topic, HTMLInputElement>();
  private readonly quietBox: HTMLInputElement;
  private readonly stateEl: HTMLElement;
  private readonly room: () => RoomHandle | undefined;
  private readonly nameOf: (session: string | undefined) => string;
  /** What the member chose (kept per room in sessionStorage); the policy follows it. */
  private prefs: ChatPrefs;
  /** Whether policy requests are being sent, and whether the choice changed meanwhile. */
  private syncing = false;
  private again = false;
  /**
   * A restored session with quiet mode off: the server may still hold a policy this page does
   * not know of (a change still on its way when the page went), so it is cleared once.
   */
  private clearUnknown = false;
  /** Batches seen (the number marks the lines that came in each). */
  private batches = 0;

  /** `room`: the room once joined; `nameOf`: the name to show for a sender. */
  constructor(roomId: string, room: () => RoomHandle | undefined, nameOf: (session: string | undefined) => string) {
    this.roomId = roomId;
    this.room = room;
    this.nameOf = nameOf;
    this.prefs = parsePrefs(store.chatPrefs(roomId));

    this.stateEl = h('span', { class: 'quiet-state', 'data-testid': 'quiet-state', 'aria-live': 'polite' });
    this.quietBox = h('input', { type: 'checkbox', 'data-testid': 'quiet-toggle' });
    this.quietBox.addEventListener('change', () => this.choose({ quiet: this.quietBox.checked }));
    const follow = h(
      'div',
      { class: 'follow', role: 'group', 'aria-label': 'Topics followed', 'data-testid': 'follow' },
      h('span', { class: 'muted' }, 'Follow'),
    );
    for (const topic of TOPICS) {
      const box = h('input', { type: 'checkbox', 'data-testid': `follow-${topic}`, value: topic });
      box.addEventListener('change', () => {
        const rest = this.prefs.follow.filter((t) => t !== topic);
        this.choose({ follow: box.checked ? [...rest, topic] : rest });
      });
      this.followBoxes.set(topic, box);
      follow.append(h('label', {}, box, `#${topic}`));
    }
    const quiet = h(
      'label',
      {
        class: 'quiet',
        title: `Messages on topics you do not follow wait up to ${QUIET_MAX_DELAY_MS / 1000} s or until ${QUIET_MAX_HELD} are waiting, then arrive together`,
      },
      this.quietBox,
      'Quiet mode',
    );

    this.log = h('ol', { class: 'chat-log', 'data-testid': 'chat-log', 'aria-live': 'polite' });
    this.topicSelect = h('select', { 'data-testid': 'chat-topic', 'aria-label': 'Topic' });
    for (const topic of TOPICS) this.topicSelect.append(h('option', { value: topic }, `#${topic}`));
    this.topicSelect.addEventListener('change', () => {
      const topic = this.topicSelect.value;
      if (TOPICS.includes(topic as Topic)) this.choose({ topic: topic as Topic });
    });
    this.input = h('input', {
      'data-testid': 'chat-input',
      placeholder: 'Say something…',
      maxlength: 500,
      autocomplete: 'off',
      'aria-label': 'Chat message',
    });
    const send = h('button', { type: 'submit', 'data-testid': 'chat-send' }, 'Send');
    const form = h('form', { class: 'chat-form' }, this.topicSelect, this.input, send);
    form.addEventListener('submit', (ev) => {
      ev.preventDefault();
      this.send();
    });
    this.element = h(
      'section',
      { class: 'card chat' },
      h('h2', {}, 'Chat'),
      h('div', { class: 'chat-prefs' }, quiet, follow),
      this.stateEl,
      this.log,
      form,
    );
    this.render();
  }

  /** The policy to join with: quiet mode's, if it is on (sent again with every rejoin). */
  joinPolicy(): DeliveryPolicy | undefined {
    return this.prefs.quiet ? quietPolicy(this.prefs.follow) : undefined;
  }

  /**
   * The room was joined (with {@link joinPolicy}); `restored`: it resumed a session saved before
   * a reload. Brings the policy in line with what the member chose meanwhile.
   */
  joined(restored: boolean): void {
    this.clearUnknown = restored && !this.prefs.quiet;
    this.sync();
  }

  private send(): void {
    const text = this.input.value.trim();
    const room = this.room();
    if (!text || !room) return;
    this.input.value = '';
    // Echoed back: the own message is shown once, when its event arrives.
    room.publish('chat', { text }, { channel: CHAT_CHANNEL, topic: this.prefs.topic, echo: true }).catch((err: unknown) => {
      toast(`Message not sent: ${String(err)}`, 'error');
    });
  }

  /** Shows `m` if it is a chat message (others are not the chat's). */
  onMessage(m: PlazaMessage): void {
    if (m.channel !== CHAT_CHANNEL || m.event !== 'chat' || !isObj(m.data) || typeof m.data['text'] !== 'string') return;
    const mine = m.from !== undefined && m.from === this.room()?.session;
    const line = h(
      'li',
      { 'data-seq': m.seq, 'data-from': m.from ?? '', 'data-topic': m.topic, class: mine ? 'self' : '' },
      h('b', {}, `${this.nameOf(m.from)}: `),
      m.data['text'],
    );
    const atBottom = this.log.scrollTop + this.log.clientHeight >= this.log.scrollHeight - 8;
    this.log.append(line);
    if (atBottom) this.log.scrollTop = this.log.scrollHeight;
  }

  /**
   * After the events of a `batch` were handled one by one (their lines are in the log): marks
   * their lines as having come together. The lines went in in the same task, so they are never
   * drawn unmarked.
   */
  onBatch(events: readonly RoomEvent[]): void {
    const seqs = new Set(events.map((e) => String(e.seq)));
    const lines = [...this.log.children].filter((li): li is HTMLElement => li instanceof HTMLElement && seqs.has(li.dataset['seq'] ?? ''));
    if (lines.length === 0) return;
    const batch = ++this.batches;
    lines.forEach((li, i) => {
      li.dataset['batch'] = String(batch);
      li.classList.add('batched');
      if (i === 0) li.classList.add('batch-start');
      li.title = `held, then arrived together (${events.length} events)`;
    });
  }

  // ---- quiet mode and the topics followed ----

  /** The member changed a choice: keep it, show it, and bring the policy in line. */
  private choose(change: Partial<ChatPrefs>): void {
    this.prefs = { ...this.prefs, ...change };
    this.prefs.follow = normalFollow(this.prefs.follow);
    store.saveChatPrefs(this.roomId, this.prefs);
    this.render();
    if (change.follow !== undefined || change.quiet !== undefined) this.sync();
  }

  /**
   * Sends what turns the policy in force into the chosen one: `policy.update` with only the
   * filters added or removed (or the whole policy when there is none), `policy.clear` when quiet
   * mode goes off. One change at a time; a choice made meanwhile is sent after. If the server
   * refuses (or the connection drops), the choice falls back to the policy in force.
   */
  private sync(): void {
    if (this.syncing) {
      this.again = true;
      return;
    }
    const room = this.room();
    if (!room) return;
    this.syncing = true;
    this.render();
    const step = async (): Promise<void> => {
      // Once more only if the choice changed while a request was on its way.
      do {
        this.again = false;
        const inForce = room.deliveryPolicy;
        if (!this.prefs.quiet) {
          if (inForce !== undefined || this.clearUnknown) await room.clearPolicy();
          this.clearUnknown = false;
        } else {
          const want = quietPolicy(this.prefs.follow);
          const update = inForce === undefined ? want : policyUpdate(inForce, want);
          if (update !== undefined) await room.updatePolicy(update);
        }
      } while (this.again);
    };
    step()
      .catch((err: unknown) => {
        const inForce = room.deliveryPolicy;
        this.prefs = { ...this.prefs, quiet: inForce !== undefined };
        if (inForce !== undefined) this.prefs.follow = followedBy(inForce);
        store.saveChatPrefs(this.roomId, this.prefs);
        toast(`Quiet mode not changed: ${String(err)}`, 'error');
      })
      .finally(() => {
        this.syncing = false;
        this.render();
        // A choice made while a failed request was on its way.
        if (this.again) this.sync();
      });
  }

  /**
   * Shows the choices and the policy in force: `data-quiet` (`on`/`off`) and `data-follow` (the
   * topics followed, space-separated) on the state line are the server's as last confirmed;
   * `data-pending` is there while a change is on its way (or before the join).
   */
  private render(): void {
    this.quietBox.checked = this.prefs.quiet;
    for (const [topic, box] of this.followBoxes) box.checked = this.prefs.follow.includes(topic);
    this.topicSelect.value = this.prefs.topic;

    const room = this.room();
    const inForce = room?.deliveryPolicy;
    const quiet = room === undefined ? this.prefs.quiet : inForce !== undefined;
    const follow = inForce !== undefined ? followedBy(inForce) : this.prefs.follow;
    const el = this.stateEl;
    el.dataset['quiet'] = quiet ? 'on' : 'off';
    el.dataset['follow'] = follow.join(' ');
    el.toggleAttribute('data-pending', room === undefined || this.syncing);
    const topics = follow.length > 0 ? follow.map((t) => `#${t}`).join(' ') : 'no topic';
    el.textContent = quiet
      ? `Quiet: ${topics} at once; other topics wait ≤ ${QUIET_MAX_DELAY_MS / 1000} s or ${QUIET_MAX_HELD} messages`
      : 'Every message at once';
  }
}
