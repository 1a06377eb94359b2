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

  it('writes the events of different objects at once (at most `concurrency`), each object in order; warnings wait where routine events are only logged', async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), 'bis-events-'));
    const real = await EmbeddedDatastore.open({ dataDir: dir });
    store = real;
    // creates wait for the gate, like writes acknowledged after a slow sync
    let open: () => void = () => {};
    const gate = new Promise<void>((resolve) => (open = resolve));
    let running = 0;
    let maxRunning = 0;
    const slow = new Proxy(real, {
      get(target, prop, receiver) {
        if (prop !== 'create') return Reflect.get(target, prop, receiver) as unknown;
        return async (...args: Parameters<EmbeddedDatastore['create']>) => {
          running++;
          maxRunning = Math.max(maxRunning, running);
          try {
            await gate;
            return await target.create(...args);
          } finally {
            running--;
          }
        };
      },
    });
    let t = Date.parse('2026-01-01T00:00:00Z');
    const lines: string[] = [];
    const r = new StoreEventRecorder({ store: slow, namespace: NS, maxPending: 10, concurrency: 3, now: () => new Date((t += 1000)), log: (l, type) => lines.push(`${type} ${l}`) });
    for (let i = 0; i < 10; i++) r.record('src', bi(`o${i % 5}`), 'Normal', 'Update', `n${i}`);
    // the queue is full: a routine event is only logged, a warning still waits
    r.record('src', bi('o0'), 'Normal', 'Update', 'dropped');
    r.record('src', bi('o1'), 'Warning', 'Failed', 'disk-1: no space left on device (ENOSPC)');
    expect(r.dropped).toEqual({ Normal: 1, Warning: 0 });
    expect(lines.some((l) => /^Warning 1 event\(s\) only logged, not stored: 10 waiting already \(1 Normal and 0 Warning since the start\)$/.test(l))).toBe(true);
    expect(lines).toContain('Normal event Normal Update BackingImage/o0: dropped');
    await new Promise((resolve) => setTimeout(resolve, 20));
    expect(running).toBe(3);
    open();
    await r.flush();
    expect(maxRunning).toBe(3);
    const events = await r.list();
    expect(events.map((e) => e.message).sort()).toEqual(['disk-1: no space left on device (ENOSPC)', 'n0', 'n1', 'n2', 'n3', 'n4', 'n5', 'n6', 'n7', 'n8', 'n9']);
    // each object's events in the order recorded
    for (let o = 0; o < 5; o++) {
      const mine = events.filter((e) => e.involvedObject.name === `o${o}` && e.reason === 'Update').sort((a, b) => a.time.localeCompare(b.time));
      expect(mine.map((e) => e.message)).toEqual([`n${o}`, `n${o + 5}`]);
    }
    expect(events.find((e) => e.type === 'Warning')?.involvedObject.name).toBe('o1');
  });

  it('keeps credentials out of messages', () => {
    expect(redactEventMessage('download from https://user:pa55word@example.com/x.img failed')).toBe('download from https://***@example.com/x.img failed');
    expect(redactEventMessage('GET https://b.s3.example.com/o?X-Amz-Signature=abcdef&x=1 403')).toBe('GET https://b.s3.example.com/o?X-Amz-Signature=***&x=1 403');
    expect(redactEventMessage('got 404 from http://127.0.0.1:8080/missing')).toBe('got 404 from http://127.0.0.1:8080/missing');
  });
});
