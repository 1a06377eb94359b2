/**
 * Harness of the fault-injection suite (`faults.e2e.spec.ts`): the real standalone system (in this process through
 * `startStandalone`, or the built `controller-manager` CLI as a child process), always with real manager and
 * data-source processes; an origin of our own; seeded random points; and the three checks every case ends with.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { createHash } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { readdir, readFile, readlink } from 'node:fs/promises';
import http from 'node:http';
import path from 'node:path';
import { seededRandom } from '@bis/datastore';
import { startStandalone, type StandaloneHandle, type StandaloneOptions } from '../standalone.js';
import { BINARIES, REPO_ROOT } from './e2e.js';

// ------------------------------------------------------------------ seeds

/** The suite's seed: `BIS_FAULT_SEED` to replay a run, else a fresh one (printed by the suite). */
export function suiteSeed(env: NodeJS.ProcessEnv = process.env): number {
  const v = env['BIS_FAULT_SEED'];
  if (v !== undefined && v !== '') {
    const n = Number(v);
    if (!Number.isInteger(n) || n < 0 || n > 0xffffffff) throw new Error(`BIS_FAULT_SEED must be an integer 0..4294967295, not ${JSON.stringify(v)}`);
    return n;
  }
  return Math.floor(Math.random() * 0xffffffff);
}

/** A case's own seed: the suite seed mixed with the case name, so one case replays alone with the same points. */
export function caseSeed(seed: number, name: string): number {
  return createHash('sha256').update(`${seed}:${name}`).digest().readUInt32BE(0);
}

/** A small deterministic generator of numbers in [0, 1) (the project's one: mulberry32, `@bis/datastore`). */
export const rng = (seed: number): (() => number) => seededRandom(seed);

/** A number in [lo, hi) drawn from `r`. */
export const between = (r: () => number, lo: number, hi: number): number => lo + (hi - lo) * r();

// ------------------------------------------------------------------ waiting

export async function until<T>(what: string, fn: () => Promise<T | undefined | false> | T | undefined | false, timeoutMs: number, everyMs = 250): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  for (;;) {
    try {
      const v = await fn();
      if (v !== undefined && v !== false) return v as T;
    } catch (err) {
      last = err;
    }
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${last ? ` (last error: ${(last as Error).message})` : ''}`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
}

// ------------------------------------------------------------------ the origin

export interface OriginOptions {
  /** Serve `Range: bytes=N-` requests with 206 and advertise `Accept-Ranges: bytes`. */
  range?: boolean;
  /** Drop the connection (destroy the socket) after this many body bytes, for the first `drops` GETs. */
  dropAfter?: number;
  drops?: number;
  /** Pause this many ms after each 64 KiB (keeps a download in progress). */
  throttleMs?: number;
}

export interface Origin {
  url: string;
  /** Body bytes sent so far, over every request. */
  sent(): number;
  gets(): number;
  rangeGets(): number;
  dropped(): number;
  throttleMs: number;
  close(): Promise<void>;
}

/** An HTTP origin on 127.0.0.1 serving one image (`/img.raw`), able to drop a response mid-body. */
export async function startOrigin(data: Buffer, opts: OriginOptions = {}): Promise<Origin> {
  let sent = 0;
  let gets = 0;
  let rangeGets = 0;
  let dropped = 0;
  const state = { throttleMs: opts.throttleMs ?? 0 };
  const server = http.createServer((req, res) => {
    let start = 0;
    const range = /^bytes=(\d+)-$/.exec(String(req.headers.range ?? ''));
    const headers: http.OutgoingHttpHeaders = { 'content-type': 'application/octet-stream', 'accept-ranges': opts.range ? 'bytes' : 'none' };
    if (opts.range && range && Number(range[1]) < data.length) {
      start = Number(range[1]);
      res.writeHead(206, { ...headers, 'content-length': data.length - start, 'content-range': `bytes ${start}-${data.length - 1}/${data.length}` });
    } else res.writeHead(200, { ...headers, 'content-length': data.length });
    if (req.method === 'HEAD') return void res.end();
    gets++;
    if (start > 0) rangeGets++;
    const dropAt = opts.dropAfter !== undefined && dropped < (opts.drops ?? 1) ? opts.dropAfter : Infinity;
    let off = start;
    let bodyBytes = 0;
    const step = (): void => {
      if (res.destroyed) return;
      if (off >= data.length) return void res.end();
      let n = Math.min(64 << 10, data.length - off);
      if (bodyBytes + n > dropAt) n = Math.max(0, dropAt - bodyBytes);
      if (n > 0) {
        const ok = res.write(data.subarray(off, off + n));
        off += n;
        bodyBytes += n;
        sent += n;
        if (bodyBytes >= dropAt) {
          dropped++;
          // let the bytes already written reach the socket, then cut the connection without a proper end
          setTimeout(() => res.socket?.destroy(), 50);
          return;
        }
        const next = (): void => void setTimeout(step, state.throttleMs);
        if (!ok) res.once('drain', next);
        else next();
      } else {
        dropped++;
        res.socket?.destroy();
      }
    };
    step();
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const port = (server.address() as { port: number }).port;
  return {
    url: `http://127.0.0.1:${port}/img.raw`,
    sent: () => sent,
    gets: () => gets,
    rangeGets: () => rangeGets,
    dropped: () => dropped,
    get throttleMs() {
      return state.throttleMs;
    },
    set throttleMs(v: number) {
      state.throttleMs = v;
    },
    close: () =>
      new Promise<void>((r) => {
        server.closeAllConnections();
        server.close(() => r());
      }),
  };
}

