import { spawn, type ChildProcess } from 'node:child_process';
import { WatchHub } from './watch-hub.js';
import net from 'node:net';
import type { Socket } from 'node:net';
import { LIVENESS_FD_ENV, procStat, removeProcessRecord, writeProcessRecord } from './process-lifecycle.js';
import { RotatingLogFile, type RotatingLogOptions } from './rotating-log.js';
import {
  matchesLabels,
  WorkloadExistsError,
  WorkloadNotFoundError,
  type WorkloadEvent,
  type WorkloadRuntime,
  type WorkloadSpec,
  type WorkloadStatus,
} from './types.js';

export interface LocalProcessRuntimeOptions {
  /** Host the readiness probes connect to. Default 127.0.0.1. */
  probeHost?: string;
  /** Readiness probe period until a workload is ready, and after a failed probe. Default 500 ms. */
  probeIntervalMs?: number;
  /**
   * Readiness probe period while the workload is ready and its last probe passed (Kubernetes' periodSeconds is 10 s
   * by default). Default the larger of 5 s and `probeIntervalMs`. A workload that ends is seen at once from its
   * process; the probe only finds one that runs but stopped accepting connections. At a 200 ms period the probes of 6
   * ready workloads were 30 loopback connections a second in the standalone controller-manager, 3 % of its CPU.
   */
  readyProbeIntervalMs?: number;
  /** How long one probe connect may take. Default the larger of 1 s and the period. */
  probeTimeoutMs?: number;
  /**
   * Consecutive failed probes before a ready workload is reported not ready (Kubernetes' failureThreshold, 3 by
   * default there and in Longhorn's probes). A single slow connect on a loaded machine is not a failure of the workload.
   */
  probeFailureThreshold?: number;
  /** Size cap and rotation of every workload's log file. */
  log?: RotatingLogOptions;
  /** Environment every workload starts from (spec.env is added). Default: this process's environment. */
  baseEnv?: NodeJS.ProcessEnv;
  /** Default SIGTERM→SIGKILL grace period. Default 10 s. */
  terminationGracePeriodMs?: number;
  /**
   * Directory of the pid records: `<name>.json` with pid, start time and command of each running child, written when
   * it starts and removed when it ends. After a crash of this process the records that remain name the children to
   * end (`endRecordedProcesses`). Default: no records.
   */
  pidDir?: string;
  /**
   * Give each child a liveness pipe as fd 3 (named by `BIS_LIVENESS_FD`), whose EOF tells the child this process is
   * gone (`exitWithParent`). Default true.
   */
  livenessPipe?: boolean;
}

interface Workload {
  spec: WorkloadSpec;
  status: WorkloadStatus;
  log: RotatingLogFile;
  child?: ChildProcess;
  /** This process's end of the child's liveness pipe: open for as long as this process lives. */
  liveness?: Socket;
  /** Writes and removals of the pid record, in order. */
  recordOps: Promise<void>;
  /** A pid record of the current run is written (or being written). */
  recorded: boolean;
  runStartedAt: number;
  backoffMs: number;
  restartTimer?: NodeJS.Timeout;
  probeTimer?: NodeJS.Timeout;
  /** Consecutive failed probes while ready. */
  probeFailures: number;
  stopping: boolean;
  exited?: Promise<void>;
}

const nowIso = (): string => new Date().toISOString().replace(/\.\d{3}Z$/, 'Z');

/** A line of the runtime in a workload's log: JSON like the lines of the processes (`component: "runtime"`). */
const runtimeLine = (level: 'info' | 'warn' | 'error', msg: string): string => `${JSON.stringify({ level, time: new Date().toISOString(), component: 'runtime', msg })}\n`;

/**
 * Runs workloads as local child processes. Each runs in its own process group (so a stop also reaches its
 * children), with stdout+stderr appended to a size-capped, rotated log file. Readiness = every declared TCP
 * port accepts a connection. Exits are restarted per the workload's RestartPolicy with exponential backoff
 * (reset after a run that lasted twice the maximum backoff). On process exit every group still running is SIGKILLed.
 */
export class LocalProcessRuntime implements WorkloadRuntime {
  private readonly workloads = new Map<string, Workload>();
  private readonly hub = new WatchHub<WorkloadEvent>();
  private readonly opts: Required<Omit<LocalProcessRuntimeOptions, 'log' | 'baseEnv' | 'pidDir'>> & Pick<LocalProcessRuntimeOptions, 'log' | 'baseEnv' | 'pidDir'>;
  private readonly onProcessExit = (): void => {
    for (const w of this.workloads.values()) if (w.child?.pid) killGroup(w.child.pid, 'SIGKILL');
  };

