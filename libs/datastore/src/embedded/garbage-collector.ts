import { FOREGROUND_FINALIZER, ORPHAN_FINALIZER } from '../types.js';
import type { EventRecord } from './log-file.js';
import { sameValue } from '../json-value.js';
import { cleanMeta, clone, k8sTime, kindOfKey, type AnyStored, type WriteAnswer } from './object-rules.js';
import type { ObjectTable } from './object-table.js';

export type PropagationPolicy = 'Foreground' | 'Background' | 'Orphan';

/** What the collector needs from the store. */
export interface GarbageCollectorHost {
  readonly table: ObjectTable;
  /** Stages one change (see GroupCommit.stage). */
  stage(k: string, type: EventRecord['type'], object: AnyStored, prevLabels?: Record<string, string>, answer?: WriteAnswer): Promise<AnyStored>;
  now(): Date;
  /** The store is closing: nothing is scheduled any more. */
  closing(): boolean;
  /** The store refuses writes: a scheduled pass does nothing. */
  failed(): boolean;
}

/**
 * Deletion and garbage collection of the embedded store, like Kubernetes': deletion with finalizers
 * (`deletionTimestamp`, then removal once the last finalizer is gone), propagation policies (Background, Foreground
 * with `foregroundDeletion` and `blockOwnerDeletion`, Orphan with `orphan`) and the collection of dependents whose
 * owners (`ownerReferences`) are all gone. Everything runs synchronously against the staged state; a pass is
 * scheduled (`schedule`) after every change that may need one and repeats until nothing changes.
 */
export class GarbageCollector {
  private scheduled = false;

  constructor(private readonly host: GarbageCollectorHost) {}

  /**
   * Starts the deletion of the object under `key` (which must exist): removes it at once when it has no finalizers
   * (after adding the policy's), else marks it with a deletionTimestamp. An object already being deleted is returned
   * as it is.
   */
  deleteByKey(key: string, policy: PropagationPolicy): Promise<AnyStored> {
    const table = this.host.table;
    const cur = table.view(key) as AnyStored;
    if (cur.metadata.deletionTimestamp) return table.settled(key, cur);
    const finalizers = [...(cur.metadata.finalizers ?? [])];
    if (policy === 'Foreground' && !finalizers.includes(FOREGROUND_FINALIZER)) finalizers.push(FOREGROUND_FINALIZER);
    if (policy === 'Orphan' && !finalizers.includes(ORPHAN_FINALIZER)) finalizers.push(ORPHAN_FINALIZER);
    const k = kindOfKey(key);
    if (finalizers.length === 0) return this.host.stage(k, 'DELETED', clone(cur));
    const next = clone(cur);
    next.metadata.finalizers = finalizers;
    next.metadata.deletionTimestamp = k8sTime(this.host.now());
    return this.host.stage(k, 'MODIFIED', next, cur.metadata.labels ?? {});
  }

  /** Stages a MODIFIED state, or removes the object when it is being deleted and has no finalizers left. */
  writeOrFinish(key: string, next: AnyStored, cur: AnyStored, answer?: WriteAnswer): Promise<AnyStored> {
    const k = kindOfKey(key);
    if (next.metadata.deletionTimestamp && (next.metadata.finalizers ?? []).length === 0) {
      const r = this.host.stage(k, 'DELETED', next, undefined, answer);
      this.schedule();
      return r;
    }
    const r = this.host.stage(k, 'MODIFIED', next, cur.metadata.labels ?? {}, answer);
    if (next.metadata.deletionTimestamp || !sameValue(next.metadata.ownerReferences, cur.metadata.ownerReferences)) this.schedule();
    return r;
  }

  /** Runs a collection pass on the next turn of the event loop (once, however often it is asked for meanwhile). */
  schedule(): void {
    if (this.scheduled || this.host.closing()) return;
    this.scheduled = true;
    setImmediate(() => {
      this.scheduled = false;
      if (this.host.closing() || this.host.failed()) return;
      // A failed batch rolls the collector's changes back too; they are staged again after the next change.
      this.collect();
    });
  }

  /**
   * Stages garbage-collection passes until nothing changes. A pass looks only at what the changes since the last one
   * concern (the table records them: objects removed, being deleted, or whose owners changed): those objects, their
   * dependents and their owners. At open every object with owners or a deletionTimestamp is such a change.
   */
  private collect(): void {
    const table = this.host.table;
    for (let round = 0; round < 1000; round++) {
      const changes = table.takeChanged();
      if (changes.size === 0) return;
      const keys = new Set<string>();
      for (const [key, c] of changes) {
        keys.add(key);
        for (const uid of c.uids) for (const dk of table.viewDependentsOf(uid)) keys.add(dk);
        for (const uid of c.owners) {
          const ok = table.viewKeyOfUid(uid);
          if (ok) keys.add(ok);
        }
      }
      for (const key of keys) this.examine(key);
    }
  }

  /** What the collector does for one object: orphan or delete its dependents, or delete it when its owners are gone. */
  private examine(key: string): void {
    const table = this.host.table;
    // Staged at once; a failed commit rolls the batch back, fails the store's writers, and is staged again after the next change.
    const ignore = (p: Promise<unknown>): void => void p.catch(() => undefined);
    const o = table.view(key);
    if (!o) return;
    const fin = o.metadata.finalizers ?? [];
    if (o.metadata.deletionTimestamp && fin.includes(ORPHAN_FINALIZER)) {
      for (const dk of table.viewDependentsOf(o.metadata.uid)) {
        const d = table.view(dk) as AnyStored;
        const next = clone(d);
        next.metadata.ownerReferences = (d.metadata.ownerReferences ?? []).filter((r) => r.uid !== o.metadata.uid);
        cleanMeta(next);
        ignore(this.host.stage(kindOfKey(dk), 'MODIFIED', next, d.metadata.labels ?? {}));
      }
      this.removeFinalizer(key, ORPHAN_FINALIZER);
      return;
    }
    if (o.metadata.deletionTimestamp && fin.includes(FOREGROUND_FINALIZER)) {
      for (const dk of table.viewDependentsOf(o.metadata.uid)) {
        const d = table.view(dk) as AnyStored;
        if (!d.metadata.deletionTimestamp) ignore(this.deleteByKey(dk, table.viewDependentsOf(d.metadata.uid).length > 0 ? 'Foreground' : 'Background'));
      }
      const blocking = table.viewDependentsOf(o.metadata.uid).filter((dk) =>
        (table.view(dk) as AnyStored).metadata.ownerReferences?.some((r) => r.uid === o.metadata.uid && r.blockOwnerDeletion),
      );
      if (blocking.length === 0) this.removeFinalizer(key, FOREGROUND_FINALIZER);
      return;
    }
    const refs = o.metadata.ownerReferences ?? [];
    if (refs.length > 0 && !o.metadata.deletionTimestamp && refs.every((r) => !table.viewHasUid(r.uid))) ignore(this.deleteByKey(key, 'Background'));
  }

  private removeFinalizer(key: string, finalizer: string): void {
    const cur = this.host.table.view(key);
    if (!cur) return;
    const next = clone(cur);
    next.metadata.finalizers = (cur.metadata.finalizers ?? []).filter((f) => f !== finalizer);
    cleanMeta(next);
    // Staged at once; a failed commit rolls the batch back, fails the store's writers, and is staged again after the next change.
    void this.writeOrFinish(key, next, cur).catch(() => undefined);
  }
}