/** Deterministic pseudo-random bytes (not compressible), and their SHA-512. */
export function imageBytes(size: number, seed: number): { data: Buffer; sum: string } {
  const data = Buffer.alloc(size);
  const r = rng(seed);
  for (let i = 0; i < size; i += 4) data.writeUInt32LE(Math.floor(r() * 0x100000000), i);
  return { data, sum: createHash('sha512').update(data).digest('hex') };
}

// ------------------------------------------------------------------ the system

export const TEST_TIMING = {
  dataSourcePollMs: 300,
  managerPollMs: 300,
  waitRequeueMs: 500,
  backupPollMs: 500,
  managerRestartInitialMs: 300,
  dataSourceRetryInitialMs: 2000,
  dataSourceRetryMaxMs: 8000,
  fileBackoffInitialMs: 2000,
  fileBackoffMaxMs: 8000,
};

/** The system under test: its REST API, its data directory, and the pid whose children its processes must be. */
export interface FaultSystem {
  kind: 'in-process' | 'cli';
  url: string;
  dataDir: string;
  /** Parent of every manager and data-source process of this system. */
  controllerPid(): number;
  /** `kill -9` of the controller-manager (the CLI only). */
  kill9?(): Promise<void>;
  /** Start again with the same data directory (after `stop` or `kill9`). */
  start(): Promise<void>;
  stop(): Promise<void>;
  output(): string;
}

const logger = (lines: string[]) => ({
  info: (m: string) => lines.push(`I ${m}`),
  warn: (m: string) => lines.push(`W ${m}`),
  error: (m: string) => lines.push(`E ${m}`),
  debug: () => {},
});

/** `startStandalone` in this process with short controller intervals; managers and data sources are real processes. */
export async function inProcessSystem(dataDir: string, disks: number, extra: Partial<StandaloneOptions> = {}): Promise<FaultSystem & { handle(): StandaloneHandle }> {
  const lines: string[] = [];
  let h: StandaloneHandle | undefined;
  const sys = {
    kind: 'in-process' as const,
    url: '',
    dataDir,
    controllerPid: () => process.pid,
    handle: () => h!,
    start: async () => {
      h = await startStandalone({
        dataDir,
        listen: '127.0.0.1:0',
        disks,
        allowSourceHosts: ['127.0.0.1'],
        binaries: BINARIES,
        log: logger(lines),
        controllerOptions: { resyncMs: 2000, timing: TEST_TIMING },
        ...extra,
      });
      sys.url = h.url;
    },
    stop: async () => {
      const x = h;
      h = undefined;
      await x?.stop();
    },
    output: () => lines.slice(-80).join('\n'),
  };
  await sys.start();
  return sys;
}

export const CONTROLLER_MANAGER_CLI = path.join(REPO_ROOT, 'apps/controller-manager/bin/controller-manager.js');

