#!/usr/bin/env node
// REST list of backing images, in-process: an embedded store with N images of 3 ready copies each, the REST API on a
// real fastify server on loopback, and `curl` (a child process) listing /v1/backingimages M times, with one image
// changed before each list (as while a system converges) and then M times with none changed (at rest). Reference in
// the same run: curl fetching a body of the same size from a plain Node HTTP server in the same process (the floor of
// sending those bytes). Prints the curl latency p50 / p99 of each case and its ratio to the reference, and the
// server process's CPU per list minus the reference's CPU per fetch (what spawning curl costs this process).
// Build first: npx nx run-many -t build -p @bis/api-resources      Run: node tools/bench/rest-list.mjs [--images 1000] [--lists 40]
import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { parseArgs } from 'node:util';
import Fastify from 'fastify';
import { EmbeddedDatastore } from '@bis/datastore';
import { BackingImageKind, SettingsReader } from '@bis/controllers';
import { ApiRegistry, restApiPlugin } from '@bis/rest-api';
import { annotationEndpoints, registerBackingImageResources, backingImageHttpPlugin } from '@bis/api-resources';

const run = promisify(execFile);
const { values } = parseArgs({ options: { images: { type: 'string', default: '1000' }, lists: { type: 'string', default: '40' } } });
const N = Number(values.images);
const M = Number(values.lists);
const NS = 'longhorn-system';
const dir = mkdtempSync(path.join(os.tmpdir(), 'bis-rest-list-'));
const store = await EmbeddedDatastore.open({ dataDir: dir });
const deps = {
  store,
  namespace: NS,
  settings: new SettingsReader(store, NS, {}),
  endpoints: annotationEndpoints(() => {
    throw new Error('no manager in this benchmark');
  }),
};
const registry = new ApiRegistry();
const api = registerBackingImageResources(registry, deps);
const app = Fastify();
await app.register(backingImageHttpPlugin, { api });
await app.register(restApiPlugin, { registry, keepAliveMs: 60_000, defaultStreamPeriodMs: 1000 });
await app.listen({ host: '127.0.0.1', port: 0 });
const url = `http://127.0.0.1:${app.server.address().port}/v1/backingimages`;

const ready = { state: 'ready', progress: 100, message: '', lastStateTransitionTime: '2026-12-07T00:00:00Z', dataEngine: 'v1' };
for (let i = 0; i < N; i += 100) {
  await Promise.all(
    Array.from({ length: Math.min(100, N - i) }, async (_, j) => {
      const o = await store.create(BackingImageKind, { apiVersion: 'longhorn.io/v1beta2', kind: 'BackingImage', metadata: { name: `img-${i + j}`, namespace: NS }, spec: { sourceType: 'download', sourceParameters: { url: `http://origin/${i + j}` }, minNumberOfCopies: 3, diskFileSpecMap: { 'disk-1': {}, 'disk-2': {}, 'disk-3': {} } } });
      await store.updateStatus(BackingImageKind, { ...o, status: { uuid: (i + j).toString(36).padStart(8, '0'), size: 65536, virtualSize: 65536, checksum: 'ab'.repeat(64), diskFileStatusMap: { 'disk-1': ready, 'disk-2': ready, 'disk-3': ready } } });
    }),
  );
}

async function fetchTimes(target, before) {
  const lat = [];
  let bytes = 0;
  const c0 = process.cpuUsage();
  for (let j = 0; j < M; j++) {
    if (before) await before(j);
    const { stdout } = await run('curl', ['-s', '-o', '/dev/null', '-w', '%{http_code} %{time_total} %{size_download}', target]);
    const [code, secs, size] = stdout.split(' ');
    if (code !== '200') throw new Error(`${target}: ${stdout}`);
    lat.push(Number(secs) * 1000);
    bytes = Number(size);
  }
  const c = process.cpuUsage(c0);
  lat.sort((a, b) => a - b);
  return { p50: lat[M >> 1], p99: lat[Math.min(M - 1, Math.floor(M * 0.99))], cpuMs: (c.user + c.system) / 1000 / M, bytes };
}

// the list while images change: one image's status changes before each list
const changing = await fetchTimes(url, async (j) => {
  const o = await store.get(BackingImageKind, `img-${j % N}`, NS);
  await store.updateStatus(BackingImageKind, { ...o, status: { ...o.status, size: 65536 + j + 1 } });
});
const atRest = await fetchTimes(url);
// reference: the same number of bytes from a plain HTTP server
const body = Buffer.alloc(changing.bytes, 'x');
const plain = http.createServer((_req, res) => {
  res.writeHead(200, { 'content-type': 'application/json', 'content-length': body.length });
  res.end(body);
});
await new Promise((r) => plain.listen(0, '127.0.0.1', r));
const reference = await fetchTimes(`http://127.0.0.1:${plain.address().port}/`);
plain.close();
await app.close();
await store.close();
rmSync(dir, { recursive: true, force: true });

const row = (r) => ({ p50Ms: +r.p50.toFixed(1), p99Ms: +r.p99.toFixed(1), ratioP50VsReference: +(r.p50 / reference.p50).toFixed(2), serverCpuMsPerList: +Math.max(0, r.cpuMs - reference.cpuMs).toFixed(1) });
console.log(
  JSON.stringify(
    {
      machine: `${os.cpus()[0]?.model ?? '?'}, ${os.cpus().length} CPUs, node ${process.version}`,
      loadAverage: os.loadavg().map((l) => +l.toFixed(2)),
      images: N,
      lists: M,
      bodyBytes: changing.bytes,
      changing: row(changing),
      atRest: row(atRest),
      reference: { tool: 'curl from a plain Node HTTP server, same body size', p50Ms: +reference.p50.toFixed(1), p99Ms: +reference.p99.toFixed(1), cpuMsPerFetch: +reference.cpuMs.toFixed(1) },
    },
    null,
    2,
  ),
);
