import { isConflict, isNotFound, type Datastore } from '@bis/datastore';
import { BackingImageManagerKind } from './kinds.js';

interface Addition {
  uuid: string;
  resolve(): void;
  reject(err: Error): void;
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

  /** Sets `spec.backingImages[image] = uuid` on manager `bimName`. */
  add(bimName: string, image: string, uuid: string): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      let m = this.#pending.get(bimName);
      if (!m) this.#pending.set(bimName, (m = new Map()));
      // a second request for the same image replaces the first; both callers learn the outcome of the write
      const prev = m.get(image);
      m.set(image, {
        uuid,
        resolve: () => {
          prev?.resolve();
          resolve();
        },
        reject: (err) => {
          prev?.reject(err);
          reject(err);
        },
      });
      if (!this.#flushing.has(bimName)) void this.#flush(bimName);
    });
  }

  async #flush(bimName: string): Promise<void> {
    this.#flushing.add(bimName);
    try {
      for (let batch = this.#take(bimName); batch; batch = this.#take(bimName)) {
        try {
          await this.#write(bimName, batch);
          for (const a of batch.values()) a.resolve();
        } catch (err) {
          for (const a of batch.values()) a.reject(err instanceof Error ? err : new Error(String(err)));
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

  async #write(bimName: string, batch: Map<string, Addition>): Promise<void> {
    for (let attempt = 1; ; attempt++) {
      const cur = await this.store.get(BackingImageManagerKind, bimName, this.namespace);
      if (cur.metadata.deletionTimestamp) throw new Error(`backing image manager ${bimName} is being deleted`);
      const have = cur.spec?.backingImages ?? {};
      const missing = [...batch].filter(([image, a]) => have[image] !== a.uuid);
      if (missing.length === 0) return;
      const backingImages = { ...have };
      for (const [image, a] of missing) backingImages[image] = a.uuid;
      try {
        await this.store.update(BackingImageManagerKind, { ...cur, spec: { ...cur.spec, backingImages } });
        this.stats.writes++;
        this.stats.additions += missing.length;
        return;
      } catch (err) {
        if (isNotFound(err) || !isConflict(err) || attempt >= 5) throw err;
      }
    }
  }
}
