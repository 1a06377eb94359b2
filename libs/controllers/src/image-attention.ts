import { sameValue } from '@bis/datastore';
import type { BackingImageManager } from './kinds.js';
import { forEachChangedKey } from './map-diff.js';

/** What a manager reconcile's per-image passes look at: every image of its disk, or the named ones. */
export type Look = 'all' | ReadonlySet<string>;

/**
 * Which images of each manager's disk its next reconcile looks at one by one.
 *
 * A manager's object lists every image of its disk, and its reconcile went through all of them at every change of any
 * one (about 2,500 reconciles per manager at 1,000 images). An image whose copy on the disk is steady (ready or being
 * received, nothing to delete, fetch or sync) needs no look until something it depends on changes: its image, its
 * data source, its entry in the manager's spec or file map. Those changes mark it here, from the informers' events;
 * the images that still need something after a pass are marked again by the pass itself.
 *
 * Level-triggered all the same: a manager seen for the first time, its resync (every 30 s), a restart of its workload,
 * a change of its node or disk, and a reconcile that failed make the next pass look at every image.
 */
export class ImageAttention {
  readonly #marked = new Map<string, Set<string> | 'all'>();
  readonly #slotWaiters = new Map<string, Set<string>>();

  /** The next pass of `manager` looks at every image. */
  all(manager: string): void {
    this.#marked.set(manager, 'all');
  }

  /** The next pass of `manager` looks at `image` (a manager not seen yet looks at every image anyway). */
  mark(manager: string, image: string): void {
    const m = this.#marked.get(manager);
    if (m !== undefined && m !== 'all') m.add(image);
  }

  /**
   * What the pass starting now looks at; the marks are cleared. A manager never seen (or forgotten): every image (and
   * the images waiting for a slot are forgotten too: that pass finds them again).
   */
  take(manager: string): Look {
    const m = this.#marked.get(manager) ?? 'all';
    this.#marked.set(manager, new Set());
    if (m === 'all') this.#slotWaiters.delete(manager);
    return m;
  }

  /**
   * `image` waits for a replenish slot of its manager's node (the per-node limit of concurrent syncs). While many
   * copies wait, looking at each of them at every reconcile only to find the node still full was most of a pass: they
   * are looked at again when the node has a free slot (`takeSlotWaiters`), or when a change marks them.
   */
  waitForSlot(manager: string, image: string): void {
    let s = this.#slotWaiters.get(manager);
    if (!s) this.#slotWaiters.set(manager, (s = new Set()));
    s.add(image);
  }

  /** How many images of `manager` wait for a slot. */
  slotWaiters(manager: string): number {
    return this.#slotWaiters.get(manager)?.size ?? 0;
  }

  /** The images of `manager` waiting for a slot, for a pass that has one to give; cleared. */
  takeSlotWaiters(manager: string): ReadonlySet<string> {
    const s = this.#slotWaiters.get(manager) ?? new Set<string>();
    this.#slotWaiters.delete(manager);
    return s;
  }

  /** A manager deleted: its next pass, if it comes back, looks at everything. */
  forget(manager: string): void {
    this.#marked.delete(manager);
    this.#slotWaiters.delete(manager);
  }

  /**
   * Marks what changed between two versions of a manager's object: the images added to or removed from its spec, and
   * those whose file entry changed. A change of its node, disk or image marks every image. The versions share what a
   * write kept, so an unchanged map costs one pointer check.
   */
  markChanges(old: BackingImageManager, cur: BackingImageManager): void {
    const name = cur.metadata.name;
    const a = old.spec;
    const b = cur.spec;
    if (a?.nodeID !== b?.nodeID || a?.diskUUID !== b?.diskUUID || a?.diskPath !== b?.diskPath || a?.image !== b?.image) {
      this.all(name);
      return;
    }
    const mark = (k: string) => this.mark(name, k);
    forEachChangedKey(a?.backingImages, b?.backingImages, (x, y) => x === y, mark);
    forEachChangedKey(old.status?.backingImageFileMap, cur.status?.backingImageFileMap, sameValue, mark);
  }
}
