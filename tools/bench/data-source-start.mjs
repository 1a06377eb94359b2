#!/usr/bin/env node
// Start cost of one `backing-image-data-source` process (the control plane starts one per image being prepared).
//
//   node tools/bench/data-source-start.mjs [--runs N] [--source-type download|upload] [--bin path [--bin path]...]
//
// Needs the built app (`npx nx run backing-image-data-source:build`). `--bin` (repeatable) measures other builds of the
// data-source binary as well, interleaved run by run (e.g. a checkout of an earlier commit). Per run it measures:
//  - `--help` (parse, print usage, exit 2) under /usr/bin/time -v: CPU seconds (user+sys) and max RSS;
//  - a real start of a data source until its HTTP API answers `GET /v1/file` (the download source fetches a 1 MiB
//    image from a local HTTP server): wall time to "listening", CPU seconds used by then (/proc/<pid>/stat) and the
//    peak RSS by then (VmHWM from /proc/<pid>/status);
//  - once, the modules loaded by then (an ES module load hook plus the CommonJS module cache, recorded at exit),
//    grouped by package.
// Reference in the same run: `node -e 0` (the bare Node start) measured the same way.
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:http';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const args = process.argv.slice(2);
const bins = args.flatMap((a, i) => (a === '--bin' ? [path.resolve(args[i + 1])] : []));
if (bins.length === 0) bins.push(path.join(root, 'apps/backing-image-data-source/bin/backing-image-data-source.js'));
const opt = (name, dflt) => {
  const i = args.indexOf(`--${name}`);
  return i >= 0 ? args[i + 1] : dflt;
};
const runs = Number(opt('runs', '5'));
const sourceType = opt('source-type', 'download');
const CLK_TCK = Number(spawnSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).stdout.trim() || '100');

const tmp = mkdtempSync(path.join(os.tmpdir(), 'ds-start-'));
const image = Buffer.alloc(1 << 20, 7);
const origin = createServer((_req, res) => {
  res.writeHead(200, { 'content-length': String(image.length), 'content-type': 'application/octet-stream' });
  res.end(image);
});
await new Promise((r) => origin.listen(0, '127.0.0.1', r));
const originPort = origin.address().port;

function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

function procCpuSeconds(pid) {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return (Number(f[11]) + Number(f[12])) / CLK_TCK; // utime, stime (fields 14, 15)
}
function procHwmMiB(pid) {
  const m = /VmHWM:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m ? Number(m[1]) / 1024 : NaN;
}

function timeV(cmd, cmdArgs) {
  const r = spawnSync('/usr/bin/time', ['-v', cmd, ...cmdArgs], { encoding: 'utf8' });
  const num = (re) => Number(re.exec(r.stderr)?.[1] ?? NaN);
  return {
    cpu: num(/User time \(seconds\): ([\d.]+)/) + num(/System time \(seconds\): ([\d.]+)/),
    rssMiB: num(/Maximum resident set size \(kbytes\): (\d+)/) / 1024,
    wall: (() => {
      const m = /Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (?:(\d+):)?(\d+):([\d.]+)/.exec(r.stderr);
      return m ? Number(m[1] ?? 0) * 3600 + Number(m[2]) * 60 + Number(m[3]) : NaN;
    })(),
  };
}

const HOOK = `
import { appendFileSync } from 'node:fs';
let out;
export function initialize(data) { out = data.out; }
export async function load(url, context, next) { appendFileSync(out, 'esm ' + url + '\\n'); return next(url, context); }
`;
const PRELOAD = `
import { register, createRequire } from 'node:module';
import { appendFileSync } from 'node:fs';
const out = process.env.DS_START_MODULES_OUT;
register('data:text/javascript,' + encodeURIComponent(${JSON.stringify(HOOK)}), { data: { out } });
process.on('exit', () => {
  const cache = createRequire(import.meta.url).cache;
  appendFileSync(out, Object.keys(cache).map((k) => 'cjs file://' + k + '\\n').join(''));
});
`;
const preloadPath = path.join(tmp, 'modules-preload.mjs');
writeFileSync(preloadPath, PRELOAD);

