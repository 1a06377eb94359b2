/**
 * Runs `pass` now, or, when a pass is already running, once more right after it (requests made meanwhile collapse
 * into that one extra pass). A failing pass is reported to `onError` and never rejects the caller.
 */
export class CoalescedRun {
  #running: Promise<void> | undefined;
  #again = false;

  constructor(
    private readonly pass: () => Promise<void>,
    private readonly onError: (err: Error) => void,
    private readonly stopped: () => boolean,
  ) {}

  trigger(): Promise<void> {
    if (this.#running) {
      this.#again = true;
      return this.#running;
    }
    this.#running = (async () => {
      do {
        this.#again = false;
        try {
          await this.pass();
        } catch (err) {
          this.onError(err as Error);
        }
      } while (this.#again && !this.stopped());
    })().finally(() => {
      this.#running = undefined;
    });
    return this.#running;
  }

  /** The pass in flight, if any. */
  get running(): Promise<void> | undefined {
    return this.#running;
  }
}
