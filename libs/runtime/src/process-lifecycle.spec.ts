import { afterEach, beforeAll, beforeEach, describe, expect, it } from '@jest/globals';
import { spawn, type ChildProcess } from 'node:child_process';
import { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { endRecordedProcesses, isProcessRunning, procStat, readProcessRecords, writeProcessRecord } from './process-lifecycle.js';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const SUPPORT = path.join(HERE, 'test-support');
const DIST = path.join(HERE, '..', 'dist', 'index.js');

async function until(what: string, fn: () => boolean | Promise<boolean>, timeoutMs = 20_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await fn())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

/** Reads the first JSON line a process prints. */
function firstJsonLine<T>(child: ChildProcess): Promise<T> {
  return new Promise((resolve, reject) => {
    let out = '';
    child.stdout!.on('data', (d: Buffer) => {
      out += d;
      const nl = out.indexOf('\n');
      if (nl >= 0) resolve(JSON.parse(out.slice(0, nl)) as T);
    });
    child.once('exit', (code) => reject(new Error(`exited with ${code} before printing: ${out}`)));
  });
}

describe('procStat / isProcessRunning', () => {
  it('reads state and start time, and tells a zombie and a reused pid from a running process', async () => {
    const me = procStat(process.pid)!;
    expect(me.state).not.toBe('Z');
    expect(me.startTime).toMatch(/^\d+$/);
    expect(isProcessRunning(process.pid, me.startTime)).toBe(true);
    expect(isProcessRunning(process.pid, String(Number(me.startTime) + 1))).toBe(false); // another process with this pid
    expect(procStat(0)).toBeUndefined();

    // `sleep 0` becomes a zombie: its parent (exec'd into `sleep 30`) never waits for it.
    // (`sleep 2`: long enough for sh to exec first, so sh never reaps it)
    const holder = spawn('sh', ['-c', 'sleep 2 & echo $!; exec sleep 30'], { stdio: ['ignore', 'pipe', 'ignore'] });
    try {
      const zombie = await new Promise<number>((r) => holder.stdout!.once('data', (d: Buffer) => r(Number(String(d).trim()))));
      await until('the zombie', () => procStat(zombie)?.state === 'Z');
      expect(isProcessRunning(zombie)).toBe(false);
    } finally {
      holder.kill('SIGKILL');
    }
  });
});

describe('liveness pipe: children end with their parent', () => {
  let dir: string;
  beforeAll(async () => {
    await fsp.access(DIST).catch(() => {
      throw new Error(`${DIST} is missing: the test target builds it first (npx nx run @bis/runtime:build)`);
    });
  });
  beforeEach(async () => {
    dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'bis-liveness-'));
  });
  // Parents a test started: killed after each test, so that a failing test cannot leave them (and their children,
  // which end with them) running and keep jest from exiting.
  const parents: ChildProcess[] = [];
  afterEach(async () => {
    for (const p of parents.splice(0)) if (p.exitCode === null && p.signalCode === null) p.kill('SIGKILL');
    await fsp.rm(dir, { recursive: true, force: true });
  });

  it('after kill -9 of the parent, every child (and the group it leads) stops; the pid records name them', async () => {
    const pidDir = path.join(dir, 'pids');
    const parent = spawn(process.execPath, [path.join(SUPPORT, 'parent.mjs'), pidDir, path.join(dir, 'logs'), path.join(SUPPORT, 'child.mjs'), '2'], {
      stdio: ['ignore', 'pipe', 'inherit'],
      env: { ...process.env, NODE_OPTIONS: '' },
    });
    parents.push(parent);
    const { pids } = await firstJsonLine<{ pids: number[] }>(parent);
    expect(pids).toHaveLength(2);
    // Each child printed its own pid, its grandchild's and whether it watches the pipe.
    const hello = async (i: number) => {
      const file = path.join(dir, 'logs', `child-${i}.log`);
      let info: { watching: boolean; pid: number; grandchild: number } | undefined;
      await until(`child ${i} to start`, async () => {
        const line = (await fsp.readFile(file, 'utf8').catch(() => '')).split('\n').find((l) => l.startsWith('{') && l.includes('"watching"')); // the runtime's own log lines are JSON too
        info = line ? JSON.parse(line) : undefined;
        return !!info;
      });
      return info!;
    };
    const infos = await Promise.all([hello(0), hello(1)]);
    expect(infos.map((i) => i.pid)).toEqual(pids);
    expect(infos.every((i) => i.watching)).toBe(true);
    await until('two pid records', async () => (await readProcessRecords(pidDir)).length === 2);
    const records = await readProcessRecords(pidDir);
    expect(records.map((r) => r.pid).sort()).toEqual([...pids].sort());
    for (const r of records) expect(isProcessRunning(r.pid, r.startTime)).toBe(true);

    const exited = new Promise((r) => parent.once('exit', r));
    parent.kill('SIGKILL');
    await exited;
    const everyone = infos.flatMap((i) => [i.pid, i.grandchild]);
    await until('every child and grandchild to stop', () => everyone.every((pid) => !isProcessRunning(pid)));
    // They stopped through their own SIGTERM handler (graceful), not SIGKILL.
    const markers = await fsp.readFile(path.join(dir, 'logs', 'markers'), 'utf8');
    for (const pid of pids) expect(markers).toContain(`${pid} SIGTERM: stopping`);
    // A crash leaves the records behind; the next run finds nothing left to end.
    const ended = await endRecordedProcesses(pidDir, { graceMs: 1000 });
    expect(ended.map((e) => e.outcome)).toEqual(['gone', 'gone']);
    expect(await readProcessRecords(pidDir)).toEqual([]);
  }, 60_000);
});

