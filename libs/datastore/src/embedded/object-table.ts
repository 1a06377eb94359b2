import type { CompiledSelector } from '../label-selector.js';
import type { EventRecord } from './log-file.js';
import { clone, objKey, type AnyStored, type WriteAnswer } from './object-rules.js';

/** What the garbage collector must look at after a change of one key: the object's uid(s), and its owners' uids. */
export interface OwnershipChange {
  uids: Set<string>;
  owners: Set<string>;
}

/** A staged (not yet durable) state of one object: `object` undefined = deleted. */
interface PendingObject {
  object: AnyStored | undefined;
  rv: number;
  /** Settles when the change's batch is durable (resolve) or failed (reject). */
  done: Promise<void>;
}

/**
 * The objects of the embedded store, in two layers:
 * - the committed (durable) state — what get/list/watch read — with the last durable resourceVersion `rv`;
 * - the staged state on top of it: changes handed a resourceVersion and waiting for their batch's fdatasync. Writes
 *   are validated against the staged view (`view`, `viewHasUid`, `viewKeyOfUid`, `viewDependentsOf`).
 * Staged and committed objects are never changed in place: a change replaces the object.
 */
export class ObjectTable {
  /** Committed (durable) state. */
  private readonly objects = new Map<string, AnyStored>();
  private readonly uids = new Map<string, string>();
  /** The committed objects again, by kind (a list of one kind reads only its own objects). */
  private readonly byKind = new Map<string, Map<string, AnyStored>>();
  /** Staged state on top of `objects` / `uids`. */
  private readonly pendingObjects = new Map<string, PendingObject>();
  private readonly pendingUids = new Map<string, { key: string | undefined; rv: number }>();
  /** Keys of the objects (in the staged view) that name each uid as an owner. */
  private readonly dependents = new Map<string, Set<string>>();
  /**
   * The changes of the view that the garbage collector must look at, since it last took them (`takeChanged`): an object
   * removed, being deleted, or whose owners changed; key → the object's uid and every owner uid it had or has.
   */
  private changed = new Map<string, OwnershipChange>();
  /** Last durable resourceVersion. */
  rv = 0;
  /** Last resourceVersion handed out (durable or staged). */
  private stagedRv = 0;

  // ---------------------------------------------------------------- committed state

  /** The committed object under `key`. */
  get(key: string): AnyStored | undefined {
    return this.objects.get(key);
  }

