#!/usr/bin/env node
// bictl upload / download through the standalone system's REST API, against curl doing the same requests.
//
//   node tools/bench/bictl-transfer.mjs [--mib 256] [--runs 3]
//
// Needs the built apps (npx nx run-many -t build -p bictl controller-manager backing-image-manager
// backing-image-data-source). Starts `controller-manager standalone` on a free port with a fresh data dir (1 disk),
// writes a file of random data (a multiple of 512 bytes), then per run:
//   upload:   bictl image upload (resumable 8 MiB parts)  vs  curl -F chunk=@file "...?action=upload&size=N",
//             both timed from when the image's upload server is up
//   download: bictl image download (gunzip + SHA-512 + write, one pass)  vs
//             curl -s URL | gunzip > file  followed by sha512sum file
// Each command runs under /usr/bin/time -v for its max RSS. Everything is removed at the end.
import { spawn } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { createWriteStream } from 'node:fs';
import { mkdtemp, rm, stat } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { parseArgs } from 'node:util';

const { values } = parseArgs({ options: { mib: { type: 'string', default: '256' }, runs: { type: 'string', default: '3' } } });
const MIB = Number(values.mib);
const RUNS = Number(values.runs);
const root = resolve(import.meta.dirname, '../..');
const BICTL = join(root, 'apps/bictl/bin/bictl.js');
const CM = join(root, 'apps/controller-manager/bin/controller-manager.js');

function run(cmd, args, opts = {}) {
  return new Promise((res, rej) => {
    const t0 = process.hrtime.bigint();
    const child = spawn('/usr/bin/time', ['-v', cmd, ...args], { stdio: ['ignore', opts.stdout ?? 'ignore', 'pipe'], env: { ...process.env, NODE_OPTIONS: '' } });
    let err = '';
    child.stderr.on('data', (d) => (err += d));
    child.on('error', rej);
    child.on('close', (code) => {
      const secs = Number(process.hrtime.bigint() - t0) / 1e9;
      const rss = Number(/Maximum resident set size \(kbytes\): (\d+)/.exec(err)?.[1] ?? 0) / 1024;
      if (code !== 0) return rej(new Error(`${cmd} ${args.join(' ')} exited ${code}: ${err.slice(-800)}`));
      res({ secs, rss });
    });
  });
}

async function api(base, method, path, body) {
  const res = await fetch(base + path, { method, headers: body ? { 'content-type': 'application/json' } : {}, body: body ? JSON.stringify(body) : undefined });
  const text = await res.text();
  if (!res.ok) throw new Error(`${method} ${path}: ${res.status} ${text}`);
  return text ? JSON.parse(text) : undefined;
}

async function waitReady(base, name) {
  for (let i = 0; i < 1200; i++) {
    const bi = await api(base, 'GET', `/v1/backingimages/${name}`);
    if (bi.currentChecksum && Object.values(bi.diskFileStatusMap).some((f) => f.state === 'ready')) return bi;
    const failed = Object.values(bi.diskFileStatusMap).find((f) => f.state.startsWith('failed'));
    if (failed) throw new Error(`${name}: ${failed.message}`);
    await new Promise((r) => setTimeout(r, 250));
  }
  throw new Error(`${name} did not become ready`);
}

async function waitUploadable(base, name) {
  for (let i = 0; i < 240; i++) {
    try {
      await api(base, 'POST', `/v1/backingimages/${name}?action=uploadOffset`);
      return;
    } catch {
      await new Promise((r) => setTimeout(r, 250));
    }
  }
  throw new Error(`upload server of ${name} did not come up`);
}

const stats = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return `${s[0].toFixed(1)} / ${s[Math.floor(s.length / 2)].toFixed(1)} / ${s[s.length - 1].toFixed(1)}`;
};

