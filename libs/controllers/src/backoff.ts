/**
 * Kubernetes `flowcontrol.Backoff(initial, max)`: per-id exponential backoff whose entries expire when not updated
 * for more than 2×max.
 */
export class Backoff {
  private readonly entries = new Map<string, { current: number; lastUpdate: number }>();

  constructor(
    readonly initialMs: number,
    readonly maxMs: number,
    private readonly now: () => number = Date.now,
  ) {}

  private live(id: string, now: number): { current: number; lastUpdate: number } | undefined {
    const e = this.entries.get(id);
    if (e && now - e.lastUpdate > 2 * this.maxMs) {
      this.entries.delete(id);
      return undefined;
    }
    return e;
  }

  /** Starts or doubles (capped) the backoff of `id` and stamps it now. */
  next(id: string): void {
    const now = this.now();
    const e = this.live(id, now);
    if (!e) this.entries.set(id, { current: this.initialMs, lastUpdate: now });
    else {
      e.current = Math.min(e.current * 2, this.maxMs);
      e.lastUpdate = now;
    }
  }

  /** The current delay of `id` (0 when none). */
  get(id: string): number {
    return this.live(id, this.now())?.current ?? 0;
  }

  /** True iff an unexpired entry exists and less than its delay passed since its last update. */
  isInBackOffSinceUpdate(id: string): boolean {
    const now = this.now();
    const e = this.live(id, now);
    return !!e && now - e.lastUpdate < e.current;
  }

  /** Milliseconds left in the window (0 when not in backoff). */
  remaining(id: string): number {
    const now = this.now();
    const e = this.live(id, now);
    return e ? Math.max(0, e.current - (now - e.lastUpdate)) : 0;
  }

  reset(id: string): void {
    this.entries.delete(id);
  }

  /** Drops expired entries. */
  gc(): void {
    const now = this.now();
    for (const id of [...this.entries.keys()]) this.live(id, now);
  }
}
