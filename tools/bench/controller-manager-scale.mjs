#!/usr/bin/env node
// Scale benchmark of the standalone system: N backing images × 3 disks from a local HTTP server converge to ready.
// Reports convergence time, the CPU seconds used until then (controller-manager, data plane), store writes (the embedded store's final resourceVersion: one per committed write;
// `writesPerImage` divides all of them, including the few dozen of the start-up, by the number of images), the events
// recorded (`eventRecords`: kept in their own log, not the store; counted from the controller-manager's log), REST list latency (p50/p99, during convergence and at rest), max RSS of the
// controller-manager process and of the data-plane processes, and a reference: curl fetching the same N images to
// 3 directories (xargs -P 8) measured in the same run.
//
// usage: node tools/bench/controller-manager-scale.mjs [--images 1000] [--size-kib 64] [--disks 3] [--copies 3]
//        [--max-data-sources 8] [--keep] [--cpu-prof-dir <dir>] [--node-arg <arg>]... [--heap-snapshot-at <n,n,...>]
//        [--heap-snapshot-dir <dir>] [--env NAME=VALUE]... [--max-minutes 60]
// --max-minutes: stop waiting after that long; the run then reports `converged: false` with the images ready by then
// (`readyAtEnd`, and `readyOverTime` every 10 s) and measures the at-rest figures on the unfinished system.
// --node-arg: extra node option for the controller-manager process (repeatable), e.g. --node-arg=--max-semi-space-size=4
// (after the options of its launcher line, apps/controller-manager/bin/controller-manager.js, which it also gets).
// --heap-snapshot-at: write a heap snapshot of the controller-manager (node --heapsnapshot-signal=SIGUSR2) when that
// many images are ready (comma list; `end` = after the at-rest measurements), into --heap-snapshot-dir (default: the
// current directory). Each snapshot is taken after the previous one is written.
// --memory-log <file>: the controller-manager preloads tools/bench/controller-manager-memlog.mjs and appends
// process.memoryUsage() + V8 heap statistics to <file> every 2 s (JSON lines); the last and the peak are reported.
// With --memory-log, --env BIS_ALLOC_PROFILE_FILE=<file> also samples the allocations that a major GC collected (garbage
// promoted to the old generation) and writes a .heapprofile at exit.
// --env: extra environment variable for the controller-manager (repeatable), e.g. --env MALLOC_ARENA_MAX=2.
// --cpu-prof-dir: the controller-manager runs with `node --cpu-prof --cpu-prof-dir <dir>` (the profile is written when
// it stops).
// --trace-writes <name>: the run also reports `writeTrace`, every store write of the objects named <name> (an image
// and its data source) and of the Events about them: kind, create/status/spec, and what changed (status fields,
// file states per disk), to see which writes an image takes and why.
// Needs: npx nx run-many -t build -p controller-manager backing-image-manager backing-image-data-source
import { spawn, execFileSync } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { closeSync, mkdtempSync, mkdirSync, openSync, readFileSync, readSync, readdirSync, rmSync, writeFileSync, statSync } from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import readline from 'node:readline';
import { createReadStream } from 'node:fs';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const { applyPatch } = await import(path.join(root, 'libs/datastore/dist/json-patch.js'));
const { values } = parseArgs({
  options: {
    images: { type: 'string', default: '1000' },
    'size-kib': { type: 'string', default: '64' },
    disks: { type: 'string', default: '3' },
    copies: { type: 'string', default: '3' },
    'max-data-sources': { type: 'string', default: '8' },
    keep: { type: 'boolean', default: false },
    'cpu-prof-dir': { type: 'string' },
    'node-arg': { type: 'string', multiple: true, default: [] },
    'heap-snapshot-at': { type: 'string', default: '' },
    'heap-snapshot-dir': { type: 'string', default: '.' },
    env: { type: 'string', multiple: true, default: [] },
    'memory-log': { type: 'string' },
    'max-minutes': { type: 'string', default: '60' },
    'trace-writes': { type: 'string' },
  },
});
const N = Number(values.images);
const SIZE = Number(values['size-kib']) * 1024;
const COPIES = Number(values.copies);
const tmp = mkdtempSync(path.join(os.tmpdir(), 'bis-scale-'));
const srcDir = path.join(tmp, 'src');
mkdirSync(srcDir);
const sums = [];
for (let i = 0; i < N; i++) {
  const buf = randomBytes(SIZE);
  writeFileSync(path.join(srcDir, `img-${i}.raw`), buf);
  sums.push(createHash('sha512').update(buf).digest('hex'));
}

