#!/usr/bin/env node
// Backup/restore throughput of the backupstore engine (through the built backup-engine CLI) beside restic and a
// plain `sha512sum` read of the same image, all in one run.
//
//   node tools/bench/backupstore-bench.mjs [--size-mib 2048] [--concurrency 2,4] [--runs 1] [--dir <tmp parent>] [--sequential]
//
// The engine's restore must verify with the backup's SHA-512 chain sidecar (checked); --sequential adds a row for the
// same restore with the sidecar removed (the sequential whole-image hash a Longhorn-written backup gets), the two
// alternating which runs first from round to round. "CPU s" is the process's user + system time.
// Needs: a built backup-engine (`npx nx run backup-engine:build`), restic and sha512sum on PATH, GNU time at
// /usr/bin/time. The image is 2 MiB blocks: half random (1/8 of them repeats of earlier random blocks), a quarter
// holes and a quarter written zeros. Throughput is image bytes / wall seconds (MB = 10^6 B); per-worker = / concurrency.
// With --runs N every measurement is repeated N times in rounds (each round: sha512sum, restic, engine) and the table
// shows the median of each row (and its min–max); ratios compare medians. The 1-minute load average is printed
// before and after each round (the machine may be shared).
import { execFileSync, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { promises as fs } from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { parseArgs } from 'node:util';

const { values } = parseArgs({
  options: {
    'size-mib': { type: 'string', default: '2048' },
    concurrency: { type: 'string', default: '2,4' },
    runs: { type: 'string', default: '1' },
    dir: { type: 'string', default: os.tmpdir() },
    // Also time each engine restore without the SHA-512 chain sidecar (sequential whole-image hash).
    sequential: { type: 'boolean', default: false },
  },
});
const BLOCK = 2 * 1024 * 1024;
const sizeMiB = Number(values['size-mib']);
const blocks = Math.floor((sizeMiB * 1024 * 1024) / BLOCK);
const size = blocks * BLOCK;
const repoRoot = path.resolve(new URL('.', import.meta.url).pathname, '../..');
const cli = path.join(repoRoot, 'apps/backup-engine/bin/backup-engine.js');
const work = await fs.mkdtemp(path.join(values.dir, 'bis-bench-'));
const { describeMachine } = await import('./machine.mjs');
console.log(await describeMachine(repoRoot));

function timed(cmd, args, env = {}) {
  const t0 = process.hrtime.bigint();
  const r = spawnSync('/usr/bin/time', ['-v', cmd, ...args], { env: { ...process.env, ...env }, encoding: 'utf8', maxBuffer: 64 << 20 });
  const secs = Number(process.hrtime.bigint() - t0) / 1e9;
  if (r.status !== 0) throw new Error(`${cmd} ${args.join(' ')} failed (${r.status}):\n${r.stdout}\n${r.stderr}`);
  const rssKiB = Number(/Maximum resident set size \(kbytes\): (\d+)/.exec(r.stderr)?.[1] ?? NaN);
  const cpu = Number(/User time \(seconds\): ([\d.]+)/.exec(r.stderr)?.[1] ?? NaN) + Number(/System time \(seconds\): ([\d.]+)/.exec(r.stderr)?.[1] ?? NaN);
  return { secs, rssMiB: rssKiB / 1024, cpu, stdout: r.stdout };
}

async function makeImage(file) {
  const fh = await fs.open(file, 'w');
  await fh.truncate(size);
  const random = [];
  for (let i = 0; i < blocks; i++) {
    const kind = i % 4; // 0,1: random data; 2: hole; 3: written zeros
    let data;
    if (kind === 2) continue;
    if (kind === 3) data = Buffer.alloc(BLOCK);
    else if (random.length >= 8 && i % 16 === 1) data = random[(i * 7) % random.length]; // a repeated block
    else {
      data = randomBytes(BLOCK);
      if (random.length < 64) random.push(data);
    }
    await fh.write(data, 0, BLOCK, i * BLOCK);
  }
  await fh.sync();
  await fh.close();
}

const mb = (secs) => size / 1e6 / secs;
const runs = Math.max(1, Number(values.runs));
const samples = new Map(); // row key -> { tool, op, workers, secs: [], rss: [] }
function row(tool, op, workers, r) {
  const key = `${tool}\0${op}\0${workers}`;
  const s = samples.get(key) ?? { tool, op, workers, secs: [], rss: [], cpu: [] };
  s.secs.push(r.secs);
  s.cpu.push(r.cpu);
  s.rss.push(r.rssMiB);
  samples.set(key, s);
}
const median = (xs) => {
  const v = [...xs].sort((a, b) => a - b);
  return v.length % 2 ? v[(v.length - 1) / 2] : (v[v.length / 2 - 1] + v[v.length / 2]) / 2;
};
const load = () => os.loadavg()[0].toFixed(2);

try {
  const image = path.join(work, 'image.raw');
  await makeImage(image);
  execFileSync('sync');
  console.error(`image: ${size} bytes (${blocks} blocks of 2 MiB) at ${image}`);
  // Warm the page cache the same way for everybody.
  timed('sha512sum', [image]);
  let expectedSha;
  for (let round = 1; round <= runs; round++) {
    console.error(`round ${round}/${runs}: load average ${load()}`);
    row('sha512sum', 'read+hash', 1, timed('sha512sum', [image]));

    const resticRepo = path.join(work, 'restic-repo');
    await fs.rm(resticRepo, { recursive: true, force: true });
    const resticEnv = { RESTIC_PASSWORD: 'bench', RESTIC_REPOSITORY: resticRepo, RESTIC_CACHE_DIR: path.join(work, 'restic-cache') };
    execFileSync('restic', ['init', '--quiet'], { env: { ...process.env, ...resticEnv } });
    row('restic 0.14', 'backup', os.cpus().length, timed('restic', ['backup', '--quiet', image], resticEnv));
    row('restic 0.14', 'restore', os.cpus().length, timed('restic', ['restore', 'latest', '--target', path.join(work, 'restic-out')], resticEnv));
    await fs.rm(path.join(work, 'restic-out'), { recursive: true, force: true });
    await fs.rm(resticRepo, { recursive: true, force: true });

    for (const c of values.concurrency.split(',').map(Number)) {
      const store = path.join(work, `store-${c}`);
      const b = timed(process.execPath, [cli, 'backup', '--target', `vfs://${store}`, '--name', 'bench', '--file', image, '--compression', 'lz4', '--concurrency', String(c), '--json']);
      row('backup-engine lz4', 'backup', c, b);
      const out = path.join(work, `restored-${c}.raw`);
      const backedUp = JSON.parse(b.stdout).sha512;
      expectedSha ??= backedUp;
      if (backedUp !== expectedSha) throw new Error('backed-up image differs');
      const sidecar = path.join(store, 'backupstore/backing-images/backing-images/bench/backing-image.sha512chain');
      const chainBytes = await fs.readFile(sidecar);
      const restore = async (mode) => {
        // 'chain': with the SHA-512 chain sidecar; 'sequential': without it (what a Longhorn-written or older backup
        // gets: the sequential whole-image hash).
        if (mode === 'chain') await fs.writeFile(sidecar, chainBytes);
        else await fs.rm(sidecar, { force: true });
        const r = timed(process.execPath, [cli, 'restore', '--backup-url', `vfs://${store}?backingImage=bench`, '--output', out, '--concurrency', String(c), '--json']);
        const doc = JSON.parse(r.stdout);
        if (doc.sha512 !== expectedSha) throw new Error('restored image differs');
        const want = mode === 'chain' ? 'sha512-chain' : 'sequential';
        if (doc.verification !== want) throw new Error(`the restore verified ${doc.verification}, expected ${want}`);
        row('backup-engine lz4', mode === 'chain' ? 'restore' : 'restore, no sidecar', c, r);
        await fs.rm(out);
      };
      // With --sequential the two restores alternate which one runs first (the first after a backup is not neutral).
      const modes = !values.sequential ? ['chain'] : round % 2 === 1 ? ['chain', 'sequential'] : ['sequential', 'chain'];
      for (const mode of modes) await restore(mode);
      await fs.rm(store, { recursive: true, force: true });
    }
    console.error(`round ${round}/${runs}: done, load average ${load()}`);
  }
  const table = [...samples.values()].map((s) => {
    const secs = median(s.secs);
    return {
      tool: s.tool,
      op: s.op,
      workers: s.workers,
      secs: secs.toFixed(2),
      'secs min–max': runs > 1 ? `${Math.min(...s.secs).toFixed(2)}–${Math.max(...s.secs).toFixed(2)}` : '',
      'MB/s': mb(secs).toFixed(0),
      'MB/s per worker': (mb(secs) / s.workers).toFixed(0),
      'max RSS MiB': median(s.rss).toFixed(0),
      'CPU s': median(s.cpu).toFixed(2),
    };
  });
  console.table(table);
  const med = (tool, op) => Math.min(...table.filter((r) => r.tool.startsWith(tool) && r.op === op).map((r) => Number(r.secs)));
  const note = runs > 1 ? `medians of ${runs} runs, best engine concurrency` : 'best engine run';
  console.log(`backup  ratio vs restic (${note}): ${(med('restic', 'backup') / med('backup-engine', 'backup')).toFixed(2)}x`);
  console.log(`restore ratio vs restic (${note}): ${(med('restic', 'restore') / med('backup-engine', 'restore')).toFixed(2)}x`);
  console.log(`engine backup vs sha512sum read: ${(med('sha512sum', 'read+hash') / med('backup-engine', 'backup')).toFixed(2)}x`);
} finally {
  await fs.rm(work, { recursive: true, force: true });
}