  constructor(opts: LocalProcessRuntimeOptions = {}) {
    this.opts = {
      probeHost: opts.probeHost ?? '127.0.0.1',
      probeIntervalMs: opts.probeIntervalMs ?? 500,
      readyProbeIntervalMs: opts.readyProbeIntervalMs ?? Math.max(5000, opts.probeIntervalMs ?? 500),
      probeTimeoutMs: opts.probeTimeoutMs ?? Math.max(1000, opts.probeIntervalMs ?? 500),
      probeFailureThreshold: Math.max(1, opts.probeFailureThreshold ?? 3),
      terminationGracePeriodMs: opts.terminationGracePeriodMs ?? 10_000,
      log: opts.log,
      baseEnv: opts.baseEnv,
      pidDir: opts.pidDir,
      livenessPipe: opts.livenessPipe ?? true,
    };
  }

  async start(spec: WorkloadSpec): Promise<WorkloadStatus> {
    validateSpec(spec);
    if (this.workloads.has(spec.name)) throw new WorkloadExistsError(spec.name);
    const log = new RotatingLogFile(spec.logFile, this.opts.log);
    const w: Workload = {
      spec: structuredClone(spec),
      status: { name: spec.name, labels: { ...(spec.labels ?? {}) }, phase: 'pending', ready: false, restarts: 0, message: 'starting' },
      log,
      runStartedAt: 0,
      backoffMs: 0,
      stopping: false,
      probeFailures: 0,
      recordOps: Promise.resolve(),
      recorded: false,
    };
    if (this.workloads.size === 0) process.on('exit', this.onProcessExit);
    this.workloads.set(spec.name, w);
    await new Promise<void>((resolve, reject) => {
      if (!log.writable) return reject(new Error('log closed'));
      log.write('', (err) => (err ? reject(err) : resolve()));
    }).catch((err: Error) => {
      this.workloads.delete(spec.name);
      throw new Error(`cannot open log file ${spec.logFile} for workload ${spec.name}: ${err.message}`);
    });
    this.emit('ADDED', w);
    await this.spawnRun(w);
    return this.snapshot(w);
  }

  get(name: string): WorkloadStatus | undefined {
    const w = this.workloads.get(name);
    return w ? this.snapshot(w) : undefined;
  }

  list(labels?: Record<string, string>): WorkloadStatus[] {
    return [...this.workloads.values()]
      .filter((w) => matchesLabels(w.status.labels, labels))
      .map((w) => this.snapshot(w))
      .sort((a, b) => a.name.localeCompare(b.name));
  }

  async stop(name: string, opts: { gracePeriodMs?: number } = {}): Promise<WorkloadStatus> {
    const w = this.workloads.get(name);
    if (!w) throw new WorkloadNotFoundError(name);
    if (!w.stopping) {
      w.stopping = true;
      if (w.restartTimer) clearTimeout(w.restartTimer);
      w.restartTimer = undefined;
      const pid = w.child?.pid;
      if (w.child && w.exited && pid) {
        killGroup(pid, 'SIGTERM');
        const grace = opts.gracePeriodMs ?? w.spec.terminationGracePeriodMs ?? this.opts.terminationGracePeriodMs;
        const killer = setTimeout(() => {
          w.log.write(runtimeLine('warn', `grace period of ${grace} ms over, sending SIGKILL`));
          killGroup(pid, 'SIGKILL');
        }, grace);
        await w.exited;
        clearTimeout(killer);
      }
      await w.recordOps;
      this.stopProbe(w);
      w.status.ready = false;
      w.status.message = `stopped`;
      if (w.status.phase === 'pending' || w.status.phase === 'running') w.status.phase = w.status.exitCode === 0 ? 'succeeded' : 'failed';
      await new Promise<void>((resolve) => w.log.end(resolve));
      this.workloads.delete(name);
      if (this.workloads.size === 0) process.off('exit', this.onProcessExit);
      this.emit('DELETED', w);
    } else if (w.exited) {
      await w.exited;
    }
    return this.snapshot(w);
  }

  async stopAll(opts: { gracePeriodMs?: number } = {}): Promise<void> {
    // A workload removed meanwhile (WorkloadNotFoundError) or one that fails to stop must not keep the others running.
    await Promise.all([...this.workloads.keys()].map((n) => this.stop(n, opts).catch(() => undefined)));
  }

