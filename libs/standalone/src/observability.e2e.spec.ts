import { readFile, readdir } from 'node:fs/promises';
import http from 'node:http';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { BackingImageDataSourceKind, BackingImageKind, type BackingImage } from '@bis/controllers';
import { createLogger, type RootLogger } from '@bis/logging';
import { startStandalone, type StandaloneHandle } from './standalone.js';
import { BINARIES, binariesBuilt, startImageServer, tempDir, waitFor, writeImage, type ImageServer } from './test-support/e2e.js';

const SIZE = 4 * 1024 * 1024;

let tmp: { dir: string; remove(): Promise<void> };
let server: ImageServer;
let sum: string;
let sys: StandaloneHandle | undefined;
let log: RootLogger;
let logFile: string;

beforeAll(async () => {
  if (!(await binariesBuilt())) throw new Error('build the data-plane apps first: npx nx run-many -t build -p backing-image-manager backing-image-data-source');
  tmp = await tempDir('bis-observability-');
  sum = await writeImage(path.join(tmp.dir, 'img.raw'), SIZE);
  server = await startImageServer(tmp.dir);
  logFile = path.join(tmp.dir, 'data', 'logs', 'controller-manager.log');
  // The controller-manager's logger as the CLI makes it: JSON lines in its log file.
  log = createLogger({ component: 'controller-manager', level: 'debug', outputs: [{ destination: { file: logFile } }] });
  sys = await startStandalone({
    log,
    dataDir: path.join(tmp.dir, 'data'),
    listen: '127.0.0.1:0',
    disks: 2,
    allowSourceHosts: ['127.0.0.1'],
    binaries: BINARIES,
    controllerOptions: { resyncMs: 2000, timing: { dataSourcePollMs: 200, managerPollMs: 200, waitRequeueMs: 300, managerRestartInitialMs: 200, dataSourceRetryInitialMs: 1000, dataSourceRetryMaxMs: 5000 } },
  });
}, 60_000);

afterAll(async () => {
  await sys?.stop();
  await log?.close();
  await server?.close();
  await tmp?.remove();
});

async function scrape(): Promise<string> {
  const r = await fetch(`${sys!.url}/metrics`);
  expect(r.status).toBe(200);
  expect(r.headers.get('content-type')).toContain('text/plain');
  return r.text();
}

/** The value of one series (exact labels as printed), or undefined when absent. */
function value(text: string, series: string): number | undefined {
  const line = text.split('\n').find((l) => l.startsWith(`${series} `));
  return line === undefined ? undefined : Number(line.slice(series.length + 1));
}

/** Every line of a log file, each parsed as JSON (a line that is not JSON fails the test). */
async function jsonLines(file: string): Promise<Record<string, unknown>[]> {
  const text = await readFile(file, 'utf8').catch(() => '');
  return text
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l) as Record<string, unknown>);
}

const readyDisks = (b: BackingImage) => Object.entries(b.status?.diskFileStatusMap ?? {}).filter(([, s]) => s.state === 'ready').map(([d]) => d);