const dir = await mkdtemp(join(tmpdir(), 'bictl-bench-'));
const dataDir = join(dir, 'system');
const cm = spawn(process.execPath, [CM, 'standalone', '--data-dir', dataDir, '--listen', '127.0.0.1:0', '--disks', '1'], { stdio: ['ignore', 'pipe', 'inherit'] });
try {
  const base = await new Promise((res, rej) => {
    let out = '';
    cm.stdout.on('data', (d) => {
      out += d;
      const m = /REST API:\s+(http:\/\/\S+?)\/v1/.exec(out);
      if (m) res(m[1]);
    });
    cm.once('exit', (c) => rej(new Error(`controller-manager exited ${c}: ${out}`)));
  });
  const file = join(dir, 'image.raw');
  const hash = createHash('sha512');
  await new Promise((res, rej) => {
    const ws = createWriteStream(file);
    let left = MIB;
    const write = () => {
      while (left > 0) {
        const chunk = randomBytes(1 << 20);
        hash.update(chunk);
        left--;
        if (!ws.write(chunk)) return ws.once('drain', write);
      }
      ws.end(res);
    };
    ws.on('error', rej);
    write();
  });
  const size = (await stat(file)).size;
  const sum = hash.digest('hex');
  const mb = size / 1e6;
  console.log(`file: ${MIB} MiB random data; system at ${base}; ${RUNS} runs`);
  const r = { bictlUp: [], curlUp: [], bictlDown: [], curlDown: [], rss: { bictlUp: 0, bictlDown: 0, curlUp: 0, curlDown: 0 } };
  for (let i = 0; i < RUNS; i++) {
    const a = `b-up-${i}`;
    // Both clients start once the image's upload server is up (bictl then continues the existing image at offset 0).
    await api(base, 'POST', '/v1/backingimages', { name: a, sourceType: 'upload', parameters: {}, expectedChecksum: sum, minNumberOfCopies: 1 });
    await waitUploadable(base, a);
    const up = await run(process.execPath, [BICTL, 'image', 'upload', a, file, '--checksum', sum, '--min-copies', '1', '--server', base]);
    await waitReady(base, a);
    r.bictlUp.push(mb / up.secs);
    r.rss.bictlUp = Math.max(r.rss.bictlUp, up.rss);

    const c = `c-up-${i}`;
    await api(base, 'POST', '/v1/backingimages', { name: c, sourceType: 'upload', parameters: {}, expectedChecksum: sum, minNumberOfCopies: 1 });
    await waitUploadable(base, c);
    const cu = await run('curl', ['-sSf', '-o', '/dev/null', '-F', `chunk=@${file}`, `${base}/v1/backingimages/${c}?action=upload&size=${size}`]);
    await waitReady(base, c);
    r.curlUp.push(mb / cu.secs);
    r.rss.curlUp = Math.max(r.rss.curlUp, cu.rss);

    const out = join(dir, `down-${i}.raw`);
    const down = await run(process.execPath, [BICTL, 'image', 'download', a, out, '--server', base]);
    r.bictlDown.push(mb / down.secs);
    r.rss.bictlDown = Math.max(r.rss.bictlDown, down.rss);
    await rm(out);

    const cd = await run('sh', ['-c', `curl -sSf "${base}/v1/backingimages/${a}/download" | gunzip > "${out}" && sha512sum "${out}" | grep -q ${sum}`]);
    r.curlDown.push(mb / cd.secs);
    r.rss.curlDown = Math.max(r.rss.curlDown, cd.rss);
    await rm(out);
    for (const n of [a, c]) await api(base, 'DELETE', `/v1/backingimages/${n}`);
  }
  const med = (xs) => [...xs].sort((x, y) => x - y)[Math.floor(xs.length / 2)];
  console.log('MB/s (10^6 B/s), min / median / max, wall time of the client process including waiting for the server:');
  console.log(`upload   bictl (resumable parts)        ${stats(r.bictlUp)}   max RSS ${r.rss.bictlUp.toFixed(0)} MiB`);
  console.log(`upload   curl -F (one multipart request) ${stats(r.curlUp)}   max RSS ${r.rss.curlUp.toFixed(0)} MiB`);
  console.log(`download bictl (gunzip+sha512+write)     ${stats(r.bictlDown)}   max RSS ${r.rss.bictlDown.toFixed(0)} MiB`);
  console.log(`download curl | gunzip ; sha512sum       ${stats(r.curlDown)}   max RSS ${r.rss.curlDown.toFixed(0)} MiB (of sh)`);
  console.log(`ratio bictl/curl (median): upload ${(med(r.bictlUp) / med(r.curlUp)).toFixed(2)}, download ${(med(r.bictlDown) / med(r.curlDown)).toFixed(2)}`);
} finally {
  cm.kill('SIGTERM');
  await new Promise((r) => (cm.exitCode !== null ? r() : cm.once('exit', r)));
  await rm(dir, { recursive: true, force: true });
}
