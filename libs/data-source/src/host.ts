/**
 * A data-source host: the instance table of one process that runs several data sources (the app's `host` command).
 * Each instance is one run of the data source (its own HTTP API, sync server, ports and log file
 * `<logsDir>/<name>.log`); the host only starts, stops and reports them. The control API is `@bis/data-source-api/host`.
 */
import path from 'node:path';
import type { Writable } from 'node:stream';
import {
  HostRefusal,
  INSTANCE_NAME_PATTERN,
  type DataSourceInstanceHost,
  type InstanceList,
  type InstanceStatus,
  type StartedInstance,
  type StartInstanceRequest,
} from '@bis/data-source-api/host';
import type { LogDestination } from '@bis/logging';
import { RotatingLogFile } from '@bis/runtime';
import type { SharedInstanceServers } from './servers.js';

/** What one data source run is given (the CLI gives the process's; a host gives each instance its own). */
export interface DataSourceRunIO {
  /** The credential variable and the proxy variables are read from it. */
  env: Readonly<Record<string, string | undefined>>;
  /** Aborted to stop the data source. */
  signal: AbortSignal;
  /** Where the JSON log lines go (default: stderr). */
  logDestination?: LogDestination;
  /** Configuration errors, one line each (default: stderr). */
  errors?: (line: string) => void;
  /** Called once both servers listen. */
  onListening?: (addresses: { http: string; sync: string }) => void;
  /** In a data-source host: the host's shared servers (each data source still listens on its own two ports). */
  servers?: SharedInstanceServers;
}

/** One data source run: resolves with an exit code (0 after a stop, 2 for a configuration error). */
export type DataSourceRun = (argv: readonly string[], io: DataSourceRunIO) => Promise<number>;

export interface DataSourceHostOptions {
  run: DataSourceRun;
  /** Instance logs go to `<logsDir>/<name>.log` (size-capped and rotated). */
  logsDir: string;
  /** At most this many instances at once (more are refused with 429). */
  maxInstances: number;
  /** The environment every instance reads (the host's); a start request's `env` is added to it. */
  env: Readonly<Record<string, string | undefined>>;
  /** How long a stop waits for an instance to end by default (10 s). */
  gracePeriodMs?: number;
  /** The host's own log. */
  log?: (message: string) => void;
}

interface Instance {
  status: InstanceStatus;
  ac: AbortController;
  ended: Promise<void>;
  logFile: RotatingLogFile;
}

const jsonLine = (level: 'info' | 'warn' | 'error', msg: string): string =>
  `${JSON.stringify({ level, time: new Date().toISOString(), component: 'backing-image-data-source-host', msg })}\n`;

/** The instance table. Every change raises the version; `changed` waits for one. */
export class DataSourceHost implements DataSourceInstanceHost {
  readonly #instances = new Map<string, Instance>();
  #version = 0;
  #starts = 0;
  #waiters = new Set<() => void>();

  constructor(private readonly o: DataSourceHostOptions) {}

  #bump(): void {
    this.#version++;
    const w = this.#waiters;
    this.#waiters = new Set();
    for (const f of w) f();
  }

  async start(name: string, request: StartInstanceRequest): Promise<StartedInstance> {
    if (!INSTANCE_NAME_PATTERN.test(name)) throw new HostRefusal(400, `invalid instance name "${name.slice(0, 64)}"`);
    if (this.#instances.has(name)) throw new HostRefusal(409, `instance ${name} exists`);
    if (this.#instances.size >= this.o.maxInstances) throw new HostRefusal(429, `the host runs ${this.#instances.size} instances, its maximum`);
    const logFile = new RotatingLogFile(path.join(this.o.logsDir, `${name}.log`));
    const write = (w: Writable, line: string): void => {
      if (w.writable) w.write(line);
    };
    const ac = new AbortController();
    const status: InstanceStatus = { name, id: `${process.pid}-${++this.#starts}`, phase: 'running', ready: false, message: 'starting', startedAt: new Date().toISOString().replace(/\.\d{3}Z$/, 'Z') };
    let listening!: () => void;
    const listened = new Promise<void>((r) => (listening = r));
    const inst: Instance = { status, ac, logFile, ended: Promise.resolve() };
    this.#instances.set(name, inst);
    this.#bump();
    this.o.log?.(`starting instance ${name}`);
    inst.ended = this.o
      .run(request.args, {
        env: { ...this.o.env, ...(request.env ?? {}) },
        signal: ac.signal,
        logDestination: { stream: logFile },
        errors: (line) => write(logFile, jsonLine('error', line)),
        onListening: () => {
          if (status.phase !== 'running') return;
          status.ready = true;
          status.message = 'listening';
          this.#bump();
          listening();
        },
      })
      .then(
        (code) => {
          status.exitCode = code;
          status.phase = code === 0 ? 'succeeded' : 'failed';
          status.message = code === 0 ? 'stopped' : `ended with exit code ${code}`;
        },
        (e: unknown) => {
          status.exitCode = 1;
          status.phase = 'failed';
          status.message = `ended with an error: ${e instanceof Error ? e.message : String(e)}`;
          write(logFile, jsonLine('error', status.message));
        },
      )
      .then(async () => {
        status.ready = false;
        this.o.log?.(`instance ${name}: ${status.message}`);
        await new Promise<void>((r) => logFile.end(r));
        this.#bump();
      });
    await Promise.race([listened, inst.ended]);
    return { version: this.#version, instance: { ...status } };
  }

  async stop(name: string, gracePeriodMs?: number): Promise<InstanceStatus | undefined> {
    const inst = this.#instances.get(name);
    if (!inst) return undefined;
    inst.ac.abort();
    const grace = gracePeriodMs ?? this.o.gracePeriodMs ?? 10_000;
    let timer: NodeJS.Timeout | undefined;
    const inTime = await Promise.race([
      inst.ended.then(() => true),
      new Promise<boolean>((r) => (timer = setTimeout(() => r(false), grace))),
    ]);
    clearTimeout(timer);
    if (!inTime) {
      // A run cannot be killed apart from the process: it keeps its name until it ends, so its ports are not reused.
      this.o.log?.(`instance ${name} did not stop within ${grace} ms`);
      return { ...inst.status, message: `did not stop within ${grace} ms` };
    }
    if (this.#instances.get(name) === inst) {
      this.#instances.delete(name);
      this.#bump();
    }
    return { ...inst.status };
  }

  list(): InstanceList {
    return {
      version: this.#version,
      pid: process.pid,
      maxInstances: this.o.maxInstances,
      instances: [...this.#instances.values()].map((i) => ({ ...i.status })),
    };
  }

  changed(version: number, signal: AbortSignal): Promise<void> {
    if (this.#version > version || signal.aborted) return Promise.resolve();
    return new Promise<void>((resolve) => {
      const done = (): void => {
        this.#waiters.delete(done);
        signal.removeEventListener('abort', done);
        resolve();
      };
      this.#waiters.add(done);
      signal.addEventListener('abort', done, { once: true });
    });
  }

  /** Stops every instance (the host's shutdown). */
  async close(gracePeriodMs?: number): Promise<void> {
    await Promise.all([...this.#instances.keys()].map((n) => this.stop(n, gracePeriodMs)));
  }
}
