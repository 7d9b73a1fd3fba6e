/**
 * Watches a connection for silence. A path cut somewhere between the client and its node (a
 * partition, a balancer that lost the node) delivers nothing, not even a close, and browsers do
 * not show WebSocket pings to scripts: so after `silenceMs` without a frame the client sends an
 * application `ping`, and when nothing arrives for as long again it takes the connection for
 * dead (docs/protocol.md, "Heartbeats").
 */
export class SilenceWatch {
  private heard = Date.now();
  private pinged = false;
  private timer: ReturnType<typeof setTimeout> | undefined;

  /**
   * Starts watching: `ping` sends the probe, `dead` is called once when the probe went
   * unanswered (the watch is then over).
   */
  constructor(
    private readonly silenceMs: number,
    private readonly ping: () => void,
    private readonly dead: () => void,
  ) {
    this.arm(silenceMs);
  }

  /** A frame arrived: the connection lives. */
  heardNow(): void {
    this.heard = Date.now();
    this.pinged = false;
  }

  /** Stops watching. */
  stop(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
  }

  private arm(ms: number): void {
    this.timer = setTimeout(() => this.check(), ms);
  }

  private check(): void {
    const quiet = Date.now() - this.heard;
    // Timers are not reset per frame (cheap): look again when the silence would be long enough.
    if (quiet < this.silenceMs) return this.arm(this.silenceMs - quiet);
    if (this.pinged) {
      this.timer = undefined;
      this.dead();
      return;
    }
    this.pinged = true;
    this.heard = Date.now();
    this.ping();
    this.arm(this.silenceMs);
  }
}
