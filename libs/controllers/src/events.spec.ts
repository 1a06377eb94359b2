import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterEach, describe, expect, it } from '@jest/globals';
import { EmbeddedDatastore } from '@bis/datastore';
import { EventKind, redactEventMessage, StoreEventRecorder } from './events.js';

const NS = 'longhorn-system';
let dir = '';
let store: EmbeddedDatastore | undefined;
afterEach(async () => {
  await store?.close();
  store = undefined;
  if (dir) await rm(dir, { recursive: true, force: true });
});

const bi = (name: string) => ({ kind: 'BackingImage', metadata: { name, namespace: NS, uid: `uid-${name}` } });

describe('StoreEventRecorder (events kept in the store)', () => {
  it('stores core/v1 Events, folds repeats, keeps the newest per object and in all, and survives a reopen', async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), 'bis-events-'));
    store = await EmbeddedDatastore.open({ dataDir: dir });
    let t = Date.parse('2026-01-01T00:00:00Z');
    const now = () => new Date((t += 1000));
    const lines: string[] = [];
    const r = new StoreEventRecorder({ store, namespace: NS, perObject: 3, total: 5, now, log: (l, type) => lines.push(`${type} ${l}`) });
    r.record('src', bi('a'), 'Warning', 'Failed', 'disk-1: no space left on device (ENOSPC)');
    r.record('src', bi('a'), 'Warning', 'Failed', 'disk-1: no space left on device (ENOSPC)');
    await r.flush();
    const [first] = (await store.list(EventKind, { namespace: NS })).items;
    expect(first).toMatchObject({
      apiVersion: 'v1',
      kind: 'Event',
      involvedObject: { kind: 'BackingImage', name: 'a', namespace: NS, uid: 'uid-a' },
      type: 'Warning',
      reason: 'Failed',
      count: 2,
      source: { component: 'src' },
      firstTimestamp: '2026-01-01T00:00:01.000Z',
      lastTimestamp: '2026-01-01T00:00:02.000Z',
    });
    expect(first!.metadata.name).toMatch(/^a\.[0-9a-f]{16}$/);
    expect(lines).toEqual(['Warning event Warning Failed BackingImage/a: disk-1: no space left on device (ENOSPC)', 'Warning event Warning Failed BackingImage/a: disk-1: no space left on device (ENOSPC)']);

    for (let i = 0; i < 4; i++) r.record('src', bi('a'), 'Normal', 'Update', `a${i}`);
    expect((await r.list({ name: 'a' })).map((e) => e.message)).toEqual(['a1', 'a2', 'a3']); // 3 per object
    for (let i = 0; i < 3; i++) r.record('src', bi('b'), 'Normal', 'Update', `b${i}`);
    const all = await r.list();
    expect(all.map((e) => e.message)).toEqual(['a2', 'a3', 'b0', 'b1', 'b2']); // 5 in all, oldest dropped first
    expect(await r.list({ kind: 'BackingImage', name: 'b', reason: 'Update' })).toHaveLength(3);

    // Kept across a restart (the embedded store persists); retention goes on from what is stored.
    await store.close();
    store = await EmbeddedDatastore.open({ dataDir: dir });
    const r2 = new StoreEventRecorder({ store, namespace: NS, perObject: 3, total: 5, now });
    expect((await r2.list()).map((e) => e.message)).toEqual(['a2', 'a3', 'b0', 'b1', 'b2']);
    r2.record('src', bi('c'), 'Normal', 'Create', 'c0');
    expect((await r2.list()).map((e) => e.message)).toEqual(['a3', 'b0', 'b1', 'b2', 'c0']);
  });

  it('keeps credentials out of messages', () => {
    expect(redactEventMessage('download from https://user:pa55word@example.com/x.img failed')).toBe('download from https://***@example.com/x.img failed');
    expect(redactEventMessage('GET https://b.s3.example.com/o?X-Amz-Signature=abcdef&x=1 403')).toBe('GET https://b.s3.example.com/o?X-Amz-Signature=***&x=1 403');
    expect(redactEventMessage('got 404 from http://127.0.0.1:8080/missing')).toBe('got 404 from http://127.0.0.1:8080/missing');
  });
});
