import { afterEach, describe, expect, it } from '@jest/globals';
import { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { EmbeddedDatastore } from './embedded/embedded-store.js';
import { SharedInformers } from './informer.js';
import { WidgetKind, type Widget } from './testing/index.js';

const w = (name: string, namespace: string, size: number): Widget => ({ apiVersion: WidgetKind.apiVersion, kind: 'Widget', metadata: { name, namespace }, spec: { size } });

describe('SharedInformers cache reads', () => {
  let dir: string | undefined;
  let store: EmbeddedDatastore | undefined;
  const running: SharedInformers[] = [];
  afterEach(async () => {
    for (const i of running.splice(0)) await i.stop();
    await store?.close();
    if (dir) await fsp.rm(dir, { recursive: true, force: true });
    store = dir = undefined;
  });

  async function started(namespace: string | undefined): Promise<SharedInformers> {
    const inf = new SharedInformers({ store: store!, ...(namespace !== undefined ? { namespace } : {}) });
    inf.on(WidgetKind, () => undefined);
    inf.start();
    running.push(inf);
    await inf.waitForSync();
    return inf;
  }

  it('reads by name in its namespace (and nothing of another), and keeps same-named objects of several namespaces apart when it watches all', async () => {
    dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'bis-informer-'));
    store = await EmbeddedDatastore.open({ dataDir: dir });
    await store.create(WidgetKind, w('a', 'ns1', 1));
    await store.create(WidgetKind, w('a', 'ns2', 2));
    const one = await started('ns1');
    const all = await started(undefined);
    expect(one.cachedGet(WidgetKind, 'a')?.spec.size).toBe(1);
    expect(one.informerFor(WidgetKind).peek('a', 'ns1')?.spec.size).toBe(1);
    expect(one.informerFor(WidgetKind).peek('a', 'ns2')).toBeUndefined();
    expect(one.cached(WidgetKind)).toHaveLength(1);
    expect(all.informerFor(WidgetKind).peek('a', 'ns1')?.spec.size).toBe(1);
    expect(all.informerFor(WidgetKind).peek('a', 'ns2')?.spec.size).toBe(2);
    expect(all.cached(WidgetKind)).toHaveLength(2);
    // a change and a delete reach the right entry
    await store.update(WidgetKind, { ...(await store.get(WidgetKind, 'a', 'ns1')), spec: { size: 5 } });
    await store.delete(WidgetKind, 'a', 'ns2');
    const until = Date.now() + 30_000;
    while (one.cachedGet(WidgetKind, 'a')?.spec.size !== 5 || all.cached(WidgetKind).length !== 1) {
      if (Date.now() > until) throw new Error('the caches never saw the change and the delete');
      await new Promise((r) => setTimeout(r, 10));
    }
    expect(all.informerFor(WidgetKind).peek('a', 'ns1')?.spec.size).toBe(5);
    // `get` hands out a copy, `peek` the cached object
    const copy = one.informerFor(WidgetKind).get('a', 'ns1')!;
    expect(copy).toEqual(one.cachedGet(WidgetKind, 'a'));
    expect(copy).not.toBe(one.cachedGet(WidgetKind, 'a'));
  });
});
