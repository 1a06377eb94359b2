#!/usr/bin/env node
// Benchmark: pipelined forwarding on one machine, over loopback. A sparse image (default 2 GiB, 50 % holes: 8 MiB of
// random data, 8 MiB hole) is sent by an ssync sender with its SHA-512 chain to the first of N sync services
// (@bis/sync-service, one process); each of them forwards to the next while it receives (`sendToPeer` of a copy being
// received). In the same run, the reference: the same image to one sync service (N = 1).
// Prints per run the wall time until every copy is ready, the process's CPU seconds (user + system: the sender, every
// receiver's verification and every forward), the ratio of the N-copy time to the one-copy time, and the CPU seconds
// each added copy cost. Every copy is checked `ready` with the image's checksum (the receivers verify it themselves).
// Usage: node tools/bench/forward-chain.mjs [--copies 4] [--gib 2] [--runs 3]   (after npx nx run-many -t build)
import { randomBytes } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const { SyncService, backingFilePath } = await import(path.join(repo, 'libs/sync-service/dist/index.js'));
const { sendFile } = await import(path.join(repo, 'libs/sync-service/dist/ssync/sender.js'));
const { computeFileChain } = await import(path.join(repo, 'libs/sha512-chain/dist/index.js'));
const { getFileLayout } = await import(path.join(repo, 'libs/block-mapping/dist/index.js'));
const { describeMachine } = await import('./machine.mjs');

const opt = (name, dflt) => {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? Number(process.argv[i + 1]) : dflt;
};
const COPIES = opt('copies', 4);
const SIZE = opt('gib', 2) * 2 ** 30;
const RUNS = opt('runs', 3);
const SEG = 8 << 20;

const freePort = () =>
  new Promise((resolve, reject) => {
    const s = net.createServer();
    s.on('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });

console.log(await describeMachine(repo));
const work = await fsp.mkdtemp(path.join(os.tmpdir(), 'bis-forward-chain-'));
try {
  const src = path.join(work, 'image.raw');
  const fh = await fsp.open(src, 'w');
  for (let off = 0; off < SIZE; off += 2 * SEG) await fh.write(randomBytes(SEG), 0, SEG, off);
  await fh.truncate(SIZE);
  await fh.close();
  const chain = await computeFileChain(src);
  console.log(`forward chain: image ${SIZE / 2 ** 30} GiB with 50 % holes, ${COPIES} copies in a chain vs one copy, ${RUNS} runs`);

  /** Sends the image to `n` sync services, each forwarding to the next; returns wall and CPU seconds. */
  const chainOf = async (n, run) => {
    const disks = await Promise.all(Array.from({ length: n }, (_, i) => fsp.mkdtemp(path.join(work, `r${run}-n${n}-${i}-`))));
    const svcs = disks.map((d) => new SyncService({ diskPath: d, receiverHost: '127.0.0.1', monitorIntervalMs: 0 }));
    try {
      const files = disks.map((d) => backingFilePath(d, 'img', 'u1'));
      const ports = [];
      for (let i = 0; i < n; i++) {
        ports.push(await freePort());
        await svcs[i].receiveFromPeer({ filePath: files[i], uuid: 'u1', size: SIZE, port: ports[i], expectedChecksum: chain.checksum });
      }
      const cpu0 = process.cpuUsage();
      const t0 = performance.now();
      const forwards = [];
      for (let i = 0; i + 1 < n; i++) forwards.push(svcs[i].sendToPeer(files[i], `127.0.0.1:${ports[i + 1]}`));
      await sendFile({ path: src, toAddress: `127.0.0.1:${ports[0]}`, layout: (p) => getFileLayout(p), chain });
      await Promise.all(forwards);
      await Promise.all(svcs.map((s, i) => s.settled(files[i])));
      const wall = (performance.now() - t0) / 1000;
      const c = process.cpuUsage(cpu0);
      for (let i = 0; i < n; i++) {
        const info = svcs[i].get(files[i]);
        if (info.state !== 'ready' || info.currentChecksum !== chain.checksum) throw new Error(`copy ${i + 1} of ${n}: ${info.state} ${info.message}`);
      }
      return { wall, cpu: (c.user + c.system) / 1e6 };
    } finally {
      await Promise.all(svcs.map((s) => s.close()));
      await Promise.all(disks.map((d) => fsp.rm(d, { recursive: true, force: true })));
    }
  };

  const rows = [];
  for (let run = 1; run <= RUNS; run++) {
    const one = await chainOf(1, run);
    const many = await chainOf(COPIES, run);
    const row = { run, one, many, ratio: many.wall / one.wall, cpuPerAddedCopy: (many.cpu - one.cpu) / (COPIES - 1) };
    rows.push(row);
    console.log(
      `run ${run}: one copy ${one.wall.toFixed(2)} s (${one.cpu.toFixed(2)} CPU-s), ${COPIES} copies ${many.wall.toFixed(2)} s (${many.cpu.toFixed(2)} CPU-s): ` +
        `ratio ${row.ratio.toFixed(2)}x, ${row.cpuPerAddedCopy.toFixed(2)} CPU-s per added copy`,
    );
  }
  const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
  console.log(
    `median ratio ${median(rows.map((r) => r.ratio)).toFixed(2)}x, ${median(rows.map((r) => r.cpuPerAddedCopy)).toFixed(2)} CPU-s per added copy; ` +
      `load ${os.loadavg().map((l) => l.toFixed(2)).join(' ')}`,
  );
} finally {
  await fsp.rm(work, { recursive: true, force: true });
}