describe('endRecordedProcesses', () => {
  let dir: string;
  const started: ChildProcess[] = [];
  beforeEach(async () => {
    dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'bis-pidrec-'));
  });
  afterEach(async () => {
    for (const c of started.splice(0)) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
    await fsp.rm(dir, { recursive: true, force: true });
  });

  const plant = async (name: string, script: string): Promise<{ child: ChildProcess; startTime: string }> => {
    const child = spawn(process.execPath, ['-e', script], { detached: true, stdio: ['ignore', 'pipe', 'ignore'] });
    started.push(child);
    await new Promise((r) => child.stdout!.once('data', r)); // ready (its signal handlers are installed)
    const startTime = procStat(child.pid!)!.startTime;
    await writeProcessRecord(dir, { name, pid: child.pid!, startTime, command: 'node -e' });
    return { child, startTime };
  };

  it('ends recorded processes that still run (SIGTERM, then SIGKILL) and leaves a reused pid alone', async () => {
    const polite = await plant('polite', "process.on('SIGTERM', () => process.exit(0)); console.log('up'); setInterval(() => {}, 1e6);");
    const stubborn = await plant('stubborn', "process.on('SIGTERM', () => {}); console.log('up'); setInterval(() => {}, 1e6);");
    // This test process under a start time it does not have: the pid was "reused", so it must not be signalled.
    const me = procStat(process.pid)!;
    await writeProcessRecord(dir, { name: 'reused', pid: process.pid, startTime: String(Number(me.startTime) + 7), command: 'node' });
    await writeProcessRecord(dir, { name: 'dead', pid: 0x3ffffff, startTime: '1', command: 'node' });
    await fsp.writeFile(path.join(dir, 'garbage.json'), '{not json');

    const polled = (c: ChildProcess) => new Promise<string | null>((r) => c.once('exit', (_code, sig) => r(sig)));
    const [politeSig, stubbornSig] = [polled(polite.child), polled(stubborn.child)];
    const log: string[] = [];
    const ended = await endRecordedProcesses(dir, { graceMs: 500, log: (m) => log.push(m) });
    const byName = Object.fromEntries(ended.map((e) => [e.name, e.outcome]));
    expect(byName).toEqual({ polite: 'terminated', stubborn: 'killed', reused: 'gone', dead: 'gone' });
    expect(await politeSig).toBeNull(); // exited by itself on SIGTERM
    expect(await stubbornSig).toBe('SIGKILL');
    expect(isProcessRunning(process.pid, me.startTime)).toBe(true);
    expect(log.join('\n')).toMatch(/still running 500 ms after SIGTERM: sending SIGKILL/);
    expect(await fsp.readdir(dir)).toEqual([]);
  }, 30_000);

  it('finds nothing in a directory that does not exist', async () => {
    expect(await endRecordedProcesses(path.join(dir, 'none'))).toEqual([]);
  });
});
