import { afterEach, beforeEach, describe, expect, it } from '@jest/globals';
import { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { runDatastoreContract, WidgetKind, type Widget } from '../testing/index.js';
import { EmbeddedDatastore } from './embedded-store.js';
import { LOG_NAME } from './log-file.js';

runDatastoreContract('embedded', async ({ historyLimit }) => {
  const dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'bis-ds-contract-'));
  let store = await EmbeddedDatastore.open({ dataDir: dir, historyLimit, compactAfterEvents: 15 });
  return {
    get store() {
      return store;
    },
    async reopen() {
      await store.close();
      store = await EmbeddedDatastore.open({ dataDir: dir, historyLimit, compactAfterEvents: 15 });
      return store;
    },
    async dispose() {
      await store.close();
      await fsp.rm(dir, { recursive: true, force: true });
    },
  };
});

const w = (name: string, size = 1): Widget => ({ apiVersion: WidgetKind.apiVersion, kind: 'Widget', metadata: { name, namespace: 'ns' }, spec: { size } });

describe('EmbeddedDatastore on disk', () => {
  let dir: string;
  beforeEach(async () => {
    dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'bis-ds-'));
  });
  afterEach(async () => {
    await fsp.rm(dir, { recursive: true, force: true });
  });

  it('drops a torn last line (an unacknowledged append) and keeps everything before it', async () => {
    const s = await EmbeddedDatastore.open({ dataDir: dir });
    await s.create(WidgetKind, w('a'));
    await s.create(WidgetKind, w('b'));
    await s.close();
    await fsp.appendFile(path.join(dir, LOG_NAME), '{"op":"ev","rv":3,"k":"contract.bis.dev/Wid');
    const s2 = await EmbeddedDatastore.open({ dataDir: dir });
    expect((await s2.list(WidgetKind)).items.map((i) => i.metadata.name)).toEqual(['a', 'b']);
    expect(s2.resourceVersion).toBe('2');
    const c = await s2.create(WidgetKind, w('c'));
    expect(c.metadata.resourceVersion).toBe('3');
    await s2.close();
    const text = await fsp.readFile(path.join(dir, LOG_NAME), 'utf8');
    expect(text.endsWith('\n')).toBe(true);
    expect(text.split('\n').filter(Boolean).every((l) => JSON.parse(l))).toBe(true);
  });

  it('refuses to open a log damaged in the middle, naming the line', async () => {
    const s = await EmbeddedDatastore.open({ dataDir: dir });
    await s.create(WidgetKind, w('a'));
    await s.create(WidgetKind, w('b'));
    await s.close();
    const file = path.join(dir, LOG_NAME);
    const lines = (await fsp.readFile(file, 'utf8')).split('\n');
    lines[1] = 'garbage';
    await fsp.writeFile(file, lines.join('\n'));
    await expect(EmbeddedDatastore.open({ dataDir: dir })).rejects.toThrow(/damaged at line 2/);
    // The failed open did not keep the lock.
    await expect(fsp.access(path.join(dir, 'LOCK'))).rejects.toThrow();
  });

  it('compacts the log: bounded size, same objects, same history', async () => {
    const s = await EmbeddedDatastore.open({ dataDir: dir, historyLimit: 10, compactAfterEvents: 50 });
    let cur = await s.create(WidgetKind, w('a', 0));
    for (let i = 1; i <= 200; i++) cur = await s.update(WidgetKind, { ...cur, spec: { size: i } });
    await s.close();
    const lines = (await fsp.readFile(path.join(dir, LOG_NAME), 'utf8')).split('\n').filter(Boolean);
    expect(lines.length).toBeLessThanOrEqual(1 + 10 + 1 + 50);
    const s2 = await EmbeddedDatastore.open({ dataDir: dir, historyLimit: 10, compactAfterEvents: 50 });
    expect((await s2.get(WidgetKind, 'a', 'ns')).spec.size).toBe(200);
    expect(s2.resourceVersion).toBe('201');
    await s2.close();
  });

  it('allows one process per data directory', async () => {
    const s = await EmbeddedDatastore.open({ dataDir: dir });
    await expect(EmbeddedDatastore.open({ dataDir: dir })).rejects.toThrow(/already open/);
    await s.close();
    const again = await EmbeddedDatastore.open({ dataDir: dir });
    await again.close();
  });
});
