/**
 * `npm start` stops when its own pid gets SIGTERM (a supervisor, `kill <pid>`): the script ends in `exec node …`, so
 * the process npm forwards the signal to is the controller-manager itself, which stops every process of the system.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from '@jest/globals';
import { processes, type Proc } from './test-support/processes.js';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', '..');

/** The live (not zombie) descendants of `root`. */
function descendants(root: number): Proc[] {
  const all = processes();
  const found: Proc[] = [];
  const frontier = [root];
  while (frontier.length) {
    const p = frontier.pop()!;
    for (const c of all) {
      if (c.ppid === p) {
        found.push(c);
        frontier.push(c.pid);
      }
    }
  }
  return found.filter((p) => p.state !== 'Z');
}

const alive = (pid: number) => processes().some((p) => p.pid === pid && p.state !== 'Z');

async function until(what: string, fn: () => boolean | Promise<boolean>, ms: number): Promise<void> {
  const deadline = Date.now() + ms;
  while (!(await fn())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

describe('npm start', () => {
  let dir = '';
  let npm: ChildProcess | undefined;
  afterAll(async () => {
    if (npm?.pid && alive(npm.pid)) {
      for (const p of descendants(npm.pid)) {
        try {
          process.kill(p.pid, 'SIGKILL');
        } catch {
          // gone
        }
      }
      npm.kill('SIGKILL');
    }
    if (dir) await rm(dir, { recursive: true, force: true });
  }, 60_000);

  it('builds, serves the REST API, and SIGTERM to the npm pid ends every process of the system', async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), 'bis-npm-start-'));
    const env: NodeJS.ProcessEnv = { ...process.env, NODE_OPTIONS: '' };
    delete env['BIS_LIVENESS_FD'];
    npm = spawn('npm', ['start', '--', '--data-dir', dir, '--listen', '127.0.0.1:0', '--disks', '2'], { cwd: ROOT, env, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    npm.stdout!.on('data', (d: Buffer) => (stdout += d));
    npm.stderr!.on('data', (d: Buffer) => (stderr += d));
    const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((r) => npm!.on('exit', (code, signal) => r({ code, signal })));
    const npmPid = npm.pid!;

    // The build may take minutes on a busy machine (it is mostly cached when the apps were built before).
    await until('the REST API line', () => /REST API: +(http:\/\/\S+)\/v1/.test(stdout) || npm!.exitCode !== null, 900_000).catch((err: Error) => {
      throw new Error(`${err.message}\nstdout:\n${stdout.slice(-3000)}\nstderr:\n${stderr.slice(-3000)}`);
    });
    const url = /REST API: +(http:\/\/\S+)\/v1/.exec(stdout)?.[1];
    expect({ url, exitCode: npm.exitCode }).toEqual({ url: expect.stringMatching(/^http:\/\/127\.0\.0\.1:\d+$/), exitCode: null });
    expect(stdout).toContain(`data directory:  ${dir}`);
    const res = await fetch(`${url}/v1/nodes`);
    expect(res.status).toBe(200);

    // An upload image: a data source waits for the file, and the manager of its disk runs.
    const created = await fetch(`${url}/v1/backingimages`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ name: 'up', sourceType: 'upload', parameters: {}, minNumberOfCopies: 1 }),
    });
    expect(created.status).toBe(200);
    // The controller-manager is npm's own child (exec replaced the shell); the data plane runs under it.
    const system = () => descendants(npmPid);
    const cm = () => system().find((p) => p.args.some((a) => a.endsWith('controller-manager.js')));
    const running = (bin: string) => system().some((p) => p.args.some((a) => a.endsWith(bin)));
    await until('a data source and a manager', () => running('backing-image-data-source.js') && running('backing-image-manager.js'), 120_000);
    expect(cm()?.ppid).toBe(npmPid);
    const pids = system().map((p) => p.pid);
    expect(pids.length).toBeGreaterThanOrEqual(3);

    process.kill(npmPid, 'SIGTERM');
    const end = await exited;
    // npm exits with the child's status; what matters is that it ended, and everything under it too.
    expect(end.code !== null || end.signal !== null).toBe(true);
    await until('every process of the system to end', () => pids.every((p) => !alive(p)), 60_000).catch((err: Error) => {
      throw new Error(`${err.message}: left ${JSON.stringify(processes().filter((p) => pids.includes(p.pid) && p.state !== 'Z'))}`);
    });
    expect(stdout).toContain('received SIGTERM');
    expect(processes().filter((p) => p.state !== 'Z' && p.args.some((a) => a.startsWith(dir)))).toEqual([]);
  }, 1_200_000);
});