let gets = 0;
const server = http.createServer((req, res) => {
  const file = path.join(srcDir, path.basename(req.url ?? ''));
  try {
    const data = readFileSync(file);
    res.writeHead(200, { 'content-length': data.length, 'content-type': 'application/octet-stream' });
    if (req.method === 'GET') gets++;
    res.end(req.method === 'HEAD' ? undefined : data);
  } catch {
    res.writeHead(404).end();
  }
});
await new Promise((r) => server.listen(0, '127.0.0.1', r));
const port = server.address().port;
const url = (i) => `http://127.0.0.1:${port}/img-${i}.raw`;

// Reference: curl fetching every image into `copies` directories, 8 in parallel.
const refDir = path.join(tmp, 'ref');
const list = path.join(tmp, 'urls.txt');
const lines = [];
for (let c = 0; c < COPIES; c++) {
  mkdirSync(path.join(refDir, `d${c}`), { recursive: true });
  for (let i = 0; i < N; i++) lines.push(`-o ${path.join(refDir, `d${c}`, `img-${i}.raw`)} ${url(i)}`);
}
writeFileSync(list, lines.join('\n') + '\n');
const refStart = performance.now();
// Async: the image server runs in this process, so the event loop must stay free.
await new Promise((resolve, reject) => {
  const p = spawn('sh', ['-c', `xargs -P 8 -L 1 curl -sf < ${list}`], { stdio: 'inherit' });
  p.once('exit', (code) => (code === 0 ? resolve() : reject(new Error(`curl reference failed with ${code}`))));
});
const refMs = performance.now() - refStart;
const gets0 = gets;

// The system under test.
// A port the kernel says is free now (a random one collided with the curl reference's thousands of closed sockets).
const apiPort = await new Promise((resolve, reject) => {
  const probe = http.createServer();
  probe.once('error', reject);
  probe.listen(0, '127.0.0.1', () => {
    const { port } = probe.address();
    probe.close(() => resolve(port));
  });
});
const base = `http://127.0.0.1:${apiPort}`;
const loadAtStart = os.loadavg().map((l) => +l.toFixed(2));
const profArgs = values['cpu-prof-dir'] ? ['--cpu-prof', '--cpu-prof-dir', path.resolve(values['cpu-prof-dir'])] : [];
const snapshotAt = values['heap-snapshot-at'].split(',').filter(Boolean);
const snapshotDir = path.resolve(values['heap-snapshot-dir']);
const snapArgs = snapshotAt.length ? ['--heapsnapshot-signal=SIGUSR2', `--diagnostic-dir=${snapshotDir}`] : [];
const extraEnv = Object.fromEntries(values.env.map((e) => [e.slice(0, e.indexOf('=')), e.slice(e.indexOf('=') + 1)]));
const memLog = values['memory-log'] ? path.resolve(values['memory-log']) : undefined;
const memLogArgs = memLog ? ['--import', path.join(root, 'tools/bench/controller-manager-memlog.mjs')] : [];
if (memLog) {
  rmSync(memLog, { force: true });
  extraEnv.BIS_MEMLOG_FILE = memLog;
}
// The node options of the controller-manager's launcher line (`#!/usr/bin/env -S node <options>`), as the image and
// `npm start` run it.
const cmBin = path.join(root, 'apps/controller-manager/bin/controller-manager.js');
const launcherNodeArgs = /^#!\/usr\/bin\/env -S node(.*)$/.exec(readFileSync(cmBin, 'utf8').split('\n')[0])?.[1].trim().split(/\s+/).filter(Boolean) ?? [];
const cm = spawn(process.execPath, [
  ...profArgs,
  ...snapArgs,
  ...memLogArgs,
  ...launcherNodeArgs,
  ...values['node-arg'],
  cmBin, 'standalone',
  '--data-dir', path.join(tmp, 'data'), '--listen', `127.0.0.1:${apiPort}`, '--disks', values.disks,
  '--allow-source-hosts', '127.0.0.1', '--max-data-sources', values['max-data-sources'],
], { stdio: ['ignore', 'pipe', 'inherit'], env: { ...process.env, ...extraEnv } });
let out = '';
cm.stdout.on('data', (d) => (out += d));
const t0 = performance.now();
while (!out.includes('Press Ctrl-C')) {
  if (cm.exitCode !== null) throw new Error(`controller-manager exited: ${out}`);
  await new Promise((r) => setTimeout(r, 100));
}
const startMs = performance.now() - t0;