/** The built `controller-manager standalone` CLI as a child process (default intervals: what a user runs). */
export async function cliSystem(dataDir: string, disks: number): Promise<FaultSystem> {
  let proc: ChildProcess | undefined;
  let out = '';
  const sys: FaultSystem = {
    kind: 'cli',
    url: '',
    dataDir,
    controllerPid: () => proc?.pid ?? -1,
    start: async () => {
      out += `\n--- start ${new Date().toISOString()}\n`;
      const p = spawn(process.execPath, [CONTROLLER_MANAGER_CLI, 'standalone', '--data-dir', dataDir, '--listen', '127.0.0.1:0', '--disks', String(disks), '--allow-source-hosts', '127.0.0.1'], {
        stdio: ['ignore', 'pipe', 'pipe'],
        env: { ...process.env, NODE_OPTIONS: '' },
      });
      proc = p;
      let mine = '';
      const keep = (d: Buffer): void => {
        mine += d;
        out = (out + d).slice(-40_000);
      };
      p.stdout!.on('data', keep);
      p.stderr!.on('data', keep);
      await until('the controller-manager to start', () => {
        if (p.exitCode !== null) throw new Error(`controller-manager exited with ${p.exitCode}: ${mine}`);
        return mine.includes('Press Ctrl-C');
      }, 60_000, 100).catch((err) => {
        if (p.exitCode !== null) throw new Error(`controller-manager exited with ${p.exitCode}: ${mine}`);
        throw err;
      });
      sys.url = /REST API:\s+(\S+)\/v1/.exec(mine)![1]!;
    },
    kill9: async () => {
      const p = proc;
      if (!p || p.exitCode !== null || p.signalCode !== null) return;
      const exited = new Promise((r) => p.once('exit', r));
      p.kill('SIGKILL');
      await exited;
    },
    stop: async () => {
      const p = proc;
      if (!p || p.exitCode !== null || p.signalCode !== null) return;
      const exited = new Promise((r) => p.once('exit', r));
      p.kill('SIGTERM');
      const t = setTimeout(() => p.kill('SIGKILL'), 30_000);
      await exited;
      clearTimeout(t);
    },
    output: () => out.slice(-6000),
  };
  await sys.start();
  return sys;
}

// ------------------------------------------------------------------ REST

export interface Api {
  call(method: string, url: string, body?: unknown): Promise<{ status: number; json: Record<string, unknown> }>;
}

export function api(sys: FaultSystem): Api {
  return {
    async call(method, url, body) {
      const res = await fetch(`${sys.url}${url}`, {
        method,
        headers: body === undefined ? {} : { 'content-type': 'application/json' },
        body: body === undefined ? undefined : JSON.stringify(body),
      });
      const text = await res.text();
      let json: Record<string, unknown> = {};
      try {
        json = text ? (JSON.parse(text) as Record<string, unknown>) : {};
      } catch {
        json = { text };
      }
      return { status: res.status, json };
    },
  };
}

export interface FileStatus {
  state: string;
  progress: number;
  message: string;
}
export interface ImageView {
  name: string;
  uuid: string;
  currentChecksum: string;
  diskFileStatusMap: Record<string, FileStatus>;
}

export async function getImage(sys: FaultSystem, name: string): Promise<ImageView | undefined> {
  const r = await api(sys).call('GET', `/v1/backingimages/${name}`);
  return r.status === 200 ? (r.json as unknown as ImageView) : undefined;
}

export async function createImage(sys: FaultSystem, name: string, url: string, sum: string, copies: number): Promise<void> {
  const r = await api(sys).call('POST', '/v1/backingimages', { name, sourceType: 'download', parameters: { url }, expectedChecksum: sum, minNumberOfCopies: copies });
  if (r.status !== 200) throw new Error(`create ${name}: ${r.status} ${JSON.stringify(r.json)}`);
}

export const readyDisks = (b: ImageView | undefined): string[] =>
  Object.entries(b?.diskFileStatusMap ?? {})
    .filter(([, s]) => s.state === 'ready')
    .map(([d]) => d);

/** Waits until `copies` copies of the image are ready with `sum` as its checksum; returns the time it took. */
export async function converged(sys: FaultSystem, name: string, sum: string, copies: number, boundMs: number): Promise<number> {
  const t0 = Date.now();
  await until(`${name}: ${copies} ready copies with the expected checksum (bound ${boundMs / 1000} s)`, async () => {
    const b = await getImage(sys, name);
    return b && b.currentChecksum === sum && readyDisks(b).length >= copies ? b : undefined;
  }, boundMs, 300);
  return Date.now() - t0;
}

export interface BackupView {
  name: string;
  state: string;
  error: string;
  url: string;
  backingImageName: string;
  progress: number;
}

export async function backupsOf(sys: FaultSystem, image: string): Promise<BackupView[]> {
  const r = await api(sys).call('GET', '/v1/backupbackingimages');
  return ((r.json['data'] ?? []) as BackupView[]).filter((b) => b.backingImageName === image);
}

// ------------------------------------------------------------------ processes

export interface Proc {
  pid: number;
  ppid: number;
  state: string;
  args: string[];
}

