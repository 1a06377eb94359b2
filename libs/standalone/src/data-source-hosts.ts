import path from 'node:path';
import { DataSourceHostClient, type InstanceStatus } from '@bis/data-source-api/host';
import {
  WatchHub,
  WorkloadExistsError,
  WorkloadNotFoundError,
  matchesLabels,
  type WorkloadEvent,
  type WorkloadRuntime,
  type WorkloadSpec,
  type WorkloadStatus,
} from '@bis/runtime';
import type { PortReservations } from './ports.js';

export interface DataSourceHostsOptions {
  /** Runs the host processes. */
  base: WorkloadRuntime;
  /** The Node executable and `apps/backing-image-data-source/bin/backing-image-data-source.js`. */
  node: string;
  binary: string;
  /** Host logs (`<name>.log`) and instance logs (`<instance>.log`). */
  logsDir: string;
  /** Data sources per host process. */
  instancesPerHost: number;
  /** Address the hosts' control APIs listen on. */
  host: string;
  ports: PortReservations;
  /** The system's internal token: the hosts require it on their control API. */
  internalAuth?: { tokenFile: string; token: string };
  /** Environment of the host processes (added to the runtime's). */
  env?: Record<string, string>;
  /** A host without instances stops after this long (default 30 s). */
  idleStopMs?: number;
  /** Labels of the host workloads. */
  labels?: Record<string, string>;
}

interface Host {
  name: string;
  members: Set<string>;
  client: DataSourceHostClient;
  ready: Promise<void>;
  readyResolve: () => void;
  readyReject: (e: Error) => void;
  ended?: string;
  ac: AbortController;
  idleTimer?: NodeJS.Timeout;
  /** Set when the host ended: its process stopped and its port released. */
  stopped?: Promise<void>;
  /** The last instance table read. */
  table?: { version: number; byName: Map<string, InstanceStatus> };
}

interface Instance {
  status: WorkloadStatus;
  host: Host;
  /** The host's id of this start, once the host answered it (the host lists it until it is stopped). */
  id?: string;
  /** The table version the status reflects (an older answer never overwrites a newer one). */
  version: number;
  stopping: boolean;
}

export const DATA_SOURCE_HOST_COMPONENT = 'backing-image-data-source-host';

/**
 * A {@link WorkloadRuntime} whose workloads are data sources run by shared host processes (`backing-image-data-source
 * host`, at most `instancesPerHost` each) instead of one process per data source. Hosts are started when every host
 * is full and stopped after being idle. A host that ends fails all its data sources (the controllers start them
 * again, as after a data-source process ended). `spec.command` is not used: `spec.args` are the data source's
 * arguments and `spec.env` its environment; the status's `pid` is its host's.
 */
export class DataSourceHosts implements WorkloadRuntime {
  readonly #hosts = new Map<string, Host>();
  readonly #instances = new Map<string, Instance>();
  readonly #hub = new WatchHub<WorkloadEvent>();
  readonly #ac = new AbortController();
  #seq = 0;

  constructor(private readonly o: DataSourceHostsOptions) {
    void this.#watchBase();
  }

  async #watchBase(): Promise<void> {
    try {
      for await (const ev of this.o.base.watch(this.#ac.signal)) {
        const h = this.#hosts.get(ev.status.name);
        if (!h) continue;
        const s = ev.status;
        if (ev.type === 'DELETED' || s.phase === 'failed' || s.phase === 'succeeded') {
          const how = s.signal ? `signal ${s.signal}` : s.exitCode !== undefined ? `exit code ${s.exitCode}` : s.message || 'removed';
          void this.#hostEnded(h, `ended (${how})`);
        } else if (s.ready) h.readyResolve();
      }
    } catch {
      // ends with close()
    }
  }

