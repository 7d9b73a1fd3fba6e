import type { DeliveryPolicy, TransportName } from '@plaza/client';

/** Read-only state for tests (`window.__plaza`). */
export interface DebugObject {
  id: string;
  x: number;
  y: number;
  /** Its fill colour (`#rrggbb`). */
  color: string;
  /** Session id of the lock's holder, or null. */
  holder: string | null;
}

export interface DebugHighlight {
  object: string;
  /** Session id of the member highlighting it. */
  by: string;
  name: string;
}

declare global {
  interface Window {
    /** Read-only state of the demo for browser tests (README.md, "Test hooks"). */
    __plaza: {
      /** This tab's session id in the room, once joined. */
      session(): string | undefined;
      /** The user id the server verified (with `demo_tokens`), if any. */
      user(): string | undefined;
      /** The transport of the room's connection (`?transport=` forces one). */
      transport(): TransportName | undefined;
      /** The delivery policy in force in the room (quiet mode's), or undefined without one. */
      policy(): DeliveryPolicy | undefined;
      /** Where this tab draws `session`'s avatar now, its target, and its colour. */
      avatar(session: string): { x: number; y: number; tx: number; ty: number; color: string } | undefined;
      /** The shared objects as drawn, with the session holding each one's lock (or null). */
      objects(): DebugObject[];
      /** Who highlights which object (`by`: session id, `name`: their name). */
      highlights(): DebugHighlight[];
      /** Client (CSS pixel) coordinates of a plaza point, to click it. */
      toClient(x: number, y: number): { x: number; y: number } | undefined;
      /** The proximity calls: pair id, peer session, `RTCPeerConnection.connectionState`. */
      calls(): Array<{ pair: number; peer: string; state: string }>;
      /** The remote videos shown: whose, how far played, frames decoded. */
      remoteVideos(): Array<{ peer: string; currentTime: number; frames: number }>;
    };
  }
}