export async function processes(): Promise<Proc[]> {
  const out: Proc[] = [];
  for (const d of await readdir('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const st = await readFile(`/proc/${d}/stat`, 'utf8');
      const f = st.slice(st.lastIndexOf(')') + 2).split(' ');
      const args = (await readFile(`/proc/${d}/cmdline`, 'utf8')).split('\0').filter(Boolean);
      out.push({ pid: Number(d), ppid: Number(f[1]), state: f[0]!, args });
    } catch {
      // ended meanwhile
    }
  }
  return out;
}

/** Running (not zombie) processes whose arguments point into `dataDir`: managers, data sources, tools. */
export async function processesOf(dataDir: string): Promise<Proc[]> {
  return (await processes()).filter((p) => p.state !== 'Z' && p.args.some((a) => a.startsWith(dataDir)));
}

export const isManager = (p: Proc): boolean => p.args.some((a) => a.endsWith('backing-image-manager.js'));
export const isDataSource = (p: Proc): boolean => p.args.some((a) => a.endsWith('backing-image-data-source.js'));

/** The log of an image's data source (written by its process or by the shared host that runs it). */
export const dataSourceLog = (dataDir: string, image: string): string => path.join(dataDir, 'logs', `backing-image-ds-${image}.log`);

/**
 * The data-source process that runs an image's data source now: a process of its own (started with `--name <image>`),
 * or the shared host that holds the data source's log open.
 */
export async function dataSourceProcess(dataDir: string, image: string): Promise<Proc | undefined> {
  const log = dataSourceLog(dataDir, image);
  const candidates = (await processesOf(dataDir)).filter(isDataSource);
  const own = candidates.find((p) => {
    const i = p.args.indexOf('--name');
    return i >= 0 && p.args[i + 1] === image;
  });
  if (own) return own;
  for (const p of candidates.filter((c) => c.args.includes('host'))) {
    const fds = await readdir(`/proc/${p.pid}/fd`).catch(() => [] as string[]);
    for (const fd of fds) {
      const target = await readlink(`/proc/${p.pid}/fd/${fd}`).catch(() => '');
      if (target === log) return p;
    }
  }
  return undefined;
}

/** The value of a flag the image's data source was last started with (from the start line in its log). */
export async function dataSourceFlag(dataDir: string, image: string, flag: string): Promise<string | undefined> {
  const lines = (await readFile(dataSourceLog(dataDir, image), 'utf8').catch(() => '')).split('\n');
  const start = lines.reverse().find((l) => l.includes(`"msg":"starting backing-image-ds-${image}:`));
  if (!start) return undefined;
  const args = (JSON.parse(start) as { msg: string }).msg.split(' ');
  const i = args.indexOf(flag);
  return i >= 0 ? args[i + 1] : undefined;
}

/** The pid recorded for a workload under `<dataDir>/processes` (managers: `<bim name>`, data sources: `backing-image-ds-<image>`). */
export async function recordedPids(dataDir: string): Promise<{ name: string; pid: number }[]> {
  const dir = path.join(dataDir, 'processes');
  const out: { name: string; pid: number }[] = [];
  for (const f of await readdir(dir).catch(() => [] as string[])) {
    if (!f.endsWith('.json')) continue;
    try {
      const r = JSON.parse(await readFile(path.join(dir, f), 'utf8')) as { name: string; pid: number };
      out.push({ name: r.name, pid: r.pid });
    } catch {
      // being written
    }
  }
  return out;
}

/** The data-plane process of this system that matches, found through the pid records. */
export async function recordedProcess(dataDir: string, match: (name: string) => boolean): Promise<{ name: string; pid: number } | undefined> {
  const live = new Set((await processesOf(dataDir)).map((p) => p.pid));
  return (await recordedPids(dataDir)).find((r) => match(r.name) && live.has(r.pid));
}

// ------------------------------------------------------------------ the three checks

/** Disk UUID → disk directory, from each disk's `longhorn-disk.cfg`. */
export async function diskPaths(dataDir: string): Promise<Map<string, string>> {
  const m = new Map<string, string>();
  const root = path.join(dataDir, 'disks');
  for (const d of await readdir(root).catch(() => [] as string[])) {
    try {
      const cfg = JSON.parse(await readFile(path.join(root, d, 'longhorn-disk.cfg'), 'utf8')) as { diskUUID: string };
      m.set(cfg.diskUUID, path.join(root, d));
    } catch {
      // not a disk
    }
  }
  return m;
}

export async function sha512File(file: string): Promise<string> {
  const h = createHash('sha512');
  for await (const c of createReadStream(file)) h.update(c as Buffer);
  return h.digest('hex');
}

