import { spawn } from 'node:child_process';
import { access, readFile, readdir } from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from '@jest/globals';
import { SourceError } from './errors.js';
import { runTool } from './tool-process.js';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const DIST = path.join(HERE, '..', 'dist', 'tool-process.js');

async function until(what: string, fn: () => Promise<boolean> | boolean, timeoutMs = 20_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await fn())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** Running (not zombie) children of `ppid`, with their command lines. */
async function childrenOf(ppid: number): Promise<{ pid: number; args: string[] }[]> {
  const out: { pid: number; args: string[] }[] = [];
  for (const d of await readdir('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const st = await readFile(`/proc/${d}/stat`, 'utf8');
      const f = st.slice(st.lastIndexOf(')') + 2).split(' ');
      if (Number(f[1]) !== ppid || f[0] === 'Z') continue;
      out.push({ pid: Number(d), args: (await readFile(`/proc/${d}/cmdline`, 'utf8')).split('\0').filter(Boolean) });
    } catch {
      // ended meanwhile
    }
  }
  return out;
}

const alive = async (pid: number): Promise<boolean> => {
  try {
    const st = await readFile(`/proc/${pid}/stat`, 'utf8');
    return st.slice(st.lastIndexOf(')') + 2)[0] !== 'Z';
  } catch {
    return false;
  }
};

describe('runTool', () => {
  it('a tool does not outlive the process that runs it when that process is killed with SIGKILL', async () => {
    await access(DIST).catch(() => {
      throw new Error(`${DIST} is missing: the test target builds it first (npx nx run @bis/file-sources:build)`);
    });
    const parent = spawn(process.execPath, [path.join(HERE, 'test-support', 'run-tool-child.mjs'), DIST, 'sleep', '300'], { stdio: ['ignore', 'pipe', 'pipe'] });
    try {
      const pid = await new Promise<number>((resolve, reject) => {
        let out = '';
        parent.stdout!.on('data', (d: Buffer) => {
          out += d;
          if (out.includes('\n')) resolve((JSON.parse(out.slice(0, out.indexOf('\n'))) as { pid: number }).pid);
        });
        parent.once('exit', (code) => reject(new Error(`the child exited with ${code}`)));
      });
      let tool = 0;
      await until('the tool to run', async () => {
        const c = (await childrenOf(pid)).find((p) => p.args.includes('sleep') && p.args.includes('300') && !p.args.some((a) => a.includes('setpriv')));
        tool = c?.pid ?? 0;
        return tool > 0;
      });
      // It is not in a process group of its own: the runner's group (stop, liveness pipe) reaches it.
      const pgrp = (pid2: number) => readFile(`/proc/${pid2}/stat`, 'utf8').then((s) => Number(s.slice(s.lastIndexOf(')') + 2).split(' ')[2]));
      expect(await pgrp(tool)).toBe(await pgrp(pid));
      const exited = new Promise((r) => parent.once('exit', r));
      parent.kill('SIGKILL');
      await exited;
      await until('the tool to end with its runner', async () => !(await alive(tool)), 10_000);
    } finally {
      if (parent.exitCode === null && parent.signalCode === null) parent.kill('SIGKILL');
    }
  });

  it('names a missing tool and its package', async () => {
    await expect(runTool('no-such-tool-bis', [], { packageName: 'nothing' })).rejects.toThrow(new SourceError('no-such-tool-bis is not installed (Debian package nothing)'));
  });

  it('an abort kills the tool', async () => {
    const ac = new AbortController();
    const p = runTool('sleep', ['300'], { packageName: 'coreutils', signal: ac.signal });
    const mine = async () => (await childrenOf(process.pid)).filter((c) => c.args.includes('300'));
    await until('the tool to run', async () => (await mine()).length > 0);
    ac.abort(new Error('stop'));
    await expect(p).rejects.toThrow();
    await until('the tool to end', async () => (await mine()).length === 0);
  });
});
