/**
 * The entities the demo keeps in a room, and how it reads them. An entity's `data` is
 * whatever JSON the server holds (any client may have written it), so every field is checked,
 * and defaulted where it can be, before the view uses it.
 */
import type { Entity, Json } from '@plaza/client';

/** `data` of an entity of kind `avatar`. */
export interface AvatarData {
  session: string;
  name: string;
  x: number;
  y: number;
  tx: number;
  ty: number;
  color: string;
}

/** `data` of an entity of kind `object`. */
export interface ObjectData {
  x: number;
  y: number;
  color: string;
  label: string;
}

const isNum = (v: unknown): v is number => typeof v === 'number' && Number.isFinite(v);

/** Whether a JSON value is an object (not null, not an array). */
export const isObj = (v: Json | undefined): v is { [k: string]: Json } => typeof v === 'object' && v !== null && !Array.isArray(v);

/** The avatar data of `e`, or undefined if it is no (usable) avatar. */
export function avatarData(e: Entity | undefined): AvatarData | undefined {
  if (!e || e.kind !== 'avatar' || !isObj(e.data)) return undefined;
  const d = e.data;
  if (typeof d['session'] !== 'string' || !isNum(d['x']) || !isNum(d['y'])) return undefined;
  return {
    session: d['session'],
    name: typeof d['name'] === 'string' ? d['name'] : d['session'],
    x: d['x'],
    y: d['y'],
    tx: isNum(d['tx']) ? d['tx'] : d['x'],
    ty: isNum(d['ty']) ? d['ty'] : d['y'],
    color: typeof d['color'] === 'string' ? d['color'] : '#888',
  };
}

/** The shared object data of `e`, or undefined if it is no (usable) shared object. */
export function objectData(e: Entity | undefined): ObjectData | undefined {
  if (!e || e.kind !== 'object' || !isObj(e.data)) return undefined;
  const d = e.data;
  if (!isNum(d['x']) || !isNum(d['y'])) return undefined;
  return {
    x: d['x'],
    y: d['y'],
    color: typeof d['color'] === 'string' ? d['color'] : '#999',
    label: typeof d['label'] === 'string' ? d['label'] : e.id,
  };
}
