#!/usr/bin/env node
// Benchmark: Sync A->B of a sparse image between two backing-image-manager daemons, against `cp --sparse=always`
// of the same file in the same run; then fan-out of the image from one disk to 4 disks at once.
// Usage: node tools/bench/bim-sync.mjs [sizeGiB=2]   (builds the daemon first with tsc -b)
import { spawn, execFileSync } from 'node:child_process';
import { createInterface } from 'node:readline';
import { randomBytes } from 'node:crypto';
import { promises as fsp, readFileSync } from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
execFileSync(process.execPath, [path.join(repo, 'node_modules/typescript/bin/tsc'), '-b', path.join(repo, 'apps/backing-image-manager/tsconfig.lib.json')], { stdio: 'inherit' });
const { ManagerClient } = await import(path.join(repo, 'libs/bimrpc/dist/index.js'));
const BIN = path.join(repo, 'apps/backing-image-manager/bin/backing-image-manager.js');

const GiB = 1 << 30, MiB = 1 << 20;
const size = Number(process.argv[2] ?? 2) * GiB;
const SEG = 8 * MiB; // alternating 8 MiB data / 8 MiB hole => 50 % holes
const root = await fsp.mkdtemp(path.join(os.tmpdir(), 'bim-bench-'));
const daemons = [];
let range = 45000;

async function disk(name) {
  const d = path.join(root, name);
  await fsp.mkdir(path.join(d, 'tmp'), { recursive: true });
  await fsp.writeFile(path.join(d, 'longhorn-disk.cfg'), JSON.stringify({ diskUUID: name }));
  return d;
}
async function daemon(d) {
  const child = spawn(process.execPath, [BIN, 'daemon', '--listen', '127.0.0.1:0', '--sync-listen', '127.0.0.1:0', '--disk-path', d, '--port-range', `${range}-${range + 9}`, '--advertise-address', '127.0.0.1'], { stdio: ['ignore', 'pipe', 'inherit'] });
  range += 10;
  const line = await new Promise((r) => createInterface({ input: child.stdout }).once('line', r));
  const { grpcPort } = JSON.parse(line);
  const x = { d, child, addr: `127.0.0.1:${grpcPort}`, client: new ManagerClient(`127.0.0.1:${grpcPort}`), maxRssMB: () => Number(/VmHWM:\s+(\d+)/.exec(readFileSync(`/proc/${child.pid}/status`, 'utf8'))[1]) / 1024 };
  daemons.push(x);
  return x;
}
async function waitReady(x, name, uuid) {
  for (;;) {
    const r = await x.client.get(name, uuid);
    if (r.status.state === 'ready') return r;
    if (r.status.state === 'failed') throw new Error(`failed on ${x.d}: ${r.status.errorMsg}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}
const sh = (cmd, args) => execFileSync(cmd, args, { stdio: 'inherit' });

try {
  const A = await disk('A');
  const src = path.join(A, 'tmp', 'bench-u1');
  const fh = await fsp.open(src, 'w');
  await fh.truncate(size);
  const buf = randomBytes(SEG);
  for (let off = 0; off < size; off += 2 * SEG) { buf.writeUInt32LE(off >>> 3, 0); await fh.write(buf, 0, SEG, off); }
  await fh.close();
  const dataBytes = size / 2;
  const a = await daemon(A);
  const ds = http.createServer((req, res) => {
    if (req.method === 'GET') return res.end(JSON.stringify({ filePath: src, uuid: 'u1', state: 'ready-for-transfer', size }));
    res.end();
  });
  await new Promise((r) => ds.listen(0, '127.0.0.1', r));
  const spec = { name: 'bench', uuid: 'u1', size, checksum: '', virtualSize: 0, realSize: 0 };
  let t = performance.now();
  await a.client.fetch({ spec, dataSourceAddress: `127.0.0.1:${ds.address().port}` });
  const ra = await waitReady(a, 'bench', 'u1');
  console.log(`fetch + SHA-512 on A: ${((performance.now() - t) / 1000).toFixed(2)} s`);
  ds.close();
  spec.checksum = ra.status.checksum;
  const backingA = path.join(A, 'backing-images', 'bench-u1', 'backing');

  sh('sync', []);
  const cpDst = path.join(root, 'cp-copy');
  t = performance.now();
  sh('cp', ['--sparse=always', backingA, cpDst]);
  sh('sync', []);
  const cpS = (performance.now() - t) / 1000;
  await fsp.rm(cpDst);

  const b = await daemon(await disk('B'));
  sh('sync', []);
  t = performance.now();
  await b.client.sync({ spec, fromAddress: a.addr });
  await waitReady(b, 'bench', 'u1');
  sh('sync', []);
  const syncS = (performance.now() - t) / 1000;
  const stB = await fsp.stat(path.join(root, 'B', 'backing-images', 'bench-u1', 'backing'));

  const fan = [];
  for (const n of ['C', 'D', 'E', 'F']) fan.push(await daemon(await disk(n)));
  sh('sync', []);
  t = performance.now();
  // at most 3 sends per file: C, D, E from A and F from B (ready already), as the control plane spreads senders
  await Promise.all(fan.map((x, i) => x.client.sync({ spec, fromAddress: i < 3 ? a.addr : b.addr })));
  await Promise.all(fan.map((x) => waitReady(x, 'bench', 'u1')));
  sh('sync', []);
  const fanS = (performance.now() - t) / 1000;

  const mbps = (s) => (dataBytes / 1e6 / s).toFixed(0);
  console.log(`image ${size / GiB} GiB, ${dataBytes / GiB} GiB data, 50 % holes (8 MiB segments)`);
  console.log(`cp --sparse=always + sync: ${cpS.toFixed(2)} s = ${mbps(cpS)} MB/s of data`);
  console.log(`Sync A->B (ready, SHA-512 verified on B) + sync: ${syncS.toFixed(2)} s = ${mbps(syncS)} MB/s of data; ratio to cp ${(cpS / syncS).toFixed(2)}x`);
  console.log(`B allocated ${(stB.blocks * 512 / GiB).toFixed(3)} GiB of ${size / GiB} GiB`);
  console.log(`fan-out to 4 disks at once (A -> C,D,E; B -> F): ${fanS.toFixed(2)} s = ${(fanS / syncS).toFixed(2)}x one copy`);
  for (const x of daemons) console.log(`max RSS daemon ${path.basename(x.d)}: ${x.maxRssMB().toFixed(0)} MB`);
} finally {
  for (const x of daemons) { x.client.close(); x.child.kill('SIGTERM'); }
  await Promise.all(daemons.map((x) => new Promise((r) => (x.child.exitCode !== null ? r() : x.child.once('exit', r)))));
  await fsp.rm(root, { recursive: true, force: true });
}
