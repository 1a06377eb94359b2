#!/usr/bin/env node
// Benchmark: exact SHA-512 of a sparse image, sequential against parallel (chained) verification.
//
//   npx nx run @bis/sha512-chain:build && node tools/bench/sha512-chain.mjs [--data-mib 1024] [--hole-mib 1024] [--runs 3]
//
// Creates a sparse file in a temp dir under os.tmpdir(): --data-mib MiB of random data and --hole-mib MiB of holes,
// alternating in 64 MiB pieces. Warms the page cache, then per round (rounds interleave the methods) times:
//   - `sha512sum` (the reference: what Longhorn's checksum costs with a public tool),
//   - `openssl dgst -sha512`,
//   - Node `createHash('sha512')` over 1 MiB reads (the sequential fallback when the addon is missing),
//   - computeFileChain (one sequential pass; holes hashed as zeros without reading),
//   - verifyFileChain with concurrency 2 and 4 (parallel; holes verified without reading).
// Each method runs in its own child process (max RSS from /usr/bin/time -v when present, else from the child's
// process.resourceUsage()). Checks that every method printed the same SHA-512, prints median/min/max seconds, GB/s
// (10^9 bytes of image per second) and the time ratio against sha512sum, the load average before and after, and
// deletes the file.
import { spawnSync } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { mkdtemp, open, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir, loadavg, cpus } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const MiB = 1024 * 1024;
const scriptPath = fileURLToPath(import.meta.url);
const repoRoot = path.resolve(path.dirname(scriptPath), '../..');
const dist = path.join(repoRoot, 'libs/sha512-chain/dist/index.js');

async function loadLibrary() {
  if (!existsSync(dist)) {
    console.error('build the library first: npx nx run @bis/sha512-chain:build');
    process.exit(2);
  }
  const lib = await import(dist);
  if (!lib.nativeSha512ChainAvailable()) {
    console.error(`the native addon is not available: ${lib.nativeAddonStatus()}`);
    process.exit(2);
  }
  return lib;
}

// ---- child mode: one measured operation, prints {seconds, checksum, maxRssKiB} as JSON ----
if (process.argv[2] === '--child') {
  const [, , , mode, file, extra] = process.argv;
  const start = process.hrtime.bigint();
  let checksum;
  if (mode === 'createHash') {
    const fh = await open(file, 'r');
    const h = createHash('sha512');
    const buf = Buffer.allocUnsafe(MiB);
    for (let pos = 0; ; ) {
      const { bytesRead } = await fh.read(buf, 0, MiB, pos);
      if (bytesRead === 0) break;
      h.update(buf.subarray(0, bytesRead));
      pos += bytesRead;
    }
    await fh.close();
    checksum = h.digest('hex');
  } else {
    const lib = await loadLibrary();
    if (mode === 'compute') {
      const chain = await lib.computeFileChain(file);
      checksum = chain.checksum;
      if (extra) await writeFile(extra, lib.encodeChain(chain));
    } else if (mode.startsWith('verify')) {
      const chain = lib.decodeChain(await readFile(extra));
      checksum = await lib.verifyFileChain(file, chain, { concurrency: Number(mode.slice('verify'.length)) });
    } else {
      throw new Error(`unknown child mode ${mode}`);
    }
  }
  const seconds = Number(process.hrtime.bigint() - start) / 1e9;
  console.log(JSON.stringify({ seconds, checksum, maxRssKiB: process.resourceUsage().maxRSS }));
  process.exit(0);
}

// ---- parent ----
function arg(name, dflt) {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? Number(process.argv[i + 1]) : dflt;
}
const dataMiB = arg('data-mib', 1024);
const holeMiB = arg('hole-mib', 1024);
const runs = arg('runs', 3);
const PIECE = 64 * MiB;
const size = (dataMiB + holeMiB) * MiB;
await loadLibrary();

const haveTime = existsSync('/usr/bin/time');
const uptime = () => {
  const r = spawnSync('uptime', { encoding: 'utf8' });
  return r.status === 0 ? r.stdout.trim() : `load average ${loadavg().map((l) => l.toFixed(2)).join(', ')}`;
};

