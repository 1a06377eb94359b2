#!/usr/bin/env node
// Embedded datastore write/reopen throughput, against the disk's synchronous-write floor measured in the same run
// with `dd oflag=dsync` (one small write + sync per block, like one store commit).
// The concurrent-writers case runs W writers (1, 8, 64), each a loop of get + updateStatus on its own objects, and
// reports total writes/s and the per-write latency (median / p99): with group commit, writers queued while a
// fdatasync is in flight share the next one.
// Build first: npx nx run @bis/datastore:build      Run: node tools/bench/datastore-bench.mjs [N]
// DATASTORE_MODULE=<file.js> runs the same cases against another build (a module exporting EmbeddedDatastore and
// defineKind), to compare before/after in one session.
import { spawnSync } from 'node:child_process';
import { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

const { EmbeddedDatastore, defineKind } = await import(process.env.DATASTORE_MODULE ? pathToFileURL(path.resolve(process.env.DATASTORE_MODULE)).href : '@bis/datastore');

const N = Number(process.argv[2] ?? 2000);
const Kind = defineKind({ apiVersion: 'bench.bis.dev/v1', kind: 'Item', plural: 'items', namespaced: true });
const dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'bis-ds-bench-'));
const item = (i) => ({ apiVersion: Kind.apiVersion, kind: Kind.kind, metadata: { name: `item-${i}`, namespace: 'bench', labels: { shard: String(i % 8) } }, spec: { size: i, url: `http://example/${i}` } });
const rate = (n, ms) => (n / (ms / 1000)).toFixed(0);

try {
  // Reference: N synchronous 512-byte writes.
  const t0 = performance.now();
  const dd = spawnSync('dd', ['if=/dev/zero', `of=${path.join(dir, 'dd.bin')}`, 'bs=512', `count=${N}`, 'oflag=dsync'], { stdio: 'ignore' });
  const ddMs = performance.now() - t0;
  if (dd.status !== 0) throw new Error('dd failed');

  let store = await EmbeddedDatastore.open({ dataDir: path.join(dir, 'store'), compactAfterEvents: 5000 });
  let t = performance.now();
  for (let i = 0; i < N; i++) await store.create(Kind, item(i));
  const createMs = performance.now() - t;

  t = performance.now();
  for (let i = 0; i < N; i++) {
    const cur = await store.get(Kind, `item-${i}`, 'bench');
    await store.updateStatus(Kind, { ...cur, status: { state: 'ready', progress: 100 } });
  }
  const statusMs = performance.now() - t;

  t = performance.now();
  await Promise.all(Array.from({ length: N }, async (_, i) => {
    const cur = await store.get(Kind, `item-${i}`, 'bench');
    await store.update(Kind, { ...cur, spec: { ...cur.spec, size: -i } });
  }));
  const concMs = performance.now() - t;

  // Concurrent writers: W loops, each get + updateStatus on its own slice of the objects, N writes in total.
  const writerRows = [];
  for (const W of [1, 8, 64]) {
    const perWriter = Math.floor(N / W);
    const latencies = [];
    const before = store.commitStats ? { ...store.commitStats } : undefined;
    t = performance.now();
    await Promise.all(Array.from({ length: W }, async (_, w) => {
      for (let j = 0; j < perWriter; j++) {
        const i = w * perWriter + j;
        const cur = await store.get(Kind, `item-${i}`, 'bench');
        const s0 = performance.now();
        await store.updateStatus(Kind, { ...cur, status: { state: 'ready', progress: j, writer: W } });
        latencies.push(performance.now() - s0);
      }
    }));
    const ms = performance.now() - t;
    latencies.sort((a, b) => a - b);
    const q = (p) => latencies[Math.min(latencies.length - 1, Math.floor(p * latencies.length))];
    const batches = before ? store.commitStats.batches - before.batches : undefined;
    writerRows.push({ W, ops: perWriter * W, ms, p50: q(0.5), p99: q(0.99), batches });
  }

  t = performance.now();
  for (let i = 0; i < 200; i++) await store.list(Kind, { namespace: 'bench', labelSelector: 'shard=3' });
  const listMs = (performance.now() - t) / 200;
  await store.close();

  const logSize = (await fsp.stat(path.join(dir, 'store', 'store.log'))).size;
  t = performance.now();
  store = await EmbeddedDatastore.open({ dataDir: path.join(dir, 'store') });
  const reopenMs = performance.now() - t;
  await store.close();

  const ddRate = Number(rate(N, ddMs));
  console.log(`N=${N} objects, ${os.cpus().length} cpus, node ${process.version}`);
  console.log(`reference dd 512 B oflag=dsync      : ${ddRate} writes/s`);
  for (const [what, ms] of [['create (sequential)', createMs], ['updateStatus (get+write, seq.)', statusMs], [`update (${N} concurrent)`, concMs]]) {
    const r = Number(rate(N, ms));
    console.log(`${what.padEnd(36)}: ${r} ops/s  (${(r / ddRate).toFixed(2)}x dd)`);
  }
  for (const r of writerRows) {
    const rr = Number(rate(r.ops, r.ms));
    const per = r.batches ? `, ${(r.ops / r.batches).toFixed(1)} writes/fdatasync` : '';
    console.log(`${`${r.W} writers x get+updateStatus`.padEnd(36)}: ${rr} writes/s  (${(rr / ddRate).toFixed(2)}x dd), latency p50 ${r.p50.toFixed(2)} ms p99 ${r.p99.toFixed(2)} ms${per}`);
  }
  console.log(`list by label (1/8 of ${N})          : ${listMs.toFixed(2)} ms`);
  console.log(`reopen (log ${(logSize / 1048576).toFixed(1)} MiB)                : ${reopenMs.toFixed(0)} ms`);
  console.log(`max RSS                              : ${(process.resourceUsage().maxRSS / 1024).toFixed(0)} MiB`);
} finally {
  await fsp.rm(dir, { recursive: true, force: true });
}
