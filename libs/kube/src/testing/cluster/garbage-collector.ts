import type { ControlPlane } from '../envtest.js';

type OwnerRef = { kind?: string; uid?: string; blockOwnerDeletion?: boolean };
type Obj = {
  metadata: { name: string; uid: string; resourceVersion?: string; deletionTimestamp?: string; finalizers?: string[]; ownerReferences?: OwnerRef[] };
  [k: string]: unknown;
};
type Listed = { collection: string; kind: string; obj: Obj };

const FOREGROUND = 'foregroundDeletion';

/**
 * The part of kube-controller-manager's garbage collector that objects with owner references need (envtest has no
 * controller-manager), over the collections it is given (e.g. `/apis/longhorn.io/v1beta2/namespaces/ns/backingimages`):
 *
 * - **foreground deletion**: an object being deleted with the `foregroundDeletion` finalizer gets its dependents
 *   deleted; once none that blocks it (`blockOwnerDeletion`) is left, the finalizer is removed and the API server
 *   finishes the delete;
 * - **orphans**: an object none of whose owners exists any more (an owner of a kind the collector lists) is deleted.
 *
 * One pass lists every collection; `TestCluster` runs a pass every second.
 */
export class GarbageCollector {
  constructor(
    private readonly cp: ControlPlane,
    private readonly collections: readonly string[],
    private readonly log: (line: string) => void,
  ) {}

  async pass(): Promise<void> {
    const all: Listed[] = [];
    const kinds = new Set<string>();
    for (const collection of this.collections) {
      const res = await this.cp.request('GET', collection);
      if (res.status !== 200) continue;
      const list = res.body as { kind?: string; items?: Obj[] };
      const kind = (list.kind ?? '').replace(/List$/, '');
      kinds.add(kind);
      for (const obj of list.items ?? []) all.push({ collection, kind, obj });
    }
    const byUid = new Map(all.map((l) => [l.obj.metadata.uid, l]));
    const dependentsOf = (uid: string) => all.filter((d) => d.obj.metadata.ownerReferences?.some((r) => r.uid === uid));

    for (const owner of all) {
      const m = owner.obj.metadata;
      if (!m.deletionTimestamp || !m.finalizers?.includes(FOREGROUND)) continue;
      const deps = dependentsOf(m.uid);
      for (const d of deps) if (!d.obj.metadata.deletionTimestamp) await this.remove(d, `dependent of ${owner.kind} ${m.name} being deleted in the foreground`);
      const blocking = deps.filter((d) => d.obj.metadata.ownerReferences?.some((r) => r.uid === m.uid && r.blockOwnerDeletion));
      if (blocking.length > 0) continue;
      const finalizers = m.finalizers.filter((f) => f !== FOREGROUND);
      const res = await this.cp.request('PUT', `${owner.collection}/${m.name}`, { body: { ...owner.obj, metadata: { ...m, finalizers } } });
      if (res.status === 200) this.log(`[gc] ${owner.kind} ${m.name}: no blocking dependent left, foreground deletion finished`);
    }

    for (const d of all) {
      const refs = d.obj.metadata.ownerReferences ?? [];
      if (d.obj.metadata.deletionTimestamp || refs.length === 0) continue;
      // Only owners of kinds listed here can be known to be gone.
      if (!refs.every((r) => kinds.has(r.kind ?? '') && !byUid.has(r.uid ?? ''))) continue;
      await this.remove(d, 'every owner is gone');
    }
  }

  private async remove(d: Listed, why: string): Promise<void> {
    const res = await this.cp.request('DELETE', `${d.collection}/${d.obj.metadata.name}`, {
      body: { apiVersion: 'v1', kind: 'DeleteOptions', propagationPolicy: 'Background', preconditions: { uid: d.obj.metadata.uid } },
    });
    if (res.status === 200 || res.status === 202) this.log(`[gc] deleted ${d.kind} ${d.obj.metadata.name}: ${why}`);
  }
}