/**
 * Check 2: every copy the API reports `ready` has, on disk, bytes whose SHA-512 is the image's expected checksum.
 * Returns the number of ready copies hashed.
 */
export async function assertNoCorruptReadyCopy(sys: FaultSystem, images: Record<string, string>): Promise<number> {
  const disks = await diskPaths(sys.dataDir);
  let hashed = 0;
  const bad: string[] = [];
  for (const [name, sum] of Object.entries(images)) {
    const b = await getImage(sys, name);
    if (!b) continue;
    for (const disk of readyDisks(b)) {
      const file = path.join(disks.get(disk) ?? `<unknown disk ${disk}>`, 'backing-images', `${name}-${b.uuid}`, 'backing');
      const got = await sha512File(file).catch((e: Error) => `unreadable: ${e.message}`);
      hashed++;
      if (got !== sum) bad.push(`${name} on ${disk} (${file}) is ready but hashes to ${got.slice(0, 16)}…, expected ${sum.slice(0, 16)}…`);
    }
  }
  if (bad.length) throw new Error(`corrupt copies served as ready:\n${bad.join('\n')}`);
  return hashed;
}

/**
 * Check 3a, while the system runs: each disk has exactly one manager, and every process that points into the data
 * directory is a child (or, for tools, a grandchild) of the running controller.
 */
export async function assertNoOrphanWhileRunning(sys: FaultSystem, disks: number): Promise<void> {
  await until('exactly one manager per disk, every data-plane process a child of the running controller', async () => {
    const procs = (await processesOf(sys.dataDir)).filter((p) => p.pid !== sys.controllerPid());
    const ours = new Set([sys.controllerPid(), ...procs.filter((p) => p.ppid === sys.controllerPid()).map((p) => p.pid)]);
    const strays = procs.filter((p) => !ours.has(p.ppid));
    const managers = procs.filter(isManager);
    const perDisk = new Map<string, number>();
    for (const m of managers) {
      const d = m.args[m.args.indexOf('--disk-path') + 1] ?? '';
      perDisk.set(d, (perDisk.get(d) ?? 0) + 1);
    }
    if (strays.length === 0 && perDisk.size === disks && [...perDisk.values()].every((n) => n === 1)) return true;
    throw new Error(`strays: ${JSON.stringify(strays.map((p) => ({ pid: p.pid, ppid: p.ppid, cmd: p.args.slice(1, 2) })))}; managers per disk: ${JSON.stringify([...perDisk])}`);
  }, 30_000, 300);
}

/** Files under `dir` whose name ends in `.tmp` (e.g. `backing.tmp`, a half-written record). */
export async function tmpFiles(dir: string): Promise<string[]> {
  const out: string[] = [];
  for (const e of await readdir(dir, { withFileTypes: true }).catch(() => [])) {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) out.push(...(await tmpFiles(p)));
    else if (e.name.endsWith('.tmp')) out.push(p);
  }
  return out;
}

/** Check 3b, after the system stopped: no process points into the data directory, no pid record, no `*.tmp` file. */
export async function assertNothingLeftAfterStop(dataDir: string): Promise<void> {
  await until('no process of the system left after its stop', async () => {
    const left = await processesOf(dataDir);
    if (left.length === 0) return true;
    throw new Error(JSON.stringify(left.map((p) => ({ pid: p.pid, ppid: p.ppid, args: p.args.slice(0, 3) }))));
  }, 20_000, 200);
  const records = (await readdir(path.join(dataDir, 'processes')).catch(() => [] as string[])).filter((f) => f.endsWith('.json'));
  if (records.length) throw new Error(`pid records left after the stop: ${records.join(', ')}`);
  const tmps = await tmpFiles(dataDir);
  if (tmps.length) throw new Error(`stray *.tmp files: ${tmps.join(', ')}`);
}

/** Kills (SIGKILL) whatever of the system still runs: only for the cleanup of a failed case. */
export async function killLeftovers(dataDir: string): Promise<void> {
  for (const p of await processesOf(dataDir)) {
    try {
      process.kill(p.pid, 'SIGKILL');
    } catch {
      // gone
    }
  }
}

/** The last lines of every log of the system (for a failed case). */
export async function logTails(dataDir: string, lines = 12): Promise<string> {
  const dir = path.join(dataDir, 'logs');
  const out: string[] = [];
  for (const f of await readdir(dir).catch(() => [] as string[])) {
    const text = await readFile(path.join(dir, f), 'utf8').catch(() => '');
    out.push(`== ${f}\n${text.split('\n').slice(-lines).join('\n')}`);
  }
  return out.join('\n');
}
