#!/usr/bin/env node
// Checks our ssync receiver against a sender written with Go's net/http client (the client Longhorn's sparse-tools
// uses): builds tools/scripts/ssync-go-sender with `go` (not needed by the tests; install golang to run this), sends a
// sparse file with Content-Length bodies and with chunked bodies, and compares the SHA-512 of what arrived.
// Usage: node tools/scripts/ssync-go-check.mjs [sizeMiB=64]
import { execFile, execFileSync } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { createReadStream, promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { fileURLToPath } from 'node:url';

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
execFileSync(process.execPath, [path.join(repo, 'node_modules/typescript/bin/tsc'), '-b', path.join(repo, 'libs/sync-service/tsconfig.lib.json')], { stdio: 'inherit' });
const { startSsyncReceiver } = await import(path.join(repo, 'libs/sync-service/dist/index.js'));

const MiB = 1 << 20;
const size = Number(process.argv[2] ?? 64) * MiB + 12345; // an odd tail after the last whole batch
const dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'ssync-go-'));
const sha512 = (file) =>
  new Promise((resolve, reject) => {
    const h = createHash('sha512');
    createReadStream(file).on('data', (c) => h.update(c)).on('end', () => resolve(h.digest('hex'))).on('error', reject);
  });
try {
  const sender = path.join(dir, 'ssync-go-sender');
  execFileSync('go', ['build', '-o', sender, '.'], { cwd: path.join(repo, 'tools/scripts/ssync-go-sender'), stdio: 'inherit', env: { ...process.env, GOFLAGS: '-mod=mod' } });
  // 4 MiB of data, 4 MiB of holes, alternating, then the tail
  const src = path.join(dir, 'src');
  const fh = await fsp.open(src, 'w');
  await fh.truncate(size);
  for (let off = 0; off + 4 * MiB <= size; off += 8 * MiB) await fh.write(randomBytes(4 * MiB), 0, 4 * MiB, off);
  await fh.write(randomBytes(12345), 0, 12345, size - 12345);
  await fh.close();
  const want = await sha512(src);
  let failed = false;
  for (const mode of ['content-length', 'chunked']) {
    const dst = path.join(dir, `dst-${mode}`);
    const rx = await startSsyncReceiver({ port: 0, host: '127.0.0.1', filePath: dst, size, computeChecksum: true });
    const t = performance.now();
    const run = promisify(execFile)(sender, ['-file', src, '-to', `127.0.0.1:${rx.port}`, ...(mode === 'chunked' ? ['-chunked'] : [])]);
    const [out, got] = await Promise.all([run, rx.done]);
    await rx.closed;
    const arrived = await sha512(dst);
    const ok = arrived === want && got.sha512 === want;
    failed ||= !ok;
    console.log(`${mode}: ${ok ? 'identical' : 'DIFFERENT'} (${((performance.now() - t) / 1000).toFixed(2)} s; sender ${out.stdout.trim()}; receiver ${got.dataBytes} data bytes, ${got.holeBytes} hole bytes, SHA-512 ${got.sha512?.slice(0, 16)}…)`);
  }
  if (failed) process.exitCode = 1;
} finally {
  await fsp.rm(dir, { recursive: true, force: true });
}
