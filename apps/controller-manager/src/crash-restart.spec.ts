import { spawn, type ChildProcess } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { readdirSync } from 'node:fs';
import { mkdtemp, rm, stat } from 'node:fs/promises';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { processes } from './test-support/processes.js';

const APP = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const BIN = path.join(APP, 'bin', 'controller-manager.js');

/** Running (not zombie) data-plane processes whose arguments point into `dataDir`. */
const dataPlane = (dataDir: string) =>
  processes().filter((p) => p.state !== 'Z' && p.args.some((a) => a.endsWith('backing-image-manager.js') || a.endsWith('backing-image-data-source.js')) && p.args.some((a) => a.startsWith(dataDir)));
const managersOfDisk = (dataDir: string, disk: string) =>
  dataPlane(dataDir).filter((p) => p.args.some((a) => a.endsWith('backing-image-manager.js')) && p.args[p.args.indexOf('--disk-path') + 1] === path.join(dataDir, 'disks', disk));

async function until(what: string, fn: () => boolean | Promise<boolean>, ms = 60_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!(await fn())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

describe('controller-manager standalone after kill -9', () => {
  let dir: string;
  let dataDir: string;
  let server: http.Server;
  let url = '';
  const data = randomBytes(256 * 1024);
  const sum = createHash('sha512').update(data).digest('hex');
  const running: ChildProcess[] = [];

  beforeAll(async () => {
    await stat(path.join(APP, 'dist', 'main.js')); // built by the test target's dependencies
    dir = await mkdtemp(path.join(os.tmpdir(), 'bis-cm-crash-'));
    dataDir = path.join(dir, 'data');
    server = http.createServer((req, res) => {
      res.writeHead(200, { 'content-length': data.length });
      res.end(req.method === 'HEAD' ? undefined : data);
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    url = `http://127.0.0.1:${(server.address() as { port: number }).port}/img.raw`;
  });

  afterAll(async () => {
    for (const p of running) if (p.exitCode === null && p.signalCode === null) p.kill('SIGTERM');
    await until('every controller-manager to stop', () => running.every((p) => p.exitCode !== null || p.signalCode !== null), 30_000).catch(() => undefined);
    for (const p of dataDir ? dataPlane(dataDir) : []) process.kill(p.pid, 'SIGKILL'); // only after a failed assertion
    if (server) {
      server.closeAllConnections();
      await new Promise((r) => server.close(r));
    }
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  async function launch(): Promise<{ proc: ChildProcess; api: string; out: () => string }> {
    const proc = spawn(process.execPath, [BIN, 'standalone', '--data-dir', dataDir, '--listen', '127.0.0.1:0', '--disks', '2', '--allow-source-hosts', '127.0.0.1'], {
      stdio: ['ignore', 'pipe', 'pipe'],
      env: { ...process.env, NODE_OPTIONS: '' },
    });
    running.push(proc);
    let out = '';
    proc.stdout!.on('data', (d) => (out += d));
    proc.stderr!.on('data', (d) => (out += d));
    await until('controller-manager to start', () => {
      if (proc.exitCode !== null) throw new Error(`controller-manager exited with ${proc.exitCode}: ${out}`);
      return out.includes('Press Ctrl-C');
    });
    return { proc, api: /REST API:\s+(\S+)\/v1/.exec(out)![1]!, out: () => out };
  }

  async function readyCopies(api: string): Promise<number> {
    const r = await fetch(`${api}/v1/backingimages/img`).catch(() => undefined);
    if (r?.status !== 200) return 0;
    const b = (await r.json()) as { diskFileStatusMap: Record<string, { state: string }>; currentChecksum: string };
    return b.currentChecksum === sum ? Object.values(b.diskFileStatusMap).filter((s) => s.state === 'ready').length : 0;
  }

  const kill9 = async (proc: ChildProcess): Promise<void> => {
    const exited = new Promise((r) => proc.once('exit', r));
    proc.kill('SIGKILL');
    await exited;
  };

  const oneManagerPerDisk = (owner: number): boolean =>
    ['disk-1', 'disk-2'].every((d) => {
      const m = managersOfDisk(dataDir, d);
      return m.length === 1 && m[0]!.ppid === owner;
    });

  it('its managers and data sources exit; a restart at once starts, with exactly one manager per disk', async () => {
    const first = await launch();
    const res = await fetch(`${first.api}/v1/backingimages`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ name: 'img', sourceType: 'download', parameters: { url }, expectedChecksum: sum, minNumberOfCopies: 2 }),
    });
    expect(res.status).toBe(200);
    await until('2 ready copies', async () => (await readyCopies(first.api)) === 2);
    await until('one manager per disk', () => oneManagerPerDisk(first.proc.pid!));
    const children = dataPlane(dataDir).filter((p) => p.ppid === first.proc.pid);
    expect(children.length).toBeGreaterThanOrEqual(2);

    // kill -9: nothing of the controller runs any more, and its children stop by themselves (liveness pipe).
    await kill9(first.proc);
    await until('the data-plane children of the killed controller to exit', () => dataPlane(dataDir).length === 0);

    // Start, and kill -9 again while the managers run; restart without waiting for them.
    const second = await launch();
    await until('ready after the first restart', async () => (await readyCopies(second.api)) === 2);
    await until('one manager per disk after the first restart', () => oneManagerPerDisk(second.proc.pid!));
    await kill9(second.proc);
    const third = await launch();
    expect(third.out()).toContain('Press Ctrl-C');
    await until('ready after the second restart', async () => (await readyCopies(third.api)) === 2);
    await until('one manager per disk, children of the running controller', () => oneManagerPerDisk(third.proc.pid!));
    // No process of an earlier run is left.
    expect(dataPlane(dataDir).filter((p) => p.ppid !== third.proc.pid)).toEqual([]);

    // A clean stop ends everything and leaves no pid record.
    const exited = new Promise<number | null>((r) => third.proc.once('exit', (code) => r(code)));
    third.proc.kill('SIGTERM');
    expect(await exited).toBe(0);
    expect(dataPlane(dataDir)).toEqual([]);
    expect(readdirSync(path.join(dataDir, 'processes'))).toEqual([]);
  }, 240_000);
});