const status = (pid) => {
  try {
    const s = readFileSync(`/proc/${pid}/status`, 'utf8');
    const kb = (k) => Number((s.match(new RegExp(`${k}:\\s+(\\d+)`)) ?? [0, 0])[1]);
    return { hwm: kb('VmHWM'), rss: kb('VmRSS'), anon: kb('RssAnon'), file: kb('RssFile') };
  } catch {
    return { hwm: 0, rss: 0 };
  }
};
const children = (pid) => {
  try {
    return execFileSync('pgrep', ['-P', String(pid)]).toString().trim().split('\n').filter(Boolean).map(Number);
  } catch {
    return [];
  }
};
/** utime + stime of a process (with `withChildren`, plus those of its waited-for children), in seconds. */
const cpuSeconds = (pid, withChildren = false) => {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    // fields after the command: state is [0], utime [11], stime [12], cutime [13], cstime [14] (clock ticks)
    const ticks = Number(f[11]) + Number(f[12]) + (withChildren ? Number(f[13]) + Number(f[14]) : 0);
    return +(ticks / 100).toFixed(1);
  } catch {
    return 0;
  }
};
let maxDataPlaneRss = 0;
const sampleDataPlane = () => {
  const kids = children(cm.pid);
  const total = kids.reduce((a, k) => a + status(k).rss, 0);
  maxDataPlaneRss = Math.max(maxDataPlaneRss, total);
  return kids.length;
};

async function req(method, p, body) {
  const r = await fetch(`${base}${p}`, { method, headers: body ? { 'content-type': 'application/json' } : {}, body: body ? JSON.stringify(body) : undefined });
  const text = await r.text();
  if (r.status !== 200) throw new Error(`${method} ${p}: ${r.status} ${text}`);
  return JSON.parse(text);
}
const pct = (a, p) => {
  const s = [...a].sort((x, y) => x - y);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
};

