#!/usr/bin/env node
// Backup/restore throughput of the backupstore engine (through the built backup-engine CLI) beside restic and a
// plain `sha512sum` read of the same image, all in one run.
//
//   node tools/bench/backupstore-bench.mjs [--size-mib 2048] [--concurrency 2,4] [--dir <tmp parent>]
//
// Needs: a built backup-engine (`npx nx run backup-engine:build`), restic and sha512sum on PATH, GNU time at
// /usr/bin/time. The image is 2 MiB blocks: half random (1/8 of them repeats of earlier random blocks), a quarter
// holes and a quarter written zeros. Throughput is image bytes / wall seconds (MB = 10^6 B); per-worker = / concurrency.
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
    dir: { type: 'string', default: os.tmpdir() },
  },
});
const BLOCK = 2 * 1024 * 1024;
const sizeMiB = Number(values['size-mib']);
const blocks = Math.floor((sizeMiB * 1024 * 1024) / BLOCK);
const size = blocks * BLOCK;
const repoRoot = path.resolve(new URL('.', import.meta.url).pathname, '../..');
const cli = path.join(repoRoot, 'apps/backup-engine/bin/backup-engine.js');
const work = await fs.mkdtemp(path.join(values.dir, 'bis-bench-'));

function timed(cmd, args, env = {}) {
  const t0 = process.hrtime.bigint();
  const r = spawnSync('/usr/bin/time', ['-v', cmd, ...args], { env: { ...process.env, ...env }, encoding: 'utf8', maxBuffer: 64 << 20 });
  const secs = Number(process.hrtime.bigint() - t0) / 1e9;
  if (r.status !== 0) throw new Error(`${cmd} ${args.join(' ')} failed (${r.status}):\n${r.stdout}\n${r.stderr}`);
  const rssKiB = Number(/Maximum resident set size \(kbytes\): (\d+)/.exec(r.stderr)?.[1] ?? NaN);
  return { secs, rssMiB: rssKiB / 1024, stdout: r.stdout };
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
const rows = [];
function row(tool, op, workers, r) {
  rows.push({ tool, op, workers, secs: r.secs.toFixed(2), 'MB/s': mb(r.secs).toFixed(0), 'MB/s per worker': workers ? (mb(r.secs) / workers).toFixed(0) : '', 'max RSS MiB': r.rssMiB.toFixed(0) });
}

try {
  const image = path.join(work, 'image.raw');
  await makeImage(image);
  execFileSync('sync');
  console.error(`image: ${size} bytes (${blocks} blocks of 2 MiB) at ${image}`);
  // Warm the page cache the same way for everybody, then measure a plain read + hash.
  timed('sha512sum', [image]);
  const sha = timed('sha512sum', [image]);
  row('sha512sum', 'read+hash', 1, sha);

  const resticRepo = path.join(work, 'restic-repo');
  const resticEnv = { RESTIC_PASSWORD: 'bench', RESTIC_REPOSITORY: resticRepo, RESTIC_CACHE_DIR: path.join(work, 'restic-cache') };
  execFileSync('restic', ['init', '--quiet'], { env: { ...process.env, ...resticEnv } });
  const rb = timed('restic', ['backup', '--quiet', image], resticEnv);
  row('restic 0.14', 'backup', os.cpus().length, rb);
  const rr = timed('restic', ['restore', 'latest', '--target', path.join(work, 'restic-out')], resticEnv);
  row('restic 0.14', 'restore', os.cpus().length, rr);
  await fs.rm(path.join(work, 'restic-out'), { recursive: true, force: true });

  for (const c of values.concurrency.split(',').map(Number)) {
    const store = path.join(work, `store-${c}`);
    const b = timed(process.execPath, [cli, 'backup', '--target', `vfs://${store}`, '--name', 'bench', '--file', image, '--compression', 'lz4', '--concurrency', String(c), '--json']);
    row('backup-engine lz4', 'backup', c, b);
    const out = path.join(work, `restored-${c}.raw`);
    const r = timed(process.execPath, [cli, 'restore', '--backup-url', `vfs://${store}?backingImage=bench`, '--output', out, '--concurrency', String(c), '--json']);
    row('backup-engine lz4', 'restore', c, r);
    const restoredSha = JSON.parse(r.stdout).sha512;
    if (restoredSha !== JSON.parse(b.stdout).sha512) throw new Error('restored image differs');
    await fs.rm(out);
    await fs.rm(store, { recursive: true, force: true });
  }
  console.table(rows);
  const best = (tool, op) => Math.min(...rows.filter((r) => r.tool.startsWith(tool) && r.op === op).map((r) => Number(r.secs)));
  console.log(`backup  ratio vs restic (best engine run): ${(best('restic', 'backup') / best('backup-engine', 'backup')).toFixed(2)}x`);
  console.log(`restore ratio vs restic (best engine run): ${(best('restic', 'restore') / best('backup-engine', 'restore')).toFixed(2)}x`);
  console.log(`engine backup vs sha512sum read: ${(best('sha512sum', 'read+hash') / best('backup-engine', 'backup')).toFixed(2)}x`);
} finally {
  await fs.rm(work, { recursive: true, force: true });
}
