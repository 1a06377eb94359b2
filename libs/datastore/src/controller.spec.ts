import { afterEach, beforeEach, describe, expect, it } from '@jest/globals';
import { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Controller } from './controller.js';
import { PermanentError } from './retry.js';
import { EmbeddedDatastore } from './embedded/embedded-store.js';
import { ConflictError } from './errors.js';
import { Informer, SharedInformers, splitKey, type SharedInformerEventType } from './informer.js';
import { eventually, WidgetKind, type Widget } from './testing/index.js';

const w = (name: string, size: number): Widget => ({ apiVersion: WidgetKind.apiVersion, kind: 'Widget', metadata: { name, namespace: 'ns' }, spec: { size } });

describe('Informer and Controller over the embedded store', () => {
  let dir: string;
  let store: EmbeddedDatastore;
  let ac: AbortController;
  beforeEach(async () => {
    dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'bis-ctrl-'));
    store = await EmbeddedDatastore.open({ dataDir: dir, historyLimit: 5 });
    ac = new AbortController();
  });
  afterEach(async () => {
    ac.abort();
    await store.close();
    await fsp.rm(dir, { recursive: true, force: true });
  });

  it('the informer cache follows creates, updates and deletes', async () => {
    await store.create(WidgetKind, w('a', 1));
    const inf = new Informer({ store, kind: WidgetKind, namespace: 'ns' });
    const run = inf.run(ac.signal);
    await inf.waitForSync();
    expect(inf.get('a', 'ns')?.spec.size).toBe(1);
    const b = await store.create(WidgetKind, w('b', 2));
    await store.update(WidgetKind, { ...b, spec: { size: 3 } });
    await store.delete(WidgetKind, 'a', 'ns');
    await eventually(() => inf.get('b', 'ns')?.spec.size === 3 && !inf.get('a', 'ns'), 3000, 'cache convergence');
    expect(inf.list().map((o) => o.metadata.name)).toEqual(['b']);
    ac.abort();
    await run;
  });

  it('shared informers: one cache per kind for every handler, event types, resync, a failing handler does not stop the others', async () => {
    await store.create(WidgetKind, w('a', 1));
    const errors: unknown[] = [];
    const shared = new SharedInformers({ store, namespace: 'ns', resyncMs: 100, onError: (e) => errors.push(e) });
    const seen: [SharedInformerEventType, string, number | undefined][] = [];
    shared.on(WidgetKind, () => {
      throw new Error('handler bug');
    });
    shared.on(WidgetKind, (type, o, old) => seen.push([type, o.metadata.name, old?.spec.size]));
    expect(shared.informerFor(WidgetKind)).toBe(shared.informerFor(WidgetKind));
    expect(shared.hasSynced(WidgetKind)).toBe(false);
    shared.start();
    await shared.waitForSync();
    expect(shared.hasSynced(WidgetKind)).toBe(true);
    const a = shared.cachedGet(WidgetKind, 'a');
    expect(a?.spec.size).toBe(1);
    const cur = await store.get(WidgetKind, 'a', 'ns');
    await store.update(WidgetKind, { ...cur, spec: { size: 2 } });
    await store.delete(WidgetKind, 'a', 'ns');
    await eventually(() => seen.some(([t]) => t === 'DELETED'), 3000, 'delete event');
    expect(seen.filter(([t]) => t !== 'RESYNC')).toEqual([
      ['ADDED', 'a', undefined],
      ['MODIFIED', 'a', 1],
      ['DELETED', 'a', undefined],
    ]);
    expect(shared.cached(WidgetKind)).toEqual([]);
    await store.create(WidgetKind, w('b', 5));
    await eventually(() => seen.some(([t, n]) => t === 'RESYNC' && n === 'b'), 3000, 'resync of b');
    expect(errors.length).toBeGreaterThanOrEqual(4);
    await shared.stop();
  });

  it('status is written by a level-triggered reconciler with N workers; errors retry with backoff', async () => {
    const inf = new Informer({ store, kind: WidgetKind, namespace: 'ns' });
    const attempts = new Map<string, number>();
    let concurrent = 0;
    let maxConcurrent = 0;
    // Reconciles hold until two run at once (3 workers, 6 keys): overlap is shown by a condition, not by timing.
    let overlapped!: () => void;
    const overlap = new Promise<void>((r) => (overlapped = r));
    const ctrl = new Controller({
      name: 'widget',
      workers: 3,
      rateLimiter: { baseDelayMs: 5, maxDelayMs: 50, qps: 0 },
      async reconcile(key) {
        concurrent++;
        maxConcurrent = Math.max(maxConcurrent, concurrent);
        if (concurrent >= 2) overlapped();
        try {
          const n = (attempts.get(key) ?? 0) + 1;
          attempts.set(key, n);
          const { namespace, name } = splitKey(key);
          const obj = inf.get(name, namespace);
          if (!obj) return;
          if (name === 'flaky' && n < 3) throw new Error('transient');
          if (name === 'conflict' && n < 2) throw new ConflictError(WidgetKind, name);
          await overlap;
          if (obj.status?.count !== obj.spec.size) await store.updateStatus(WidgetKind, { ...obj, status: { count: obj.spec.size } });
        } finally {
          concurrent--;
        }
      },
    }).watch(inf);
    const runs = [inf.run(ac.signal), ctrl.run(ac.signal)];
    for (const n of ['a', 'b', 'c', 'd', 'flaky', 'conflict']) await store.create(WidgetKind, w(n, n.length));
    await eventually(async () => {
      const { items } = await store.list(WidgetKind, { namespace: 'ns' });
      return items.length === 6 && items.every((i) => (i.status as { count?: number } | undefined)?.count === i.spec.size);
    }, 5000, 'all statuses reconciled');
    expect(attempts.get('ns/flaky')).toBeGreaterThanOrEqual(3);
    expect(attempts.get('ns/conflict')).toBeGreaterThanOrEqual(2);
    expect(maxConcurrent).toBeGreaterThan(1);
    expect(maxConcurrent).toBeLessThanOrEqual(3);
    ac.abort();
    await Promise.all(runs);
  });

  it('never drops a failing key: it is retried with backoff until it succeeds', async () => {
    const inf = new Informer({ store, kind: WidgetKind, namespace: 'ns' });
    let calls = 0;
    const errors: string[] = [];
    const ctrl = new Controller({
      name: 'failing',
      workers: 1,
      rateLimiter: { baseDelayMs: 1, maxDelayMs: 5, qps: 0 },
      logger: { error: (m) => errors.push(m) },
      async reconcile() {
        calls++;
        // fails far more often than any retry limit would allow, then recovers
        if (calls < 12) throw new Error('always');
      },
    }).watch(inf);
    const runs = [inf.run(ac.signal), ctrl.run(ac.signal)];
    await store.create(WidgetKind, w('x', 1));
    await eventually(() => calls >= 12, 5000, 'the key is reconciled again after 11 failures');
    expect(errors.filter((e) => e.includes('reconcile ns/x failed'))).toHaveLength(11);
    expect(errors.some((e) => e.includes('dropping'))).toBe(false);
    expect(ctrl.queue.numRequeues('ns/x')).toBe(0);
    ac.abort();
    await Promise.all(runs);
  });

  it('does not retry a permanent error; the next event brings the key back', async () => {
    const inf = new Informer({ store, kind: WidgetKind, namespace: 'ns' });
    let calls = 0;
    const errors: string[] = [];
    const ctrl = new Controller({
      name: 'permanent',
      workers: 1,
      rateLimiter: { baseDelayMs: 1, maxDelayMs: 5, qps: 0 },
      logger: { error: (m) => errors.push(m) },
      async reconcile() {
        calls++;
        throw new PermanentError('cannot ever work');
      },
    }).watch(inf);
    const runs = [inf.run(ac.signal), ctrl.run(ac.signal)];
    const created = await store.create(WidgetKind, w('p', 1));
    await eventually(() => errors.some((e) => e.includes('reconcile ns/p failed permanently')), 3000, 'permanent failure logged');
    // a retry would come within 5 ms; an event-free wait well beyond it shows none came
    await new Promise((r) => setTimeout(r, 100));
    expect(calls).toBe(1);
    await store.update(WidgetKind, { ...created, spec: { size: 2 } });
    await eventually(() => calls === 2, 3000, 'the update enqueues the key again');
    ac.abort();
    await Promise.all(runs);
  });

  it('re-lists after 410 Gone and still converges', async () => {
    // The first watch starts only after the history (limit 5) has moved past the informer's list version,
    // so the real store answers 410 Gone and the informer must re-list.
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    let watches = 0;
    const gated = Object.create(store) as EmbeddedDatastore;
    gated.watch = ((kind, opts) => {
      watches++;
      const inner = store.watch(kind, opts);
      return {
        async *[Symbol.asyncIterator]() {
          await gate;
          yield* inner;
        },
      };
    }) as EmbeddedDatastore['watch'];
    const errs: unknown[] = [];
    const inf = new Informer({ store: gated, kind: WidgetKind, namespace: 'ns', retryDelayMs: 10, onError: (e) => errs.push(e) });
    const deleted: string[] = [];
    inf.addHandler({ onDelete: (o) => deleted.push(o.metadata.name) });
    await store.create(WidgetKind, w('gone-soon', 0));
    const run = inf.run(ac.signal);
    await inf.waitForSync();
    await store.delete(WidgetKind, 'gone-soon', 'ns');
    for (let i = 0; i < 30; i++) await store.create(WidgetKind, w(`o${i}`, i));
    release();
    await eventually(() => inf.list().length === 30, 5000, 'all 30 objects in the cache');
    expect(errs.map((e) => (e as { reason?: string }).reason)).toEqual(['Gone']);
    expect(watches).toBe(2);
    expect(deleted).toEqual(['gone-soon']);
    ac.abort();
    await run;
  });
});