// The store's resourceVersion counts committed writes; read it from the store log (the process owns the file, so
// only after it stopped, and from `--keep`-less runs too).
// Also classifies the writes since the last compaction (all of them for runs under 5,000 writes) by kind and by what
// changed: `create`, `delete`, `status` (only .status changed), `spec/metadata` (anything else).
const writesByKind = {};
const eventsByReason = {};
const writeTrace = [];
/** What changed between two versions of an object, in a few words (for --trace-writes). */
function describeChange(prev, next) {
  if (next.kind === 'Event') return `${next.type} ${next.reason}: ${String(next.message ?? '').slice(0, 120)}`;
  const out = [];
  const ps = prev?.status ?? {};
  const ns = next.status ?? {};
  for (const k of new Set([...Object.keys(ps), ...Object.keys(ns)])) {
    if (JSON.stringify(ps[k]) === JSON.stringify(ns[k])) continue;
    const v = ns[k];
    if (v && typeof v === 'object' && !Array.isArray(v)) {
      const parts = [];
      for (const [d, e] of Object.entries(v)) {
        if (JSON.stringify(ps[k]?.[d]) === JSON.stringify(e)) continue;
        parts.push(e && typeof e === 'object' ? `${d.slice(0, 6)}:${e.state ?? ''}${e.progress !== undefined ? `/${e.progress}` : ''}${e.message ? ` "${String(e.message).slice(0, 60)}"` : ''}` : `${d.slice(0, 6)}=${String(e).slice(0, 30)}`);
      }
      out.push(`${k}{${parts.join(', ')}}`);
    } else out.push(`${k}=${JSON.stringify(v)?.slice(0, 40)}`);
  }
  if (prev && stripRv({ ...prev, status: undefined }) !== stripRv({ ...next, status: undefined })) out.push('spec/metadata');
  return out.join('; ');
}
// Reads the store log while the system runs (it is append-only between compactions; a compaction replaces it, and
// the events already counted are skipped by resourceVersion), so every write is classified.
const storeLog = path.join(tmp, 'data', 'store', 'store.log');
const lastObj = new Map();
/** The last history event of each object in the current log file (the base of its next `histp` record). */
const histObj = new Map();
let logIno = 0;
let logPos = 0;
let logRest = '';
let countedRv = 0;
const stripRv = (o) => JSON.stringify({ ...o, metadata: { ...o.metadata, resourceVersion: undefined, generation: undefined }, status: undefined });
function classifyLine(line) {
  if (!line.startsWith('{"op":"ev"') && !line.startsWith('{"op":"patch"') && !line.startsWith('{"op":"hist') && !line.startsWith('{"op":"obj"')) return;
  const r = JSON.parse(line);
  if (r.op === 'patch') {
    // a change written as a patch of the object's previous version
    if (r.rv <= countedRv) return;
    const base = lastObj.get(`${r.k}/${r.n}`);
    if (!base) throw new Error(`store log: patch of ${r.k}/${r.n} at ${r.rv} without a version before it`);
    r.object = applyPatch(base, r.ops);
  } else if (r.op === 'histp') {
    // a history event written as a patch of the history's previous event of the object (after a compaction)
    const base = histObj.get(`${r.k}/${r.n}`);
    if (!base) throw new Error(`store log: history patch of ${r.k}/${r.n} at ${r.rv} without an event before it`);
    r.object = applyPatch(base, r.ops);
  }
  const key = `${r.k}/${r.object.metadata.name}`;
  // the history (read again after each compaction) holds the events the last read may have missed
  if (r.op === 'hist' || r.op === 'histp') histObj.set(key, r.object);
  if (r.op === 'obj') {
    // the state at the compaction, which the patches after it build on
    lastObj.set(key, r.object);
    return;
  }
  if (r.rv <= countedRv) return;
  countedRv = r.rv;
  const kind = r.k.split('/').pop();
  const prev = lastObj.get(key);
  const how = r.type === 'ADDED' ? 'create' : r.type === 'DELETED' ? 'delete' : prev && stripRv(prev) === stripRv(r.object) ? 'status' : 'spec/metadata';
  writesByKind[kind] ??= {};
  writesByKind[kind][how] = (writesByKind[kind][how] ?? 0) + 1;
  // Events created, by type and reason (which events make the Event writes)
  if (kind === 'Event' && how === 'create') {
    const reason = `${r.object.type ?? ''} ${r.object.involvedObject?.kind ?? ''} ${r.object.reason ?? ''}`;
    eventsByReason[reason] = (eventsByReason[reason] ?? 0) + 1;
  }
  const traced = values['trace-writes'];
  if (traced && (r.object.metadata.name === traced || (kind === 'Event' && r.object.involvedObject?.name === traced))) {
    writeTrace.push({ rv: r.rv, kind: kind === 'Event' ? `Event(${r.object.involvedObject?.kind})` : kind, how, change: how === 'delete' ? '' : describeChange(prev, r.object) });
  }
  if (r.type === 'DELETED') lastObj.delete(key);
  else lastObj.set(key, r.object);
}
function readStoreLog() {
  let st;
  try {
    st = statSync(storeLog);
  } catch {
    return;
  }
  if (st.ino !== logIno || st.size < logPos) {
    logIno = st.ino;
    logPos = 0;
    logRest = '';
    histObj.clear();
  }
  if (st.size === logPos) return;
  const fd = openSync(storeLog, 'r');
  try {
    const buf = Buffer.alloc(st.size - logPos);
    const n = readSync(fd, buf, 0, buf.length, logPos);
    logPos += n;
    const text = logRest + buf.subarray(0, n).toString('utf8');
    const lines = text.split('\n');
    logRest = lines.pop() ?? '';
    for (const l of lines) classifyLine(l);
  } finally {
    closeSync(fd);
  }
}
/** Event lines in the controller-manager's log files (the current one and the rotated ones), by type, kind and reason. */
function countEventRecords(logsDir) {
  let n = 0;
  for (const f of readdirSync(logsDir).filter((x) => x.startsWith('controller-manager.log'))) {
    for (const line of readFileSync(path.join(logsDir, f), 'utf8').split('\n')) {
      if (!line.includes('"msg":"event ')) continue;
      let msg;
      try {
        msg = JSON.parse(line).msg;
      } catch {
        continue;
      }
      const m = /^event (\S+) (\S+) ([^/\s]+)\//.exec(msg);
      if (!m) continue;
      n++;
      const reason = `${m[1]} ${m[3]} ${m[2]}`;
      eventsByReason[reason] = (eventsByReason[reason] ?? 0) + 1;
    }
  }
  return n;
}
async function storeRv(dir) {
  const files = [];
  const walk = (d) => {
    for (const e of readdirSync(d, { withFileTypes: true })) {
      if (e.isDirectory()) walk(path.join(d, e.name));
      else if (e.name === 'store.log') files.push(path.join(d, e.name));
    }
  };
  walk(dir);
  let rv = 0;
  for (const f of files) {
    for await (const line of readline.createInterface({ input: createReadStream(f) })) {
      if (line.startsWith('{"op":"header"') || line.startsWith('{"op":"ev"') || line.startsWith('{"op":"patch"')) rv = Math.max(rv, JSON.parse(line).rv);
    }
  }
  return rv;
}
const c0 = performance.now();
let next = 0;
await Promise.all(
  Array.from({ length: 16 }, async () => {
    while (next < N) {
      const i = next++;
      await req('POST', '/v1/backingimages', { name: `img-${i}`, sourceType: 'download', parameters: { url: url(i) }, expectedChecksum: sums[i], minNumberOfCopies: COPIES });
    }
  }),
);
const createMs = performance.now() - c0;