  watch(signal: AbortSignal): AsyncIterable<WorkloadEvent> {
    return this.hub.watch(signal, () => [...this.workloads.values()].map((w) => ({ type: 'ADDED' as const, status: this.snapshot(w) })));
  }

  // ------------------------------------------------------------------ internals

  private snapshot(w: Workload): WorkloadStatus {
    return structuredClone(w.status);
  }

  private emit(type: WorkloadEvent['type'], w: Workload): void {
    const e = { type, status: this.snapshot(w) };
    this.hub.publish(e);
  }

  private spawnRun(w: Workload): Promise<void> {
    return new Promise<void>((resolveSpawned) => {
      const { spec } = w;
      w.log.write(runtimeLine('info', `starting ${spec.command} ${(spec.args ?? []).join(' ')} (restarts: ${w.status.restarts})`));
      let child: ChildProcess;
      try {
        const liveness = this.opts.livenessPipe;
        child = spawn(spec.command, spec.args ?? [], {
          cwd: spec.cwd,
          env: { ...(this.opts.baseEnv ?? process.env), ...(spec.env ?? {}), ...(liveness ? { [LIVENESS_FD_ENV]: '3' } : {}) },
          stdio: liveness ? ['ignore', 'pipe', 'pipe', 'pipe'] : ['ignore', 'pipe', 'pipe'],
          detached: true,
        });
      } catch (err) {
        this.onRunEnded(w, undefined, null, `failed to start: ${(err as Error).message}`);
        return resolveSpawned();
      }
      w.child = child;
      child.stdout?.pipe(w.log, { end: false });
      child.stderr?.pipe(w.log, { end: false });
      // The child never writes to its liveness pipe; reading lets its end be seen (the 'close' below waits for it).
      w.liveness = (child.stdio[3] as Socket | null | undefined) ?? undefined;
      w.liveness?.on('data', () => undefined).on('error', () => undefined);
      let spawnError: Error | undefined;
      w.exited = new Promise<void>((resolveExited) => {
        child.once('error', (err) => {
          spawnError = err;
          // 'close' follows for spawn failures too.
        });
        child.once('close', (code, sig) => {
          w.child = undefined;
          w.liveness = undefined;
          this.forget(w);
          this.onRunEnded(w, code ?? undefined, sig, spawnError ? `failed to start: ${spawnError.message}` : undefined);
          resolveExited();
          resolveSpawned();
        });
      });
      child.once('spawn', () => {
        w.runStartedAt = Date.now();
        w.status.phase = 'running';
        w.status.pid = child.pid;
        w.status.startedAt = nowIso();
        w.status.exitCode = undefined;
        w.status.signal = undefined;
        w.status.ready = (spec.readinessPorts ?? []).length === 0;
        w.status.message = w.status.ready ? 'running' : 'running, waiting for readiness';
        this.emit('MODIFIED', w);
        if (!w.status.ready) this.startProbe(w);
        this.record(w, child);
        resolveSpawned();
      });
    });
  }

  /** Writes the pid record of a run that just started (when records are kept). */
  private record(w: Workload, child: ChildProcess): void {
    const dir = this.opts.pidDir;
    const pid = child.pid;
    if (!dir || !pid) return;
    const stat = procStat(pid);
    if (!stat) return; // ended already
    const command = [w.spec.command, ...(w.spec.args ?? []).slice(0, 1)].join(' ');
    w.recorded = true;
    w.recordOps = w.recordOps
      .then(() => writeProcessRecord(dir, { name: w.spec.name, pid, startTime: stat.startTime, command }))
      .catch((err: Error) => {
        if (w.log.writable) w.log.write(runtimeLine('warn', `cannot write the pid record under ${dir}: ${err.message}`));
      });
  }

  /** Removes the pid record of a run that ended. */
  private forget(w: Workload): void {
    const dir = this.opts.pidDir;
    if (!dir || !w.recorded) return;
    w.recorded = false;
    // A record left behind names a process that is no longer running: endRecordedProcesses skips it.
    w.recordOps = w.recordOps.then(() => removeProcessRecord(dir, w.spec.name)).catch(() => undefined);
  }

