import { afterEach, describe, expect, it } from '@jest/globals';
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { LONGHORN_API_VERSION } from '@bis/crd-types';
import { EmbeddedDatastore, SharedInformers, type Datastore } from '@bis/datastore';
import { SettingKind } from './kinds.js';
import { SettingName, SettingsReader } from './settings.js';

const NS = 'longhorn-system';
const LIMIT = SettingName.ConcurrentBackingImageReplenishPerNodeLimit;

describe('SettingsReader', () => {
  let dir: string | undefined;
  let store: EmbeddedDatastore | undefined;
  let informers: SharedInformers | undefined;
  afterEach(async () => {
    await informers?.stop();
    await store?.close();
    if (dir) await rm(dir, { recursive: true, force: true });
    informers = store = dir = undefined;
  });

  async function open(): Promise<{ store: EmbeddedDatastore; reads: { n: number }; counting: Datastore }> {
    dir = await mkdtemp(path.join(os.tmpdir(), 'bis-settings-'));
    store = await EmbeddedDatastore.open({ dataDir: dir });
    const reads = { n: 0 };
    const s = store;
    // the store as the reader sees it, counting its reads of settings
    const counting = new Proxy(s, {
      get(target, prop, receiver) {
        if (prop === 'get') return (...args: Parameters<Datastore['get']>) => (reads.n++, s.get(...args));
        return Reflect.get(target, prop, receiver) as unknown;
      },
    }) as Datastore;
    return { store: s, reads, counting };
  }

  it('reads the store without informers, and falls back to the default when the setting is absent or empty', async () => {
    const { store: s, reads, counting } = await open();
    const r = new SettingsReader(counting, NS);
    expect(await r.int(LIMIT)).toBe(5);
    await s.create(SettingKind, { apiVersion: LONGHORN_API_VERSION, kind: 'Setting', metadata: { name: LIMIT, namespace: NS }, value: '7' });
    expect(await r.int(LIMIT)).toBe(7);
    expect(reads.n).toBe(2);
  });

  it('reads the informer cache once it has synced, without a store read, and sees a change once the cache has it', async () => {
    const { store: s, reads, counting } = await open();
    await s.create(SettingKind, { apiVersion: LONGHORN_API_VERSION, kind: 'Setting', metadata: { name: LIMIT, namespace: NS }, value: '7' });
    informers = new SharedInformers({ store: s, namespace: NS });
    informers.on(SettingKind, () => undefined);
    const r = new SettingsReader(counting, NS, {}, informers);
    // before the cache has synced: from the store
    expect(await r.int(LIMIT)).toBe(7);
    expect(reads.n).toBe(1);
    informers.start();
    await informers.waitForSync();
    expect(await r.int(LIMIT)).toBe(7);
    expect(await r.get(SettingName.BackupCompressionMethod)).toBe('lz4');
    expect(reads.n).toBe(1);
    const cur = await s.get(SettingKind, LIMIT, NS);
    await s.update(SettingKind, { ...cur, value: '2' });
    const until = Date.now() + 30_000;
    while ((await r.int(LIMIT)) !== 2) {
      if (Date.now() > until) throw new Error('the cache never had the new value');
      await new Promise((res) => setTimeout(res, 10));
    }
    expect(reads.n).toBe(1);
  });
});