async function startOnce(bin, nodeArgs, extraEnv = {}) {
  const [http, sync] = [await freePort(), await freePort()];
  const disk = mkdtempSync(path.join(tmp, 'disk-'));
  const dsArgs = [
    ...nodeArgs, bin,
    '--listen', `127.0.0.1:${http}`, '--sync-listen', `127.0.0.1:${sync}`, '--disk-path', disk,
    '--name', 'bench', '--uuid', 'b0', '--source-type', sourceType,
    ...(sourceType === 'download'
      ? ['--parameters', `url=http://127.0.0.1:${originPort}/image.raw`, '--allow-source-hosts', '127.0.0.1']
      : []),
  ];
  const t0 = process.hrtime.bigint();
  const child = spawn(process.execPath, dsArgs, { stdio: ['ignore', 'ignore', 'pipe'], env: { ...process.env, ...extraEnv } });
  let stderr = '';
  child.stderr.on('data', (d) => (stderr += d));
  const exited = new Promise((r) => child.once('exit', (code, sig) => r({ code, sig })));
  let answered = false;
  while (!answered) {
    if (child.exitCode !== null) throw new Error(`data source exited early: ${stderr}`);
    answered = await fetch(`http://127.0.0.1:${http}/v1/file`).then((r) => r.ok, () => false);
    if (!answered) await new Promise((r) => setTimeout(r, 5));
  }
  const wall = Number(process.hrtime.bigint() - t0) / 1e9;
  const cpu = procCpuSeconds(child.pid);
  const rssMiB = procHwmMiB(child.pid);
  child.kill('SIGTERM');
  const ex = await exited;
  rmSync(disk, { recursive: true, force: true });
  return { wall, cpu, rssMiB, exit: ex };
}

async function bareNode() {
  return timeV(process.execPath, ['-e', '0']);
}

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)];
};
const fmt = (xs, d = 3) => `${median(xs).toFixed(d)} (${Math.min(...xs).toFixed(d)}–${Math.max(...xs).toFixed(d)})`;

const res = bins.map(() => ({ help: [], start: [] }));
const bare = [];
for (let i = 0; i < runs; i++) {
  bare.push(await bareNode());
  for (const [b, bin] of bins.entries()) {
    res[b].help.push(timeV(process.execPath, [bin, '--help']));
    res[b].start.push(await startOnce(bin, []));
  }
}

// Module list at "listening" (recorded at exit after SIGTERM; shutdown loads nothing new).
const modules = [];
for (const bin of bins) {
  const modulesOut = path.join(tmp, 'modules.txt');
  writeFileSync(modulesOut, '');
  await startOnce(bin, ['--import', preloadPath], { DS_START_MODULES_OUT: modulesOut });
  const urls = new Set(
    readFileSync(modulesOut, 'utf8').split('\n').filter(Boolean).map((l) => l.slice(l.indexOf(' ') + 1))
      .filter((u) => u.startsWith('file://') && !u.endsWith('modules-preload.mjs')),
  );
  const binRoot = path.resolve(path.dirname(bin), '../../..');
  const groups = new Map();
  for (const u of urls) {
    const p = fileURLToPath(u);
    const nm = p.lastIndexOf('/node_modules/');
    let key;
    if (nm >= 0) {
      const rest = p.slice(nm + 14).split('/');
      key = rest[0].startsWith('@') ? `${rest[0]}/${rest[1]}` : rest[0];
    } else {
      const rel = path.relative(binRoot, p).split(path.sep);
      key = rel[0] === 'libs' || rel[0] === 'apps' ? `${rel[0]}/${rel[1]}` : rel.join('/');
    }
    groups.set(key, (groups.get(key) ?? 0) + 1);
  }
  modules.push({ count: urls.size, groups });
}

origin.close();
rmSync(tmp, { recursive: true, force: true });

console.log(`uptime: ${os.loadavg().map((l) => l.toFixed(2)).join(' ')} (load average), ${os.cpus().length} CPUs, node ${process.version}`);
console.log(`runs: ${runs}; median (min–max); CPU and max RSS of the data source at the moment its API first answers`);
console.log('| binary | measurement | CPU s | wall s | max RSS MiB | modules |');
console.log('|---|---|---|---|---|---|');
console.log(`| – | node -e 0 (reference) | ${fmt(bare.map((r) => r.cpu), 2)} | ${fmt(bare.map((r) => r.wall), 2)} | ${fmt(bare.map((r) => r.rssMiB), 1)} | – |`);
for (const [b, bin] of bins.entries()) {
  const name = path.relative(process.cwd(), bin) || bin;
  const r = res[b];
  console.log(`| ${name} | --help | ${fmt(r.help.map((x) => x.cpu), 2)} | ${fmt(r.help.map((x) => x.wall), 2)} | ${fmt(r.help.map((x) => x.rssMiB), 1)} | – |`);
  console.log(`| ${name} | ${sourceType} to listening | ${fmt(r.start.map((x) => x.cpu), 2)} | ${fmt(r.start.map((x) => x.wall), 3)} | ${fmt(r.start.map((x) => x.rssMiB), 1)} | ${modules[b].count} |`);
}
for (const [b, bin] of bins.entries()) {
  console.log(`modules loaded by listening, ${path.relative(process.cwd(), bin) || bin}: ${modules[b].count}`);
  console.log('  ' + [...modules[b].groups].sort((x, y) => y[1] - x[1]).map(([k, n]) => `${k} ${n}`).join(', '));
}
