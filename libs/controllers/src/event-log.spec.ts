import { appendFile, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterEach, describe, expect, it } from '@jest/globals';
import { EVENT_MESSAGE_MAX, EventLogRecorder } from './event-log.js';

const NS = 'longhorn-system';
let dir = '';
const open: EventLogRecorder[] = [];
afterEach(async () => {
  for (const r of open.splice(0)) await r.close().catch(() => undefined);
  if (dir) await rm(dir, { recursive: true, force: true });
  dir = '';
});

const bi = (name: string) => ({ kind: 'BackingImage', metadata: { name, namespace: NS, uid: `uid-${name}` } });
const bim = (name: string) => ({ kind: 'BackingImageManager', metadata: { name } });

async function start(opts: { perObject?: number; total?: number; lines?: string[] } = {}) {
  dir ||= await mkdtemp(path.join(os.tmpdir(), 'bis-event-log-'));
  let t = Date.parse('2026-01-01T00:00:00Z');
  const file = path.join(dir, 'events', 'events.log');
  const { recorder, opened } = await EventLogRecorder.open({
    file,
    namespace: NS,
    perObject: opts.perObject,
    total: opts.total,
    now: () => new Date((t += 1000)),
    log: (l, type) => opts.lines?.push(`${type} ${l}`),
  });
  open.push(recorder);
  return { r: recorder, opened, file };
}

async function fileLines(file: string): Promise<string[]> {
  return (await readFile(file, 'utf8')).split('\n').filter((l) => l !== '');
}

