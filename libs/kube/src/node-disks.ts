import { randomUUID } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { LONGHORN_API_VERSION, type Condition } from '@bis/crd-types';
import { NodeKind, type Logger, type Node } from '@bis/controllers';
import { isConflict, isNotFound, type Datastore } from '@bis/datastore';
import { CoalescedRun } from './coalesced-run.js';

/** The disk configuration file Longhorn writes at the root of every disk (`{"diskUUID":"…"}`). */
export const DISK_CONFIG_FILE = 'longhorn-disk.cfg';

export interface NodeDiskReporterOptions {
  store: Datastore;
  namespace: string;
  nodeID: string;
  /** Disk created in a new Node record (Longhorn's `default-data-path`, `/var/lib/longhorn/`). Empty: no disk. */
  defaultDataPath: string;
  /**
   * Prefix under which this process sees host paths (empty when the disks are mounted at their host paths, as the
   * chart does with the data path).
   */
  hostRoot?: string;
  /** Period of the disk check (Longhorn's disk monitor: 30 s). */
  intervalMs?: number;
  log?: Logger;
}

interface DiskCheck {
  uuid: string;
  ready: boolean;
  reason: string;
  message: string;
  storageMaximum: number;
  storageAvailable: number;
}

const rfc3339 = (d: Date): string => d.toISOString().replace(/\.\d{3}Z$/, 'Z');

function condition(type: string, ok: boolean, reason: string, message: string, prev: readonly Condition[] | null | undefined, now: string): Condition {
  const status = ok ? 'True' : 'False';
  const old = prev?.find((c) => c.type === type);
  const unchanged = old && old.status === status && (old.reason ?? '') === reason && (old.message ?? '') === message;
  return { type, status, reason, message, lastProbeTime: '', lastTransitionTime: unchanged ? (old.lastTransitionTime ?? now) : now };
}

/**
 * The node-side disk part of Longhorn's node controller for the node this instance runs on: it creates the Node
 * record (with the default disk) when missing, writes `longhorn-disk.cfg` on each disk of the node's spec that has
 * none, and reports every disk's UUID, capacity and Ready/Schedulable conditions, plus the node's own Ready and
 * Schedulable conditions, in the Node status. Only this node's record is written; another node's record is never
 * touched.
 */
export class NodeDiskReporter {
  private timer: NodeJS.Timeout | undefined;
  private readonly runs = new CoalescedRun(
    () => this.sync(),
    (err) => this.o.log?.warn(`node ${this.o.nodeID}: disk status update failed: ${err.message}`),
    () => this.stopped,
  );
  private stopped = false;

  constructor(private readonly o: NodeDiskReporterOptions) {}

  private hostPath(p: string): string {
    return this.o.hostRoot ? path.join(this.o.hostRoot, p) : p;
  }

  /** Creates the Node record when missing, reports the disks once, then every `intervalMs`. */
  async start(): Promise<void> {
    await this.ensureNode();
    await this.sync();
    this.schedule();
  }

  private schedule(): void {
    if (this.stopped) return;
    this.timer = setTimeout(() => {
      // trigger() never rejects: CoalescedRun passes a failure to onError (the log).
      void this.trigger().finally(() => this.schedule());
    }, this.o.intervalMs ?? 30_000);
    this.timer.unref();
  }

  /** Runs a disk check now (coalesced with one that is running). */
  trigger(): Promise<void> {
    return this.runs.trigger();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
    await this.runs.running;
  }

  /** Longhorn's daemon start: the Node record of this node with one default disk, when there is none. */
  async ensureNode(): Promise<void> {
    const { store, namespace, nodeID } = this.o;
    try {
      await store.get(NodeKind, nodeID, namespace);
      return;
    } catch (err) {
      if (!isNotFound(err)) throw err;
    }
    const disks: NonNullable<Node['spec']>['disks'] = {};
    if (this.o.defaultDataPath) {
      const dir = this.hostPath(this.o.defaultDataPath);
      await fsp.mkdir(dir, { recursive: true });
      const st = await fsp.stat(dir);
      disks[`default-disk-${st.dev.toString(16)}`] = { diskType: 'filesystem', diskDriver: '', path: this.o.defaultDataPath, allowScheduling: true, evictionRequested: false, storageReserved: 0, tags: [] };
    }
    try {
      await store.create(NodeKind, {
        apiVersion: LONGHORN_API_VERSION,
        kind: 'Node',
        metadata: { name: nodeID, namespace },
        spec: { name: nodeID, disks, allowScheduling: true, evictionRequested: false, tags: [], instanceManagerCPURequest: 0 },
      });
      this.o.log?.info(`created node ${nodeID}${this.o.defaultDataPath ? ` with the default disk ${this.o.defaultDataPath}` : ''}`);
    } catch (err) {
      if ((err as { reason?: string }).reason !== 'AlreadyExists') throw err;
    }
  }

