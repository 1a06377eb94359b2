import { getForReading, updateForReading, type Datastore } from '@bis/datastore';
import { retryOnConflict } from './actions.js';
import { BackingImageManagerKind } from './kinds.js';

interface Addition {
  uuid: string;
  /** Every caller that asked for this image since the last write: all learn its outcome. */
  waiters: { resolve(): void; reject(err: Error): void }[];
}

/**
 * Adds images to managers' `spec.backingImages`, several in one write. A manager's object lists every image of its
 * disk, so each write of it costs in proportion to that number; while one write of a manager is in flight, the
 * additions asked for meanwhile wait and go together in the next one (group commit, no timer). Each caller's promise
 * settles when its own addition is stored (or failed: a manager that is gone, or a write that still conflicts after
 * re-reading it 5 times).
 */
export class ManagerSpecBatcher {
  readonly #pending = new Map<string, Map<string, Addition>>();
  readonly #flushing = new Set<string>();
  /** Writes made, and the additions they carried (so `additions / writes` is the mean batch). */
  readonly stats = { writes: 0, additions: 0 };

  constructor(
    private readonly store: Datastore,
    private readonly namespace: string,
  ) {}

  /** Sets `spec.backingImages[image] = uuid` on manager `bimName` (a later request for the same image wins). */
  add(bimName: string, image: string, uuid: string): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      let m = this.#pending.get(bimName);
      if (!m) this.#pending.set(bimName, (m = new Map()));
      const waiters = m.get(image)?.waiters ?? [];
      waiters.push({ resolve, reject });
      m.set(image, { uuid, waiters });
      if (!this.#flushing.has(bimName)) void this.#flush(bimName);
    });
  }

  async #flush(bimName: string): Promise<void> {
    this.#flushing.add(bimName);
    try {
      for (let batch = this.#take(bimName); batch; batch = this.#take(bimName)) {
        const waiters = [...batch.values()].flatMap((a) => a.waiters);
        try {
          await retryOnConflict(() => this.#write(bimName, batch));
          for (const w of waiters) w.resolve();
        } catch (err) {
          for (const w of waiters) w.reject(err instanceof Error ? err : new Error(String(err)));
        }
      }
    } finally {
      this.#flushing.delete(bimName);
    }
  }

  #take(bimName: string): Map<string, Addition> | undefined {
    const m = this.#pending.get(bimName);
    this.#pending.delete(bimName);
    return m && m.size > 0 ? m : undefined;
  }

  /** One write of the manager as it is now, with the additions it lacks (none: no write). */
  async #write(bimName: string, batch: Map<string, Addition>): Promise<void> {
    // only read (the write spreads it): the committed object where the store shares it (it lists every image of its disk)
    const cur = await getForReading(this.store, BackingImageManagerKind, bimName, this.namespace);
    if (cur.metadata.deletionTimestamp) throw new Error(`backing image manager ${bimName} is being deleted`);
    const have = cur.spec?.backingImages ?? {};
    const missing = [...batch].filter(([image, a]) => have[image] !== a.uuid);
    if (missing.length === 0) return;
    const backingImages = { ...have };
    for (const [image, a] of missing) backingImages[image] = a.uuid;
    await updateForReading(this.store, BackingImageManagerKind, { ...cur, spec: { ...cur.spec, backingImages } });
    this.stats.writes++;
    this.stats.additions += missing.length;
  }
}
