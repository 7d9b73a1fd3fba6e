/** The plaza: one SVG of 800 × 500 logical units, scaled to fit, redrawn every frame. */
import { PROXIMITY_RADIUS } from './video';
import { s } from './util';

export const WIDTH = 800;
export const HEIGHT = 500;
/** Half the side of a shared object's square. */
export const OBJECT_HALF = 30;
export const AVATAR_RADIUS = 16;

/** What to draw for one avatar. */
export interface AvatarView {
  id: string;
  session: string;
  name: string;
  color: string;
  x: number;
  y: number;
  /** This tab's own avatar. */
  self: boolean;
  /** Moving: its target (drawn for the own avatar). */
  target?: { x: number; y: number };
  /** Its member is not connected (it may come back: a reload, a network drop). */
  absent: boolean;
}

/** What to draw for one shared object. */
export interface ObjectView {
  id: string;
  label: string;
  color: string;
  x: number;
  y: number;
  /** Who holds its lock, if anyone. */
  holder?: { name: string; self: boolean };
  /** Names of the members highlighting it. */
  highlightedBy: string[];
}

interface AvatarEls {
  g: SVGGElement;
  body: SVGCircleElement;
  label: SVGTextElement;
  key: string;
}

interface ObjectEls {
  g: SVGGElement;
  body: SVGRectElement;
  halo: SVGRectElement;
  label: SVGTextElement;
  highlighters: SVGTextElement;
  lock: SVGGElement;
  lockLabel: SVGTextElement;
  key: string;
}

const fmt = (n: number) => (Math.round(n * 10) / 10).toString();

export class Scene {
  readonly svg: SVGSVGElement;
  private readonly objectLayer: SVGGElement;
  private readonly avatarLayer: SVGGElement;
  private readonly targetMarker: SVGGElement;
  private readonly avatars = new Map<string, AvatarEls>();
  private readonly objects = new Map<string, ObjectEls>();

  constructor() {
    this.objectLayer = s('g', { class: 'objects' });
    this.avatarLayer = s('g', { class: 'avatars' });
    this.targetMarker = s(
      'g',
      { class: 'target', visibility: 'hidden' },
      s('circle', { r: 6 }),
      s('path', { d: 'M -10 0 H 10 M 0 -10 V 10' }),
    );
    this.svg = s(
      'svg',
      {
        'data-testid': 'plaza',
        class: 'plaza',
        viewBox: `0 0 ${WIDTH} ${HEIGHT}`,
        role: 'application',
        'aria-label': 'The plaza: click to move your avatar, drag objects to move them',
      },
      s(
        'defs',
        {},
        s(
          'pattern',
          { id: 'grid', width: 40, height: 40, patternUnits: 'userSpaceOnUse' },
          s('path', { d: 'M 40 0 L 0 0 0 40', class: 'grid-line' }),
        ),
      ),
      s('rect', { class: 'floor', 'data-floor': '', x: 0, y: 0, width: WIDTH, height: HEIGHT }),
      s('rect', { class: 'grid', x: 0, y: 0, width: WIDTH, height: HEIGHT, fill: 'url(#grid)' }),
      this.targetMarker,
      this.objectLayer,
      this.avatarLayer,
    );
  }

  /** Plaza coordinates of a point in client (CSS pixel) coordinates. */
  toPlaza(clientX: number, clientY: number): { x: number; y: number } {
    const ctm = this.svg.getScreenCTM();
    if (!ctm) return { x: 0, y: 0 };
    const p = new DOMPoint(clientX, clientY).matrixTransform(ctm.inverse());
    return { x: p.x, y: p.y };
  }

  /** Client (CSS pixel) coordinates of a plaza point. */
  toClient(x: number, y: number): { x: number; y: number } {
    const ctm = this.svg.getScreenCTM();
    if (!ctm) return { x: 0, y: 0 };
    const p = new DOMPoint(x, y).matrixTransform(ctm);
    return { x: p.x, y: p.y };
  }

  /** The id of the shared object an event target belongs to, if any. */
  objectAt(target: EventTarget | null): string | undefined {
    if (!(target instanceof Element)) return undefined;
    return target.closest<SVGGElement>('[data-object-id]')?.dataset['objectId'];
  }

  /** Draws this frame: creates, updates and removes elements to match. */
  draw(avatars: readonly AvatarView[], objects: readonly ObjectView[]): void {
    this.drawObjects(objects);
    this.drawAvatars(avatars);
  }

