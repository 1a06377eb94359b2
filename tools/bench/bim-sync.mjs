#!/usr/bin/env node
// Benchmark: Sync A->B of a sparse image between two backing-image-manager daemons, against `cp --sparse=always`
// of the same file in the same run; then fan-out of the image from one disk to 4 disks at once.
// Usage: node tools/bench/bim-sync.mjs [sizeGiB=2] [runs=3] [--sync-only]   (builds the daemon first with tsc -b)
//   --sync-only: per run only the Sync A->B, with the CPU seconds of each daemon's main thread and of its other threads
//   (thread pool, hashing and sendfile threads); for comparing builds or settings quickly.
//   BIM_SYNC_REPO=<dir>: measure the daemon and receiver of another checkout (e.g. an older commit exported with
//   `git archive` and given its own node_modules/@bis links), to interleave runs of two builds with the same script.
//   BIM_SYNC_NODE_FLAGS="<flags>": node flags for every daemon (e.g. --initial-old-space-size=64).
// Prints per run: cp --sparse=always, sha512sum of the image (the hash floor), Sync A->B until B is ready (with the
// receiver's own stage timings from its log: open->close and close->checksum final), fan-out to 4 disks; then medians.
import { spawn, spawnSync, execFileSync } from 'node:child_process';
import { createInterface } from 'node:readline';
import { randomBytes } from 'node:crypto';
import { promises as fsp, readFileSync } from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const repo = process.env.BIM_SYNC_REPO ? path.resolve(process.env.BIM_SYNC_REPO) : path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
execFileSync(process.execPath, [path.join(repo, 'node_modules/typescript/bin/tsc'), '-b', path.join(repo, 'apps/backing-image-manager/tsconfig.lib.json')], { stdio: 'inherit' });
const { ManagerClient } = await import(path.join(repo, 'libs/bimrpc/dist/index.js'));
const { describeMachine } = await import('./machine.mjs');
const { encodeFileId } = await import(path.join(repo, 'libs/sync-service/dist/index.js'));
const { startSsyncReceiver } = await import(path.join(repo, 'libs/sync-service/dist/ssync/receiver.js'));
const BIN = path.join(repo, 'apps/backing-image-manager/bin/backing-image-manager.js');
const nodeFlags = (process.env.BIM_SYNC_NODE_FLAGS ?? '').split(' ').filter(Boolean);

const GiB = 1 << 30, MiB = 1 << 20;
const args = process.argv.slice(2).filter((x) => !x.startsWith('--'));
const syncOnly = process.argv.includes('--sync-only');
const size = Number(args[0] ?? 2) * GiB;
const SEG = 8 * MiB; // alternating 8 MiB data / 8 MiB hole => 50 % holes
const root = await fsp.mkdtemp(path.join(os.tmpdir(), 'bim-bench-'));
const daemons = [];
let range = 22000 + Math.floor(Math.random() * 100) * 100; // below the ephemeral range; spread: other benchmarks may run at the same time