describe('observability of the standalone system', () => {
  it('GET /metrics moves during a real download: bytes, copy state labels, work-queue adds, process metrics', async () => {
    const before = await scrape();
    expect(before).toMatch(/^process_cpu_user_seconds_total \d/m);
    expect(before).toMatch(/^nodejs_eventloop_lag_seconds \d/m);
    expect(value(before, 'bis_backing_image_transferred_bytes_total{direction="in",kind="download"}') ?? 0).toBe(0);

    server.throttleMs = 15; // about 1 s for the 64 chunks: the download is seen in progress
    await sys!.controllers.actions.create({ name: 'img', sourceType: 'download', parameters: { url: server.url('img.raw') }, expectedChecksum: sum, minNumberOfCopies: 2 });
    await waitFor('2 ready copies', async () => readyDisks(await sys!.store.get(BackingImageKind, 'img', sys!.namespace)).length === 2, 90_000);
    server.throttleMs = 0;

    const after = await waitFor('bytes counted and copies ready in /metrics', async () => {
      const t = await scrape();
      const ready = t.split('\n').filter((l) => l.startsWith('bis_backing_image_copy_state{') && l.includes('backing_image="img"') && l.includes('state="ready"') && l.endsWith(' 1'));
      const counted = (value(t, 'bis_backing_image_transferred_bytes_total{direction="in",kind="download"}') ?? 0) >= SIZE && (value(t, 'bis_backing_image_transferred_bytes_total{direction="in",kind="sync"}') ?? 0) >= SIZE;
      return counted && ready.length === 2 ? t : undefined;
    }, 30_000);
    // The data source received the image once; the second disk received it from the first (its first copy is the
    // data source's file, moved, not sent).
    expect(value(after, 'bis_backing_image_transferred_bytes_total{direction="in",kind="download"}')).toBe(SIZE);
    expect(value(after, 'bis_backing_image_transferred_bytes_total{direction="in",kind="sync"}')).toBe(SIZE);
    for (const l of after.split('\n').filter((x) => x.startsWith('bis_backing_image_copy_progress_ratio{') && x.includes('backing_image="img"'))) expect(l.endsWith(' 1')).toBe(true);
    expect(after).not.toMatch(/^longhorn_backing_image_state/m);
    expect(value(after, 'workqueue_adds_total{name="BackingImageController"}')).toBeGreaterThan(0);
    expect(value(after, 'workqueue_adds_total{name="BackingImageDataSourceController"}')).toBeGreaterThan(0);
    expect(after).toMatch(/^workqueue_depth\{name="BackingImageManagerController"\} \d/m);
    expect(after).toMatch(/^controller_runtime_reconcile_time_seconds_count\{controller="BackingImageController",result="success"\} [1-9]/m);
    expect(value(after, 'process_cpu_user_seconds_total')).toBeGreaterThan(0);

    // A download of the image through the REST API counts as bytes sent out.
    const got = await fetch(`${sys!.url}/v1/backingimages/img/download`);
    expect(got.status).toBe(200);
    expect((await got.arrayBuffer()).byteLength).toBeGreaterThan(0);
    const out = await waitFor('the REST download counted', async () => {
      const t = await scrape();
      return value(t, 'bis_rest_transfers_total{kind="download",result="succeeded"}') === 1 ? t : undefined;
    }, 10_000);
    expect(value(out, 'bis_backing_image_transferred_bytes_total{direction="out",kind="image-download"}')).toBeGreaterThan(0);
    expect(value(out, 'bis_rest_transfers_active{kind="download"}')).toBe(0);

    // The data-plane processes log JSON lines to their files, with their component and the image's fields.
    const dsLog = (await readdir(sys!.logsDir)).find((f) => f.startsWith('backing-image-ds-img'));
    expect(dsLog).toBeDefined();
    const all = await jsonLines(path.join(sys!.logsDir, dsLog!));
    // the runtime's own lines (start, exit) are JSON too
    expect(all.some((l) => l['component'] === 'runtime' && String(l['msg']).startsWith('starting '))).toBe(true);
    const ds = all.filter((l) => l['component'] !== 'runtime');
    expect(ds.length).toBeGreaterThan(0);
    for (const l of ds) {
      expect(l).toMatchObject({ component: 'backing-image-data-source', image: 'img', sourceType: 'download' });
      expect(typeof l['level']).toBe('string');
      expect(typeof l['time']).toBe('string');
      expect(typeof l['uuid']).toBe('string');
    }
    const bimLog = (await readdir(sys!.logsDir)).find((f) => f.startsWith('bim-'));
    const bim = await jsonLines(path.join(sys!.logsDir, bimLog!));
    expect(bim.some((l) => l['component'] === 'backing-image-manager' && typeof l['diskPath'] === 'string' && l['level'] === 'info')).toBe(true);
  }, 150_000);

  it('a failed download attempt is a WARN naming the image and the disk in the controller log, and a failure in /metrics', async () => {
    await sys!.controllers.actions.create({ name: 'missing', sourceType: 'download', parameters: { url: server.url('no-such-file.raw') }, minNumberOfCopies: 1 });
    const warn = await waitFor('a warning about the failed download', async () =>
      (await jsonLines(logFile)).find((l) => l['level'] === 'warn' && l['image'] === 'missing' && String(l['msg']).includes('data source')),
    60_000);
    const disk = sys!.disks.find((d) => d.name === warn['disk']);
    expect(disk).toBeDefined();
    expect(warn).toMatchObject({ component: 'controller-manager', image: 'missing', diskUUID: disk!.uuid, sourceType: 'download' });
    expect(String(warn['msg'])).toContain('backing image missing');
    expect(String(warn['msg'])).toContain(`disk ${disk!.name}`);
    expect(String(warn['msg'])).toContain('404');
    expect(typeof warn['uuid']).toBe('string');
    const t = await waitFor('the failure counted', async () => {
      const s = await scrape();
      return (value(s, 'bis_backing_image_failures_total{kind="data-source",reason="http-4xx"}') ?? 0) >= 1 ? s : undefined;
    }, 30_000);
    expect(t).toContain('bis_backing_image_failures_total');
    await sys!.controllers.actions.delete('missing');
  }, 90_000);

  it('each failed download attempt that is retried (a 500 origin) is a WARN naming the image and the disk in the controller log', async () => {
    let requests = 0;
    const origin = http.createServer((_req, res) => {
      requests++;
      res.writeHead(500).end('try later');
    });
    await new Promise<void>((r) => origin.listen(0, '127.0.0.1', r));
    try {
      const url = `http://127.0.0.1:${(origin.address() as { port: number }).port}/img.raw`;
      await sys!.controllers.actions.create({ name: 'flaky', sourceType: 'download', parameters: { url }, minNumberOfCopies: 1 });
      const warn = await waitFor('a warning about the failed attempt', async () =>
        (await jsonLines(logFile)).find((l) => l['level'] === 'warn' && l['image'] === 'flaky' && /attempt 1 of \d+ failed/.test(String(l['msg']))),
      60_000);
      expect(requests).toBeGreaterThanOrEqual(1);
      const disk = sys!.disks.find((d) => d.name === warn['disk']);
      expect(disk).toBeDefined();
      expect(String(warn['msg'])).toContain(`backing image flaky (${String(warn['uuid'])}) on disk ${disk!.name}`);
      expect(String(warn['msg'])).toContain('got 500');
      // while the download goes on, the data source's status says why
      const bids = await sys!.store.get(BackingImageDataSourceKind, 'flaky', sys!.namespace);
      expect(bids.status?.currentState).not.toBe('ready');
    } finally {
      await sys!.controllers.actions.delete('flaky').catch(() => undefined);
      origin.closeAllConnections();
      await new Promise((r) => origin.close(r));
    }
  }, 90_000);
});
