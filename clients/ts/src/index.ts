/**
 * `@plaza/client`: a TypeScript client for Plaza protocol v1 (docs/protocol.md).
 * @packageDocumentation
 */
export { PlazaClient, COMPACT_SUBPROTOCOL, CompactKeys, expandCompact, type ClientEvents, type ConnectionState, type Identity, type PlazaClientOptions } from './client.js';
export { RoomHandle } from './room.js';
export type {
  EntityOptions,
  JoinOptions,
  LockOptions,
  SavedSession,
  PublishAck,
  PublishOptions,
  RequestOptions,
  RoomClosed,
  RoomEvents,
} from './room-options.js';
export { positionAt } from './space.js';
export { ProximityCalls, type PeerConnection, type ProximityCallsOptions } from './calls.js';
export { RoomReplica, merge, type PendingChange, type ReplicaChange, type ReplicaEvents } from './replica.js';
export { PlazaError, SERVER_ERROR_CODES, type PlazaErrorCode, type ServerErrorCode } from './errors.js';
export { backoffDelay, type BackoffOptions } from './backoff.js';
export type { WebSocketConstructor, WebSocketLike } from './socket.js';
export { SseSocket, PollSocket, type TransportName } from './http-socket.js';
export type * from './frames.js';
