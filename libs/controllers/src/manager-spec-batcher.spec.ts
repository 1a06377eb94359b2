import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from '@jest/globals';
import { EmbeddedDatastore, isConflict } from '@bis/datastore';
import { LONGHORN_API_VERSION } from '@bis/crd-types';
import { BackingImageManagerKind } from './kinds.js';
import { ManagerSpecBatcher } from './manager-spec-batcher.js';

const NS = 'longhorn-system';
let dir: string;
let store: EmbeddedDatastore;

beforeEach(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), 'batcher-'));
  store = await EmbeddedDatastore.open({ dataDir: dir });
  await store.create(BackingImageManagerKind, {
    apiVersion: LONGHORN_API_VERSION,
    kind: 'BackingImageManager',
    metadata: { name: 'bim-1', namespace: NS },
    spec: { image: 'i', nodeID: 'n', diskUUID: 'd', diskPath: '/d', backingImages: { old: 'u-old' } },
  });
});
afterEach(async () => {
  await store.close();
  await rm(dir, { recursive: true, force: true });
});

describe('ManagerSpecBatcher', () => {
  it('adds images asked for while a write is in flight in one write, keeping what the manager listed', async () => {
    const b = new ManagerSpecBatcher(store, NS);
    await Promise.all(Array.from({ length: 20 }, (_, i) => b.add('bim-1', `img-${i}`, `u-${i}`)));
    const m = await store.get(BackingImageManagerKind, 'bim-1', NS);
    expect(Object.keys(m.spec?.backingImages ?? {}).sort()).toEqual(['old', ...Array.from({ length: 20 }, (_, i) => `img-${i}`)].sort());
    expect(m.spec?.backingImages?.['img-7']).toBe('u-7');
    // the first addition is written alone, the 19 asked for meanwhile together
    expect(b.stats).toEqual({ writes: 2, additions: 20 });
  });

  it('retries a write that conflicts with another writer, and fails the additions of a manager that is gone', async () => {
    // the store as the batcher sees it, counting the conflicts its updates meet
    let conflicts = 0;
    const seen = new Proxy(store, {
      get(target, prop) {
        const v = Reflect.get(target, prop, target) as unknown;
        if (typeof v !== 'function') return v;
        const method = (v as (...a: unknown[]) => unknown).bind(target);
        // the batcher writes with `update`, or `updateShared` where the store offers it
        if (prop !== 'update' && prop !== 'updateShared') return method;
        return (...args: Parameters<EmbeddedDatastore['update']>) =>
          (method(...args) as ReturnType<EmbeddedDatastore['update']>).catch((err: unknown) => {
            if (isConflict(err)) conflicts++;
            throw err;
          });
      },
    });
    const b = new ManagerSpecBatcher(seen, NS);
    const cur = await store.get(BackingImageManagerKind, 'bim-1', NS);
    // the other writer's update is staged first: the batcher's write, made from the version before it, conflicts
    const other = store.update(BackingImageManagerKind, { ...cur, spec: { ...cur.spec, backingImages: { ...cur.spec?.backingImages, other: 'u-o' } } });
    await Promise.all([other, b.add('bim-1', 'a', 'u-a')]);
    expect(conflicts).toBe(1);
    expect(b.stats.writes).toBe(1);
    const m = await store.get(BackingImageManagerKind, 'bim-1', NS);
    expect(m.spec?.backingImages).toMatchObject({ old: 'u-old', other: 'u-o', a: 'u-a' });
    await expect(b.add('bim-2', 'a', 'u-a')).rejects.toThrow(/not found/i);
  });
});