// Heap snapshots on request: SIGUSR2, then wait until the .heapsnapshot file stops growing.
const memSamples = [];
async function heapSnapshot(label) {
  const before = new Set(readdirSync(snapshotDir));
  const st0 = status(cm.pid);
  cm.kill('SIGUSR2');
  let file;
  let lastSize = -1;
  for (let i = 0; i < 600; i++) {
    await new Promise((r) => setTimeout(r, 1000));
    file ??= readdirSync(snapshotDir).find((f) => f.endsWith('.heapsnapshot') && !before.has(f));
    if (!file) continue;
    const size = statSync(path.join(snapshotDir, file)).size;
    if (size === lastSize && size > 0) break;
    lastSize = size;
  }
  memSamples.push({ label, rssMiB: +(st0.rss / 1024).toFixed(0), anonMiB: +(st0.anon / 1024).toFixed(0), hwmMiB: +(st0.hwm / 1024).toFixed(0), snapshot: file });
  process.stderr.write(`heap snapshot at ${label}: ${file} (RSS ${(st0.rss / 1024).toFixed(0)} MiB)\n`);
}
const busyLat = [];
let ready = 0;
let failed = 0;
let lastReport = 0;
let converged = false;
const readyOverTime = [];
const maxMs = Number(values['max-minutes']) * 60_000;
if (!(maxMs > 0)) throw new Error(`--max-minutes must be a positive number, got ${values['max-minutes']}`);
for (;;) {
  const t = performance.now();
  const list = await req('GET', '/v1/backingimages');
  busyLat.push(performance.now() - t);
  ready = 0;
  failed = 0;
  for (const b of list.data) {
    const st = Object.values(b.diskFileStatusMap ?? {});
    if (st.filter((s) => s.state === 'ready').length >= COPIES && b.currentChecksum === sums[Number(b.name.slice(4))]) ready++;
    if (st.some((s) => s.state === 'failed' || s.state === 'failed-and-cleanup')) failed++;
  }
  const procs = sampleDataPlane();
  readStoreLog();
  while (snapshotAt.length && snapshotAt[0] !== 'end' && ready >= Number(snapshotAt[0])) await heapSnapshot(`${snapshotAt.shift()} ready`);
  if (performance.now() - lastReport > 10_000) {
    const m = status(cm.pid);
    memSamples.push({ label: `${((performance.now() - c0) / 1000).toFixed(0)} s, ${ready} ready`, rssMiB: +(m.rss / 1024).toFixed(0), anonMiB: +(m.anon / 1024).toFixed(0), hwmMiB: +(m.hwm / 1024).toFixed(0) });
  }
  if (performance.now() - lastReport > 10_000) {
    lastReport = performance.now();
    readyOverTime.push([+((performance.now() - c0) / 1000).toFixed(0), ready]);
    process.stderr.write(`${((performance.now() - c0) / 1000).toFixed(0)} s: ${ready}/${N} ready, ${failed} with a failed copy, ${procs} data-plane processes\n`);
  }
  if (ready === N) {
    converged = true;
    break;
  }
  if (performance.now() - c0 > maxMs) {
    process.stderr.write(`not converged within ${values['max-minutes']} min: ${ready}/${N} ready\n`);
    break;
  }
  await new Promise((r) => setTimeout(r, 1000));
}
const convergeMs = performance.now() - c0;
// CPU seconds (user + system) used until convergence: the controller-manager, and its children (the data plane): those
// running, and those that ended (data-source hosts end when they have no data source left), which the
// controller-manager's own counters of its waited-for children hold
const cpuAtConvergence = {
  controller: cpuSeconds(cm.pid),
  dataPlane: children(cm.pid).reduce((a, k) => a + cpuSeconds(k, true), 0) + (cpuSeconds(cm.pid, true) - cpuSeconds(cm.pid)),
};
const gets1 = gets - gets0;

