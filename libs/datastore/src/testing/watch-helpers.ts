import type { KubeObject, WatchEvent } from '../types.js';

/** Opens a watch, reads events until `n` arrived or `timeoutMs` passed, then aborts the watch. Errors propagate. */
export async function takeEvents<T extends KubeObject>(
  open: (signal: AbortSignal) => AsyncIterable<WatchEvent<T>>,
  n: number,
  timeoutMs = 5000,
  accept: (e: WatchEvent<T>) => boolean = (e) => e.type !== 'BOOKMARK',
): Promise<WatchEvent<T>[]> {
  const ac = new AbortController();
  const it = open(ac.signal)[Symbol.asyncIterator]();
  const out: WatchEvent<T>[] = [];
  const deadline = Date.now() + timeoutMs;
  try {
    while (out.length < n) {
      const left = deadline - Date.now();
      if (left <= 0) break;
      let timer: NodeJS.Timeout | undefined;
      let r: IteratorResult<WatchEvent<T>> | 'timeout';
      try {
        r = await Promise.race([
          it.next(),
          new Promise<'timeout'>((resolve) => {
            timer = setTimeout(() => resolve('timeout'), left);
          }),
        ]);
      } finally {
        clearTimeout(timer);
      }
      if (r === 'timeout' || r.done) break;
      if (accept(r.value)) out.push(r.value);
    }
  } finally {
    ac.abort();
    void it.return?.().catch(() => undefined);
  }
  return out;
}

/** Polls `check` until it returns a value other than undefined/false, or throws after `timeoutMs`. */
export async function eventually<R>(check: () => Promise<R | undefined | false> | R | undefined | false, timeoutMs = 5000, what = 'condition'): Promise<R> {
  const deadline = Date.now() + timeoutMs;
  let lastErr: unknown;
  for (;;) {
    try {
      const r = await check();
      if (r !== undefined && r !== false) return r;
    } catch (err) {
      lastErr = err;
    }
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}${lastErr ? `: ${String(lastErr)}` : ''}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/**
 * Polls `fn` every `intervalMs` until it returns a truthy value (a thrown error counts as "not yet"); after
 * `timeoutMs` fails naming `what`, the last value and the last error.
 */
export async function waitFor<T>(what: string, fn: () => Promise<T> | T, timeoutMs = 10_000, intervalMs = 25): Promise<NonNullable<T>> {
  const deadline = Date.now() + timeoutMs;
  let last: T | undefined;
  let lastErr: unknown;
  while (Date.now() < deadline) {
    try {
      last = await fn();
      if (last) return last as NonNullable<T>;
    } catch (err) {
      lastErr = err;
    }
    await new Promise((r) => setTimeout(r, intervalMs));
  }
  throw new Error(`timed out waiting for ${what}; last value ${JSON.stringify(last)}${lastErr ? `; last error ${(lastErr as Error).message}` : ''}`);
}