/** Runs argv, timing it from outside (wall clock); returns {seconds, checksum, maxRssKiB}. */
function measure(argv, parse) {
  const cmd = haveTime ? ['/usr/bin/time', '-v', ...argv] : argv;
  const start = process.hrtime.bigint();
  const r = spawnSync(cmd[0], cmd.slice(1), { encoding: 'utf8', maxBuffer: 16 * MiB });
  const wall = Number(process.hrtime.bigint() - start) / 1e9;
  if (r.status !== 0) throw new Error(`${argv.join(' ')} failed (${r.status ?? r.signal}): ${r.stderr}`);
  const rss = /Maximum resident set size \(kbytes\): (\d+)/.exec(r.stderr ?? '');
  const out = parse(r.stdout);
  return { seconds: out.seconds ?? wall, checksum: out.checksum, maxRssKiB: rss ? Number(rss[1]) : out.maxRssKiB };
}

const dir = await mkdtemp(path.join(tmpdir(), 'bench-sha512-chain-'));
const file = path.join(dir, 'image.raw');
const chainFile = path.join(dir, 'image.chain');
try {
  console.log(`creating ${file}: ${dataMiB} MiB data + ${holeMiB} MiB holes in ${PIECE / MiB} MiB pieces`);
  const fh = await open(file, 'w');
  await fh.truncate(size);
  let dataLeft = dataMiB * MiB;
  let holeLeft = holeMiB * MiB;
  for (let pos = 0; pos < size; ) {
    if (dataLeft > 0) {
      const n = Math.min(PIECE, dataLeft);
      for (let w = 0; w < n; w += 4 * MiB) await fh.write(randomBytes(Math.min(4 * MiB, n - w)), 0, Math.min(4 * MiB, n - w), pos + w);
      pos += n;
      dataLeft -= n;
    }
    const h = Math.min(PIECE, holeLeft);
    pos += h;
    holeLeft -= h;
  }
  await fh.sync();
  await fh.close();

  const sha512sum = () => measure(['sha512sum', file], (s) => ({ checksum: s.split(/\s+/)[0] }));
  const openssl = () => measure(['openssl', 'dgst', '-sha512', '-r', file], (s) => ({ checksum: s.split(/\s+/)[0] }));
  const child = (mode, extra) => () =>
    measure([process.execPath, scriptPath, '--child', mode, file, ...(extra ? [extra] : [])], (s) => JSON.parse(s));
  const methods = [
    ['sha512sum', sha512sum],
    ['openssl dgst -sha512', openssl],
    ['node createHash (1 MiB reads)', child('createHash')],
    ['computeFileChain (sequential)', child('compute', chainFile)],
    ['verifyFileChain concurrency 2', child('verify2', chainFile)],
    ['verifyFileChain concurrency 4', child('verify4', chainFile)],
  ];

  console.log('warming the page cache and writing the chain');
  sha512sum();
  child('compute', chainFile)();
  const loadBefore = uptime();
  console.log(`before: ${loadBefore}`);
  const results = new Map(methods.map(([name]) => [name, []]));
  for (let round = 0; round < runs; round++) {
    for (const [name, run] of methods) {
      const r = run();
      results.get(name).push(r);
      console.log(`  round ${round + 1} ${name}: ${r.seconds.toFixed(2)} s`);
    }
  }
  const loadAfter = uptime();
  console.log(`after: ${loadAfter}`);

  const sums = new Set([...results.values()].flat().map((r) => r.checksum));
  if (sums.size !== 1) throw new Error(`methods disagree on the checksum: ${[...sums].join(', ')}`);
  const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
  const refMedian = median(results.get('sha512sum').map((r) => r.seconds));
  console.log(`\nimage ${size} bytes (${dataMiB} MiB data, ${holeMiB} MiB holes), ${runs} rounds, ${cpus().length} cores, ` +
    `UV_THREADPOOL_SIZE=${process.env.UV_THREADPOOL_SIZE ?? '4 (default)'}; all methods: sha512 ${[...sums][0].slice(0, 16)}…`);
  console.log('| method | seconds median (min–max) | GB/s | time / sha512sum | max RSS MiB |');
  console.log('|---|---|---|---|---|');
  for (const [name] of methods) {
    const rs = results.get(name);
    const secs = rs.map((r) => r.seconds);
    const med = median(secs);
    const rss = Math.max(...rs.map((r) => r.maxRssKiB ?? 0)) / 1024;
    console.log(
      `| ${name} | ${med.toFixed(2)} (${Math.min(...secs).toFixed(2)}–${Math.max(...secs).toFixed(2)}) | ` +
        `${(size / med / 1e9).toFixed(2)} | ${(med / refMedian).toFixed(2)} | ${rss.toFixed(0)} |`,
    );
  }
} finally {
  await rm(dir, { recursive: true, force: true });
}
