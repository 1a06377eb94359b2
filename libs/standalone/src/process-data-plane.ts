import { DataSourceClient } from '@bis/data-source-api';
import { confineDiskPath } from '@bis/disk-path';
import { removeFileSet } from '@bis/sync-service/service';
import { appendFile, mkdir, open } from 'node:fs/promises';
import path from 'node:path';
import { ManagerClient } from '@bis/bimrpc';
import {
  dataSourceWorkloadName,
  managerApiFromClient,
  type BackingImageDataSource,
  type BackingImageManager,
  type BackupTargetApi,
  type DataPlane,
  type DataSourceApi,
  DATA_SOURCE_CREDENTIAL_ENV,
  DATA_SOURCE_MALLOC_ENV,
  type DataSourceLaunch,
  type ManagerApi,
  type ManagerLaunch,
  managerLaunchArgs,
  type WorkloadStatus,
} from '@bis/controllers';
import type { WorkloadRuntime, WorkloadStatus as RuntimeStatus } from '@bis/runtime';
import { PortRangeAllocator, PortReservations } from './ports.js';

export interface DataPlaneBinaries {
  /** Path of `apps/backing-image-manager/bin/backing-image-manager.js`. */
  manager: string;
  /** Path of `apps/backing-image-data-source/bin/backing-image-data-source.js`. */
  dataSource: string;
  /** The Node executable (default: this process's). */
  node?: string;
}

export interface ProcessDataPlaneOptions {
  runtime: WorkloadRuntime;
  /** Backup-target operations (the composition root gives `backupTargetOperations` of `@bis/backupstore`). */
  backupTarget: BackupTargetApi;
  binaries: DataPlaneBinaries;
  nodeID: string;
  logsDir: string;
  /** At most this many data sources at once (default 8); more are deferred. */
  maxDataSources?: number;
  /**
   * Runs the data sources instead of `runtime` (one process each): `DataSourceHosts`, several in a shared host
   * process. Given the data source's arguments without the program.
   */
  dataSourceRuntime?: WorkloadRuntime;
  /** Port reservations shared with the data-source hosts (default: its own). */
  ports?: PortReservations;
  /** Hosts/CIDRs the data sources may download from although private or loopback. */
  allowSourceHosts?: readonly string[];
  host?: string;
  /**
   * The system's internal token: its file is passed to every manager and data source (`--internal-token-file`), and
   * the token is sent on every call to them.
   */
  internalAuth?: { tokenFile: string; token: string; allowUnauthenticated?: boolean };
}

interface Endpoint {
  address: string;
  syncAddress: string;
  diskUUID: string;
}

const COMPONENT = 'longhorn.io/component';
/** How much of the end of a log a failure message is taken from. */
const LOG_TAIL_BYTES = 16 * 1024;

/**
 * The standalone DataPlane: every manager and data source is a local process run by `@bis/runtime`, listening on
 * 127.0.0.1 with ports of its own. Restarts are the controllers' job (restartPolicy Never, as Longhorn's pods).
 */
export class ProcessDataPlane implements DataPlane {
  private readonly endpoints = new Map<string, Endpoint>();
  private readonly everReady = new Set<string>();
  /** Data sources being started (until their process is registered with the runtime). */
  private readonly starting = new Map<string, Promise<'started' | 'deferred'>>();
  private readonly clients = new Map<string, ManagerClient>();
  private readonly listeners = new Set<(kind: 'manager' | 'data-source', name: string) => void>();
  private readonly ac = new AbortController();
  private readonly ranges = new PortRangeAllocator();
  private readonly ports: PortReservations;
  private readonly host: string;

  /** Runs the data sources: the shared hosts, or `runtime`. */
  private readonly dsRuntime: WorkloadRuntime;

