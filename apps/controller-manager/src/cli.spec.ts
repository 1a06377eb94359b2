import { spawn, execFileSync, type ChildProcess } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { mkdtemp, readFile, rm, stat, writeFile } from 'node:fs/promises';
import http from 'node:http';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { runStandaloneCli } from './cli.js';

const APP = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const BIN = path.join(APP, 'bin', 'controller-manager.js');

describe('controller-manager CLI', () => {
  it('answers usage errors with exit code 2', async () => {
    const err: string[] = [];
    const io = { out: () => {}, err: (l: string) => err.push(l) };
    expect(await runStandaloneCli([], io)).toBe(2);
    expect(await runStandaloneCli(['standalone', '--disks', '0'], io)).toBe(2);
    expect(await runStandaloneCli(['standalone', '--bogus'], io)).toBe(2);
    expect(await runStandaloneCli(['standalone', '--max-data-sources', 'x'], io)).toBe(2);
    expect(err.join('\n')).toContain('invalid --disks "0"');
    expect(err.join('\n')).toContain('usage: controller-manager standalone');
  });
});

describe('controller-manager standalone as a process', () => {
  let dir: string;
  let server: http.Server;
  let gets = 0;
  const data = randomBytes(512 * 1024);
  const sum = createHash('sha512').update(data).digest('hex');
  let url = '';

  beforeAll(async () => {
    await stat(path.join(APP, 'dist', 'main.js')); // built by the test target's dependencies
    dir = await mkdtemp(path.join(os.tmpdir(), 'bis-cm-cli-'));
    server = http.createServer((req, res) => {
      res.writeHead(200, { 'content-length': data.length });
      if (req.method === 'GET') gets++;
      res.end(req.method === 'HEAD' ? undefined : data);
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    url = `http://127.0.0.1:${(server.address() as { port: number }).port}/img.raw`;
  });

  afterAll(async () => {
    server?.closeAllConnections();
    await new Promise((r) => server?.close(r));
    await rm(dir, { recursive: true, force: true });
  });

  async function launch(extra: string[] = [], dataDir = path.join(dir, 'data')): Promise<{ proc: ChildProcess; api: string; out: () => string }> {
    const proc = spawn(process.execPath, [BIN, 'standalone', '--data-dir', dataDir, '--listen', '127.0.0.1:0', '--disks', '2', '--allow-source-hosts', '127.0.0.1', ...extra], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    proc.stdout!.on('data', (d) => (out += d));
    proc.stderr!.on('data', (d) => (out += d));
    const deadline = Date.now() + 30_000;
    while (!out.includes('Press Ctrl-C')) {
      if (proc.exitCode !== null || Date.now() > deadline) throw new Error(`controller-manager did not start: ${out}`);
      await new Promise((r) => setTimeout(r, 50));
    }
    const api = /REST API:\s+(\S+)\/v1/.exec(out)![1]!;
    return { proc, api, out: () => out };
  }

  const children = (pid: number): number[] => {
    try {
      return execFileSync('pgrep', ['-P', String(pid)]).toString().trim().split('\n').filter(Boolean).map(Number);
    } catch {
      return [];
    }
  };
  const alive = (pid: number) => {
    try {
      process.kill(pid, 0);
      return true;
    } catch {
      return false;
    }
  };
  async function readyCopies(api: string): Promise<number> {
    const r = await fetch(`${api}/v1/backingimages/img`);
    if (r.status !== 200) return 0;
    const b = (await r.json()) as { diskFileStatusMap: Record<string, { state: string }>; currentChecksum: string };
    return b.currentChecksum === sum ? Object.values(b.diskFileStatusMap).filter((s) => s.state === 'ready').length : 0;
  }
  async function until(what: string, fn: () => Promise<boolean>, ms = 60_000): Promise<void> {
    const deadline = Date.now() + ms;
    while (!(await fn())) {
      if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
      await new Promise((r) => setTimeout(r, 200));
    }
  }

  it('prints where everything is, stops every child on SIGINT, and a restart picks up where it was', async () => {
    const first = await launch();
    expect(first.out()).toContain(`data directory:  ${path.join(dir, 'data')}`);
    expect(first.out()).toContain('backup target:   vfs://');
    // the internal token: generated on the first start, mode 0600, given to every data-plane process
    const tokenFile = path.join(dir, 'data', 'internal-token');
    expect((await stat(tokenFile)).mode & 0o777).toBe(0o600);
    const token = (await readFile(tokenFile, 'utf8')).trim();
    expect(token.length).toBeGreaterThanOrEqual(40);
    const res = await fetch(`${first.api}/v1/backingimages`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ name: 'img', sourceType: 'download', parameters: { url }, expectedChecksum: sum, minNumberOfCopies: 2 }),
    });
    expect(res.status).toBe(200);
    await until('2 ready copies', async () => (await readyCopies(first.api)) === 2);
    const kids = children(first.proc.pid!);
    expect(kids.length).toBeGreaterThanOrEqual(2); // one manager per disk
    for (const k of kids) expect((await readFile(`/proc/${k}/cmdline`, 'utf8')).split('\0')).toContain(tokenFile);
    const exited = new Promise<number | null>((r) => first.proc.once('exit', (code) => r(code)));
    first.proc.kill('SIGINT');
    expect(await exited).toBe(0);
    expect(first.out()).toContain('stopped');
    expect(kids.filter(alive)).toEqual([]);

    const second = await launch();
    try {
      await until('ready again after restart', async () => (await readyCopies(second.api)) === 2);
      expect(gets).toBe(1);
      // the same token, still 0600
      expect((await readFile(tokenFile, 'utf8')).trim()).toBe(token);
      expect((await stat(tokenFile)).mode & 0o777).toBe(0o600);
    } finally {
      const done = new Promise((r) => second.proc.once('exit', r));
      second.proc.kill('SIGTERM');
      await done;
    }
  }, 120_000);

  it('logs JSON lines to controller-manager.log, readable lines to the terminal with --log-format pretty, and serves /metrics', async () => {
    const dataDir = path.join(dir, 'logs-data');
    const run = await launch(['--log-format', 'pretty', '--verbose'], dataDir);
    try {
      // A download that fails (wrong checksum): its data source's failure is a warning naming the image and the disk.
      const res = await fetch(`${run.api}/v1/backingimages`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ name: 'gone', sourceType: 'download', parameters: { url }, expectedChecksum: sum.slice(1) + sum[0], minNumberOfCopies: 1 }),
      });
      expect(res.status).toBe(200);
      await until('a warning about the failed download', async () => /WARN: controller-manager: download data source of backing image gone \(/.test(run.out()));
      const r = await fetch(`${run.api}/metrics`);
      expect(r.status).toBe(200);
      const text = await r.text();
      expect(text).toMatch(/^process_resident_memory_bytes \d/m);
      expect(text).toMatch(/^workqueue_adds_total\{name="NodeController"\} [1-9]/m);
    } finally {
      const done = new Promise((res) => run.proc.once('exit', res));
      run.proc.kill('SIGTERM');
      await done;
    }
    const lines = (await readFile(path.join(dataDir, 'logs', 'controller-manager.log'), 'utf8')).split('\n').filter(Boolean);
    expect(lines.length).toBeGreaterThan(0);
    for (const l of lines) {
      const o = JSON.parse(l) as Record<string, unknown>;
      expect(o['component']).toBe('controller-manager');
      expect(['debug', 'info', 'warn', 'error']).toContain(o['level']);
      expect(new Date(String(o['time'])).toISOString()).toBe(o['time']);
      expect(typeof o['msg']).toBe('string');
    }
    // The terminal got the same lines in pino-pretty's form: "[time] LEVEL (component/pid): message", no JSON.
    const terminal = run.out().split('\n').filter((l) => /^\[\d{4}-\d\d-\d\d /.test(l));
    expect(terminal.length).toBeGreaterThan(0);
    expect(terminal.some((l) => /\] (INFO|DEBUG): controller-manager: /.test(l))).toBe(true);
    expect(lines.map((l) => JSON.parse(l) as Record<string, unknown>)).toContainEqual(expect.objectContaining({ level: 'warn', image: 'gone', disk: 'disk-1' }));
    expect(run.out()).not.toMatch(/^\{"level"/m);
  }, 90_000);

  it('refuses --listen 0.0.0.0 without --auth-token-file or --insecure (exit 2, clear message)', async () => {
    const proc = spawn(process.execPath, [BIN, 'standalone', '--data-dir', path.join(dir, 'exposed'), '--listen', '0.0.0.0:0'], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    proc.stderr!.on('data', (d) => (out += d));
    const code = await new Promise<number | null>((r) => proc.once('exit', (c) => r(c)));
    expect(code).toBe(2);
    expect(out).toContain('refusing to serve the REST API on 0.0.0.0:0 without authentication');
    expect(out).toContain('--auth-token-file');
    expect(out).toContain('--insecure');
  });

  it('starts with --listen 0.0.0.0:<port> --insecure and serves REST without a token, then stops cleanly', async () => {
    // a free port (the listener is closed again before the process binds it)
    const probe = net.createServer();
    await new Promise<void>((r) => probe.listen(0, '0.0.0.0', r));
    const port = (probe.address() as net.AddressInfo).port;
    await new Promise<void>((r) => probe.close(() => r()));
    const proc = spawn(
      process.execPath,
      [BIN, 'standalone', '--data-dir', path.join(dir, 'insecure'), '--listen', `0.0.0.0:${port}`, '--insecure', '--disks', '1'],
      { stdio: ['ignore', 'pipe', 'pipe'] },
    );
    let out = '';
    proc.stdout!.on('data', (d) => (out += d));
    proc.stderr!.on('data', (d) => (out += d));
    const exited = new Promise<number | null>((r) => proc.once('exit', (c) => r(c)));
    try {
      const deadline = Date.now() + 30_000;
      while (!out.includes('Press Ctrl-C')) {
        if (proc.exitCode !== null || Date.now() > deadline) throw new Error(`controller-manager did not start: ${out}`);
        await new Promise((r) => setTimeout(r, 50));
      }
      expect(out).toContain('REST auth:       NONE (--insecure): anyone who can reach the port controls the system');
      expect(out).toMatch(new RegExp(`REST API:\\s+http://[^:]+:${port}/v1`));
      // only reached over loopback; no authorization header at all
      const list = await fetch(`http://127.0.0.1:${port}/v1/backingimages`);
      expect(list.status).toBe(200);
      expect(((await list.json()) as { data: unknown[] }).data).toEqual([]);
      expect((await fetch(`http://127.0.0.1:${port}/v1/settings`)).status).toBe(200);
    } finally {
      proc.kill('SIGTERM');
    }
    expect(await exited).toBe(0);
    expect(out).toContain('stopped');
  }, 60_000);

  it('with --auth-token-file on 0.0.0.0: REST calls without the token get 401, with it 200; the UI files stay public', async () => {
    const tokenFile = path.join(dir, 'rest-token');
    const token = 'rest-api-test-token-0123456789abcdef';
    await writeFile(tokenFile, `${token}\n`, { mode: 0o600 });
    const proc = spawn(
      process.execPath,
      [BIN, 'standalone', '--data-dir', path.join(dir, 'authed'), '--listen', '0.0.0.0:0', '--disks', '1', '--auth-token-file', tokenFile],
      { stdio: ['ignore', 'pipe', 'pipe'] },
    );
    let out = '';
    proc.stdout!.on('data', (d) => (out += d));
    proc.stderr!.on('data', (d) => (out += d));
    try {
      const deadline = Date.now() + 30_000;
      while (!out.includes('Press Ctrl-C')) {
        if (proc.exitCode !== null || Date.now() > deadline) throw new Error(`controller-manager did not start: ${out}`);
        await new Promise((r) => setTimeout(r, 50));
      }
      expect(out).toContain('REST auth:       bearer token required');
      const port = /REST API:\s+http:\/\/[^:]+:(\d+)\/v1/.exec(out)![1]!;
      const api = `http://127.0.0.1:${port}`;
      const none = await fetch(`${api}/v1/backingimages`);
      expect(none.status).toBe(401);
      expect(none.headers.get('www-authenticate')).toContain('Bearer');
      expect(((await none.json()) as { message: string }).message).toContain('authentication required');
      expect((await fetch(`${api}/v1/backingimages`, { headers: { authorization: 'Bearer not-the-token-at-all' } })).status).toBe(401);
      expect((await fetch(`${api}/v1/settings`, { method: 'PUT', body: '{}' })).status).toBe(401);
      const ok = await fetch(`${api}/v1/backingimages`, { headers: { authorization: `Bearer ${token}` } });
      expect(ok.status).toBe(200);
      expect(((await ok.json()) as { data: unknown[] }).data).toEqual([]);
      // the UI's own files hold no data and are served without a token (when the UI is built)
      const ui = await fetch(`${api}/`);
      expect([200, 404]).toContain(ui.status);
    } finally {
      const done = new Promise((r) => proc.once('exit', r));
      proc.kill('SIGTERM');
      await done;
    }
  }, 60_000);
});