  private onRunEnded(w: Workload, code: number | undefined, sig: NodeJS.Signals | null, failure?: string): void {
    this.stopProbe(w);
    w.status.ready = false;
    w.status.pid = undefined;
    w.status.exitCode = code;
    w.status.signal = sig ?? undefined;
    const how = failure ?? (sig ? `killed by ${sig}` : `exited with code ${code}`);
    w.log.write(runtimeLine(code === 0 ? 'info' : 'warn', how));
    if (w.stopping) {
      w.status.phase = code === 0 ? 'succeeded' : 'failed';
      w.status.message = `stopped: ${how}`;
      this.emit('MODIFIED', w);
      return;
    }
    const ok = code === 0 && !failure;
    const policy = w.spec.restartPolicy ?? { kind: 'Never' };
    const restart = policy.kind === 'Always' || (policy.kind === 'OnFailure' && !ok);
    if (!restart) {
      w.status.phase = ok ? 'succeeded' : 'failed';
      w.status.message = how;
      this.emit('MODIFIED', w);
      return;
    }
    const initial = policy.initialBackoffMs ?? 1000;
    const max = policy.maxBackoffMs ?? 120_000;
    const ranFor = w.runStartedAt ? Date.now() - w.runStartedAt : 0;
    w.backoffMs = w.backoffMs === 0 || ranFor > 2 * max ? initial : Math.min(max, w.backoffMs * 2);
    w.status.phase = 'pending';
    w.status.message = `back-off ${w.backoffMs} ms restarting: ${how}`;
    this.emit('MODIFIED', w);
    w.restartTimer = setTimeout(() => {
      w.restartTimer = undefined;
      if (w.stopping) return;
      w.status.restarts++;
      // spawnRun() never rejects: a failure to start is recorded in the workload's status.
      void this.spawnRun(w);
    }, w.backoffMs);
  }

  private startProbe(w: Workload): void {
    const ports = w.spec.readinessPorts ?? [];
    w.probeFailures = 0;
    const tick = async (): Promise<void> => {
      const results = await Promise.all(ports.map((p) => tcpProbe(this.opts.probeHost, p, this.opts.probeTimeoutMs)));
      if (w.status.phase !== 'running' || w.stopping || w.probeTimer === undefined) return;
      const passed = results.every(Boolean);
      w.probeFailures = passed ? 0 : w.probeFailures + 1;
      // Becoming ready takes one passed probe; losing readiness takes probeFailureThreshold failed ones in a row.
      const ready = passed || (w.status.ready && w.probeFailures < this.opts.probeFailureThreshold);
      if (ready !== w.status.ready) {
        w.status.ready = ready;
        w.status.message = ready ? 'running' : `running, port(s) ${ports.filter((_, i) => !results[i]).join(',')} not accepting connections`;
        this.emit('MODIFIED', w);
      }
      // tick() cannot reject: the probes resolve to true or false.
      const period = w.status.ready && passed ? this.opts.readyProbeIntervalMs : this.opts.probeIntervalMs;
      if (w.probeTimer !== undefined) w.probeTimer = setTimeout(() => void tick(), period);
    };
    w.probeTimer = setTimeout(() => void tick(), 0);
  }

  private stopProbe(w: Workload): void {
    if (w.probeTimer) clearTimeout(w.probeTimer);
    w.probeTimer = undefined;
  }
}

function validateSpec(spec: WorkloadSpec): void {
  const problems: string[] = [];
  if (!spec || typeof spec !== 'object') throw new Error('invalid workload spec: not an object');
  if (!spec.name || !/^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$/.test(spec.name)) problems.push(`name "${spec.name}" must be a lowercase DNS-style name`);
  if (!spec.command) problems.push('command is required');
  if (!spec.logFile) problems.push('logFile is required');
  for (const p of spec.readinessPorts ?? []) if (!Number.isInteger(p) || p < 1 || p > 65535) problems.push(`readiness port ${p} is not a TCP port`);
  const rp = spec.restartPolicy;
  if (rp && !['Never', 'Always', 'OnFailure'].includes(rp.kind)) problems.push(`restartPolicy.kind "${(rp as { kind: string }).kind}" must be Never, Always or OnFailure`);
  if (problems.length) throw new Error(`invalid workload spec ${spec.name ?? ''}: ${problems.join('; ')}`);
}

function killGroup(pid: number, sig: NodeJS.Signals): void {
  try {
    process.kill(-pid, sig);
  } catch {
    try {
      process.kill(pid, sig);
    } catch {
      // already gone
    }
  }
}

function tcpProbe(host: string, port: number, timeoutMs: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = net.connect({ host, port });
    const done = (ok: boolean): void => {
      s.destroy();
      resolve(ok);
    };
    s.setTimeout(timeoutMs, () => done(false));
    s.once('connect', () => done(true));
    s.once('error', () => done(false));
  });
}
