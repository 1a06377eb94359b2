/**
 * The built `bictl` binary (apps/bictl/bin/bictl.js → dist) run as a child process against a live REST API on
 * loopback: output formats, exit codes, waiting, resumable upload across two runs, TTY progress bars, download
 * verification.
 */
import { spawn } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { mkdtemp, readFile, rm, writeFile, readdir } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { describe, it, expect, beforeAll, afterAll } from '@jest/globals';
import { BisClient } from '@bis/api-client';
import { startApiDouble, startFileServer, startFlakyProxy, type ApiDouble } from '@bis/api-client/test-support';

const BIN = resolve(import.meta.dirname, '../bin/bictl.js');

interface Result {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** Runs a command asynchronously (the API lives in this process, so a synchronous spawn would deadlock). */
function exec(cmd: string, args: string[], env: Record<string, string> = {}): Promise<Result & { raw: Buffer }> {
  return new Promise((res, rej) => {
    const child = spawn(cmd, args, { env: { ...process.env, NODE_OPTIONS: '', ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
    const out: Buffer[] = [];
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => out.push(d));
    child.stderr.on('data', (d: Buffer) => (stderr += d));
    child.on('error', rej);
    child.on('close', (code) => {
      const raw = Buffer.concat(out);
      res({ code, stdout: raw.toString('utf8'), stderr, raw });
    });
  });
}
const bictl = (args: string[], env: Record<string, string> = {}): Promise<Result> => exec(process.execPath, [BIN, ...args], env);

describe('bictl against a live API', () => {
  let api: ApiDouble;
  let files: { url: string; close(): Promise<void> };
  let dir: string;
  let S: string[];
  const image = randomBytes(5 << 20);
  const sha512 = createHash('sha512').update(image).digest('hex');

  beforeAll(async () => {
    api = await startApiDouble({ disks: 3, stepMs: 30 });
    files = await startFileServer({ '/a.raw': image });
    dir = await mkdtemp(join(tmpdir(), 'bictl-'));
    S = ['--server', api.url];
  });
  afterAll(async () => {
    await files.close();
    await api.close();
    await rm(dir, { recursive: true, force: true });
  });

  it('prints help and rejects bad usage with exit code 2', async () => {
    const help = await bictl(['--help']);
    expect(help.code).toBe(0);
    expect(help.stdout).toContain('image upload');
    expect((await bictl([])).code).toBe(2);
    const unknown = await bictl(['image', 'explode']);
    expect(unknown.code).toBe(2);
    expect(unknown.stderr).toContain('unknown command "image explode"');
    const both = await bictl(['image', 'create', 'x', ...S]);
    expect(both.code).toBe(2);
    expect(both.stderr).toContain('give exactly one source: --url URL or --from-image IMAGE');
    const sum = await bictl(['image', 'create', 'x', '--url', 'http://h/x', '--checksum', 'sha256:abc', ...S]);
    expect(sum.code).toBe(2);
    expect(sum.stderr).toContain('--checksum: a sha256 checksum has 64 hex characters, got 3');
    const misplaced = await bictl(['image', 'ls', '--disk', 'x', ...S]);
    expect(misplaced.code).toBe(2);
    expect(misplaced.stderr).toContain('option --disk does not apply to "bictl image ls"');
    expect((await bictl(['image', 'ls', '-o', 'xml', ...S])).code).toBe(2);
  });

  it('exits 3 for a missing image and 5 for an unreachable server', async () => {
    const nf = await bictl(['image', 'get', 'nope', ...S]);
    expect(nf.code).toBe(3);
    expect(nf.stderr).toContain('"nope" not found');
    const down = await bictl(['image', 'ls'], { BICTL_SERVER: 'http://127.0.0.1:9' });
    expect(down.code).toBe(5);
  });

  it('creates from a URL with --wait and lists it as table, json and yaml', async () => {
    const c = await bictl(['image', 'create', 'base', '--url', `${files.url}/a.raw`, '--checksum', sha512, '--min-copies', '2', '--wait', ...S]);
    expect(c.stderr).toBe('');
    expect(c.code).toBe(0);
    expect(c.stdout).toBe('backing image base is ready (2/2 ready)\n');
    const t = await bictl(['image', 'ls'], { BICTL_SERVER: api.url });
    expect(t.stdout.split('\n')[0]).toMatch(/^NAME\s+SIZE\s+VIRTUAL-SIZE\s+SOURCE\s+STATE\s+COPIES\s+PROGRESS$/);
    expect(t.stdout).toMatch(/base\s+5\.00 MiB\s+5\.00 MiB\s+download http:\/\/127\.0\.0\.1:\d+\/a\.raw\s+ready\s+2\/2\s+100%/);
    const j = JSON.parse((await bictl(['image', 'get', 'base', '-o', 'json', ...S])).stdout);
    expect(j.currentChecksum).toBe(sha512);
    expect(Object.keys(j.diskFileStatusMap)).toHaveLength(2);
    const y = (await bictl(['image', 'get', 'base', '-o', 'yaml', ...S])).stdout;
    // hex starting with a digit is quoted (it could read as a number), otherwise plain
    expect(y).toContain(`currentChecksum: ${/^\d/.test(sha512) ? JSON.stringify(sha512) : sha512}\n`);
    expect(y).toMatch(/^diskFileStatusMap:\n {2}disk-uuid-1:\n {4}dataEngine: v1\n/m);
    expect(y).toContain('deletionTimestamp: ""');
  });

  it('exits 1 with the copy message when the checksum does not match, and 4 when --wait times out', async () => {
    const bad = await bictl(['image', 'create', 'bad', '--url', `${files.url}/a.raw`, '--checksum', 'f'.repeat(128), '--wait', ...S]);
    expect(bad.code).toBe(1);
    expect(bad.stderr).toContain(`every copy of backing image bad failed: the expected checksum ${'f'.repeat(128)} doesn't match the file actual checksum ${sha512}`);
    const slow = await bictl(['image', 'create', 'slow', '--url', `${files.url}/a.raw`, '--wait', '--timeout', '10ms', ...S]);
    expect(slow.code).toBe(4);
    expect(slow.stderr).toContain('timed out');
  });

  it('resumes an upload interrupted by SIGINT when run again', async () => {
    const big = randomBytes(24 << 20);
    const path = join(dir, 'big.img');
    await writeFile(path, big);
    const proxy = await startFlakyProxy(api.url, { cutAfterBytes: 10 << 20, cuts: 1, stall: true });
    const client = new BisClient({ server: api.url });
    try {
      const child = spawn(process.execPath, [BIN, 'image', 'upload', 'up', path, '--server', proxy.url], { env: { ...process.env, NODE_OPTIONS: '' }, stdio: ['ignore', 'pipe', 'pipe'] });
      let stderr = '';
      child.stderr.on('data', (d: Buffer) => (stderr += d));
      const exited = new Promise<number | null>((r) => child.on('close', r));
      // Wait until the server holds part of the upload and the network hangs, then interrupt.
      for (let i = 0; i < 200; i++) {
        const off = await client.uploadOffset('up').catch(() => ({ offset: 0 }));
        if (off.offset > 0 && proxy.cutsDone() === 1) break;
        await new Promise((r) => setTimeout(r, 50));
      }
      const held = (await client.uploadOffset('up')).offset;
      expect(held).toBeGreaterThan(0);
      expect(held).toBeLessThan(big.length);
      child.kill('SIGINT');
      expect(await exited).toBe(130);
      expect(stderr).toMatch(/upload interrupted at \d+ of 25165824 bytes; run the same command again to resume/);
    } finally {
      await proxy.close();
    }
    const again = await bictl(['image', 'upload', 'up', path, '--wait', ...S]);
    expect(again.stderr).toContain('resuming the upload of up');
    expect(again.code).toBe(0);
    expect(again.stdout).toContain('uploaded 24.0 MiB to backing image up (1/1 ready)');
    expect((await client.getBackingImage('up')).currentChecksum).toBe(createHash('sha512').update(big).digest('hex'));
    const twice = await bictl(['image', 'upload', 'up', path, ...S]);
    expect(twice.code).toBe(1);
    expect(twice.stderr).toContain('has already been uploaded');
  });

  it('draws progress bars with throughput and ETA on a terminal only', async () => {
    const path = join(dir, 'tty.img');
    await writeFile(path, image);
    const cmd = [process.execPath, BIN, 'image', 'upload', 'tty-up', path, '--server', api.url].map((a) => `'${a}'`).join(' ');
    const tty = await exec('script', ['-qec', cmd, '/dev/null']);
    expect(tty.code).toBe(0);
    expect(tty.stdout).toMatch(/tty-up \[#+-*\]\s+\d+%\s+[\d.]+ (B|KiB|MiB)\/5\.00 MiB\s+[\d.]+ (B|KiB|MiB|GiB)\/s\s+ETA /);
    expect(tty.stdout).toMatch(/tty-up \[#{24}\] 100%/);
    const piped = await bictl(['image', 'download', 'base', join(dir, 'piped.img'), ...S]);
    expect(piped.code).toBe(0);
    expect(piped.stderr).toBe(`downloaded 5.00 MiB to ${join(dir, 'piped.img')} (SHA-512 verified)\n`);
  });

  it('downloads to a file or stdout with SHA-512 verification and leaves no partial file on failure', async () => {
    const out = join(dir, 'base.img');
    const d = await bictl(['image', 'download', 'base', out, ...S]);
    expect(d.code).toBe(0);
    expect(createHash('sha512').update(await readFile(out)).digest('hex')).toBe(sha512);
    const child = await exec(process.execPath, [BIN, 'image', 'download', 'base', '-', ...S]);
    expect(child.code).toBe(0);
    expect(createHash('sha512').update(child.raw).digest('hex')).toBe(sha512);
    const failed = await bictl(['image', 'download', 'bad', join(dir, 'bad.img'), ...S]);
    expect(failed.code).toBe(1);
    expect(failed.stderr).toContain('backing image bad has no ready copy to download yet (copies: ');
    expect((await readdir(dir)).filter((f) => f.startsWith('bad'))).toEqual([]);
    // A destination in a folder that does not exist: said in words with what to do, not a raw `ENOENT … x.part`.
    const nowhere = join(dir, 'no-such-folder', 'x.img');
    const missing = await bictl(['image', 'download', 'base', nowhere, ...S]);
    expect(missing.code).toBe(1);
    expect(missing.stderr).toBe(`bictl: cannot save to ${nowhere}: the folder ${join(dir, 'no-such-folder')} does not exist; create it (mkdir -p ${join(dir, 'no-such-folder')}) or give a path in an existing folder\n`);
    expect(missing.stderr).not.toContain('ENOENT');
    expect(missing.stderr).not.toContain('.part');
  });

  it('cleans up a disk, changes min copies, backs up, restores and removes', async () => {
    const refused = await bictl(['image', 'cleanup', 'base', '--disk', 'disk-uuid-1', ...S]);
    expect(refused.code).toBe(1);
    expect(refused.stderr).toContain('no enough ready files for HA');
    expect((await bictl(['image', 'min-copies', 'base', '1', ...S])).stdout).toBe('backing image base now keeps at least 1 copies\n');
    expect((await bictl(['image', 'min-copies', 'base', '0', ...S])).code).toBe(2);
    const unknown = await bictl(['image', 'cleanup', 'base', '--disk', 'disk-uuid-2', '--disk', 'no-such-disk', ...S]);
    expect(unknown.code).toBe(3);
    expect(unknown.stdout).toBe('');
    expect(unknown.stderr).toContain('backing image base has no copy on disk no-such-disk; its copies are on disk-uuid-1, disk-uuid-2');
    const ok = await bictl(['image', 'cleanup', 'base', '--disk', 'disk-uuid-2', ...S]);
    expect(ok.code).toBe(0);
    const j = JSON.parse((await bictl(['image', 'get', 'base', '-o', 'json', ...S])).stdout);
    expect(Object.keys(j.diskFileStatusMap)).toEqual(['disk-uuid-1']);

    const b = await bictl(['backup', 'create', 'base', '--wait', ...S]);
    expect(b.code).toBe(0);
    expect(b.stdout).toMatch(/^backup base-[0-9a-f]{8} of base completed\n$/);
    const bname = /backup (\S+)/.exec(b.stdout)![1];
    const ls = await bictl(['backup', 'ls', ...S]);
    expect(ls.stdout).toMatch(new RegExp(`${bname}\\s+base\\s+default\\s+5\\.00 MiB\\s+Completed\\s+100%`));
    const exists = await bictl(['backup', 'restore', bname, ...S]);
    expect(exists.code).toBe(1);
    expect(exists.stderr).toContain('backing image base already exists');
    const rmImg = await bictl(['image', 'rm', 'base', '--wait', ...S]);
    expect(rmImg.stdout).toBe('backing image base deleted\n');
    const r = await bictl(['backup', 'restore', bname, '--wait', ...S]);
    expect(r.code).toBe(0);
    expect(r.stdout).toBe(`backing image base restored from ${bname}\n`);
    expect((await bictl(['backup', 'rm', bname, ...S])).code).toBe(0);
    expect((await bictl(['backup', 'get', bname, ...S])).code).toBe(3);
  });

  it('lists and evicts nodes', async () => {
    const ls = await bictl(['node', 'ls', ...S]);
    expect(ls.stdout).toMatch(/node-1\s+true\s+false\s+disk-1\s+disk-uuid-1\s+10\.0 GiB\s+ok 2h ago\n/);
    // the SCRUB column: a corrupt copy found, with its message; no scrub yet
    expect(ls.stdout).toMatch(/^node\s+schedulable\s+eviction\s+disk\s+disk-uuid\s+available\s+scrub\n/i);
    expect(ls.stdout).toMatch(/disk-2\s+disk-uuid-2\s+10\.0 GiB\s+corrupted 5m ago: base: SHA-512 chain mismatch in segment 3\n/);
    expect(ls.stdout).toMatch(/disk-3\s+disk-uuid-3\s+10\.0 GiB\s+-\n/);
    const ev = await bictl(['node', 'evict', 'node-1', ...S]);
    expect(ev.stdout).toBe('eviction requested for node node-1\n');
    expect((await bictl(['node', 'evict', 'node-9', ...S])).code).toBe(3);
  });
});