  private drawObjects(objects: readonly ObjectView[]): void {
    const seen = new Set<string>();
    for (const o of objects) {
      seen.add(o.id);
      let els = this.objects.get(o.id);
      if (!els) {
        els = this.createObject(o.id);
        this.objects.set(o.id, els);
      }
      els.g.setAttribute('transform', `translate(${fmt(o.x)} ${fmt(o.y)})`);
      const key = JSON.stringify([o.label, o.color, o.holder, o.highlightedBy]);
      if (key === els.key) continue;
      els.key = key;
      els.body.setAttribute('fill', o.color);
      els.label.textContent = o.label;
      const highlighted = o.highlightedBy.length > 0;
      els.halo.setAttribute('visibility', highlighted ? 'visible' : 'hidden');
      els.highlighters.textContent = highlighted ? o.highlightedBy.join(', ') : '';
      els.g.classList.toggle('held', o.holder !== undefined);
      els.g.classList.toggle('held-by-me', o.holder?.self === true);
      els.g.classList.toggle('highlighted', highlighted);
      els.lock.setAttribute('visibility', o.holder ? 'visible' : 'hidden');
      els.lockLabel.textContent = o.holder ? (o.holder.self ? 'you' : o.holder.name) : '';
      if (o.holder) els.g.dataset['holder'] = o.holder.name;
      else delete els.g.dataset['holder'];
    }
    for (const [id, els] of this.objects) {
      if (seen.has(id)) continue;
      els.g.remove();
      this.objects.delete(id);
    }
  }

  private createObject(id: string): ObjectEls {
    const a = OBJECT_HALF;
    const halo = s('rect', { class: 'halo', x: -a - 9, y: -a - 9, width: 2 * a + 18, height: 2 * a + 18, rx: 16 });
    const body = s('rect', { class: 'body', x: -a, y: -a, width: 2 * a, height: 2 * a, rx: 10 });
    const label = s('text', { class: 'label', y: 5 });
    const highlighters = s('text', { class: 'highlighters', y: -a - 16 });
    const lockLabel = s('text', { class: 'lock-label', x: 4, y: a + 24 });
    // A small padlock left of the holder's name.
    const lock = s(
      'g',
      { class: 'lock', visibility: 'hidden' },
      s('path', { class: 'shackle', d: `M -12 ${a + 16} v -5 a 5 5 0 0 1 10 0 v 5` }),
      s('rect', { class: 'lock-body', x: -15, y: a + 15, width: 16, height: 12, rx: 2 }),
      lockLabel,
    );
    const g = s(
      'g',
      { class: 'object', 'data-object-id': id, 'data-testid': `object-${id}` },
      halo,
      body,
      label,
      highlighters,
      lock,
    );
    this.objectLayer.append(g);
    return { g, body, halo, label, highlighters, lock, lockLabel, key: '' };
  }

  private drawAvatars(avatars: readonly AvatarView[]): void {
    const seen = new Set<string>();
    let ownTarget: { x: number; y: number } | undefined;
    for (const a of avatars) {
      seen.add(a.id);
      let els = this.avatars.get(a.id);
      if (!els) {
        const body = s('circle', { class: 'body', r: AVATAR_RADIUS });
        const label = s('text', { class: 'name', y: AVATAR_RADIUS + 16 });
        // Proximity range: shown around this member's own avatar only (CSS).
        const range = s('circle', { class: 'range', r: PROXIMITY_RADIUS });
        const g = s('g', { class: 'avatar', 'data-avatar-id': a.id, 'data-session': a.session }, range, body, label);
        this.avatarLayer.append(g);
        els = { g, body, label, key: '' };
        this.avatars.set(a.id, els);
      }
      els.g.setAttribute('transform', `translate(${fmt(a.x)} ${fmt(a.y)})`);
      if (a.self && a.target) ownTarget = a.target;
      const key = JSON.stringify([a.name, a.color, a.self, a.absent]);
      if (key === els.key) continue;
      els.key = key;
      els.body.setAttribute('fill', a.color);
      els.label.textContent = a.self ? `${a.name} (you)` : a.name;
      els.g.classList.toggle('self', a.self);
      els.g.classList.toggle('absent', a.absent);
    }
    for (const [id, els] of this.avatars) {
      if (seen.has(id)) continue;
      els.g.remove();
      this.avatars.delete(id);
    }
    if (ownTarget) {
      this.targetMarker.setAttribute('transform', `translate(${fmt(ownTarget.x)} ${fmt(ownTarget.y)})`);
      this.targetMarker.setAttribute('visibility', 'visible');
    } else {
      this.targetMarker.setAttribute('visibility', 'hidden');
    }
  }
}
