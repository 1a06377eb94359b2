import { readFileSync } from 'node:fs';
import { mkdir, readdir, readFile, rename, rm, writeFile } from 'node:fs/promises';
import net from 'node:net';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';

/**
 * Environment variable naming the file descriptor of a child's liveness pipe (set by {@link LocalProcessRuntime}).
 * The parent holds the only write end and never writes: the child reads EOF exactly when the parent is gone.
 */
export const LIVENESS_FD_ENV = 'BIS_LIVENESS_FD';

/** State and start time of a process from `/proc/<pid>/stat`; undefined when there is no such process. */
export interface ProcStat {
  /** One letter: R, S, D, Z (zombie), T, … */
  state: string;
  /** Start time after boot in clock ticks: with the pid, it names one process (pids are reused, start times are not). */
  startTime: string;
  /** Process group id. */
  pgrp: number;
}

export function procStat(pid: number): ProcStat | undefined {
  if (!Number.isInteger(pid) || pid <= 0) return undefined;
  let text: string;
  try {
    text = readFileSync(`/proc/${pid}/stat`, 'utf8');
  } catch {
    return undefined;
  }
  // The command name (field 2) is in parentheses and may hold spaces or ')': the fields after the last ')' are fixed.
  const fields = text.slice(text.lastIndexOf(')') + 2).split(' ');
  // fields[0] is field 3 (state), fields[2] field 5 (pgrp), fields[19] field 22 (starttime).
  const state = fields[0];
  const startTime = fields[19];
  if (!state || !startTime) return undefined;
  return { state, startTime, pgrp: Number(fields[2]) };
}

/** True when `pid` is a running process (not a zombie) and, if `startTime` is given, the one that started then. */
export function isProcessRunning(pid: number, startTime?: string): boolean {
  const s = procStat(pid);
  return !!s && s.state !== 'Z' && (startTime === undefined || s.startTime === startTime);
}

// ------------------------------------------------------------------ child side

export interface ExitWithParentOptions {
  /** After the parent is gone: time between SIGTERM and SIGKILL of this process (and its group). Default 10 s. */
  graceMs?: number;
  /** Told why the process stops (default: a line on stderr). */
  log?: (message: string) => void;
  /** Environment to read {@link LIVENESS_FD_ENV} from (default process.env; the variable is removed from it). */
  env?: NodeJS.ProcessEnv;
}

/**
 * Child side of the liveness pipe: when this process was started by a runtime that passed one (see
 * {@link LIVENESS_FD_ENV}), it stops once its parent is gone. It sends itself (its process group when it leads one)
 * SIGTERM, so its own shutdown runs, and SIGKILL after `graceMs`. Returns false (and does nothing) when no pipe was
 * passed. Call it first thing at startup; the pipe does not keep the event loop alive.
 */
export function exitWithParent(opts: ExitWithParentOptions = {}): boolean {
  const env = opts.env ?? process.env;
  const raw = env[LIVENESS_FD_ENV];
  if (raw === undefined || raw === '') return false;
  delete env[LIVENESS_FD_ENV]; // the processes this one starts have no such pipe
  const fd = Number(raw);
  const log = opts.log ?? ((m: string) => process.stderr.write(`${new Date().toISOString()} ${m}\n`));
  if (!Number.isInteger(fd) || fd < 3) {
    log(`ignoring ${LIVENESS_FD_ENV}=${JSON.stringify(raw)}: not a file descriptor above 2`);
    return false;
  }
  let pipe: net.Socket;
  try {
    pipe = new net.Socket({ fd, readable: true, writable: false });
  } catch (err) {
    log(`cannot watch the parent process through fd ${fd}: ${(err as Error).message}`);
    return false;
  }
  let fired = false;
  const parentGone = (why: string): void => {
    if (fired) return;
    fired = true;
    // stdout and stderr usually lead to the parent's log pipes, now closed: a write would fail with EPIPE, and an
    // unhandled stream error would end the process before its own shutdown ran.
    for (const s of [process.stdout, process.stderr]) s.on('error', () => undefined);
    const grace = opts.graceMs ?? 10_000;
    log(`parent process gone (${why}): stopping, SIGKILL in ${grace} ms if still running`);
    const group = procStat(process.pid)?.pgrp === process.pid;
    const signal = (sig: NodeJS.Signals): void => {
      try {
        process.kill(group ? -process.pid : process.pid, sig);
      } catch {
        process.kill(process.pid, sig);
      }
    };
    setTimeout(() => signal('SIGKILL'), grace).unref();
    signal('SIGTERM');
  };
  pipe.on('data', () => undefined); // the parent never writes; reading is what makes EOF visible
  pipe.once('end', () => parentGone('liveness pipe closed'));
  pipe.once('error', (err) => parentGone(`liveness pipe: ${err.message}`));
  pipe.unref();
  return true;
}

