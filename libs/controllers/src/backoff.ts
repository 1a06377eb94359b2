import { retryDelay, type RandomSource, type RetryBounds } from '@bis/datastore';

/**
 * Per-id backoff (Kubernetes `flowcontrol.Backoff` shape) whose delays come from the project's one retry policy
 * (`retryDelay` of `@bis/datastore`: exponential, capped, with jitter). Entries expire when not updated for more than
 * 2×max.
 */
export class Backoff {
  private readonly entries = new Map<string, { failures: number; current: number; lastUpdate: number }>();
  private readonly bounds: RetryBounds;

  constructor(
    readonly initialMs: number,
    readonly maxMs: number,
    private readonly now: () => number = Date.now,
    /** Jitter fraction (default 0.2) and its random source (tests pass `seededRandom(n)`). */
    opts: { jitter?: number; random?: RandomSource } = {},
  ) {
    this.bounds = { initialMs, maxMs, jitter: opts.jitter ?? 0.2 };
    this.random = opts.random ?? Math.random;
  }
  private readonly random: RandomSource;

  private live(id: string, now: number): { failures: number; current: number; lastUpdate: number } | undefined {
    const e = this.entries.get(id);
    if (e && now - e.lastUpdate > 2 * this.maxMs) {
      this.entries.delete(id);
      return undefined;
    }
    return e;
  }

  /** Counts one more attempt of `id` and starts its next window (doubling, capped, jittered) now. */
  next(id: string): void {
    const now = this.now();
    const e = this.live(id, now);
    const failures = (e?.failures ?? 0) + 1;
    this.entries.set(id, { failures, current: retryDelay(this.bounds, failures, this.random), lastUpdate: now });
  }

  /** Starts the current window of `id` again now (same attempt, same delay): the attempt was seen failing now. */
  restart(id: string): void {
    const e = this.live(id, this.now());
    if (e) e.lastUpdate = this.now();
  }

  /** The current delay of `id` (0 when none). */
  get(id: string): number {
    return this.live(id, this.now())?.current ?? 0;
  }

  /** Attempts counted since the last reset (0 when none). */
  attempts(id: string): number {
    return this.live(id, this.now())?.failures ?? 0;
  }

  /** When (ms, this backoff's clock) the current window of `id` ends; undefined when none. */
  nextAt(id: string): number | undefined {
    const e = this.live(id, this.now());
    return e ? e.lastUpdate + e.current : undefined;
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
