/**
 * Error codes the server sends (docs/protocol.md, "Error codes"), plus the client's own:
 * `timeout` (a request got no response in time), `disconnected` (the connection dropped while
 * a request was in flight, so its outcome is unknown), `closed` (the client or room was closed).
 */
export type PlazaErrorCode =
  | 'bad_json'
  | 'unknown_type'
  | 'invalid_frame'
  | 'frame_too_large'
  | 'rate_limited'
  | 'ticket_invalid'
  | 'ticket_expired'
  | 'ticket_used'
  | 'room_not_found'
  | 'room_full'
  | 'ticket_required'
  | 'too_many_rooms'
  | 'already_joined'
  | 'not_joined'
  | 'unknown_op'
  | 'invalid_args'
  | 'entity_not_found'
  | 'version_conflict'
  | 'lock_held'
  | 'lock_not_held'
  | 'session_not_found'
  | 'shutting_down'
  | 'invalid_request'
  | 'broker_unavailable'
  | 'internal'
  | 'timeout'
  | 'disconnected'
  | 'closed'
  // Codes added by newer servers stay representable.
  | (string & {});

/** An error answered by the server (`error` frame or failed `response`) or raised by the client. */
export class PlazaError extends Error {
  /** Stable machine-readable code, e.g. `lock_held`. */
  readonly code: PlazaErrorCode;

  constructor(code: PlazaErrorCode, message: string) {
    super(message);
    this.name = 'PlazaError';
    this.code = code;
  }
}
