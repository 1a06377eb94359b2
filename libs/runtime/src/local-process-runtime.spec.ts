import { afterEach, beforeEach, describe, expect, it, jest } from '@jest/globals';
import { promises as fsp } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { LocalProcessRuntime } from './local-process-runtime.js';
import { RotatingLogFile } from './rotating-log.js';
import type { WorkloadEvent, WorkloadStatus } from './types.js';

const NODE = process.execPath;

async function waitFor(rt: LocalProcessRuntime, name: string, pred: (s: WorkloadStatus) => boolean, timeoutMs = 8000): Promise<WorkloadStatus> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const s = rt.get(name);
    if (s && pred(s)) return s;
    if (Date.now() > deadline) throw new Error(`timed out; last status ${JSON.stringify(s)}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

async function freePort(): Promise<number> {
  const srv = net.createServer();
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  const port = (srv.address() as net.AddressInfo).port;
  await new Promise((r) => srv.close(r));
  return port;
}

describe('LocalProcessRuntime', () => {
  let dir: string;
  let rt: LocalProcessRuntime;
  beforeEach(async () => {
    dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'bis-rt-'));
    rt = new LocalProcessRuntime({ probeIntervalMs: 50, terminationGracePeriodMs: 2000 });
  });
  afterEach(async () => {
    await rt.stopAll({ gracePeriodMs: 200 });
    await fsp.rm(dir, { recursive: true, force: true });
  });

  it('runs a process to completion, captures its output and reports exit code 0 as succeeded', async () => {
    const ac = new AbortController();
    const events: WorkloadEvent[] = [];
    const watching = (async () => {
      for await (const e of rt.watch(ac.signal)) {
        events.push(e);
        if (e.status.phase === 'succeeded') break;
      }
    })();
    const logFile = path.join(dir, 'logs', 'ok.log');
    await rt.start({ name: 'ok', labels: { app: 'x' }, command: NODE, args: ['-e', "console.log('hello from child'); console.error('to stderr')"], logFile });
    const s = await waitFor(rt, 'ok', (st) => st.phase === 'succeeded');
    expect(s.exitCode).toBe(0);
    expect(s.restarts).toBe(0);
    expect(s.labels).toEqual({ app: 'x' });
    await watching;
    ac.abort();
    expect(events.map((e) => e.status.phase)).toEqual(expect.arrayContaining(['pending', 'running', 'succeeded']));
    expect(events[0].type).toBe('ADDED');
    expect(rt.list({ app: 'x' }).map((w) => w.name)).toEqual(['ok']);
    expect(rt.list({ app: 'y' })).toEqual([]);
    await rt.stop('ok');
    const log = await fsp.readFile(logFile, 'utf8');
    expect(log).toContain('hello from child');
    expect(log).toContain('to stderr');
    expect(log).toContain('exited with code 0');
    expect(rt.get('ok')).toBeUndefined();
  });

  it('reports a non-zero exit as failed with RestartPolicy Never, and a missing binary as failed to start', async () => {
    await rt.start({ name: 'bad', command: NODE, args: ['-e', 'process.exit(3)'], logFile: path.join(dir, 'bad.log') });
    const s = await waitFor(rt, 'bad', (st) => st.phase === 'failed');
    expect(s.exitCode).toBe(3);
    expect(s.message).toBe('exited with code 3');
    await rt.start({ name: 'missing', command: path.join(dir, 'no-such-binary'), logFile: path.join(dir, 'm.log') });
    const m = await waitFor(rt, 'missing', (st) => st.phase === 'failed');
    expect(m.message).toMatch(/failed to start: .*ENOENT/);
  });

  it('restarts a failing workload with exponential backoff (OnFailure)', async () => {
    await rt.start({
      name: 'crashy',
      command: NODE,
      args: ['-e', 'process.exit(1)'],
      logFile: path.join(dir, 'crashy.log'),
      restartPolicy: { kind: 'OnFailure', initialBackoffMs: 50, maxBackoffMs: 200 },
    });
    const s = await waitFor(rt, 'crashy', (st) => st.restarts >= 3);
    expect(['pending', 'running']).toContain(s.phase);
    const backoff = await waitFor(rt, 'crashy', (st) => st.phase === 'pending' && /back-off/.test(st.message));
    expect(backoff.message).toMatch(/back-off (100|200) ms restarting: exited with code 1/);
    const stopped = await rt.stop('crashy');
    expect(stopped.phase).toBe('failed');
    const restarts = stopped.restarts;
    await new Promise((r) => setTimeout(r, 300));
    expect(rt.get('crashy')).toBeUndefined();
    expect((await fsp.readFile(path.join(dir, 'crashy.log'), 'utf8')).match(/starting /g)?.length).toBeGreaterThanOrEqual(restarts);
  });

  it('is ready only once its declared TCP port accepts connections', async () => {
    const port = await freePort();
    const script = `setTimeout(() => require('net').createServer().listen(${port}, '127.0.0.1'), 300)`;
    const started = await rt.start({ name: 'server', command: NODE, args: ['-e', script], logFile: path.join(dir, 's.log'), readinessPorts: [port] });
    expect(started.phase).toBe('running');
    expect(started.ready).toBe(false);
    expect(started.pid).toBeGreaterThan(0);
    const ready = await waitFor(rt, 'server', (st) => st.ready);
    expect(ready.phase).toBe('running');
    const stopped = await rt.stop('server', { gracePeriodMs: 2000 });
    expect(stopped.signal).toBe('SIGTERM');
    expect(alive(started.pid as number)).toBe(false);
  });

  it('reports a ready workload not ready only after probeFailureThreshold failed probes in a row', async () => {
    const port = await freePort();
    // Listens, then closes its listener after 500 ms, logs when, and keeps running: every probe after that fails.
    const script = `const s = require('net').createServer().listen(${port}, '127.0.0.1', () => setTimeout(() => { s.close(); console.log('closed at ' + Date.now()); }, 500)); setInterval(() => {}, 1000)`;
    const strict = new LocalProcessRuntime({ probeIntervalMs: 100, readyProbeIntervalMs: 100, probeFailureThreshold: 3 });
    const lenient = new LocalProcessRuntime({ probeIntervalMs: 100, readyProbeIntervalMs: 100, probeFailureThreshold: 1000 });
    try {
      const notReadyAt: Record<string, number> = {};
      const closedAt: Record<string, number> = {};
      for (const [name, r] of [['strict', strict], ['lenient', lenient]] as const) {
        await r.start({ name, command: NODE, args: ['-e', script], logFile: path.join(dir, `${name}.log`), readinessPorts: [port] });
        await waitFor(r, name, (st) => st.ready);
        await waitFor(r, name, (st) => !st.ready, 4000).then(
          () => (notReadyAt[name] = Date.now()),
          () => undefined,
        );
        // The child's own record of the moment (a load can only delay what follows it, never make it earlier).
        const closed = /closed at (\d+)/.exec(await fsp.readFile(path.join(dir, `${name}.log`), 'utf8'));
        if (closed) closedAt[name] = Number(closed[1]);
        await r.stop(name, { gracePeriodMs: 2000 });
      }
      // Three refused probes 100 ms apart: not ready no sooner than ~200 ms after the listener closed (a lower bound:
      // timers fire late under load, never early).
      expect(notReadyAt['strict']).toBeDefined();
      expect(closedAt['strict']).toBeDefined();
      expect(notReadyAt['strict']! - closedAt['strict']!).toBeGreaterThanOrEqual(150);
      expect(strict.get('strict')).toBeUndefined();
      // A threshold of 1000 probes (100 s) is not reached within the 4 s waited.
      expect(notReadyAt['lenient']).toBeUndefined();
    } finally {
      await strict.stopAll();
      await lenient.stopAll();
    }
  });

  it('probes a ready workload at the ready period, not at the start-up period', async () => {
    const port = await freePort();
    // The child counts the connections its listener accepts (every probe is one) and logs the count when asked.
    const script = `let n = 0; require('net').createServer((c) => { n++; c.destroy(); }).listen(${port}, '127.0.0.1'); process.on('SIGUSR2', () => console.log('accepted ' + n)); setInterval(() => {}, 1000)`;
    const r = new LocalProcessRuntime({ probeIntervalMs: 50, readyProbeIntervalMs: 60_000 });
    try {
      const started = await r.start({ name: 'quiet', command: NODE, args: ['-e', script], logFile: path.join(dir, 'quiet.log'), readinessPorts: [port] });
      await waitFor(r, 'quiet', (st) => st.ready);
      // At the start-up period this would be about 20 more probes; timers fire late under load, never early, so at the
      // ready period of 60 s none comes within the second.
      await new Promise((res) => setTimeout(res, 1000));
      process.kill(started.pid as number, 'SIGUSR2');
      let log = '';
      for (let i = 0; i < 500 && !/accepted \d+/.test(log); i++) {
        log = await fsp.readFile(path.join(dir, 'quiet.log'), 'utf8');
        if (!/accepted \d+/.test(log)) await new Promise((res) => setTimeout(res, 20));
      }
      const accepted = Number(/accepted (\d+)/.exec(log)?.[1]);
      // the probe that found it ready (and at most one retried connect while it started listening)
      expect(accepted).toBeGreaterThanOrEqual(1);
      expect(accepted).toBeLessThanOrEqual(2);
      expect(r.get('quiet')?.ready).toBe(true);
    } finally {
      await r.stopAll();
    }
  });

  it('stops with SIGTERM, then SIGKILL after the grace period, including grandchildren', async () => {
    const pidFile = path.join(dir, 'grandchild.pid');
    const script = [
      "process.on('SIGTERM', () => {});",
      `const c = require('child_process').spawn(process.execPath, ['-e', "process.on('SIGTERM',()=>{}); setInterval(()=>{},1000)"], { stdio: 'ignore' });`,
      `require('fs').writeFileSync(${JSON.stringify(pidFile)}, String(c.pid));`,
      'setInterval(() => {}, 1000);',
    ].join('\n');
    const s = await rt.start({ name: 'stubborn', command: NODE, args: ['-e', script], logFile: path.join(dir, 'st.log') });
    const grandchild = Number(await (async () => {
      for (let i = 0; i < 200; i++) {
        const t = await fsp.readFile(pidFile, 'utf8').catch(() => '');
        if (t) return t;
        await new Promise((r) => setTimeout(r, 20));
      }
      throw new Error('grandchild did not start');
    })());
    const t0 = Date.now();
    const stopped = await rt.stop('stubborn', { gracePeriodMs: 300 });
    expect(Date.now() - t0).toBeGreaterThanOrEqual(280);
    expect(stopped.signal).toBe('SIGKILL');
    expect(alive(s.pid as number)).toBe(false);
    for (let i = 0; i < 50 && alive(grandchild); i++) await new Promise((r) => setTimeout(r, 20));
    expect(alive(grandchild)).toBe(false);
    expect(await fsp.readFile(path.join(dir, 'st.log'), 'utf8')).toContain('sending SIGKILL');
  });

  it('a process that handles SIGTERM exits cleanly within the grace period', async () => {
    const s = await rt.start({
      name: 'graceful',
      command: NODE,
      args: ['-e', "process.on('SIGTERM', () => { console.log('bye'); process.exit(0); }); setInterval(() => {}, 1000); console.log('up')"],
      logFile: path.join(dir, 'g.log'),
    });
    for (let i = 0; i < 250 && !(await fsp.readFile(path.join(dir, 'g.log'), 'utf8')).includes('up\n'); i++) await new Promise((r) => setTimeout(r, 20));
    // a grace period longer than the test's timeout: a stop that waited it out instead of seeing the exit fails the test
    const stopped = await rt.stop('graceful', { gracePeriodMs: 120_000 });
    expect(stopped.phase).toBe('succeeded');
    expect(stopped.exitCode).toBe(0);
    expect(alive(s.pid as number)).toBe(false);
    expect(await fsp.readFile(path.join(dir, 'g.log'), 'utf8')).toContain('bye');
  });

  it('rejects duplicates and invalid specs with clear errors; stopAll stops everything', async () => {
    const spec = { name: 'sleeper', command: NODE, args: ['-e', 'setInterval(() => {}, 1000)'], logFile: path.join(dir, 'a.log') };
    await rt.start(spec);
    await expect(rt.start(spec)).rejects.toThrow('workload sleeper already exists');
    await expect(rt.start({ ...spec, name: 'Bad Name', command: '' })).rejects.toThrow(/name "Bad Name" must be a lowercase DNS-style name; command is required/);
    await expect(rt.stop('nope')).rejects.toThrow('workload nope not found');
    const s2 = await rt.start({ ...spec, name: 'sleeper2' });
    await rt.stopAll({ gracePeriodMs: 1000 });
    expect(rt.list()).toEqual([]);
    expect(alive(s2.pid as number)).toBe(false);
  });
});

describe('RotatingLogFile', () => {
  it('caps each file and keeps maxFiles rotated copies', async () => {
    const dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'bis-log-'));
    try {
      const file = path.join(dir, 'w.log');
      const log = new RotatingLogFile(file, { maxBytes: 1024, maxFiles: 2 });
      for (let i = 0; i < 50; i++) log.write(`line ${String(i).padStart(3, '0')} ${'x'.repeat(90)}\n`);
      await new Promise<void>((r) => log.end(r));
      const names = (await fsp.readdir(dir)).sort();
      expect(names).toEqual(['w.log', 'w.log.1', 'w.log.2']);
      for (const n of names) expect((await fsp.stat(path.join(dir, n))).size).toBeLessThanOrEqual(1024);
      const newest = await fsp.readFile(file, 'utf8');
      expect(newest).toContain('line 049');
      const all = (await Promise.all(['w.log.2', 'w.log.1', 'w.log'].map((n) => fsp.readFile(path.join(dir, n), 'utf8')))).join('');
      // The kept files are the tail of what was written, in order.
      const written = Array.from({ length: 50 }, (_, i) => `line ${String(i).padStart(3, '0')} ${'x'.repeat(90)}\n`).join('');
      expect(written.endsWith(all)).toBe(true);
    } finally {
      await fsp.rm(dir, { recursive: true, force: true });
    }
  });

  it('lines written while a write is in flight reach the file together, whole and in order', async () => {
    const dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'bis-log-'));
    try {
      const file = path.join(dir, 'w.log');
      const log = new RotatingLogFile(file, { maxBytes: 1 << 20 });
      const writev = jest.spyOn(log, '_writev');
      const lines = Array.from({ length: 2000 }, (_, i) => `{"msg":"line ${i}"}\n`);
      for (const l of lines) log.write(l);
      await new Promise<void>((r) => log.end(r));
      expect(await fsp.readFile(file, 'utf8')).toBe(lines.join(''));
      // the first line is written alone; the ones buffered behind it go in few writes
      expect(writev).toHaveBeenCalled();
      expect(writev.mock.calls.length).toBeLessThan(20);
    } finally {
      await fsp.rm(dir, { recursive: true, force: true });
    }
  });
});
