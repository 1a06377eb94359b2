import http from 'node:http';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { EventKind, NodeKind } from '@bis/controllers';
import { EmbeddedDatastore } from '@bis/datastore';
import { startStandalone, type StandaloneHandle, type StandaloneOptions } from './standalone.js';
import { BINARIES, binariesBuilt, tempDir, waitFor, writeImage } from './test-support/e2e.js';
import { readFile } from 'node:fs/promises';

/*
 * What an operator sees when a copy fails: the reason in the image's status (message, retry count, next retry as a
 * time), the same reason in `GET /v1/events`, and the events still there after a restart (kept in
 * `<dataDir>/events/events.log`), and the events an earlier version kept in the store moved there.
 */

const SIZE = 2 * 1024 * 1024;
let tmp: { dir: string; remove(): Promise<void> };
let origin: http.Server;
let originUrl = '';
let sys: StandaloneHandle;
let image: Buffer;
const hits = new Map<string, number>();

const options = (): StandaloneOptions => ({
  dataDir: path.join(tmp.dir, 'data'),
  listen: '127.0.0.1:0',
  disks: 2,
  allowSourceHosts: ['127.0.0.1'],
  binaries: BINARIES,
  // retries close together, so that a test sees several attempts; the waiting window stays long enough to be seen
  controllerOptions: { resyncMs: 2000, timing: { dataSourcePollMs: 200, managerPollMs: 200, waitRequeueMs: 300, dataSourceRetryInitialMs: 4000, dataSourceRetryMaxMs: 8000 } },
});

beforeAll(async () => {
  if (!(await binariesBuilt())) throw new Error('build the data-plane apps first: npx nx run-many -t build -p backing-image-manager backing-image-data-source');
  tmp = await tempDir('bis-standalone-events-');
  await writeImage(path.join(tmp.dir, 'good.raw'), SIZE, 7);
  image = await readFile(path.join(tmp.dir, 'good.raw'));
  // An origin that answers 404 for /missing, 500 for /broken, and the image for /good.raw.
  origin = http.createServer((req, res) => {
    const p = (req.url ?? '/').split('?')[0]!;
    hits.set(p, (hits.get(p) ?? 0) + 1);
    if (p === '/broken') return res.writeHead(500, { 'content-type': 'text/plain' }).end('internal error');
    if (p === '/good.raw') return res.writeHead(200, { 'content-length': image.length }).end(image);
    res.writeHead(404, { 'content-type': 'text/plain' }).end('not found');
  });
  await new Promise<void>((r) => origin.listen(0, '127.0.0.1', r));
  originUrl = `http://127.0.0.1:${(origin.address() as { port: number }).port}`;
  sys = await startStandalone(options());
}, 60_000);

afterAll(async () => {
  await sys?.stop();
  origin?.closeAllConnections();
  await new Promise((r) => origin?.close(r));
  await tmp?.remove();
});

type Json = Record<string, unknown>;
type DiskFile = { state: string; message: string; progress: number; retryCount?: number; nextRetryAt?: string };
type Ev = { eventType: string; reason: string; message: string; source: string; count: number; involvedObjectKind: string; involvedObjectName: string; lastTimestamp: string };

async function call(method: string, url: string, body?: unknown): Promise<{ status: number; json: Json }> {
  const res = await fetch(`${sys.url}${url}`, { method, headers: { accept: 'application/json', 'content-type': 'application/json' }, body: body === undefined ? undefined : JSON.stringify(body) });
  const text = await res.text();
  return { status: res.status, json: text ? (JSON.parse(text) as Json) : {} };
}

const create = (name: string, url: string, checksum = '') =>
  call('POST', '/v1/backingimages', { name, sourceType: 'download', parameters: { url }, expectedChecksum: checksum, minNumberOfCopies: 1 });

const files = async (name: string): Promise<DiskFile[]> => Object.values(((await call('GET', `/v1/backingimages/${name}`)).json['diskFileStatusMap'] ?? {}) as Record<string, DiskFile>);

