/**
 * The error codes the server sends (over WebSocket, and in HTTP error bodies), in the order of
 * docs/protocol.md's "Error codes" table: a test checks the two against each other, and the
 * server's own test checks the table against its codes, so client and server cannot drift.
 */
export const SERVER_ERROR_CODES = [
  'bad_json',
  'unknown_type',
  'invalid_frame',
  'frame_too_large',
  'rate_limited',
  'ticket_invalid',
  'ticket_expired',
  'ticket_used',
  'room_not_found',
  'room_full',
  'ticket_required',
  'token_required',
  'token_invalid',
  'token_expired',
  'forbidden',
  'too_many_rooms',
  'already_joined',
  'not_joined',
  'unknown_op',
  'invalid_args',
  'entity_not_found',
  'version_conflict',
  'lock_held',
  'lock_not_held',
  'session_not_found',
  'not_in_proximity',
  'shutting_down',
  'invalid_request',
  'room_exists',
  'not_found',
  'method_not_allowed',
  'unauthorized',
  'idempotency_conflict',
  'payload_too_large',
  'broker_unavailable',
  'internal',
  // Only in HTTP error bodies (the HTTP transports, and connections refused before any route).
  'transport_not_found',
  'already_reading',
  'frames_gone',
  'origin_not_allowed',
  'too_many_connections',
  'server_full',
] as const;

/** An error code the server sends. */
export type ServerErrorCode = (typeof SERVER_ERROR_CODES)[number];

/**
 * Error codes the server sends ({@link SERVER_ERROR_CODES}), plus the client's own:
 * `timeout` (a request got no response in time), `disconnected` (the connection dropped while
 * a request was in flight, so its outcome is unknown), `closed` (the client or room was closed),
 * `token_unavailable` (the `token` function failed; the client retries with backoff).
 */
export type PlazaErrorCode =
  | ServerErrorCode
  | 'timeout'
  | 'disconnected'
  | 'closed'
  | 'token_unavailable'
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
