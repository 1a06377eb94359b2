/**
 * Fan-out of events to watchers, each an async iterable that starts with a snapshot of what exists and then yields
 * every event published while it iterates (no event is lost between the snapshot and the first one).
 */
export class WatchHub<E> {
  readonly #subscribers = new Set<(e: E) => void>();

  publish(e: E): void {
    for (const s of this.#subscribers) s(e);
  }

  /** `initial` is called when the iteration starts (after subscribing), so nothing falls between the two. */
  watch(signal: AbortSignal, initial: () => E[]): AsyncIterable<E> {
    const subscribers = this.#subscribers;
    return {
      async *[Symbol.asyncIterator]() {
        let wake: (() => void) | undefined;
        const queue: E[] = [];
        const sub = (e: E): void => {
          queue.push(e);
          wake?.();
        };
        const onAbort = (): void => wake?.();
        subscribers.add(sub);
        queue.unshift(...initial());
        signal.addEventListener('abort', onAbort);
        try {
          while (!signal.aborted) {
            const e = queue.shift();
            if (e !== undefined) {
              yield e;
              continue;
            }
            await new Promise<void>((r) => (wake = r));
            wake = undefined;
          }
        } finally {
          subscribers.delete(sub);
          signal.removeEventListener('abort', onAbort);
        }
      },
    };
  }
}
