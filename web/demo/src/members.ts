/**
 * The members: the list (each member with its avatar's colour), their count, and the name of
 * everyone seen in the room — kept after they go, for their chat lines.
 */
import type { Member, RoomHandle } from '@plaza/client';
import { h } from './util';

export class Members {
  /** The member count with its noun, "1 member" or "3 members" (shown in the room's header). */
  readonly count: HTMLElement;
  private readonly countNumber: HTMLElement;
  private readonly countNoun: HTMLElement;
  /** The "Members" card. */
  readonly element: HTMLElement;
  private readonly list: HTMLElement;
  private readonly room: () => RoomHandle | undefined;
  private readonly colorOf: (session: string) => string | undefined;
  private readonly changed: () => void;
  /** Every name seen, by session (for chat lines of members who have gone). */
  private readonly names = new Map<string, string>();
  private key = '';

  /**
   * `room`: the room once joined; `colorOf`: the colour of a member's avatar; `changed`: told
   * when the list was redrawn.
   */
  constructor(
    room: () => RoomHandle | undefined,
    colorOf: (session: string) => string | undefined,
    changed: () => void,
  ) {
    this.room = room;
    this.colorOf = colorOf;
    this.changed = changed;
    this.countNumber = h('span', { 'data-testid': 'member-count' }, '0');
    this.countNoun = h('span', {}, ' members');
    this.count = h('span', { 'data-testid': 'member-count-label' }, this.countNumber, this.countNoun);
    this.list = h('ul', { class: 'members', 'data-testid': 'member-list' });
    this.element = h('section', { class: 'card members-card' }, h('h2', {}, 'Members'), this.list);
  }

  /** Remembers a member's name (from its join or its avatar). */
  remember(session: string, name: string): void {
    this.names.set(session, name);
  }

  /** The name of `session`: a member's, or the last one seen of someone who has gone. */
  nameOf(session: string | undefined): string {
    if (session === undefined) return 'someone';
    return this.room()?.members.find((m) => m.session === session)?.name ?? this.names.get(session) ?? session.slice(0, 6);
  }

  /** Renders the member list (with each member's avatar colour) if anything in it changed. */
  show(members: readonly Member[]): void {
    const me = this.room()?.session;
    for (const m of members) this.names.set(m.session, m.name);
    const rows = members.map((m) => ({ ...m, color: this.colorOf(m.session) ?? '#888' }));
    const key = JSON.stringify([me, rows]);
    if (key === this.key) return;
    this.key = key;
    this.countNumber.textContent = String(members.length);
    this.countNoun.textContent = members.length === 1 ? ' member' : ' members';
    this.list.replaceChildren(
      ...rows.map((m) =>
        h(
          'li',
          { 'data-session': m.session, class: m.session === me ? 'self' : '' },
          h('span', { class: 'dot', style: `background:${m.color}` }),
          m.name,
          m.session === me ? h('span', { class: 'muted' }, ' (you)') : '',
          m.platform !== 'browser' ? h('span', { class: 'muted' }, ` · ${m.platform}`) : '',
        ),
      ),
    );
    this.changed();
  }
}