  /** Committed objects of kind `k` (in `namespace`, when given) matching `sel`, sorted by namespace/name. */
  matching(k: string, namespace: string | undefined, sel: CompiledSelector): AnyStored[] {
    const prefix = namespace === undefined ? `${k}|` : `${k}|${namespace}|`;
    const out: [string, AnyStored][] = [];
    for (const [key, o] of this.byKind.get(k) ?? []) if (key.startsWith(prefix) && sel.matches(o.metadata.labels)) out.push([`${o.metadata.namespace ?? ''}/${o.metadata.name}`, o]);
    // the order of etcd's keys (namespace/name, compared as bytes: names are ASCII)
    return out.sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)).map(([, o]) => o);
  }

  /** Every committed object with its key (for a compaction snapshot). */
  committed(): IterableIterator<[string, AnyStored]> {
    return this.objects.entries();
  }

  /** Puts a live object into the committed state (replay of a compacted log's `obj` record). */
  loadObject(k: string, o: AnyStored): void {
    const key = objKey(k, o.metadata.namespace, o.metadata.name);
    this.viewChanging(key, o);
    this.setCommitted(k, key, o);
  }

  private setCommitted(k: string, key: string, o: AnyStored): void {
    this.objects.set(key, o);
    this.uids.set(o.metadata.uid, key);
    let m = this.byKind.get(k);
    if (!m) this.byKind.set(k, (m = new Map()));
    m.set(key, o);
  }

  /** Applies a durable change to the committed state and advances `rv`. */
  applyCommitted(ev: EventRecord): void {
    const o = ev.object as AnyStored;
    const key = objKey(ev.k, o.metadata.namespace, o.metadata.name);
    // the view shows a staged change of the key over the committed one (replay and compaction have none)
    if (!this.pendingObjects.has(key)) this.viewChanging(key, ev.type === 'DELETED' ? undefined : o);
    if (ev.type === 'DELETED') {
      this.objects.delete(key);
      this.uids.delete(o.metadata.uid);
      this.byKind.get(ev.k)?.delete(key);
    } else {
      this.setCommitted(ev.k, key, o);
    }
    this.rv = ev.rv;
  }

  // ---------------------------------------------------------------- staged state

  /** The object as writes see it: staged state first, then committed. */
  view(key: string): AnyStored | undefined {
    const p = this.pendingObjects.get(key);
    return p ? p.object : this.objects.get(key);
  }

  viewHasUid(uid: string): boolean {
    const p = this.pendingUids.get(uid);
    return p ? p.key !== undefined : this.uids.has(uid);
  }

  /** The key of the object with `uid` in the staged view. */
  viewKeyOfUid(uid: string): string | undefined {
    const p = this.pendingUids.get(uid);
    return p ? p.key : this.uids.get(uid);
  }

  /** Keys of the objects in the staged view whose ownerReferences name `uid`. */
  viewDependentsOf(uid: string): string[] {
    return [...(this.dependents.get(uid) ?? [])];
  }

  /** The changes the garbage collector must look at since the last call (see `changed`). */
  takeChanged(): Map<string, OwnershipChange> {
    const out = this.changed;
    this.changed = new Map();
    return out;
  }

  /** Keeps the owner index and the collector's change set up to date with a change of the view at `key` to `next`. */
  private viewChanging(key: string, next: AnyStored | undefined): void {
    const prev = this.view(key);
    const prevOwners = prev?.metadata.ownerReferences ?? [];
    const nextOwners = next?.metadata.ownerReferences ?? [];
    const ownersChanged = prevOwners.length !== nextOwners.length || prevOwners.some((r, i) => r.uid !== nextOwners[i]!.uid || r.blockOwnerDeletion !== nextOwners[i]!.blockOwnerDeletion);
    if ((prev && !next) || next?.metadata.deletionTimestamp || ownersChanged) {
      const c = this.changed.get(key) ?? { uids: new Set<string>(), owners: new Set<string>() };
      for (const o of [prev, next]) if (o) c.uids.add(o.metadata.uid);
      for (const r of [...prevOwners, ...nextOwners]) c.owners.add(r.uid);
      this.changed.set(key, c);
    }
    for (const r of prevOwners) {
      const set = this.dependents.get(r.uid);
      set?.delete(key);
      if (set?.size === 0) this.dependents.delete(r.uid);
    }
    for (const r of nextOwners) {
      let set = this.dependents.get(r.uid);
      if (!set) this.dependents.set(r.uid, (set = new Set()));
      set.add(key);
    }
  }

  /** When `key` has a staged change: the promise of its batch. */
  pendingDone(key: string): Promise<void> | undefined {
    return this.pendingObjects.get(key)?.done;
  }

  /** `cur` as a write result: when it is still staged, resolves once its batch is durable. */
  settled(key: string, cur: AnyStored, answer: WriteAnswer = 'copy'): Promise<AnyStored> {
    // The copy is made when it is handed out: a copy made at staging would live through the fdatasync and be promoted
    // to the old generation as garbage.
    const done = this.pendingDone(key);
    const hand = (): AnyStored => (answer === 'shared' ? cur : clone(cur));
    return done ? done.then(hand) : Promise.resolve(hand());
  }

  /** The next resourceVersion to hand out. */
  nextRv(): number {
    return ++this.stagedRv;
  }

  /** Records a staged change of `object` (deleted when `deleted`) under `key`. */
  stage(key: string, object: AnyStored, deleted: boolean, rv: number, done: Promise<void>): void {
    this.viewChanging(key, deleted ? undefined : object);
    this.pendingObjects.set(key, { object: deleted ? undefined : object, rv, done });
    this.pendingUids.set(object.metadata.uid, { key: deleted ? undefined : key, rv });
  }

  /** Forgets the staged changes up to `lastRv` (they were applied with `applyCommitted`). */
  promote(lastRv: number): void {
    for (const [key, p] of this.pendingObjects) if (p.rv <= lastRv) this.pendingObjects.delete(key);
    for (const [uid, p] of this.pendingUids) if (p.rv <= lastRv) this.pendingUids.delete(uid);
  }

  /** Drops every staged change; resourceVersions continue from the committed one. */
  dropStaged(): void {
    for (const [key] of this.pendingObjects) this.viewChanging(key, this.objects.get(key));
    this.pendingObjects.clear();
    this.pendingUids.clear();
    this.stagedRv = this.rv;
  }
}