  constructor(private readonly o: ProcessDataPlaneOptions) {
    this.host = o.host ?? '127.0.0.1';
    this.ports = o.ports ?? new PortReservations(this.host);
    this.dsRuntime = o.dataSourceRuntime ?? o.runtime;
    // watchRuntime() never rejects: the watch ends with close().
    void this.watchRuntime(o.runtime);
    if (this.dsRuntime !== o.runtime) void this.watchRuntime(this.dsRuntime);
  }

  private async watchRuntime(runtime: WorkloadRuntime): Promise<void> {
    try {
      for await (const ev of runtime.watch(this.ac.signal)) {
        const s = ev.status;
        if (ev.type === 'DELETED') this.everReady.delete(s.name);
        else if (s.ready && this.endpoints.has(s.name)) this.everReady.add(s.name);
        const comp = s.labels[COMPONENT];
        const kind = comp === 'backing-image-manager' ? 'manager' : comp === 'backing-image-data-source' ? 'data-source' : undefined;
        if (!kind) continue;
        const name = kind === 'manager' ? s.name : (s.labels['longhorn.io/backing-image-data-source'] ?? '');
        for (const l of this.listeners) l(kind, name);
      }
    } catch {
      // the watch ends with close()
    }
  }

  onWorkloadChange(listener: (kind: 'manager' | 'data-source', name: string) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  /** Process id of a running workload (for operators and tests). */
  pidOf(name: string): number | undefined {
    return (this.o.runtime.get(name) ?? this.dsRuntime.get(name))?.pid;
  }

  /** Names of the workloads that exist now (with shared data-source hosts: the hosts and each data source). */
  workloads(): string[] {
    const names = this.o.runtime.list().map((w) => w.name);
    return this.dsRuntime === this.o.runtime ? names : [...names, ...this.dsRuntime.list().map((w) => w.name)];
  }

  /** Stops watching the runtime and closes every gRPC channel (does not stop workloads). */
  close(): void {
    this.ac.abort();
    for (const c of this.clients.values()) c.close();
    this.clients.clear();
  }

  /** The last 5 lines of a workload's log (the message of each JSON line), read from its last 16 KiB (the log itself may be up to 10 MiB). */
  private async tail(name: string): Promise<string> {
    try {
      const fh = await open(path.join(this.o.logsDir, `${name}.log`), 'r');
      try {
        const { size } = await fh.stat();
        const len = Math.min(size, LOG_TAIL_BYTES);
        const buf = Buffer.alloc(len);
        await fh.read(buf, 0, len, size - len);
        const lines = buf.toString('utf8').trimEnd().split('\n');
        if (len < size) lines.shift(); // the first line is cut
        return lines.slice(-5).map(readableLogLine).join(' | ');
      } finally {
        await fh.close();
      }
    } catch {
      return '';
    }
  }

  private async toStatus(name: string, s: RuntimeStatus | undefined): Promise<WorkloadStatus> {
    const ep = this.endpoints.get(name);
    const base = { nodeID: this.o.nodeID, diskUUID: ep?.diskUUID ?? '', ip: this.host, address: ep?.address ?? '', syncAddress: ep?.syncAddress ?? '' };
    if (!s || !ep) return { ...base, phase: 'missing', ip: '', address: '', syncAddress: '' };
    if (s.phase === 'pending') return { ...base, phase: 'pending' };
    if (s.phase === 'running') {
      if (s.ready) return { ...base, phase: 'ready' };
      return { ...base, phase: this.everReady.has(name) ? 'not-ready' : 'pending' };
    }
    const how = s.signal ? `signal ${s.signal}` : `exit code ${s.exitCode ?? '?'}`;
    return { ...base, phase: 'failed', message: `process ended with ${how}${s.message ? `: ${s.message}` : ''}; log: ${await this.tail(name)}` };
  }

  async managerStatus(bim: BackingImageManager): Promise<WorkloadStatus> {
    return this.toStatus(bim.metadata.name, this.o.runtime.get(bim.metadata.name));
  }

  async startManager(bim: BackingImageManager, launch?: ManagerLaunch): Promise<void> {
    const name = bim.metadata.name;
    if (this.o.runtime.get(name)) return;
    this.ports.release(name);
    const [grpc, sync] = (await this.ports.reserve(name, 2)) as [number, number];
    const diskPath = bim.spec?.diskPath ?? '';
    const ep: Endpoint = { address: `${this.host}:${grpc}`, syncAddress: `${this.host}:${sync}`, diskUUID: bim.spec?.diskUUID ?? '' };
    this.endpoints.set(name, ep);
    this.everReady.delete(name);
    const args = [
      this.o.binaries.manager,
      'daemon',
      '--listen', ep.address,
      '--sync-listen', ep.syncAddress,
      '--disk-path', diskPath,
      '--disk-uuid', ep.diskUUID,
      '--port-range', this.ranges.allocate(),
      '--advertise-address', this.host,
      ...(this.o.allowSourceHosts ?? []).flatMap((h) => ['--allow-source-host', h]),
      ...managerLaunchArgs(launch),
      ...this.authArgs(),
    ];
    await this.start(name, args, [grpc, sync], { [COMPONENT]: 'backing-image-manager', 'longhorn.io/disk-uuid': ep.diskUUID });
  }

  private authArgs(): string[] {
    const a = this.o.internalAuth;
    if (!a) return [];
    return ['--internal-token-file', a.tokenFile, ...(a.allowUnauthenticated ? ['--allow-unauthenticated-internal-calls'] : [])];
  }

  private async start(name: string, args: string[], ports: number[], labels: Record<string, string>, env?: Record<string, string>, runtime = this.o.runtime): Promise<void> {
    await mkdir(this.o.logsDir, { recursive: true });
    const logFile = path.join(this.o.logsDir, `${name}.log`);
    await appendFile(logFile, `${JSON.stringify({ level: 'info', time: new Date().toISOString(), component: 'runtime', msg: `starting ${name}: ${args.join(' ')}` })}\n`);
    await runtime.start({
      name,
      labels,
      command: this.o.binaries.node ?? process.execPath,
      args,
      logFile,
      readinessPorts: ports,
      restartPolicy: { kind: 'Never' },
      terminationGracePeriodMs: 10_000,
      ...(env ? { env } : {}),
    });
  }

  async deleteManager(bimName: string): Promise<void> {
    const address = this.endpoints.get(bimName)?.address ?? '';
    await this.stop(bimName);
    const c = this.clients.get(address);
    if (c) {
      c.close();
      this.clients.delete(address);
    }
  }

  /** Stops a workload and forgets everything kept about it (ports, endpoint, readiness seen). */
  private async stop(name: string, runtime = this.o.runtime): Promise<void> {
    if (runtime.get(name)) {
      try {
        await runtime.stop(name);
      } catch (err) {
        if ((err as Error).name !== 'WorkloadNotFoundError') throw err;
      }
    }
    this.ports.release(name);
    this.endpoints.delete(name);
    this.everReady.delete(name);
  }

  /** How many workloads the data plane keeps an endpoint for (each started one until it is deleted). */
  get trackedWorkloads(): number {
    return this.endpoints.size;
  }

  managerClient(address: string): ManagerApi {
    let c = this.clients.get(address);
    if (!c) this.clients.set(address, (c = new ManagerClient(address, { callTimeoutMs: 60_000, token: this.o.internalAuth?.token })));
    return managerApiFromClient(c);
  }

  async dataSourceStatus(bids: BackingImageDataSource): Promise<WorkloadStatus> {
    const w = dataSourceWorkloadName(bids.metadata.name);
    return this.toStatus(w, this.dsRuntime.get(w));
  }

  async startDataSource(bids: BackingImageDataSource, launch: DataSourceLaunch): Promise<'started' | 'deferred'> {
    const name = dataSourceWorkloadName(bids.metadata.name);
    // A delete that comes while the process is being started waits for the start, then stops it: it must never find
    // "nothing to stop" and leave a process that starts a moment later running.
    const p = this.launchDataSource(name, bids, launch);
    this.starting.set(name, p);
    try {
      return await p;
    } finally {
      if (this.starting.get(name) === p) this.starting.delete(name);
    }
  }

  private async launchDataSource(name: string, bids: BackingImageDataSource, launch: DataSourceLaunch): Promise<'started' | 'deferred'> {
    if (this.dsRuntime.get(name)) return 'started';
    const running = this.dsRuntime.list({ [COMPONENT]: 'backing-image-data-source' }).length;
    if (running >= (this.o.maxDataSources ?? 8)) return 'deferred';
    this.ports.release(name);
    const [http, sync] = (await this.ports.reserve(name, 2)) as [number, number];
    const ep: Endpoint = { address: `${this.host}:${http}`, syncAddress: `${this.host}:${sync}`, diskUUID: bids.spec?.diskUUID ?? '' };
    this.endpoints.set(name, ep);
    this.everReady.delete(name);
    const args = [
      '--listen', ep.address,
      '--sync-listen', ep.syncAddress,
      '--disk-path', launch.diskPath,
      '--name', launch.name,
      '--uuid', launch.uuid,
      '--source-type', launch.sourceType,
      ...Object.entries(launch.parameters).flatMap(([k, v]) => ['--parameters', `${k}=${v}`]),
      ...(launch.checksum ? ['--checksum', launch.checksum] : []),
      ...(this.o.allowSourceHosts?.length ? ['--allow-source-hosts', this.o.allowSourceHosts.join(',')] : []),
      '--max-size', String(launch.maxImageSize),
      '--storage-reserved', String(launch.storageReserved),
      ...this.authArgs(),
    ];
    const env = { ...DATA_SOURCE_MALLOC_ENV, ...(Object.keys(launch.credentials).length > 0 ? { [DATA_SOURCE_CREDENTIAL_ENV]: JSON.stringify(launch.credentials) } : {}) };
    const labels = { [COMPONENT]: 'backing-image-data-source', 'longhorn.io/backing-image-data-source': bids.metadata.name, 'longhorn.io/disk-uuid': ep.diskUUID };
    // A data source of its own is a process running the program; a shared host is given the arguments alone.
    const shared = this.dsRuntime !== this.o.runtime;
    await this.start(name, shared ? args : [this.o.binaries.dataSource, ...args], [http], labels, env, this.dsRuntime);
    return 'started';
  }

  async deleteDataSource(bidsName: string): Promise<void> {
    const name = dataSourceWorkloadName(bidsName);
    await this.starting.get(name)?.catch(() => undefined); // only waits for a start in progress to settle; its failure went to its own caller
    await this.stop(name, this.dsRuntime);
  }

  /** The data source's file set in `<disk>/tmp`, confined to the disk (its name and uuid are checked as any path). */
  async discardDataSourceFiles(bids: BackingImageDataSource): Promise<void> {
    const root = bids.spec?.diskPath;
    if (!root || !bids.spec?.uuid) return;
    const { path: file } = await confineDiskPath({ root, kind: 'data-source-file', name: bids.metadata.name, uuid: bids.spec.uuid });
    await removeFileSet(file);
  }

  dataSourceClient(address: string): DataSourceApi {
    return new DataSourceClient(address, { token: this.o.internalAuth?.token });
  }

  get backupTarget(): BackupTargetApi {
    return this.o.backupTarget;
  }
}

/** The message of a JSON log line (`WARN message`), or the line itself when it is not one (e.g. a crash's stack). */
function readableLogLine(line: string): string {
  if (!line.startsWith('{')) return line;
  try {
    const o = JSON.parse(line) as { level?: unknown; msg?: unknown };
    if (typeof o.msg !== 'string') return line;
    return typeof o.level === 'string' && o.level !== 'info' ? `${o.level.toUpperCase()} ${o.msg}` : o.msg;
  } catch {
    return line;
  }
}
