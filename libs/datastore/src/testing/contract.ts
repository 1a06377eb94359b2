import { afterEach, beforeEach, describe, expect, it } from '@jest/globals';
import type { Datastore } from '../datastore.js';
import { isAlreadyExists, isConflict, isGone, isInvalid, isNotFound, StatusError } from '../errors.js';
import { defineKind, FOREGROUND_FINALIZER, type KubeObject, type Stored } from '../types.js';
import { eventually, takeEvents } from './watch-helpers.js';

/** Namespaced kind with a status subresource used by the contract suite (install it as a CRD for a Kubernetes store). */
export interface Widget extends KubeObject {
  spec: { size: number; color?: string };
  status?: { phase?: string; count?: number };
}
/** Cluster-scoped kind without a status subresource, top-level `value` like a Longhorn Setting. */
export interface Gadget extends KubeObject {
  value: string;
  status?: { applied?: boolean };
}
export const WidgetKind = defineKind<Widget>({ apiVersion: 'contract.bis.dev/v1', kind: 'Widget', plural: 'widgets', namespaced: true });
export const GadgetKind = defineKind<Gadget>({ apiVersion: 'contract.bis.dev/v1', kind: 'Gadget', plural: 'gadgets', namespaced: false, statusSubresource: false });
export const CONTRACT_KINDS = [WidgetKind, GadgetKind] as const;

export interface ContractHarness {
  store: Datastore;
  /** Closes the current store and opens a new one over the same persisted data. */
  reopen(): Promise<Datastore>;
  /** Closes the store and removes its data. */
  dispose(): Promise<void>;
}

/** What the store behind the contract cannot do, each with the reason the affected tests are skipped. */
export interface ContractLimits {
  /**
   * Set when no garbage collector runs (an API server without kube-controller-manager, as in envtest): the
   * Background / Foreground / Orphan tests need one to act on dependents and are skipped with this reason.
   */
  noGarbageCollector?: string;
}

export interface ContractFactoryOptions {
  /** The store must keep at most about this many events of watch history (older versions answer Gone). */
  historyLimit: number;
}

const NS = 'contract';
const widget = (name: string, size = 1, labels?: Record<string, string>, extra: Partial<Widget['metadata']> = {}): Widget => ({
  apiVersion: WidgetKind.apiVersion,
  kind: WidgetKind.kind,
  metadata: { name, namespace: NS, ...(labels ? { labels } : {}), ...extra },
  spec: { size },
});

async function rejection(p: Promise<unknown>): Promise<unknown> {
  try {
    await p;
  } catch (err) {
    return err;
  }
  throw new Error('expected the promise to reject');
}

/**
 * The behaviour every `Datastore` implementation must have. Call it from a spec file:
 * `runDatastoreContract('embedded', (opts) => makeHarness(opts))`.
 */
