#!/usr/bin/env node
// Benchmark: mapping the data extents of a big sparse file.
//
//   npx nx run @bis/block-mapping:build && node tools/bench/extent-scan.mjs [--size-gib 10] [--data-mib 100] [--chunks 100] [--runs 3]
//
// Creates a sparse file of --size-gib GiB holding --data-mib MiB of random data in --chunks equal chunks spread evenly
// over the file, in a temp dir under os.tmpdir(); times getFileLayout with the seek-data backend (N-API lseek
// SEEK_DATA/SEEK_HOLE) and the zero-scan backend (reads everything), and as public references `filefrag -v` (FIEMAP)
// and a python3 os.lseek(SEEK_DATA/SEEK_HOLE) loop when those tools exist. Prints min/median/max and ratios, checks
// that every method found the same data extents, then deletes the file.
// The first zero-scan run is the cold one: reading a hole makes the kernel fill page-cache pages with zeros, so later
// runs read those cached pages instead.
import { spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { mkdtemp, open, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const dist = path.join(repoRoot, 'libs/block-mapping/dist/index.js');
if (!existsSync(dist)) {
  console.error('build the library first: npx nx run @bis/block-mapping:build');
  process.exit(2);
}
const { getFileLayout, extentBackend } = await import(dist);

function arg(name, dflt) {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? Number(process.argv[i + 1]) : dflt;
}
const GiB = 1024 ** 3;
const MiB = 1024 ** 2;
const size = arg('size-gib', 10) * GiB;
const dataBytes = arg('data-mib', 100) * MiB;
const chunks = arg('chunks', 100);
const runs = arg('runs', 3);
const chunkBytes = Math.floor(dataBytes / chunks / 4096) * 4096;
const stride = Math.floor(size / chunks / MiB) * MiB;

const stats = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return { min: s[0], median: s[Math.floor(s.length / 2)], max: s[s.length - 1] };
};
const fmt = (ms) => (ms >= 1000 ? `${(ms / 1000).toFixed(2)} s` : `${ms.toFixed(2)} ms`);
const fmtStats = (st) => `${fmt(st.min)} / ${fmt(st.median)} / ${fmt(st.max)}`;

function has(tool) {
  return spawnSync('sh', ['-c', `command -v ${tool}`]).status === 0;
}

const dir = await mkdtemp(path.join(tmpdir(), 'bis-extent-scan-'));
const file = path.join(dir, 'sparse.img');
try {
  console.log(`native addon backend available: ${extentBackend() === 'seek-data'}`);
  console.log(
    `creating ${file}: ${size / GiB} GiB, ${chunks} data chunks of ${chunkBytes / 1024} KiB every ${stride / MiB} MiB`,
  );
  const fh = await open(file, 'w');
  const payload = randomBytes(chunkBytes);
  for (let i = 0; i < chunks; i++) {
    payload[0] = (i & 0xff) | 1; // never an all-zero 4 KiB block
    await fh.write(payload, 0, chunkBytes, i * stride);
  }
  await fh.truncate(size);
  await fh.sync();
  await fh.close();
  const expected = Array.from({ length: chunks }, (_, i) => ({ offset: i * stride, length: chunkBytes }));
  const same = (data, what) => {
    if (JSON.stringify(data) !== JSON.stringify(expected)) {
      throw new Error(`${what} found ${data.length} extents, not the ${chunks} written`);
    }
  };

  const results = {};
  async function time(name, n, fn) {
    const times = [];
    for (let r = 0; r < n; r++) {
      const t0 = performance.now();
      const data = await fn();
      times.push(performance.now() - t0);
      same(data, name);
    }
    results[name] = { ...stats(times), first: times[0] };
    console.log(
      `${name.padEnd(34)} ${fmtStats(results[name])}   (min / median / max of ${n}; first run ${fmt(times[0])})`,
    );
  }

  await time('getFileLayout seek-data', Math.max(runs, 5), async () => (await getFileLayout(file, { backend: 'seek-data' })).data);
  const rssBefore = process.resourceUsage().maxRSS;
  await time('getFileLayout zero-scan', runs, async () => (await getFileLayout(file, { backend: 'zero-scan' })).data);
  const rssAfter = process.resourceUsage().maxRSS;

  if (has('python3')) {
    const py = `
import os, sys, time, json, errno
fd = os.open(sys.argv[1], os.O_RDONLY); size = os.fstat(fd).st_size; pos = 0; ext = []
t = time.perf_counter()
while pos < size:
    try: d = os.lseek(fd, pos, os.SEEK_DATA)
    except OSError as e:
        if e.errno == errno.ENXIO: break
        raise
    h = os.lseek(fd, d, os.SEEK_HOLE); ext.append({"offset": d, "length": min(h, size) - d}); pos = h
print(json.dumps({"ms": (time.perf_counter() - t) * 1000, "data": ext}))`;
    const inner = [];
    await time('python3 os.lseek loop (process)', Math.max(runs, 5), async () => {
      const r = spawnSync('python3', ['-c', py, file], { encoding: 'utf8' });
      if (r.status !== 0) throw new Error(r.stderr);
      const out = JSON.parse(r.stdout);
      inner.push(out.ms);
      return out.data;
    });
    results['python3 os.lseek loop (in-process)'] = { ...stats(inner), first: inner[0] };
    console.log(`${'python3 os.lseek loop (in-process)'.padEnd(34)} ${fmtStats(results['python3 os.lseek loop (in-process)'])}`);
  }
  if (has('filefrag')) {
    await time('filefrag -v (FIEMAP, process)', Math.max(runs, 5), async () => {
      const r = spawnSync('filefrag', ['-v', '-b1', file], { encoding: 'utf8' });
      if (r.status !== 0) throw new Error(r.stderr);
      // lines: "  0:        0..   409599:   34816..  444415: 409600: ..." with -b1 offsets in bytes
      const extents = [];
      for (const line of r.stdout.split('\n')) {
        const m = /^\s*\d+:\s+(\d+)\.\.\s*(\d+):/.exec(line);
        if (!m) continue;
        const offset = Number(m[1]);
        const end = Number(m[2]) + 1;
        const last = extents[extents.length - 1];
        if (last && last.offset + last.length === offset) last.length += end - offset;
        else extents.push({ offset, length: end - offset });
      }
      return extents;
    });
  }

  const seek = results['getFileLayout seek-data'].median;
  console.log('\nratios to the getFileLayout seek-data median (median run / first run):');
  for (const [name, st] of Object.entries(results)) {
    console.log(`  ${name.padEnd(34)} ${(st.median / seek).toFixed(1)}x / ${(st.first / seek).toFixed(1)}x`);
  }
  const scan = results['getFileLayout zero-scan'];
  const rate = (ms) => (size / MiB / (ms / 1000)).toFixed(0);
  console.log(`\nzero-scan throughput over ${size / GiB} GiB: ${rate(scan.first)} MiB/s cold (first run), ${rate(scan.median)} MiB/s median`);
  console.log(`max RSS: ${(rssBefore / 1024).toFixed(0)} MiB before zero-scan, ${(rssAfter / 1024).toFixed(0)} MiB after`);
} finally {
  await rm(dir, { recursive: true, force: true });
}