describe('EventLogRecorder (events in their own file)', () => {
  it('records events with a log line each, folds repeats of an object last event, and answers list by kind, name and reason', async () => {
    const lines: string[] = [];
    const { r } = await start({ lines });
    r.record('src', bi('a'), 'Warning', 'Failed', 'disk-1: no space left on device (ENOSPC)');
    r.record('src', bi('a'), 'Warning', 'Failed', 'disk-1: no space left on device (ENOSPC)');
    r.record('src', bi('b'), 'Normal', 'Ready', 'Copy of backing image b on disk disk-1 on node n1 is ready');
    r.record('src', bim('m1'), 'Normal', 'Syncing', 'Syncing backing image b');
    r.record('src', bi('a'), 'Normal', 'Ready', 'Copy of backing image a on disk disk-2 on node n1 is ready');
    expect(lines[0]).toBe('Warning event Warning Failed BackingImage/a: disk-1: no space left on device (ENOSPC)');
    expect(lines).toHaveLength(5);
    const all = await r.list();
    expect(all.map((e) => `${e.involvedObject.name} ${e.reason} ${e.count}`)).toEqual(['a Failed 2', 'b Ready 1', 'm1 Syncing 1', 'a Ready 1']);
    expect(all[0]).toMatchObject({ type: 'Warning', source: 'src', firstTime: '2026-01-01T00:00:01.000Z', time: '2026-01-01T00:00:02.000Z', involvedObject: { kind: 'BackingImage', name: 'a', namespace: NS } });
    // an object without a namespace gets the log's
    expect(all[2]!.involvedObject.namespace).toBe(NS);
    expect((await r.list({ kind: 'BackingImage', name: 'a' })).map((e) => e.reason)).toEqual(['Failed', 'Ready']);
    expect((await r.list({ reason: 'Ready' })).map((e) => e.involvedObject.name)).toEqual(['b', 'a']);
    // a repeat after another event of the object is a new event
    r.record('src', bi('a'), 'Warning', 'Failed', 'disk-1: no space left on device (ENOSPC)');
    expect((await r.list({ name: 'a' })).map((e) => `${e.reason} ${e.count}`)).toEqual(['Failed 2', 'Ready 1', 'Failed 1']);
    // list answers copies
    (await r.list())[0]!.involvedObject.name = 'changed';
    expect((await r.list())[0]!.involvedObject.name).toBe('a');
  });

  it('keeps the newest per object and in all, and a reopen gives the same events back', async () => {
    const { r, file } = await start({ perObject: 3, total: 5 });
    for (let i = 1; i <= 5; i++) r.record('src', bi('a'), 'Normal', 'Update', `a ${i}`);
    r.record('src', bi('b'), 'Normal', 'Update', 'b 1');
    r.record('src', bi('b'), 'Normal', 'Update', 'b 2');
    r.record('src', bi('c'), 'Normal', 'Update', 'c 1');
    r.record('src', bi('c'), 'Normal', 'Update', 'c 1');
    const want = ['a 4', 'a 5', 'b 1', 'b 2', 'c 1'];
    expect((await r.list()).map((e) => e.message)).toEqual(want);
    expect((await r.list({ name: 'c' }))[0]!.count).toBe(2);
    const before = await r.list();
    await r.close();
    // every record and repeat is one line (the file is rewritten only beyond 2 × total lines)
    expect(await fileLines(file)).toHaveLength(9);
    const again = await start({ perObject: 3, total: 5 });
    expect(again.opened).toEqual({ events: 5, skippedLines: 0 });
    expect(await again.r.list()).toEqual(before);
    // a repeat of the last event of an object folds after the reopen too
    again.r.record('src', bi('c'), 'Normal', 'Update', 'c 1');
    expect((await again.r.list({ name: 'c' }))[0]!.count).toBe(3);
  });

  it('rewrites the file when it holds more than twice the kept events, keeping what was recorded', async () => {
    const { r, file } = await start({ total: 10 });
    for (let i = 0; i < 100; i++) r.record('src', bi(`img-${i}`), 'Normal', 'Create', `created ${i}`);
    await r.flush();
    const lines = await fileLines(file);
    expect(lines.length).toBeLessThanOrEqual(20);
    expect((await r.list()).map((e) => e.message)).toEqual(Array.from({ length: 10 }, (_, i) => `created ${90 + i}`));
    await r.close();
    const again = await start({ total: 10 });
    expect((await again.r.list()).map((e) => e.message)).toEqual(Array.from({ length: 10 }, (_, i) => `created ${90 + i}`));
  });

  it('skips lines that are not events (a write cut short, damage), says so, and rewrites the file without them', async () => {
    const lines: string[] = [];
    const { r, file } = await start({ lines });
    r.record('src', bi('a'), 'Normal', 'Create', 'created a');
    r.record('src', bi('b'), 'Normal', 'Create', 'created b');
    await r.close();
    await appendFile(file, '{"id":"x","time":"2026"}\nnot json\n{"id":"cut","time":"2026-01-01T00:00:09.000Z","type":"Nor');
    const again = await start({ lines });
    expect(again.opened).toEqual({ events: 2, skippedLines: 3 });
    expect(lines.some((l) => l.startsWith('Warning event log') && l.includes('3 line(s) that are not events skipped'))).toBe(true);
    expect((await again.r.list()).map((e) => e.message)).toEqual(['created a', 'created b']);
    expect(await fileLines(file)).toHaveLength(2);
    // new events go after them
    again.r.record('src', bi('c'), 'Normal', 'Create', 'created c');
    await again.r.flush();
    expect((await fileLines(file)).map((l) => (JSON.parse(l) as { message: string }).message)).toEqual(['created a', 'created b', 'created c']);
  });

  it('redacts credentials, bounds a message, and imports events kept elsewhere oldest first', async () => {
    const { r, file } = await start({ perObject: 2 });
    r.record('src', bi('a'), 'Warning', 'Failed', 'download of https://user:secret@host/x.img?X-Amz-Signature=abc failed');
    r.record('src', bi('b'), 'Warning', 'Failed', 'x'.repeat(EVENT_MESSAGE_MAX * 2));
    const [a, b] = await r.list();
    expect(a!.message).toBe('download of https://***@host/x.img?X-Amz-Signature=*** failed');
    expect(b!.message.length).toBe(EVENT_MESSAGE_MAX);
    expect(b!.message.endsWith('… (truncated)')).toBe(true);
    await r.import([
      { id: 'old-1', time: '2025-01-01T00:00:00.000Z', type: 'Normal', reason: 'Create', message: 'old 1', source: 's', involvedObject: { kind: 'BackingImage', name: 'c', namespace: NS }, count: 1 },
      { id: 'old-2', time: '2025-01-01T00:00:01.000Z', type: 'Normal', reason: 'Update', message: 'old 2', source: 's', involvedObject: { kind: 'BackingImage', name: 'c', namespace: NS }, count: 4 },
      { id: 'old-3', time: '2025-01-01T00:00:02.000Z', type: 'Normal', reason: 'Update', message: 'old 3', source: 's', involvedObject: { kind: 'BackingImage', name: 'c', namespace: NS }, count: 1 },
    ]);
    // the per-object bound holds for imported events too
    expect((await r.list({ name: 'c' })).map((e) => `${e.message} ${e.count}`)).toEqual(['old 2 4', 'old 3 1']);
    expect(await fileLines(file)).toHaveLength(5);
    expect(JSON.stringify(await fileLines(file))).not.toContain('secret');
  });

  it('a write that fails is logged and the next write goes on; after close, events are only logged', async () => {
    const lines: string[] = [];
    const { r, file } = await start({ lines });
    r.record('src', bi('a'), 'Normal', 'Create', 'created a');
    await r.flush();
    // the directory becomes a file: the rewrite (forced by a tiny total) cannot make its temporary file
    await r.close();
    const again = await start({ lines, total: 1 });
    await rm(path.dirname(file), { recursive: true });
    await writeFile(path.dirname(file), 'not a directory');
    again.r.record('src', bi('b'), 'Normal', 'Create', 'created b');
    again.r.record('src', bi('c'), 'Normal', 'Create', 'created c');
    await again.r.flush();
    expect(again.r.writeFailures).toBeGreaterThan(0);
    expect(lines.some((l) => l.startsWith('Warning event log') && l.includes('not written'))).toBe(true);
    expect((await again.r.list()).map((e) => e.message)).toEqual(['created c']);
    await again.r.close();
    const n = lines.length;
    again.r.record('src', bi('d'), 'Normal', 'Create', 'created d');
    expect(lines.length).toBe(n + 1);
    expect((await again.r.list()).map((e) => e.message)).toEqual(['created c']);
  });
});