const idleLat = [];
for (let i = 0; i < 100; i++) {
  const t = performance.now();
  await req('GET', '/v1/backingimages');
  idleLat.push(performance.now() - t);
}
const oneLat = [];
for (let i = 0; i < 200; i++) {
  const t = performance.now();
  await req('GET', `/v1/backingimages/img-${i % N}`);
  oneLat.push(performance.now() - t);
}
// Reconciles per controller over the whole run (count and seconds), from the controller-manager's own /metrics.
const reconciles = {};
{
  const text = await (await fetch(`${base}/metrics`)).text();
  for (const m of text.matchAll(/^controller_runtime_reconcile_time_seconds_(count|sum)\{([^}]*)\} (\S+)$/gm)) {
    const controller = /controller="([^"]*)"/.exec(m[2])?.[1] ?? '?';
    const r = (reconciles[controller] ??= { count: 0, seconds: 0 });
    if (m[1] === 'count') r.count += Number(m[3]);
    else r.seconds = +(r.seconds + Number(m[3])).toFixed(1);
  }
}
readStoreLog();
const cmMem = status(cm.pid);
if (snapshotAt[0] === 'end') await heapSnapshot('end');
sampleDataPlane();
let files = 0;
for (const d of readdirSync(path.join(tmp, 'data', 'disks'))) files += readdirSync(path.join(tmp, 'data', 'disks', d, 'backing-images')).length;