// ------------------------------------------------------------------ parent side: pid records

/** What a runtime records about each child it starts, so that a later run can find it. */
export interface ProcessRecord {
  /** Workload name. */
  name: string;
  pid: number;
  /** From `/proc/<pid>/stat`: guards against a reused pid. */
  startTime: string;
  /** Executable and script (arguments are left out: they may hold credentials). */
  command: string;
}

const recordFile = (dir: string, name: string): string => path.join(dir, `${name}.json`);

/** Writes (atomically) the record of a child that just started; mode 0600. */
export async function writeProcessRecord(dir: string, record: ProcessRecord): Promise<void> {
  await mkdir(dir, { recursive: true });
  const file = recordFile(dir, record.name);
  const tmp = `${file}.${process.pid}.tmp`;
  await writeFile(tmp, `${JSON.stringify(record)}\n`, { mode: 0o600 });
  await rename(tmp, file);
}

/** Removes a child's record once it has ended. */
export async function removeProcessRecord(dir: string, name: string): Promise<void> {
  await rm(recordFile(dir, name), { force: true });
}

/** Every readable record under `dir` (none when it does not exist). */
export async function readProcessRecords(dir: string): Promise<ProcessRecord[]> {
  let files: string[];
  try {
    files = await readdir(dir);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return [];
    throw err;
  }
  const out: ProcessRecord[] = [];
  for (const f of files.filter((f) => f.endsWith('.json')).sort()) {
    try {
      const r = JSON.parse(await readFile(path.join(dir, f), 'utf8')) as Partial<ProcessRecord>;
      if (typeof r.name === 'string' && Number.isInteger(r.pid) && typeof r.startTime === 'string') {
        out.push({ name: r.name, pid: r.pid!, startTime: r.startTime, command: typeof r.command === 'string' ? r.command : '' });
      }
    } catch {
      // unreadable: removed below by the caller's sweep
    }
  }
  return out;
}

export interface EndedProcess extends ProcessRecord {
  /** `gone`: not running any more (or its pid now names another process); `terminated` by SIGTERM; `killed` by SIGKILL; `survived` SIGKILL. */
  outcome: 'gone' | 'terminated' | 'killed' | 'survived';
}

export interface EndRecordedProcessesOptions {
  /** Between SIGTERM and SIGKILL. Default 10 s. */
  graceMs?: number;
  /** Poll period while waiting for a process to end. Default 50 ms. */
  pollMs?: number;
  log?: (message: string) => void;
}

async function waitGone(pid: number, startTime: string, timeoutMs: number, pollMs: number): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  while (isProcessRunning(pid, startTime)) {
    if (Date.now() >= deadline) return false;
    await sleep(pollMs);
  }
  return true;
}

function signalGroup(pid: number, sig: NodeJS.Signals): void {
  try {
    process.kill(-pid, sig);
  } catch {
    try {
      process.kill(pid, sig);
    } catch {
      // gone meanwhile
    }
  }
}

/**
 * Ends the processes a previous run recorded under `dir` and that still run (same pid, same start time; zombies
 * count as ended): SIGTERM to their process group, SIGKILL after `graceMs`. Every record is removed afterwards,
 * also those of processes already gone. The caller must own `dir` exclusively (e.g. hold the data directory's lock).
 */
export async function endRecordedProcesses(dir: string, opts: EndRecordedProcessesOptions = {}): Promise<EndedProcess[]> {
  const grace = opts.graceMs ?? 10_000;
  const poll = opts.pollMs ?? 50;
  const records = await readProcessRecords(dir);
  const ended = await Promise.all(
    records.map(async (r): Promise<EndedProcess> => {
      if (!isProcessRunning(r.pid, r.startTime)) return { ...r, outcome: 'gone' };
      opts.log?.(`process ${r.pid} (${r.name}: ${r.command}) of a previous run is still running: sending SIGTERM`);
      signalGroup(r.pid, 'SIGTERM');
      if (await waitGone(r.pid, r.startTime, grace, poll)) return { ...r, outcome: 'terminated' };
      opts.log?.(`process ${r.pid} (${r.name}) still running ${grace} ms after SIGTERM: sending SIGKILL`);
      if (isProcessRunning(r.pid, r.startTime)) signalGroup(r.pid, 'SIGKILL');
      if (await waitGone(r.pid, r.startTime, 5_000, poll)) return { ...r, outcome: 'killed' };
      opts.log?.(`process ${r.pid} (${r.name}) survived SIGKILL`);
      return { ...r, outcome: 'survived' };
    }),
  );
  let files: string[] = [];
  try {
    files = await readdir(dir);
  } catch {
    // no directory: nothing recorded
  }
  await Promise.all(files.filter((f) => f.endsWith('.json') || f.endsWith('.tmp')).map((f) => rm(path.join(dir, f), { force: true })));
  return ended;
}