async function disk(name) {
  const d = path.join(root, name);
  await fsp.mkdir(path.join(d, 'tmp'), { recursive: true });
  await fsp.writeFile(path.join(d, 'longhorn-disk.cfg'), JSON.stringify({ diskUUID: name }));
  return d;
}
async function daemon(d) {
  const child = spawn(process.execPath, [...nodeFlags, BIN, 'daemon', '--listen', '127.0.0.1:0', '--sync-listen', '127.0.0.1:0', '--disk-path', d, '--port-range', `${range}-${range + 9}`, '--advertise-address', '127.0.0.1'], { stdio: ['ignore', 'pipe', 'pipe'] });
  range += 10;
  const received = [];
  createInterface({ input: child.stderr }).on('line', (l) => {
    // sequential hash: "(in order …, holes …, read back … , post-pass … bytes)"; chain: "(SHA-512 chain: N segments, in flight …, holes …, read back …)"
    const m = /received .* in (\d+) ms; checksum final (\d+) ms after close/.exec(l);
    if (m) {
      const h = /\(in order (\d+), holes (\d+), read back (\d+), post-pass (\d+) bytes\)/.exec(l);
      const c = /\(SHA-512 chain: (\d+) segments, in flight (\d+), holes (\d+), read back (\d+)\)/.exec(l);
      received.push({ receiveMs: +m[1], tailMs: +m[2], readBack: h ? +h[3] : 0, postPass: h ? +h[4] : 0, chain: c ? `chain ${c[1]} segs: ${c[2]} in flight, ${c[3]} holes, ${c[4]} read back` : 'no chain' });
    }
    else if (/fail|error/i.test(l)) process.stderr.write(`[${path.basename(d)}] ${l}\n`);
  });
  const line = await new Promise((r) => createInterface({ input: child.stdout }).once('line', r));
  const { grpcPort, syncPort } = JSON.parse(line);
  const x = { d, child, received, syncPort, addr: `127.0.0.1:${grpcPort}`, client: new ManagerClient(`127.0.0.1:${grpcPort}`), maxRssMB: () => Number(/VmHWM:\s+(\d+)/.exec(readFileSync(`/proc/${child.pid}/status`, 'utf8'))[1]) / 1024 };
  daemons.push(x);
  return x;
}
// polls every 10 ms: the time to `ready` is overstated by 5 ms on average (it was 25 ms with the 50 ms polls used before)
async function waitReady(x, name, uuid) {
  for (;;) {
    const r = await x.client.get(name, uuid);
    if (r.status.state === 'ready') return r;
    if (r.status.state === 'failed') throw new Error(`failed on ${x.d}: ${r.status.errorMsg}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}
const sh = (cmd, args) => execFileSync(cmd, args, { stdio: 'inherit' });
// CPU seconds (user + system) of a process: a figure the machine's load does not inflate the way it inflates wall time
const cpuOf = (pid) => { const f = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' '); return (Number(f[11]) + Number(f[12])) / 100; };
/** Runs a command under /usr/bin/time; returns its wall seconds, CPU seconds and stdout. */
function timed(cmd, args) {
  const t = performance.now();
  const r = spawnSync('/usr/bin/time', ['-f', '%U %S', cmd, ...args], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`${cmd} failed: ${r.stderr}`);
  const [u, sy] = r.stderr.trim().split('\n').pop().split(' ').map(Number);
  return { s: (performance.now() - t) / 1000, cpu: u + sy, stdout: r.stdout };
}
const runs = Number(args[1] ?? 3);
/** CPU seconds of a process's main thread and of the process as a whole (threads that ended included). */
const threadCpu = (pid) => {
  const f = readFileSync(`/proc/${pid}/task/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
  return { main: (Number(f[11]) + Number(f[12])) / 100, total: cpuOf(pid) };
};
const median = (xs) => { const s = [...xs].sort((a, b) => a - b); return s[Math.floor(s.length / 2)]; };
const stop = async (x) => {
  x.client.close();
  x.child.kill('SIGTERM');
  await new Promise((r) => (x.child.exitCode !== null ? r() : x.child.once('exit', r)));
  daemons.splice(daemons.indexOf(x), 1);
  await fsp.rm(x.d, { recursive: true, force: true });
};

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
  const mbps = (s) => (dataBytes / 1e6 / s).toFixed(0);
  console.log(await describeMachine(repo));
  console.log(`image ${size / GiB} GiB, ${dataBytes / GiB} GiB data, 50 % holes (8 MiB segments); ${runs} runs; load ${os.loadavg().map((x) => x.toFixed(2)).join(' ')}`);

  const rows = [];
  for (let run = 1; run <= runs; run++) {
    if (syncOnly) {
      const b = await daemon(await disk(`B${run}`));
      sh('sync', []);
      const c0 = [a, b].map((x) => threadCpu(x.child.pid));
      t = performance.now();
      await b.client.sync({ spec, fromAddress: a.addr });
      await waitReady(b, 'bench', 'u1');
      const readyS = (performance.now() - t) / 1000;
      const [ca, cb] = [a, b].map((x, i) => {
        const c1 = threadCpu(x.child.pid);
        return `main ${(c1.main - c0[i].main).toFixed(2)} + other threads ${(c1.total - c1.main - (c0[i].total - c0[i].main)).toFixed(2)}`;
      });
      rows.push({ readyS });
      console.log(`run ${run} (sync only): Sync A->B ready ${readyS.toFixed(2)} s | CPU s: A ${ca}, B ${cb} | max RSS B ${b.maxRssMB().toFixed(0)} MB | load ${os.loadavg()[0].toFixed(2)}`);
      await stop(b);
      continue;
    }
    sh('sync', []);
    const cpDst = path.join(root, 'cp-copy');
    t = performance.now();
    const cp = timed('cp', ['--sparse=always', backingA, cpDst]);
    sh('sync', []);
    const cpS = (performance.now() - t) / 1000;
    await fsp.rm(cpDst);

    const sum = timed('sha512sum', [backingA]);
    const shaS = sum.s;
    if (sum.stdout.split(' ')[0] !== spec.checksum) throw new Error('sha512sum differs from the daemon checksum');

    // the transport alone: A's sender (the daemon) into a receiver in this process that neither hashes nor verifies
    const rxFile = path.join(root, `rx-only-${run}`);
    const rx = await startSsyncReceiver({ port: 0, host: '127.0.0.1', filePath: rxFile, size, acceptChain: false });
    const txCpu0 = cpuOf(a.child.pid);
    const rxRu0 = process.resourceUsage();
    t = performance.now();
    await new Promise((resolve, reject) => {
      const req = http.request({ host: '127.0.0.1', port: a.syncPort, method: 'POST', path: `/v1/files/${encodeFileId(backingA)}?action=sendToPeer&to-address=127.0.0.1:${rx.port}` }, (res) => {
        res.resume();
        res.on('end', () => (res.statusCode === 200 ? resolve() : reject(new Error(`sendToPeer: HTTP ${res.statusCode}`))));
      });
      req.on('error', reject);
      req.end();
    });
    const rxResult = await rx.done;
    const transferS = (performance.now() - t) / 1000;
    const rxRu1 = process.resourceUsage();
    const transferCpu = { tx: cpuOf(a.child.pid) - txCpu0, rx: (rxRu1.userCPUTime + rxRu1.systemCPUTime - rxRu0.userCPUTime - rxRu0.systemCPUTime) / 1e6 };
    await rx.closed;
    await fsp.rm(rxFile);

    const b = await daemon(await disk(`B${run}`));
    sh('sync', []);
    const cpuA0 = cpuOf(a.child.pid);
    const cpuB0 = cpuOf(b.child.pid);
    t = performance.now();
    await b.client.sync({ spec, fromAddress: a.addr });
    await waitReady(b, 'bench', 'u1');
    const syncCpu = { a: cpuOf(a.child.pid) - cpuA0, b: cpuOf(b.child.pid) - cpuB0 };
    const readyS = (performance.now() - t) / 1000;
    sh('sync', []);
    const syncS = (performance.now() - t) / 1000;
    const stB = await fsp.stat(path.join(b.d, 'backing-images', 'bench-u1', 'backing'));
    // peak memory of A and B up to the end of the Sync (before the fan-out adds sends)
    const rssSync = [a, b].map((x) => x.maxRssMB());
    const rec = b.received[0] ?? { receiveMs: NaN, tailMs: NaN };

    const fan = [];
    for (const n of ['C', 'D', 'E', 'F']) fan.push(await daemon(await disk(`${n}${run}`)));
    sh('sync', []);
    const fanCpu0 = [a, b, ...fan].map((x) => cpuOf(x.child.pid));
    t = performance.now();
    // at most 3 sends per file: C, D, E from A and F from B (ready already), as the control plane spreads senders
    await Promise.all(fan.map((x, i) => x.client.sync({ spec, fromAddress: i < 3 ? a.addr : b.addr })));
    await Promise.all(fan.map((x) => waitReady(x, 'bench', 'u1')));
    sh('sync', []);
    const fanS = (performance.now() - t) / 1000;
    const fanCpu = [a, b, ...fan].reduce((sum, x, i) => sum + cpuOf(x.child.pid) - fanCpu0[i], 0);
    const rss = [a, b, ...fan].map((x) => x.maxRssMB());
    const fanRec = fan.map((x) => x.received[0] ?? {});
    const fanStats = `fan-out receivers: open->close ${fanRec.map((r) => (r.receiveMs / 1000).toFixed(1)).join('/')} s, read back ${fanRec.reduce((n, r) => n + (r.readBack ?? 0), 0)} B, post-pass ${fanRec.reduce((n, r) => n + (r.postPass ?? 0), 0)} B`;
    const row = { txCpu: transferCpu.tx, rxCpu: transferCpu.rx, cpS, cpCpu: cp.cpu, shaCpu: sum.cpu, syncCpuA: syncCpu.a, syncCpuB: syncCpu.b, fanCpu, shaS, transferS, readyS, syncS, receiveS: rec.receiveMs / 1000, tailS: rec.tailMs / 1000, fanS, maxRss: Math.max(...rss), allocB: stB.blocks * 512 / GiB, readBack: rec.readBack, postPass: rec.postPass };
    rows.push(row);
    console.log(
      `run ${run} (${path.basename(repo)}${nodeFlags.length ? ` ${nodeFlags.join(' ')}` : ''}): cp --sparse=always + sync ${cpS.toFixed(2)} s (${mbps(cpS)} MB/s of data) | sha512sum ${shaS.toFixed(2)} s | transfer alone (no hash) ${transferS.toFixed(2)} s (${mbps(transferS)} MB/s${rxResult.writeStats ? `, ${(rxResult.writeStats.directBytes / GiB).toFixed(2)} GiB written direct` : ''}) | ` +
        `Sync A->B ready ${readyS.toFixed(2)} s, + sync ${syncS.toFixed(2)} s (${mbps(syncS)} MB/s of data, ${(cpS / syncS).toFixed(2)}x cp) ` +
        `[receiver open->close ${row.receiveS.toFixed(2)} s, checksum final ${row.tailS.toFixed(2)} s after close, ${rec.chain}, read back ${rec.readBack} B, post-pass ${rec.postPass} B] | ` +
        `CPU s: cp ${cp.cpu.toFixed(2)}, sha512sum ${sum.cpu.toFixed(2)}, transfer alone sender ${transferCpu.tx.toFixed(2)} + receiver ${transferCpu.rx.toFixed(2)}, Sync sender ${syncCpu.a.toFixed(2)} + receiver ${syncCpu.b.toFixed(2)}, fan-out all daemons ${fanCpu.toFixed(2)} | B allocated ${row.allocB.toFixed(3)} GiB | fan-out 4 disks ${fanS.toFixed(2)} s = ${(fanS / syncS).toFixed(2)}x one copy (${fanStats}) | max RSS ${rss.map((x) => x.toFixed(0)).join('/')} MB (A/B after the Sync ${rssSync.map((x) => x.toFixed(0)).join('/')} MB) | load ${os.loadavg()[0].toFixed(2)}`,
    );
    for (const x of [...fan, b]) await stop(x);
  }
  const m = (k) => median(rows.map((r) => r[k]));
  if (syncOnly) {
    console.log(`median of ${runs}: Sync ready ${m('readyS').toFixed(2)} s`);
  } else {
    console.log(`median of ${runs}: cp ${m('cpS').toFixed(2)} s (${mbps(m('cpS'))} MB/s) | sha512sum ${m('shaS').toFixed(2)} s | transfer alone ${m('transferS').toFixed(2)} s (${mbps(m('transferS'))} MB/s) | Sync ready ${m('readyS').toFixed(2)} s, +sync ${m('syncS').toFixed(2)} s (${mbps(m('syncS'))} MB/s, ${(m('cpS') / m('syncS')).toFixed(2)}x cp) | receive ${m('receiveS').toFixed(2)} s, checksum tail ${m('tailS').toFixed(2)} s | fan-out ${m('fanS').toFixed(2)} s (${(m('fanS') / m('syncS')).toFixed(2)}x one copy) | max RSS ${m('maxRss').toFixed(0)} MB`);
    console.log(`median CPU seconds: cp ${m('cpCpu').toFixed(2)} | sha512sum ${m('shaCpu').toFixed(2)} | transfer alone sender ${m('txCpu').toFixed(2)} + receiver ${m('rxCpu').toFixed(2)} | Sync sender ${m('syncCpuA').toFixed(2)} + receiver ${m('syncCpuB').toFixed(2)} | fan-out (all daemons) ${m('fanCpu').toFixed(2)}`);
  }
} finally {
  for (const x of daemons) { x.client.close(); x.child.kill('SIGTERM'); }
  await Promise.all(daemons.map((x) => new Promise((r) => (x.child.exitCode !== null ? r() : x.child.once('exit', r)))));
  await fsp.rm(root, { recursive: true, force: true });
}