export function runDatastoreContract(
  name: string,
  factory: (opts: ContractFactoryOptions) => Promise<ContractHarness>,
  limits: ContractLimits = {},
): void {
  const HISTORY = 20;
  const gcReason = limits.noGarbageCollector;
  if (gcReason) console.warn(`Datastore contract: ${name}: garbage-collection tests skipped: ${gcReason}`);
  const itGc = (title: string, fn: () => Promise<void>): void =>
    gcReason ? it.skip(`${title} [skipped: ${gcReason}]`, fn) : it(title, fn);
  describe(`Datastore contract: ${name}`, () => {
    let h: ContractHarness;
    let ds: Datastore;
    beforeEach(async () => {
      h = await factory({ historyLimit: HISTORY });
      ds = h.store;
    });
    afterEach(async () => {
      await h.dispose();
    });

    describe('create / get', () => {
      it('fills uid, resourceVersion, generation and creationTimestamp', async () => {
        const w = await ds.create(WidgetKind, widget('a', 3));
        expect(w.metadata.uid).toMatch(/^[0-9a-f-]{36}$/);
        expect(w.metadata.resourceVersion).toMatch(/^\d+$/);
        expect(w.metadata.generation).toBe(1);
        expect(w.metadata.creationTimestamp).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/);
        const got = await ds.get(WidgetKind, 'a', NS);
        expect(got).toEqual(w);
        expect(got.spec.size).toBe(3);
      });

      it('answers AlreadyExists and NotFound with Kubernetes reasons and messages', async () => {
        await ds.create(WidgetKind, widget('a'));
        const dup = await rejection(ds.create(WidgetKind, widget('a')));
        expect(isAlreadyExists(dup)).toBe(true);
        expect((dup as StatusError).code).toBe(409);
        expect((dup as Error).message).toBe('widgets.contract.bis.dev "a" already exists');
        const nf = await rejection(ds.get(WidgetKind, 'nope', NS));
        expect(isNotFound(nf)).toBe(true);
        expect((nf as StatusError).code).toBe(404);
        expect((nf as Error).message).toBe('widgets.contract.bis.dev "nope" not found');
        expect(isNotFound(await rejection(ds.get(WidgetKind, 'a', 'other-ns')))).toBe(true);
      });

      it('rejects invalid names and missing namespaces as Invalid', async () => {
        const bad = await rejection(ds.create(WidgetKind, widget('Not_Valid')));
        expect(isInvalid(bad)).toBe(true);
        expect((bad as Error).message).toContain('metadata.name');
        const noNs = await rejection(ds.create(WidgetKind, { ...widget('x'), metadata: { name: 'x' } }));
        expect(isInvalid(noNs)).toBe(true);
        expect((noNs as Error).message).toContain('metadata.namespace');
      });

      it('ignores status on create when the kind has a status subresource', async () => {
        const w = await ds.create(WidgetKind, { ...widget('a'), status: { phase: 'x' } });
        expect(w.status).toBeUndefined();
      });

      it('keeps the given status on create with { keepStatus: true }', async () => {
        const w = await ds.create(WidgetKind, { ...widget('a', 2), status: { phase: 'ready', count: 3 } }, { keepStatus: true });
        expect(w.status).toEqual({ phase: 'ready', count: 3 });
        expect(w.spec.size).toBe(2);
        expect(w.metadata.generation).toBe(1);
        expect(await ds.get(WidgetKind, 'a', NS)).toEqual(w);
        const plain = await ds.create(WidgetKind, { ...widget('b'), status: { phase: 'dropped' } }, { keepStatus: false });
        expect(plain.status).toBeUndefined();
      });

      it('generates a name from generateName', async () => {
        const w = await ds.create(WidgetKind, { ...widget(''), metadata: { name: '', generateName: 'gen-', namespace: NS } });
        expect(w.metadata.name).toMatch(/^gen-[a-z0-9]{5}$/);
      });
    });

    describe('list', () => {
      it('filters by namespace and label selector and returns a resourceVersion', async () => {
        await ds.create(WidgetKind, widget('a', 1, { tier: 'gold', app: 'x' }));
        await ds.create(WidgetKind, widget('b', 1, { tier: 'silver', app: 'x' }));
        await ds.create(WidgetKind, widget('c', 1, { app: 'y' }));
        await ds.create(WidgetKind, { ...widget('d'), metadata: { name: 'd', namespace: 'elsewhere' } });
        const names = async (sel?: string | object, ns: string | null = NS): Promise<string[]> =>
          (await ds.list(WidgetKind, { namespace: ns ?? undefined, labelSelector: sel as string })).items.map((i) => i.metadata.name).sort();
        expect(await names()).toEqual(['a', 'b', 'c']);
        expect(await names(undefined, null)).toEqual(['a', 'b', 'c', 'd']);
        expect(await names('app=x')).toEqual(['a', 'b']);
        expect(await names('app==x,tier!=gold')).toEqual(['b']);
        expect(await names('tier in (gold, silver)')).toEqual(['a', 'b']);
        expect(await names('tier notin (gold)')).toEqual(['b', 'c']);
        expect(await names('tier')).toEqual(['a', 'b']);
        expect(await names('!tier')).toEqual(['c']);
        expect(await names({ matchLabels: { app: 'x' }, matchExpressions: [{ key: 'tier', operator: 'In', values: ['gold'] }] })).toEqual(['a']);
        const l = await ds.list(WidgetKind, { namespace: NS });
        expect(Number(l.resourceVersion)).toBeGreaterThanOrEqual(Math.max(...l.items.map((i) => Number(i.metadata.resourceVersion))));
      });

      it('rejects a malformed selector with a clear error', async () => {
        const err = await rejection(ds.list(WidgetKind, { labelSelector: 'a in (' }));
        expect(err).toBeInstanceOf(StatusError);
        expect((err as Error).message).toContain('a in (');
      });
    });

    describe('update / updateStatus', () => {
      it('bumps generation on spec changes only, and Conflicts on a stale resourceVersion', async () => {
        const w = await ds.create(WidgetKind, widget('a', 1));
        const w2 = await ds.update(WidgetKind, { ...w, spec: { size: 2 } });
        expect(w2.metadata.generation).toBe(2);
        expect(Number(w2.metadata.resourceVersion)).toBeGreaterThan(Number(w.metadata.resourceVersion));
        const w3 = await ds.update(WidgetKind, { ...w2, metadata: { ...w2.metadata, labels: { a: 'b' } } });
        expect(w3.metadata.generation).toBe(2);
        expect(w3.metadata.labels).toEqual({ a: 'b' });
        const stale = await rejection(ds.update(WidgetKind, { ...w, spec: { size: 9 } }));
        expect(isConflict(stale)).toBe(true);
        expect((stale as StatusError).code).toBe(409);
        expect((stale as Error).message).toContain('the object has been modified');
        expect((await ds.get(WidgetKind, 'a', NS)).spec.size).toBe(2);
      });

      it('accepts an unconditional update (no resourceVersion) and ignores status in update', async () => {
        const w = await ds.create(WidgetKind, widget('a', 1));
        const u = await ds.update(WidgetKind, { ...widget('a', 5), status: { phase: 'ignored' } });
        expect(u.spec.size).toBe(5);
        expect(u.status).toBeUndefined();
        expect(u.metadata.uid).toBe(w.metadata.uid);
        expect(u.metadata.creationTimestamp).toBe(w.metadata.creationTimestamp);
      });

      it('updateStatus changes only status and keeps generation', async () => {
        const w = await ds.create(WidgetKind, widget('a', 1));
        const s = await ds.updateStatus(WidgetKind, { ...w, spec: { size: 100 }, status: { phase: 'ready', count: 1 } });
        expect(s.status).toEqual({ phase: 'ready', count: 1 });
        expect(s.spec.size).toBe(1);
        expect(s.metadata.generation).toBe(1);
        const stale = await rejection(ds.updateStatus(WidgetKind, { ...w, status: { phase: 'x' } }));
        expect(isConflict(stale)).toBe(true);
        expect(isNotFound(await rejection(ds.updateStatus(WidgetKind, { ...widget('missing'), status: {} })))).toBe(true);
      });

      it('for a kind without status subresource, update writes status and any non-metadata change bumps generation', async () => {
        const g = await ds.create(GadgetKind, { apiVersion: GadgetKind.apiVersion, kind: 'Gadget', metadata: { name: 'g' }, value: '1' });
        expect(g.metadata.namespace).toBeUndefined();
        const g2 = await ds.update(GadgetKind, { ...g, value: '2', status: { applied: true } });
        expect(g2.value).toBe('2');
        expect(g2.status).toEqual({ applied: true });
        expect(g2.metadata.generation).toBe(2);
      });

      it('concurrent updates from the same version: exactly one wins, the others Conflict', async () => {
        const w = await ds.create(WidgetKind, widget('a', 0));
        const results = await Promise.allSettled(Array.from({ length: 8 }, (_, i) => ds.update(WidgetKind, { ...w, spec: { size: i + 1 } })));
        const ok = results.filter((r) => r.status === 'fulfilled');
        const failed = results.filter((r): r is PromiseRejectedResult => r.status === 'rejected');
        expect(ok).toHaveLength(1);
        expect(failed).toHaveLength(7);
        for (const f of failed) expect(isConflict(f.reason)).toBe(true);
      });

      it('read-modify-write retries on Conflict converge (no lost increments)', async () => {
        await ds.create(WidgetKind, widget('counter', 0));
        const increment = async (): Promise<void> => {
          for (;;) {
            const cur = await ds.get(WidgetKind, 'counter', NS);
            try {
              await ds.update(WidgetKind, { ...cur, spec: { size: cur.spec.size + 1 } });
              return;
            } catch (err) {
              if (!isConflict(err)) throw err;
            }
          }
        };
        await Promise.all(Array.from({ length: 10 }, () => increment()));
        expect((await ds.get(WidgetKind, 'counter', NS)).spec.size).toBe(10);
      });
    });

    describe('delete and finalizers', () => {
      it('deletes an object without finalizers at once', async () => {
        await ds.create(WidgetKind, widget('a'));
        await ds.delete(WidgetKind, 'a', NS);
        expect(isNotFound(await rejection(ds.get(WidgetKind, 'a', NS)))).toBe(true);
        expect(isNotFound(await rejection(ds.delete(WidgetKind, 'a', NS)))).toBe(true);
      });

      it('with finalizers sets deletionTimestamp; the object goes when the last finalizer is removed', async () => {
        await ds.create(WidgetKind, widget('a', 1, undefined, { finalizers: ['longhorn.io', 'other'] }));
        const d = await ds.delete(WidgetKind, 'a', NS);
        expect(d.metadata.deletionTimestamp).toMatch(/Z$/);
        let cur = await ds.get(WidgetKind, 'a', NS);
        expect(cur.metadata.deletionTimestamp).toBe(d.metadata.deletionTimestamp);
        const added = await rejection(ds.update(WidgetKind, { ...cur, metadata: { ...cur.metadata, finalizers: ['longhorn.io', 'other', 'new'] } }));
        expect(isInvalid(added)).toBe(true);
        cur = await ds.update(WidgetKind, { ...cur, metadata: { ...cur.metadata, finalizers: ['longhorn.io'] } });
        expect(cur.metadata.finalizers).toEqual(['longhorn.io']);
        await ds.update(WidgetKind, { ...cur, metadata: { ...cur.metadata, finalizers: [] } });
        expect(isNotFound(await rejection(ds.get(WidgetKind, 'a', NS)))).toBe(true);
      });

      it('honours delete preconditions', async () => {
        const w = await ds.create(WidgetKind, widget('a'));
        expect(isConflict(await rejection(ds.delete(WidgetKind, 'a', NS, { preconditions: { uid: 'other' } })))).toBe(true);
        await ds.delete(WidgetKind, 'a', NS, { preconditions: { uid: w.metadata.uid, resourceVersion: w.metadata.resourceVersion } });
      });

      const ownerRef = (o: Stored<Widget>, block = true): NonNullable<Widget['metadata']['ownerReferences']>[number] => ({
        apiVersion: o.apiVersion,
        kind: o.kind,
        name: o.metadata.name,
        uid: o.metadata.uid,
        controller: true,
        blockOwnerDeletion: block,
      });

      itGc('Background: dependents are deleted when their owner is gone', async () => {
        const owner = await ds.create(WidgetKind, widget('owner'));
        await ds.create(WidgetKind, widget('dep', 1, undefined, { ownerReferences: [ownerRef(owner)] }));
        await ds.delete(WidgetKind, 'owner', NS);
        await eventually(async () => isNotFound(await rejection(ds.get(WidgetKind, 'dep', NS))), 5000, 'dependent deletion');
      });

      itGc('Background cascades: a dependent of a dependent goes too; a dependent created after its owner is gone is collected', async () => {
        const owner = await ds.create(WidgetKind, widget('owner'));
        const dep = await ds.create(WidgetKind, widget('dep', 1, undefined, { ownerReferences: [ownerRef(owner)] }));
        await ds.create(WidgetKind, widget('dep2', 1, undefined, { ownerReferences: [ownerRef(dep)] }));
        await ds.create(WidgetKind, widget('other', 1, undefined, { ownerReferences: [ownerRef(await ds.create(WidgetKind, widget('keeper')))] }));
        await ds.delete(WidgetKind, 'owner', NS);
        await eventually(async () => isNotFound(await rejection(ds.get(WidgetKind, 'dep2', NS))), 5000, 'the second-level dependent deletion');
        expect(isNotFound(await rejection(ds.get(WidgetKind, 'dep', NS)))).toBe(true);
        await ds.create(WidgetKind, widget('late', 1, undefined, { ownerReferences: [ownerRef(owner)] }));
        await eventually(async () => isNotFound(await rejection(ds.get(WidgetKind, 'late', NS))), 5000, 'the late dependent deletion');
        // an object whose owner lives is left alone
        expect((await ds.get(WidgetKind, 'other', NS)).metadata.ownerReferences).toHaveLength(1);
      });

      itGc('Foreground: the owner waits (deletionTimestamp + foregroundDeletion) until blocking dependents are gone', async () => {
        const owner = await ds.create(WidgetKind, widget('owner', 1, undefined, { finalizers: ['longhorn.io'] }));
        await ds.create(WidgetKind, widget('dep', 1, undefined, { ownerReferences: [ownerRef(owner)], finalizers: ['longhorn.io'] }));
        await ds.delete(WidgetKind, 'owner', NS, { propagationPolicy: 'Foreground' });
        const dep = await eventually(async () => {
          const d = await ds.get(WidgetKind, 'dep', NS);
          return d.metadata.deletionTimestamp ? d : undefined;
        }, 5000, 'dependent deletionTimestamp');
        const o = await ds.get(WidgetKind, 'owner', NS);
        expect(o.metadata.deletionTimestamp).toBeTruthy();
        expect(o.metadata.finalizers).toContain(FOREGROUND_FINALIZER);
        expect(dep.metadata.finalizers).toContain('longhorn.io');
        await eventually(async () => {
          const d = await ds.get(WidgetKind, 'dep', NS);
          await ds.update(WidgetKind, { ...d, metadata: { ...d.metadata, finalizers: [] } });
          return true;
        }, 5000, 'dependent finalizer removal');
        await eventually(async () => {
          const cur = await ds.get(WidgetKind, 'owner', NS);
          return !cur.metadata.finalizers?.includes(FOREGROUND_FINALIZER) ? cur : undefined;
        }, 5000, 'foregroundDeletion finalizer removal');
        const cur = await ds.get(WidgetKind, 'owner', NS);
        expect(cur.metadata.finalizers).toEqual(['longhorn.io']);
        await ds.update(WidgetKind, { ...cur, metadata: { ...cur.metadata, finalizers: [] } });
        expect(isNotFound(await rejection(ds.get(WidgetKind, 'owner', NS)))).toBe(true);
      });

      itGc('Orphan: dependents stay and lose the owner reference', async () => {
        const owner = await ds.create(WidgetKind, widget('owner'));
        await ds.create(WidgetKind, widget('dep', 1, undefined, { ownerReferences: [ownerRef(owner)] }));
        await ds.delete(WidgetKind, 'owner', NS, { propagationPolicy: 'Orphan' });
        await eventually(async () => isNotFound(await rejection(ds.get(WidgetKind, 'owner', NS))), 5000, 'owner deletion');
        const dep = await ds.get(WidgetKind, 'dep', NS);
        expect(dep.metadata.ownerReferences ?? []).toEqual([]);
      });
    });

    describe('watch', () => {
      it('delivers ADDED, MODIFIED and DELETED in order from a list resourceVersion', async () => {
        await ds.create(WidgetKind, widget('before'));
        const { resourceVersion } = await ds.list(WidgetKind, { namespace: NS });
        const events = takeEvents((signal) => ds.watch(WidgetKind, { namespace: NS, resourceVersion, signal }), 3);
        const a = await ds.create(WidgetKind, widget('a'));
        await ds.update(WidgetKind, { ...a, spec: { size: 2 } });
        await ds.delete(WidgetKind, 'a', NS);
        const got = await events;
        expect(got.map((e) => `${e.type}:${e.object.metadata.name}`)).toEqual(['ADDED:a', 'MODIFIED:a', 'DELETED:a']);
        expect(got[1].object.spec.size).toBe(2);
        const rvs = got.map((e) => Number(e.object.metadata.resourceVersion));
        expect([...rvs].sort((x, y) => x - y)).toEqual(rvs);
      });

      it('without a resourceVersion starts with ADDED for existing objects', async () => {
        await ds.create(WidgetKind, widget('a'));
        await ds.create(WidgetKind, widget('b'));
        const events = takeEvents((signal) => ds.watch(WidgetKind, { namespace: NS, signal }), 3);
        await new Promise((r) => setTimeout(r, 50));
        await ds.create(WidgetKind, widget('c'));
        expect((await events).map((e) => `${e.type}:${e.object.metadata.name}`)).toEqual(['ADDED:a', 'ADDED:b', 'ADDED:c']);
      });

      it('filters by label selector and turns label transitions into ADDED/DELETED', async () => {
        const { resourceVersion } = await ds.list(WidgetKind, { namespace: NS });
        const events = takeEvents((signal) => ds.watch(WidgetKind, { namespace: NS, resourceVersion, labelSelector: 'pick=yes', signal }), 3);
        const a = await ds.create(WidgetKind, widget('a', 1, { pick: 'no' }));
        await ds.create(WidgetKind, widget('b', 1, { pick: 'yes' }));
        const a2 = await ds.update(WidgetKind, { ...a, metadata: { ...a.metadata, labels: { pick: 'yes' } } });
        await ds.update(WidgetKind, { ...a2, metadata: { ...a2.metadata, labels: { pick: 'no' } } });
        expect((await events).map((e) => `${e.type}:${e.object.metadata.name}`)).toEqual(['ADDED:b', 'ADDED:a', 'DELETED:a']);
      });

      it('sends BOOKMARK events with the current resourceVersion when asked', async () => {
        const w = await ds.create(WidgetKind, widget('a'));
        const events = await takeEvents(
          (signal) => ds.watch(WidgetKind, { namespace: NS, resourceVersion: w.metadata.resourceVersion, bookmarkIntervalMs: 50, signal }),
          1,
          3000,
          (e) => e.type === 'BOOKMARK',
        );
        expect(events).toHaveLength(1);
        expect(Number(events[0].object.metadata.resourceVersion)).toBeGreaterThanOrEqual(Number(w.metadata.resourceVersion));
      });

      it('a client resuming from its last seen resourceVersion misses nothing and sees nothing twice', async () => {
        const { resourceVersion } = await ds.list(WidgetKind, { namespace: NS });
        const first = takeEvents((signal) => ds.watch(WidgetKind, { namespace: NS, resourceVersion, signal }), 2);
        for (const n of ['a', 'b']) await ds.create(WidgetKind, widget(n));
        const seen = await first;
        expect(seen.map((e) => e.object.metadata.name)).toEqual(['a', 'b']);
        // Disconnected: changes happen meanwhile.
        for (const n of ['c', 'd', 'e']) await ds.create(WidgetKind, widget(n));
        const last = seen[seen.length - 1].object.metadata.resourceVersion;
        const resumed = await takeEvents((signal) => ds.watch(WidgetKind, { namespace: NS, resourceVersion: last, signal }), 3);
        expect(resumed.map((e) => e.object.metadata.name)).toEqual(['c', 'd', 'e']);
      });

      it('answers 410 Gone for a resourceVersion older than the kept history', async () => {
        const first = await ds.create(WidgetKind, widget('a', 0));
        let cur = first;
        for (let i = 1; i <= HISTORY * 3; i++) cur = await ds.update(WidgetKind, { ...cur, spec: { size: i } });
        const err = await rejection(takeEvents((signal) => ds.watch(WidgetKind, { namespace: NS, resourceVersion: first.metadata.resourceVersion, signal }), 1));
        expect(isGone(err)).toBe(true);
        expect((err as StatusError).code).toBe(410);
        expect((err as Error).message).toMatch(/too old resource version/);
        // A recent version still works.
        const ok = takeEvents((signal) => ds.watch(WidgetKind, { namespace: NS, resourceVersion: cur.metadata.resourceVersion, signal }), 1);
        await ds.update(WidgetKind, { ...cur, spec: { size: -1 } });
        expect((await ok).map((e) => e.type)).toEqual(['MODIFIED']);
      });
    });

    describe('persistence', () => {
      it('keeps objects and the resourceVersion counter across a restart', async () => {
        const a = await ds.create(WidgetKind, widget('a', 1, { x: 'y' }, { finalizers: ['longhorn.io'] }));
        const a2 = await ds.updateStatus(WidgetKind, { ...a, status: { phase: 'ready' } });
        await ds.create(GadgetKind, { apiVersion: GadgetKind.apiVersion, kind: 'Gadget', metadata: { name: 'g' }, value: 'v' });
        const rvBefore = (await ds.list(WidgetKind)).resourceVersion;
        ds = await h.reopen();
        const back = await ds.get(WidgetKind, 'a', NS);
        expect(back).toEqual(a2);
        expect((await ds.get(GadgetKind, 'g')).value).toBe('v');
        expect((await ds.list(WidgetKind)).resourceVersion).toBe(rvBefore);
        const b = await ds.create(WidgetKind, widget('b'));
        expect(Number(b.metadata.resourceVersion)).toBeGreaterThan(Number(rvBefore));
        expect(isConflict(await rejection(ds.update(WidgetKind, { ...a, spec: { size: 7 } })))).toBe(true);
      });

      it('a watch resumes across a restart from the last seen resourceVersion', async () => {
        const { resourceVersion } = await ds.list(WidgetKind, { namespace: NS });
        const first = takeEvents((signal) => ds.watch(WidgetKind, { namespace: NS, resourceVersion, signal }), 1);
        await ds.create(WidgetKind, widget('a'));
        const seen = await first;
        await ds.create(WidgetKind, widget('b'));
        ds = await h.reopen();
        await ds.create(WidgetKind, widget('c'));
        const resumed = await takeEvents((signal) => ds.watch(WidgetKind, { namespace: NS, resourceVersion: seen[0].object.metadata.resourceVersion, signal }), 2);
        expect(resumed.map((e) => `${e.type}:${e.object.metadata.name}`)).toEqual(['ADDED:b', 'ADDED:c']);
      });

      it('a deletion pending on finalizers survives a restart', async () => {
        await ds.create(WidgetKind, widget('a', 1, undefined, { finalizers: ['longhorn.io'] }));
        await ds.delete(WidgetKind, 'a', NS);
        ds = await h.reopen();
        const cur = await ds.get(WidgetKind, 'a', NS);
        expect(cur.metadata.deletionTimestamp).toBeTruthy();
        await ds.update(WidgetKind, { ...cur, metadata: { ...cur.metadata, finalizers: [] } });
        expect(isNotFound(await rejection(ds.get(WidgetKind, 'a', NS)))).toBe(true);
      });
    });
  });
}