  /** Reads (or writes) the disk's `longhorn-disk.cfg` and measures the filesystem. Never throws. */
  async checkDisk(diskPath: string): Promise<DiskCheck> {
    const dir = this.hostPath(diskPath);
    const fail = (reason: string, message: string): DiskCheck => ({ uuid: '', ready: false, reason, message, storageMaximum: 0, storageAvailable: 0 });
    try {
      const st = await fsp.stat(dir);
      if (!st.isDirectory()) return fail('DiskNotReady', `Disk path ${diskPath} is not a directory`);
    } catch (err) {
      return fail('DiskNotReady', `Disk path ${diskPath} is not accessible: ${(err as Error).message}`);
    }
    const cfg = path.join(dir, DISK_CONFIG_FILE);
    let uuid = '';
    try {
      const parsed = JSON.parse(await fsp.readFile(cfg, 'utf8')) as { diskUUID?: unknown };
      if (typeof parsed.diskUUID !== 'string' || !parsed.diskUUID) return fail('DiskNotReady', `Disk config ${cfg} has no diskUUID`);
      uuid = parsed.diskUUID;
    } catch (err) {
      const e = err as NodeJS.ErrnoException;
      if (e.code !== 'ENOENT') return fail('DiskNotReady', `Disk config ${cfg} cannot be read: ${e.message}`);
      uuid = randomUUID();
      try {
        // Written to a temporary name and renamed, so a crash never leaves a truncated config behind.
        const tmp = `${cfg}.tmp-${process.pid}`;
        await fsp.writeFile(tmp, JSON.stringify({ diskUUID: uuid }), { flag: 'w' });
        // The temporary name may already be gone; the link's own error is what matters.
        await fsp.link(tmp, cfg).finally(() => fsp.unlink(tmp).catch(() => undefined));
        this.o.log?.info(`wrote ${cfg} with disk UUID ${uuid}`);
      } catch (werr) {
        if ((werr as NodeJS.ErrnoException).code === 'EEXIST') return this.checkDisk(diskPath);
        return fail('DiskNotReady', `Disk config ${cfg} cannot be written: ${(werr as Error).message}`);
      }
    }
    try {
      const fs = await fsp.statfs(dir);
      return { uuid, ready: true, reason: '', message: '', storageMaximum: fs.blocks * fs.bsize, storageAvailable: fs.bavail * fs.bsize };
    } catch (err) {
      return { ...fail('DiskNotReady', `Disk ${diskPath} cannot be measured: ${(err as Error).message}`), uuid };
    }
  }

  /** One pass: checks every disk of this node's spec and writes the Node status when it changed. */
  async sync(): Promise<void> {
    const { store, namespace, nodeID } = this.o;
    for (let attempt = 0; attempt < 5; attempt++) {
      let node;
      try {
        node = await store.get(NodeKind, nodeID, namespace);
      } catch (err) {
        if (isNotFound(err)) return;
        throw err;
      }
      const now = rfc3339(new Date());
      const prev = node.status ?? {};
      const diskStatus: NonNullable<NonNullable<Node['status']>['diskStatus']> = {};
      const seen = new Map<string, string>();
      for (const [name, spec] of Object.entries(node.spec?.disks ?? {})) {
        const old = prev.diskStatus?.[name];
        let c = await this.checkDisk(spec.path ?? '');
        const dup = c.uuid ? seen.get(c.uuid) : undefined;
        if (dup) c = { ...c, ready: false, reason: 'DiskNotReady', message: `Disk ${name} has the same UUID ${c.uuid} as disk ${dup} (same filesystem?)` };
        if (c.uuid) seen.set(c.uuid, name);
        const schedulable = c.ready && (spec.allowScheduling ?? false) && !(spec.evictionRequested ?? false);
        diskStatus[name] = {
          ...old,
          diskUUID: c.uuid || (old?.diskUUID ?? ''),
          diskName: name,
          diskPath: spec.path ?? '',
          diskType: spec.diskType ?? 'filesystem',
          storageMaximum: c.storageMaximum,
          storageAvailable: c.storageAvailable,
          conditions: [
            // conditions other controllers own (a disk error's `Healthy`) are kept as they are
            ...(old?.conditions ?? []).filter((x) => x.type !== 'Ready' && x.type !== 'Schedulable'),
            condition('Ready', c.ready, c.reason, c.message, old?.conditions, now),
            condition('Schedulable', schedulable, schedulable ? '' : 'DiskNotSchedulable', schedulable ? '' : c.ready ? 'Disk does not allow scheduling or has eviction requested' : 'Disk is not ready', old?.conditions, now),
          ],
        };
      }
      const status: NonNullable<Node['status']> = {
        ...prev,
        diskStatus,
        // The node's Ready condition belongs to the NodeHealthMonitor once set (Kubernetes Node and manager pod
        // health); a new record starts Ready.
        conditions: [prev.conditions?.find((c) => c.type === 'Ready') ?? condition('Ready', true, '', '', prev.conditions, now), condition('Schedulable', true, '', '', prev.conditions, now)],
      };
      if (JSON.stringify(status) === JSON.stringify(prev)) return;
      try {
        await store.updateStatus(NodeKind, { ...node, status });
        return;
      } catch (err) {
        if (!isConflict(err)) throw err;
      }
    }
    throw new Error(`node ${nodeID}: status kept changing during 5 attempts`);
  }
}