const events = async (name: string): Promise<Ev[]> => ((await call('GET', `/v1/events?kind=BackingImage&name=${name}`)).json['data'] ?? []) as Ev[];

describe('failing copies show why (standalone)', () => {
  it('a 404 origin: the status says so with the retry count and the next retry time; /v1/events has the failure', async () => {
    expect((await create('ev404', `${originUrl}/missing`)).status).toBe(200);
    // The failed first copy waits for its next attempt: the message keeps the reason and says when it comes.
    const waiting = await waitFor('the failed copy with its next retry', async () => (await files('ev404')).find((f) => f.nextRetryAt && /got 404/.test(f.message)), 60_000);
    expect(waiting.message).toContain(`expected status code 200 from ${originUrl}/missing, got 404`);
    expect(waiting.retryCount).toBeGreaterThanOrEqual(1);
    expect(Number.isFinite(Date.parse(waiting.nextRetryAt!))).toBe(true);
    expect(waiting.message).toContain(`next attempt at ${waiting.nextRetryAt}`);
    // Through the next attempts the reason stays visible: never `starting 0%` with an empty message.
    const samples: DiskFile[] = [];
    await waitFor('a second failed attempt', async () => {
      const fs = await files('ev404');
      samples.push(...fs);
      return fs.some((f) => (f.retryCount ?? 0) >= 2);
    }, 60_000);
    expect(hits.get('/missing')).toBeGreaterThanOrEqual(2);
    const silent = samples.filter((f) => f.state !== 'ready' && !f.message);
    expect(silent).toEqual([]);
    expect(samples.filter((f) => !/got 404/.test(f.message)).map((f) => `${f.state}: ${f.message}`)).toEqual([]);

    const evs = await waitFor('the failure as an event', async () => {
      const l = await events('ev404');
      return l.some((e) => e.eventType === 'Warning' && e.reason === 'Failed' && e.message.includes('got 404')) ? l : undefined;
    });
    expect(evs.every((e) => e.involvedObjectKind === 'BackingImage' && e.involvedObjectName === 'ev404')).toBe(true);
    expect(evs.map((e) => e.reason)).toEqual(expect.arrayContaining(['Create', 'Started', 'Failed']));
    expect(evs.find((e) => e.reason === 'Started')!.source).toBe('longhorn-backing-image-data-source-controller');
    // A collection like the other resources, and other objects' events are not in it.
    const all = (await call('GET', '/v1/events')).json as { type: string; resourceType: string; data: Ev[] };
    expect(all.type).toBe('collection');
    expect(all.resourceType).toBe('event');
    expect(all.data.length).toBeGreaterThan(evs.length - 1);
  }, 120_000);

  it('a 500 origin: while the download retries, the status says the origin answered HTTP 500 and when the next attempt is', async () => {
    expect((await create('ev500', `${originUrl}/broken`)).status).toBe(200);
    const f = await waitFor('the retry note of the 500', async () => (await files('ev500')).find((x) => /origin answered HTTP 500; attempt \d+ of \d+ failed, next attempt at \S+/.test(x.message)), 60_000);
    expect(['starting', 'in-progress', 'pending']).toContain(f.state);
    const at = /next attempt at (\S+Z)/.exec(f.message)?.[1];
    expect(Number.isFinite(Date.parse(at ?? ''))).toBe(true);
  }, 90_000);

  it('a bad checksum: the status and the events name both checksums', async () => {
    const wrong = 'a'.repeat(128);
    expect((await create('evsum', `${originUrl}/good.raw`, wrong)).status).toBe(200);
    const f = await waitFor('the checksum failure', async () => (await files('evsum')).find((x) => x.message.includes(`the expected checksum ${wrong} doesn't match`)), 60_000);
    expect(f.message).toMatch(/the file actual checksum [0-9a-f]{128}/);
    await waitFor('the checksum failure as an event', async () =>
      (await events('evsum')).find((e) => e.eventType === 'Warning' && e.reason === 'Failed' && e.message.includes(`the expected checksum ${wrong} doesn't match`)),
    );
  }, 90_000);

  it('a good image: each copy ready is an event; the events survive a restart', async () => {
    expect((await create('evgood', `${originUrl}/good.raw`)).status).toBe(200);
    await waitFor('a ready copy event', async () => (await events('evgood')).find((e) => e.reason === 'Ready' && /Copy of backing image evgood on disk disk-\d on node local is ready/.test(e.message)), 60_000);
    const before = await events('evgood');
    // A disk error's condition on the disk without the copy: kept by the disk measurement and across the restart.
    // The event is recorded as the controller decides; the status write that says `ready` may land a moment later.
    const copyDisk = await waitFor('the ready copy in the status', async () => Object.entries((await call('GET', '/v1/backingimages/evgood')).json['diskFileStatusMap'] as Record<string, DiskFile>).find(([, f]) => f.state === 'ready')?.[0], 30_000);
    const other = sys.disks.find((d) => d.uuid !== copyDisk)!;
    const node = await sys.store.get(NodeKind, 'local', sys.namespace);
    const ds = node.status!.diskStatus![other.name]!;
    const t = new Date().toISOString();
    await sys.store.updateStatus(NodeKind, {
      ...node,
      status: { ...node.status, diskStatus: { ...node.status!.diskStatus, [other.name]: { ...ds, conditions: [...(ds.conditions ?? []), { type: 'Healthy', status: 'False', reason: 'DiskIOError', message: `${other.name}: EIO`, lastProbeTime: t, lastTransitionTime: t }] } } },
    });
    await sys.stop();
    sys = await startStandalone({ ...options(), diskCheckIntervalMs: 100 });
    const after = await events('evgood');
    for (const e of before) expect(after).toContainEqual(expect.objectContaining({ reason: e.reason, message: e.message }));
    await new Promise((r) => setTimeout(r, 500)); // a few disk measurements
    const conds = (await sys.store.get(NodeKind, 'local', sys.namespace)).status!.diskStatus![other.name]!.conditions!;
    expect(conds.find((c) => c.type === 'Healthy')).toMatchObject({ status: 'False', reason: 'DiskIOError', lastTransitionTime: t });
  }, 120_000);

  it('events an earlier version kept in the store move into the event log at the start and leave the store', async () => {
    await sys.stop();
    const store = await EmbeddedDatastore.open({ dataDir: path.join(tmp.dir, 'data', 'store') });
    const ns = sys.namespace;
    const old = (name: string, reason: string, at: string, count: number) => ({
      apiVersion: 'v1' as const,
      kind: 'Event' as const,
      metadata: { name, namespace: ns },
      involvedObject: { kind: 'BackingImage', name: 'evold', namespace: ns },
      reason,
      message: `${reason} of evold`,
      type: 'Normal' as const,
      source: { component: 'longhorn-backing-image-controller' },
      firstTimestamp: at,
      lastTimestamp: at,
      count,
    });
    // created newest first: the log keeps them by time
    await store.create(EventKind, old('evold.0000000000000002', 'Ready', '2026-01-01T00:00:05.000Z', 1));
    await store.create(EventKind, old('evold.0000000000000001', 'Create', '2026-01-01T00:00:01.000Z', 3));
    await store.close();
    sys = await startStandalone(options());
    expect((await events('evold')).map((e) => `${e.reason} ${e.count} ${e.message} ${e.lastTimestamp}`)).toEqual([
      'Create 3 Create of evold 2026-01-01T00:00:01.000Z',
      'Ready 1 Ready of evold 2026-01-01T00:00:05.000Z',
    ]);
    expect((await sys.store.list(EventKind, { namespace: ns })).items).toEqual([]);
    // kept in the log from now on: there after the next restart too, and the earlier events with them
    await sys.stop();
    sys = await startStandalone(options());
    expect((await events('evold')).map((e) => e.reason)).toEqual(['Create', 'Ready']);
    expect((await events('evgood')).some((e) => e.reason === 'Ready')).toBe(true);
  }, 120_000);
});
