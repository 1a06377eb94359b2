#!/usr/bin/env node
// Download benchmark for the data-source download path (@bis/file-sources built into dist/).
// Usage: node tools/bench/data-source-download.mjs [sizeMiB=2048] [runs=3]
// Serves a random file from a local Node HTTP server (1 MiB reads) and measures, in one run:
//   curl -o alone, sha512sum alone, `openssl dgst -sha512` alone (the machine's single-core SHA-512 speed), curl -o then sha512sum (Longhorn's order), and the data-source download
//   (got -> hash on a worker thread + sparse write, checksum verified) in a child process whose max RSS is reported.
// Each measurement runs `runs` times, interleaved; the median is reported (min/max alongside).
import { createServer } from 'node:http';
import { createReadStream, createWriteStream } from 'node:fs';
import { mkdtemp, rm, stat } from 'node:fs/promises';
import { readdirSync, readFileSync } from 'node:fs';
import { execFileSync, spawn } from 'node:child_process';
import { tmpdir } from 'node:os';
import { join, dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { randomBytes } from 'node:crypto';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
const sizeMiB = Number(process.argv[2] ?? 2048);
const runs = Number(process.argv[3] ?? 3);
const dir = await mkdtemp(join(tmpdir(), 'ds-bench-'));
const src = join(dir, 'src.img');
try {
  const { describeMachine } = await import('./machine.mjs');
  const { DATA_SOURCE_MALLOC_ENV } = await import(join(root, 'libs/controllers/dist/data-plane.js'));
  console.log(await describeMachine(root));
  const ws = createWriteStream(src);
  for (let i = 0; i < sizeMiB; i++) if (!ws.write(randomBytes(1 << 20))) await new Promise((r) => ws.once('drain', r));
  await new Promise((r) => ws.end(r));
  const srv = createServer((req, res) => {
    res.writeHead(200, { 'content-length': sizeMiB * 1048576, 'accept-ranges': 'bytes' });
    createReadStream(src, { highWaterMark: 1 << 20 }).pipe(res);
  });
  await new Promise((r) => srv.listen(0, '127.0.0.1', r));
  const url = `http://127.0.0.1:${srv.address().port}/img`;
  const sha = execFileSync('sha512sum', [src]).toString().split(' ')[0];
  const time = (fn) => { const t = process.hrtime.bigint(); fn(); return Number(process.hrtime.bigint() - t) / 1e9; };
  const out = join(dir, 'out.img');
  // Server runs in this process: run the clients as children so the event loop keeps serving.
  // Per-thread CPU of a child (user + system seconds by thread id), sampled from /proc every 50 ms: a thread's last
  // sample before it exits is kept (the hash worker ends before the process does).
  const threadCpu = (pid, into) => {
    try {
      for (const tid of readdirSync(`/proc/${pid}/task`)) {
        const stat = readFileSync(`/proc/${pid}/task/${tid}/stat`, 'utf8');
        const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
        into.set(tid, (Number(f[11]) + Number(f[12])) / 100);
      }
    } catch {
      // the process or thread ended between the listing and the read
    }
  };
  const runAsync = (cmd, args, env, threads) => new Promise((res, rej) => {
    const t = process.hrtime.bigint();
    const c = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'inherit'], ...(env ? { env: { ...process.env, ...env } } : {}) });
    const sampler = threads ? setInterval(() => threadCpu(c.pid, threads), 50) : undefined;
    let stdout = '';
    c.stdout.on('data', (d) => (stdout += d));
    c.on('close', (code) => {
      clearInterval(sampler);
      return code === 0 ? res({ s: Number(process.hrtime.bigint() - t) / 1e9, stdout }) : rej(new Error(`${cmd} exited ${code}`));
    });
  });
  const samples = { curl: [], sha512sum: [], openssl: [], curlThenSha: [], dataSource: [] };
  let maxRssKiB = 0;
  const threadSamples = [];
  const child = join(root, 'tools/bench/data-source-download-child.mjs');
  for (let i = 0; i < runs; i++) {
    await rm(out, { force: true });
    samples.curl.push((await runAsync('curl', ['-sS', '-o', out, url])).s);
    samples.sha512sum.push(time(() => execFileSync('sha512sum', [src])));
    samples.openssl.push(time(() => execFileSync('openssl', ['dgst', '-sha512', src])));
    await rm(out, { force: true });
    samples.curlThenSha.push((await runAsync('sh', ['-c', `curl -sS -o ${out} ${url} && sha512sum ${out}`])).s);
    await rm(out, { force: true });
    // The environment the data plane gives every data-source process (glibc malloc settings).
    const threads = new Map();
    const r = await runAsync('node', [child, url, out, sha], DATA_SOURCE_MALLOC_ENV, threads);
    const ds = JSON.parse(r.stdout.trim().split('\n').pop());
    // The busiest thread is the hash worker; the main thread (tid = pid) receives; the rest write and start up.
    const cpu = [...threads.entries()].sort((a, b) => b[1] - a[1]);
    const hashCpu = cpu[0]?.[1] ?? 0;
    const total = cpu.reduce((n, [, v]) => n + v, 0);
    threadSamples.push({ hash: hashCpu, other: total - hashCpu });
    samples.dataSource.push(ds.seconds);
    maxRssKiB = Math.max(maxRssKiB, ds.maxRssKiB);
    await rm(out, { force: true });
  }
  srv.close();
  const median = (a) => [...a].sort((x, y) => x - y)[Math.floor(a.length / 2)];
  const results = Object.fromEntries(Object.entries(samples).map(([k, v]) => [k, median(v)]));
  const best = Math.max(results.curl, results.sha512sum);
  const bestOpenssl = Math.max(results.curl, results.openssl);
  const mb = (s) => ((sizeMiB * 1048576) / s / 1e6).toFixed(0);
  console.log(`size ${sizeMiB} MiB, ${runs} runs (median; min / max)`);
  for (const [k, v] of Object.entries(results)) {
    const a = samples[k];
    console.log(`${k.padEnd(12)} ${v.toFixed(2)} s  ${mb(v)} MB/s   (${Math.min(...a).toFixed(2)} / ${Math.max(...a).toFixed(2)} s)`);
  }
  console.log(`data-source / max(curl, sha512sum) = ${(results.dataSource / best).toFixed(2)}`);
  console.log(`data-source / max(curl, openssl dgst -sha512) = ${(results.dataSource / bestOpenssl).toFixed(2)}  (goal <= 1.10)`);
  console.log(`data-source / (curl then sha512sum) = ${(results.dataSource / results.curlThenSha).toFixed(2)}`);
  const hashCpu = median(threadSamples.map((t) => t.hash));
  const otherCpu = median(threadSamples.map((t) => t.other));
  console.log(`data-source CPU (median): hash thread ${hashCpu.toFixed(2)} s, every other thread ${otherCpu.toFixed(2)} s`);
  console.log(`data-source max RSS ${(maxRssKiB / 1024).toFixed(0)} MiB (goal < 150 MB)`);
} finally {
  await rm(dir, { recursive: true, force: true });
}