  #emit(type: WorkloadEvent['type'], i: Instance): void {
    this.#hub.publish({ type, status: structuredClone(i.status) });
  }

  /** A host with room, or a new one. */
  #pick(): Host {
    for (const h of this.#hosts.values()) if (!h.ended && h.members.size < this.o.instancesPerHost) return h;
    const name = `data-source-host-${++this.#seq}`;
    let readyResolve!: () => void;
    let readyReject!: (e: Error) => void;
    const ready = new Promise<void>((res, rej) => {
      readyResolve = res;
      readyReject = rej;
    });
    ready.catch(() => undefined); // observed by every start that waits on it
    const h: Host = { name, members: new Set(), client: undefined as unknown as DataSourceHostClient, ready, readyResolve, readyReject, ac: new AbortController() };
    this.#hosts.set(name, h);
    void this.#startHost(h);
    return h;
  }

  async #startHost(h: Host): Promise<void> {
    try {
      const [port] = (await this.o.ports.reserve(h.name, 1)) as [number];
      const address = `${this.o.host}:${port}`;
      h.client = new DataSourceHostClient(address, { token: this.o.internalAuth?.token });
      const auth = this.o.internalAuth ? ['--internal-token-file', this.o.internalAuth.tokenFile] : [];
      await this.o.base.start({
        name: h.name,
        labels: { ...(this.o.labels ?? {}), 'longhorn.io/component': DATA_SOURCE_HOST_COMPONENT },
        command: this.o.node,
        args: [this.o.binary, 'host', '--listen', address, '--logs-dir', this.o.logsDir, '--max-instances', String(this.o.instancesPerHost), ...auth],
        logFile: path.join(this.o.logsDir, `${h.name}.log`),
        readinessPorts: [port],
        restartPolicy: { kind: 'Never' },
        terminationGracePeriodMs: 15_000,
        ...(this.o.env ? { env: this.o.env } : {}),
      });
      const st = this.o.base.get(h.name);
      if (st?.ready) h.readyResolve();
      else if (!st || st.phase === 'failed' || st.phase === 'succeeded') void this.#hostEnded(h, `could not start: ${st?.message ?? 'gone'}`);
      await h.ready.catch(() => undefined);
      if (!h.ended) void this.#follow(h);
    } catch (e) {
      void this.#hostEnded(h, `could not start: ${(e as Error).message}`);
    }
  }

  /** Follows the host's instance table (long polls) into the statuses. */
  async #follow(h: Host): Promise<void> {
    let after = -1;
    while (!h.ended && !h.ac.signal.aborted) {
      try {
        const l = await h.client.list({ after, waitSeconds: 25, signal: h.ac.signal });
        after = l.version;
        h.table = { version: l.version, byName: new Map(l.instances.map((st) => [st.name, st])) };
        for (const name of h.members) {
          const i = this.#instances.get(name);
          if (!i || i.stopping || i.id === undefined) continue;
          const st = h.table.byName.get(name);
          if (st?.id === i.id) this.#apply(i, st, l.version);
          else if (l.version > i.version && (i.status.phase === 'running' || i.status.phase === 'pending')) this.#fail(i, `data-source host ${h.name} no longer runs it`);
        }
      } catch {
        if (h.ended || h.ac.signal.aborted) return;
        // The host's end comes through the base runtime; until then, ask again shortly.
        await new Promise((r) => setTimeout(r, 500));
      }
    }
  }

  #apply(i: Instance, s: InstanceStatus, version: number): void {
    if (version < i.version) return;
    i.version = version;
    const phase = s.phase;
    const next = {
      phase,
      ready: s.ready,
      message: s.message,
      ...(s.exitCode !== undefined ? { exitCode: s.exitCode } : {}),
    };
    const cur = i.status;
    if (cur.phase === next.phase && cur.ready === next.ready && cur.message === next.message && cur.exitCode === next.exitCode) return;
    Object.assign(cur, next, { startedAt: s.startedAt });
    this.#emit('MODIFIED', i);
  }

  #fail(i: Instance, message: string): void {
    i.status.phase = 'failed';
    i.status.ready = false;
    i.status.message = message;
    this.#emit('MODIFIED', i);
  }

  /** Marks the host ended and fails its data sources; resolves once its process is stopped and its port released. */
  #hostEnded(h: Host, how: string, gracePeriodMs?: number): Promise<void> {
    if (h.ended) return h.stopped ?? Promise.resolve();
    h.ended = how;
    h.ac.abort();
    clearTimeout(h.idleTimer);
    h.readyReject(new Error(`data-source host ${h.name} ${how}`));
    this.#hosts.delete(h.name);
    h.client?.close();
    for (const name of h.members) {
      const i = this.#instances.get(name);
      if (i && !i.stopping && (i.status.phase === 'running' || i.status.phase === 'pending')) this.#fail(i, `data-source host ${h.name} ${how}`);
    }
    // Its process record and its port (it may have ended by itself).
    h.stopped = this.o.base
      .stop(h.name, gracePeriodMs === undefined ? undefined : { gracePeriodMs })
      .then(() => undefined, () => undefined)
      .finally(() => this.o.ports.release(h.name));
    return h.stopped;
  }

  #leave(h: Host, name: string): void {
    h.members.delete(name);
    if (h.members.size > 0 || h.ended) return;
    clearTimeout(h.idleTimer);
    h.idleTimer = setTimeout(() => {
      if (h.members.size === 0 && !h.ended) void this.#hostEnded(h, 'stopped after being idle');
    }, this.o.idleStopMs ?? 30_000);
    h.idleTimer.unref();
  }

  async start(spec: WorkloadSpec): Promise<WorkloadStatus> {
    if (this.#instances.has(spec.name)) throw new WorkloadExistsError(spec.name);
    const h = this.#pick();
    clearTimeout(h.idleTimer);
    h.members.add(spec.name);
    const i: Instance = {
      status: { name: spec.name, labels: { ...(spec.labels ?? {}) }, phase: 'pending', ready: false, restarts: 0, message: `waiting for data-source host ${h.name}` },
      host: h,
      version: -1,
      stopping: false,
    };
    this.#instances.set(spec.name, i);
    this.#emit('ADDED', i);
    try {
      await h.ready;
      if (i.stopping) return structuredClone(i.status);
      const pid = this.o.base.get(h.name)?.pid;
      if (pid !== undefined) i.status.pid = pid;
      const { version, instance } = await h.client.start(spec.name, { args: spec.args ?? [], ...(spec.env ? { env: spec.env } : {}) });
      i.id = instance.id;
      if (i.stopping) {
        // Stopped while the host was starting it: the stop found nothing to stop on the host.
        await h.client.stop(spec.name).catch(() => undefined);
        return structuredClone(i.status);
      }
      this.#apply(i, instance, version);
      // A table read while the start was answered may be newer than the answer.
      const later = h.table?.byName.get(spec.name);
      if (h.table && later?.id === i.id) this.#apply(i, later, h.table.version);
    } catch (e) {
      if (!i.stopping && i.status.phase !== 'failed') this.#fail(i, `data-source host ${h.name}: ${(e as Error).message}`);
    }
    return structuredClone(i.status);
  }

  async stop(name: string, opts: { gracePeriodMs?: number } = {}): Promise<WorkloadStatus> {
    const i = this.#instances.get(name);
    if (!i) throw new WorkloadNotFoundError(name);
    i.stopping = true;
    const h = i.host;
    if (!h.ended && i.id !== undefined) {
      const s = await h.client.stop(name, opts.gracePeriodMs ?? 10_000).catch(() => undefined);
      if (s) Object.assign(i.status, { phase: s.phase, exitCode: s.exitCode, message: s.message });
    }
    i.status.ready = false;
    if (i.status.phase === 'pending' || i.status.phase === 'running') i.status.phase = i.status.exitCode === 0 ? 'succeeded' : 'failed';
    this.#instances.delete(name);
    this.#leave(h, name);
    this.#emit('DELETED', i);
    return structuredClone(i.status);
  }

  get(name: string): WorkloadStatus | undefined {
    const i = this.#instances.get(name);
    return i ? structuredClone(i.status) : undefined;
  }

  list(labels?: Record<string, string>): WorkloadStatus[] {
    return [...this.#instances.values()]
      .filter((i) => matchesLabels(i.status.labels, labels))
      .map((i) => structuredClone(i.status))
      .sort((a, b) => a.name.localeCompare(b.name));
  }

  watch(signal: AbortSignal): AsyncIterable<WorkloadEvent> {
    return this.#hub.watch(signal, () => [...this.#instances.values()].map((i) => ({ type: 'ADDED' as const, status: structuredClone(i.status) })));
  }

  /** Names of the host processes running now. */
  hosts(): string[] {
    return [...this.#hosts.keys()];
  }

  /** Stops every data source, then every host. */
  async stopAll(opts: { gracePeriodMs?: number } = {}): Promise<void> {
    await Promise.all([...this.#instances.keys()].map((n) => this.stop(n, opts).catch(() => undefined)));
    await Promise.all([...this.#hosts.values()].map((h) => this.#hostEnded(h, 'stopped', opts.gracePeriodMs)));
  }

  /** Stops following the hosts (does not stop them: `stopAll` does). */
  close(): void {
    this.#ac.abort();
    for (const h of this.#hosts.values()) h.ac.abort();
  }
}
