/**
 * The one retry policy of the project: exponential backoff with jitter, capped, never giving up. The work queue's
 * per-item limiter, the controllers' per-file and per-data-source backoffs and the manager restart backoff all
 * compute their delays here, each with its own documented bounds (`RETRY_BOUNDS`).
 */

/** A random source in [0, 1) (tests pass a seeded one). */
export type RandomSource = () => number;

export interface RetryBounds {
  /** Delay after the first failure. */
  initialMs: number;
  /** Cap: later delays stay at this (retries go on). */
  maxMs: number;
  /** Growth per failure (2 = doubling). */
  factor?: number;
  /**
   * Jitter as a fraction of the delay: the delay is spread uniformly over `[d·(1−jitter), d]` (never above the
   * cap, never below `initialMs·(1−jitter)`), so that many keys failing together do not retry together.
   */
  jitter?: number;
}

/** The documented bounds (docs/reliability.md "Retries"). */
export const RETRY_BOUNDS = {
  /** A failing reconcile of any key (work queue, per item): 5 ms doubling up to 5 min. */
  reconcile: { initialMs: 5, maxMs: 300_000, factor: 2, jitter: 0.2 },
  /** A copy of an image on a disk that failed (Fetch/Sync), and a data source that failed: 1 min doubling up to 5 min. */
  file: { initialMs: 60_000, maxMs: 300_000, factor: 2, jitter: 0.2 },
  /** A manager workload that is missing: 1 s doubling up to 2 min. */
  managerRestart: { initialMs: 1_000, maxMs: 120_000, factor: 2, jitter: 0.2 },
} as const satisfies Record<string, RetryBounds>;

/** The delay before retry number `failures` (1 = after the first failure), with `random()` drawn for the jitter. */
export function retryDelay(bounds: RetryBounds, failures: number, random: RandomSource = Math.random): number {
  if (failures < 1) return 0;
  const factor = bounds.factor ?? 2;
  const jitter = Math.min(1, Math.max(0, bounds.jitter ?? 0));
  const raw = Math.min(bounds.maxMs, bounds.initialMs * factor ** Math.min(failures - 1, 1000));
  const d = Number.isFinite(raw) ? raw : bounds.maxMs;
  return Math.round(d - d * jitter * random());
}

/**
 * A deterministic random source for tests (mulberry32): the same seed gives the same sequence.
 */
export function seededRandom(seed: number): RandomSource {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/**
 * An error that retrying cannot fix (a refused request, an image that can never be stored): the reconcile that gets
 * it moves the object to `failed` with the message at once, and the work queue does not retry the key for it.
 */
export class PermanentError extends Error {
  override readonly name = 'PermanentError';
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
  }
}

export function isPermanentError(err: unknown): err is PermanentError {
  return err instanceof PermanentError;
}

/** "next retry in 40 s" / "in 2 min 5 s" / "in 300 ms": a delay as operators read it. */
export function formatRetryDelay(ms: number): string {
  if (ms < 1000) return `${Math.max(0, Math.round(ms))} ms`;
  const s = Math.round(ms / 1000);
  if (s < 60) return `${s} s`;
  const m = Math.floor(s / 60);
  return s % 60 ? `${m} min ${s % 60} s` : `${m} min`;
}