const s0 = performance.now();
cm.kill('SIGINT');
await new Promise((r) => cm.once('exit', r));
const stopMs = performance.now() - s0;
server.close();
const storeWrites = await storeRv(path.join(tmp, 'data'));

let memoryLog;
if (memLog) {
  const rows = readFileSync(memLog, 'utf8').trim().split('\n').map((l) => JSON.parse(l));
  const peak = (k) => Math.max(...rows.map((r) => r[k]));
  memoryLog = { file: memLog, samples: rows.length, peakMiB: { rss: peak('rss'), heapTotal: peak('heapTotal'), heapUsed: peak('heapUsed'), external: peak('external'), arrayBuffers: peak('arrayBuffers'), malloced: peak('peakMalloced') }, last: rows.at(-1) };
}
// Events are kept in their own log (data/events/events.log), not in the store: counted from the controller-manager's
// log, which has one line per event recorded (a repeat folded into the previous event included).
const eventRecords = countEventRecords(path.join(tmp, 'data', 'logs'));
const result = {
  images: N,
  sizeBytes: SIZE,
  copies: COPIES,
  disks: Number(values.disks),
  startSeconds: +(startMs / 1000).toFixed(2),
  createSeconds: +(createMs / 1000).toFixed(1),
  converged,
  readyAtEnd: ready,
  convergeSeconds: +(convergeMs / 1000).toFixed(1),
  cpuSecondsToConvergence: { controller: cpuAtConvergence.controller, dataPlane: +cpuAtConvergence.dataPlane.toFixed(1) },
  readyOverTime,
  originDownloads: gets1,
  storeWrites,
  writesPerImage: +(storeWrites / N).toFixed(1),
  writesByKind,
  ...(values['trace-writes'] ? { writeTrace } : {}),
  eventRecords,
  eventRecordsPerImage: +(eventRecords / N).toFixed(1),
  eventsByReason,
  reconciles,
  loadAverage: { atStart: loadAtStart, atEnd: os.loadavg().map((l) => +l.toFixed(2)) },
  filesOnDisks: files,
  listBusyMs: { p50: +pct(busyLat, 50).toFixed(1), p99: +pct(busyLat, 99).toFixed(1), n: busyLat.length },
  listIdleMs: { p50: +pct(idleLat, 50).toFixed(1), p99: +pct(idleLat, 99).toFixed(1), n: idleLat.length },
  getOneIdleMs: { p50: +pct(oneLat, 50).toFixed(2), p99: +pct(oneLat, 99).toFixed(2) },
  controllerMaxRssMiB: +(cmMem.hwm / 1024).toFixed(0),
  controllerRssAtEndMiB: +(cmMem.rss / 1024).toFixed(0),
  controllerMemorySamples: memSamples,
  controllerMemoryLog: memoryLog,
  dataPlaneMaxRssMiB: +(maxDataPlaneRss / 1024).toFixed(0),
  stopSeconds: +(stopMs / 1000).toFixed(2),
  reference: { tool: 'curl via xargs -P 8', downloads: gets0, seconds: +(refMs / 1000).toFixed(1) },
  ratioConvergeVsCurl: +(convergeMs / refMs).toFixed(1),
};
console.log(JSON.stringify(result, null, 2));
if (!values.keep) rmSync(tmp, { recursive: true, force: true });
else console.log(`kept ${tmp} (the processes' logs in data/logs)`);
