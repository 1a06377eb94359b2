/**
 * An in-process simulation of the data plane (managers and data sources) for controller tests. It keeps files per
 * disk, follows the data plane's state machine (data source: starting → in-progress → ready-for-transfer → ready
 * after transfer; manager file: in-progress → ready), verifies checksums, counts downloads per URL and can kill
 * workloads. It stands in for the data-plane processes, not for the controllers under test.
 */
import { createHash } from 'node:crypto';
import type { BackingImageResponse, ListResponse } from '@bis/bimrpc';
import type { DataSourceFileInfo } from '@bis/data-source-api';
import type { FileState } from '@bis/state-machine';
import type { BackupTargetApi, DataPlane, DataSourceApi, DataSourceLaunch, ManagerApi, WorkloadStatus } from '../data-plane.js';
import type { BackingImageDataSource, BackingImageManager } from '../kinds.js';

const SIM_SENDING_LIMIT = 3;
/** Sends of a copy still being received (as a real manager forwards what it has verified). */
const SIM_FORWARDING_LIMIT = 1;
const RECEIVING = new Set(['starting', 'in-progress']);

interface SimFile {
  name: string;
  uuid: string;
  size: number;
  checksum: string;
  state: string;
  progress: number;
  message: string;
  sendingReference: number;
  /** The sender's address while the file is synced (as a real manager reports it). */
  sender?: string;
  /** Refused by its busy sender: waits for one of its sends to end, or for a Sync naming another sender. */
  waiting?: boolean;
}

interface SimManager {
  name: string;
  nodeID: string;
  diskUUID: string;
  address: string;
  files: Map<string, SimFile>;
  watchers: Set<() => void>;
  enders: Set<(err?: Error) => void>;
}

interface SimDataSource {
  name: string;
  nodeID: string;
  diskUUID: string;
  address: string;
  launch: DataSourceLaunch;
  state: string;
  size: number;
  progress: number;
  checksum: string;
  message: string;
  timers: NodeJS.Timeout[];
  failed?: string;
}

export interface SimContent {
  size: number;
  data: string;
}

const sha512 = (s: string) => createHash('sha512').update(s).digest('hex');
const grpcError = (code: number, details: string) => Object.assign(new Error(details), { code, details });

export class SimDataPlane implements DataPlane {
  readonly managers = new Map<string, SimManager>();
  readonly dataSources = new Map<string, SimDataSource>();
  /** A sync to a disk fails with this message when it returns one (e.g. a full disk's ENOSPC). */
  syncFailure: (diskUUID: string) => string | undefined = () => undefined;
  /** Files that survive a manager restart: diskUUID → `<name>-<uuid>` → file. */
  readonly disks = new Map<string, Map<string, SimFile>>();
  readonly urls = new Map<string, SimContent>();
  readonly downloads = new Map<string, number>();
  readonly backups = new Map<string, { name: string; checksum: string; size: number; data: string; createdAt: string }>();
  /** Every Sync asked for: `from` is the sender the controller chose. */
  readonly syncCalls: { to: string; from: string; bi: string; alternatives: string[] }[] = [];
  /** Every send begun: `from` is the copy that sent (the chosen one, or the alternative the receiver took). */
  readonly sends: { to: string; from: string; bi: string }[] = [];
  /** The most sends one copy had at once. */
  maxSending = 0;
  private readonly backupStates = new Map<string, { state: string; url: string; progress: number }>();
  private readonly listeners = new Set<(kind: 'manager' | 'data-source', name: string) => void>();
  private port = 20000;
  /** Time a download / sync takes (ms). */
  transferMs = 150;
  /**
   * Whether a sender's `sendingReference` shows its sends. False plays a sender whose sends have not begun yet (its
   * receivers are refused or not yet asked), so only the receivers' statuses tell that it is taken.
   */
  reportSends = true;
  /** Whether a sender takes at most 3 sends at once, the others waiting (a real manager's limit). */
  enforceSendingLimit = false;
  /**
   * Whether a copy still being received forwards to a receiver (a manager of this system does; false plays one that
   * refuses, e.g. Longhorn's: the receiver then asks the ready copies the Sync names). A forwarded copy is ready when
   * its upstream copy is and its own transfer time has passed.
   */
  forwarding = true;
  /**
   * Whether a data source waits for a change of its file's state (`waitForChange`, as this system's data source does);
   * false plays one that answers at once (Longhorn's), which the controller polls instead.
   */
  dataSourceWaits = true;
  /** Waits for a change asked of the data sources so far, and those that answered with a changed state. */
  readonly dataSourceWaitCalls = { asked: 0, changed: 0 };

  serve(url: string, data: string): string {
    this.urls.set(url, { size: data.length, data });
    return sha512(data);
  }

  private notify(kind: 'manager' | 'data-source', name: string): void {
    for (const l of this.listeners) l(kind, name);
  }

  onWorkloadChange(listener: (kind: 'manager' | 'data-source', name: string) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  private changed(m: SimManager): void {
    for (const w of m.watchers) w();
  }

  // ------------------------------------------------------------------ managers

  async managerStatus(bim: BackingImageManager): Promise<WorkloadStatus> {
    const m = this.managers.get(bim.metadata.name);
    if (!m) return { phase: 'missing', nodeID: '', diskUUID: '', ip: '', address: '', syncAddress: '' };
    return { phase: 'ready', nodeID: m.nodeID, diskUUID: m.diskUUID, ip: '127.0.0.1', address: m.address, syncAddress: m.address.replace(/:(\d+)$/, (_s, p) => `:${Number(p) + 1}`) };
  }

  /** Managers whose start does not happen (as a pod that stays pending) while they are in this set. */
  readonly startsHeld = new Set<string>();

  async startManager(bim: BackingImageManager): Promise<void> {
    if (this.managers.has(bim.metadata.name) || this.startsHeld.has(bim.metadata.name)) return;
    const m: SimManager = { name: bim.metadata.name, nodeID: bim.spec!.nodeID!, diskUUID: bim.spec!.diskUUID!, address: `127.0.0.1:${(this.port += 2)}`, files: new Map(), watchers: new Set(), enders: new Set() };
    this.managers.set(m.name, m);
    setTimeout(() => this.notify('manager', m.name), 5).unref();
  }

  async deleteManager(name: string): Promise<void> {
    this.kill(name);
  }

  /** Kills a manager process: in-flight transfers fail, files being written are lost, complete files stay on disk. */
  kill(name: string): void {
    const m = this.managers.get(name);
    if (!m) return;
    this.managers.delete(name);
    const disk = this.disks.get(m.diskUUID);
    for (const f of m.files.values()) if (f.state !== 'ready') disk?.delete(`${f.name}-${f.uuid}`);
    for (const e of m.enders) e(new Error('manager process exited'));
    this.notify('manager', name);
  }

  /** A send from `sender` to `m`'s `file`; when it ends, the next copy waiting for this sender begins. */
  private beginSend(m: SimManager, file: SimFile, sender: SimManager, src: SimFile): void {
    const name = file.name;
    file.waiting = false;
    file.state = 'in-progress';
    src.sendingReference++;
    this.sends.push({ to: m.name, from: sender.name, bi: name });
    this.maxSending = Math.max(this.maxSending, src.sendingReference);
    this.changed(m);
    const end = () => {
      // forwarded: the last segment comes once the upstream copy has all of it
      if (RECEIVING.has(src.state) && this.managers.get(sender.name) === sender && sender.files.get(name) === src) {
        setTimeout(end, 10).unref();
        return;
      }
      src.sendingReference = Math.max(0, src.sendingReference - 1);
      this.beginNextWaiting(sender, src);
      if (this.managers.get(m.name) !== m || m.files.get(name) !== file) return;
      const failure = this.syncFailure(m.diskUUID);
      if (this.managers.get(sender.name) !== sender || src.state !== 'ready') {
        file.state = 'failed';
        file.message = 'sender went away';
      } else if (failure) {
        file.state = 'failed';
        file.message = failure;
      } else {
        Object.assign(file, { state: 'ready', progress: 100, checksum: src.checksum });
        const disk = this.disks.get(m.diskUUID) ?? new Map<string, SimFile>();
        this.disks.set(m.diskUUID, disk);
        disk.set(`${name}-${file.uuid}`, file);
      }
      this.changed(m);
      this.changed(sender);
    };
    setTimeout(end, this.transferMs).unref();
  }

  /** Whether `src` can send one more now: a ready copy below its limit, or a copy being received that forwards nothing. */
  private hasRoom(src: SimFile | undefined): boolean {
    if (src?.state === 'ready') return !this.enforceSendingLimit || src.sendingReference < SIM_SENDING_LIMIT;
    return this.forwarding && RECEIVING.has(src?.state ?? '') && src!.sendingReference < SIM_FORWARDING_LIMIT;
  }

  /** Sets the progress a manager reports for its copy of `bi` (a receive under way), and tells its watchers. */
  /** The copy of `bi` on a running manager, and that manager. */
  private copyOn(managerName: string, bi: string): { m: SimManager; f: SimFile } {
    const m = this.managers.get(managerName);
    const f = m?.files.get(bi);
    if (!m || !f) throw new Error(`no copy of ${bi} on ${managerName}`);
    return { m, f };
  }

  setProgress(managerName: string, bi: string, progress: number): void {
    const { m, f } = this.copyOn(managerName, bi);
    f.progress = progress;
    this.changed(m);
  }

  /** A ready copy found corrupt (as a scrub finds it): the manager reports it failed with `message`. */
  failFile(managerName: string, bi: string, message: string): void {
    const { m, f } = this.copyOn(managerName, bi);
    f.state = 'failed';
    f.message = message;
    this.changed(m);
  }

  private beginNextWaiting(sender: SimManager, src: SimFile): void {
    if (src.sendingReference >= (src.state === 'ready' ? SIM_SENDING_LIMIT : SIM_FORWARDING_LIMIT)) return;
    for (const m of this.managers.values()) {
      const f = m.files.get(src.name);
      if (f?.waiting && f.sender === sender.address) return this.beginSend(m, f, sender, src);
    }
  }

  managerClient(address: string): ManagerApi {
    const find = () => {
      const m = [...this.managers.values()].find((x) => x.address === address);
      if (!m) throw grpcError(14, `connection refused: ${address}`);
      return m;
    };
    const response = (f: SimFile): BackingImageResponse => ({
      spec: { name: f.name, uuid: f.uuid, size: f.size, virtualSize: f.size, realSize: f.size, checksum: f.checksum },
      status: { state: f.state, errorMsg: f.message, sendingReference: this.reportSends ? f.sendingReference : 0, senderManagerAddress: f.state === 'ready' || f.state === 'failed' ? '' : (f.sender ?? ''), progress: f.progress, checksum: f.state === 'ready' ? f.checksum : '' },
    });
    return {
      list: async (): Promise<ListResponse> => ({ backingImages: Object.fromEntries([...find().files.values()].map((f) => [f.name, response(f)])) }),
      delete: async (name, uuid) => {
        const m = find();
        const f = m.files.get(name);
        if (f && f.uuid === uuid) m.files.delete(name);
        this.disks.get(m.diskUUID)?.delete(`${name}-${uuid}`);
        this.changed(m);
      },
      versionGet: async () => ({ version: 'sim', gitCommit: '', buildDate: '', backingImageManagerApiVersion: 3, backingImageManagerApiMinVersion: 3 }),
      fetch: async ({ spec, dataSourceAddress }) => {
        const m = find();
        const name = spec!.name;
        if (m.files.get(name)?.state === 'ready') throw grpcError(6, `backing image ${name} already exists`);
        const disk = this.disks.get(m.diskUUID) ?? new Map<string, SimFile>();
        this.disks.set(m.diskUUID, disk);
        let file: SimFile;
        if (!dataSourceAddress) {
          const existing = disk.get(`${name}-${spec!.uuid}`);
          file = existing ? { ...existing, state: 'ready', sendingReference: 0 } : { name, uuid: spec!.uuid, size: spec!.size, checksum: spec!.checksum, state: 'failed', progress: 0, message: 'no existing file to reuse', sendingReference: 0 };
        } else {
          const ds = [...this.dataSources.values()].find((d) => d.address === dataSourceAddress);
          if (!ds || ds.state !== 'ready-for-transfer') throw grpcError(9, `data source ${dataSourceAddress} is not ready for transfer`);
          ds.state = 'ready';
          file = { name, uuid: spec!.uuid, size: ds.size, checksum: ds.checksum, state: 'ready', progress: 100, message: '', sendingReference: 0 };
        }
        if (file.state === 'ready') disk.set(`${name}-${file.uuid}`, file);
        m.files.set(name, file);
        this.changed(m);
        return response(file);
      },
      sync: async ({ spec, fromAddress, alternativeFromAddresses = [] }) => {
        const m = find();
        const name = spec!.name;
        const existing = m.files.get(name);
        const sender = [...this.managers.values()].find((x) => x.address === fromAddress);
        const src = sender?.files.get(name);
        // a copy still waiting for a sender takes the one a new Sync names (as a real manager does)
        const again = existing?.state === 'starting' && existing.waiting === true;
        if (existing && existing.state !== 'failed' && !again) throw grpcError(6, `backing image ${name} already exists`);
        const canSend = (f: SimFile | undefined) => f?.state === 'ready' || (this.forwarding && RECEIVING.has(f?.state ?? ''));
        // as the receiving manager does: the chosen sender, else the first alternative with room, else wait for the
        // first one that can send at all (a copy that cannot forward is dropped)
        const named = [fromAddress, ...alternativeFromAddresses]
          .map((a) => [...this.managers.values()].find((x) => x.address === a))
          .filter((x): x is SimManager => x !== undefined && x !== m)
          .map((x) => ({ mgr: x, file: x.files.get(name)! }))
          .filter((c) => canSend(c.file));
        const chosen = named.find((c) => this.hasRoom(c.file)) ?? named[0];
        if (!sender || !chosen) throw grpcError(9, `sender ${fromAddress} has no ready file ${name}`);
        const alternatives = alternativeFromAddresses.map((a) => [...this.managers.values()].find((x) => x.address === a)?.name ?? a);
        this.syncCalls.push({ to: m.name, from: sender.name, bi: name, alternatives });
        const file: SimFile = again ? existing : { name, uuid: spec!.uuid, size: chosen.file.size, checksum: '', state: 'starting', progress: 0, message: '', sendingReference: 0 };
        file.sender = chosen.mgr.address;
        m.files.set(name, file);
        if (!this.hasRoom(chosen.file)) {
          file.waiting = true; // refused by the busy sender: waits for one of its sends to end
          this.changed(m);
          return response(file);
        }
        this.beginSend(m, file, chosen.mgr, chosen.file);
        return response(file);
      },
      prepareDownload: async (name, uuid) => ({ srcFilePath: `/data/backing-images/${name}-${uuid}/backing`, address: find().address }),
      backupCreate: async (req) => {
        const m = find();
        const f = m.files.get(req.name);
        if (f?.state !== 'ready') throw grpcError(9, `no ready file ${req.name}`);
        const url = `${req.backupTarget}?backingImage=${req.name}`;
        this.backupStates.set(req.name, { state: 'in_progress', url, progress: 0 });
        setTimeout(() => {
          const content = [...this.urls.values()].find((c) => sha512(c.data) === f.checksum);
          this.backups.set(req.name, { name: req.name, checksum: f.checksum, size: f.size, data: content?.data ?? '', createdAt: new Date().toISOString() });
          this.backupStates.set(req.name, { state: 'complete', url, progress: 100 });
        }, this.transferMs).unref();
      },
      backupStatus: async (name) => {
        const s = this.backupStates.get(name);
        if (!s) throw grpcError(5, `no backup for ${name}`);
        return { progress: s.progress, backupUrl: s.url, error: '', state: s.state };
      },
      watch: (onChange, onEnd) => {
        let m: SimManager;
        try {
          m = find();
        } catch (err) {
          setTimeout(() => onEnd(err as Error), 0).unref();
          return () => {};
        }
        m.watchers.add(onChange);
        m.enders.add(onEnd);
        return () => {
          m.watchers.delete(onChange);
          m.enders.delete(onEnd);
        };
      },
    };
  }

  // ------------------------------------------------------------------ data sources

  async dataSourceStatus(bids: BackingImageDataSource): Promise<WorkloadStatus> {
    const d = this.dataSources.get(bids.metadata.name);
    if (!d) return { phase: 'missing', nodeID: '', diskUUID: '', ip: '', address: '', syncAddress: '' };
    return { phase: d.failed ? 'failed' : 'ready', nodeID: d.nodeID, diskUUID: d.diskUUID, ip: '127.0.0.1', address: d.address, syncAddress: '', message: d.failed };
  }

  /** At most this many data sources at once (`deferred` beyond). */
  maxDataSources = Number.POSITIVE_INFINITY;

  /** Called when a start is told to wait, before the answer reaches the controller (to make a change meanwhile). */
  onDeferred?: (name: string) => void;

  /** Signals a change of a data-source workload, as the data plane does when one starts or ends. */
  signalDataSourceChange(name: string): void {
    this.notify('data-source', name);
  }

  async startDataSource(bids: BackingImageDataSource, launch: DataSourceLaunch): Promise<'started' | 'deferred'> {
    if (this.dataSources.has(bids.metadata.name)) return 'started';
    if (this.dataSources.size >= this.maxDataSources) {
      this.onDeferred?.(bids.metadata.name);
      return 'deferred';
    }
    const d: SimDataSource = { name: bids.metadata.name, nodeID: bids.spec!.nodeID!, diskUUID: bids.spec!.diskUUID!, address: `127.0.0.1:${(this.port += 2)}`, launch, state: '', size: 0, progress: 0, checksum: '', message: '', timers: [] };
    this.dataSources.set(d.name, d);
    const after = (ms: number, fn: () => void) => {
      const t = setTimeout(() => {
        if (this.dataSources.get(d.name) === d) fn();
      }, ms);
      t.unref();
      d.timers.push(t);
    };
    if (launch.sourceType === 'upload') {
      d.state = 'pending';
      return 'started';
    }
    let content: SimContent | undefined;
    if (launch.sourceType === 'download') {
      const url = launch.parameters['url'] ?? '';
      content = this.urls.get(url);
      this.downloads.set(url, (this.downloads.get(url) ?? 0) + 1);
    } else if (launch.sourceType === 'restore') {
      const name = new URL(launch.parameters['backup-url'] ?? '').searchParams.get('backingImage') ?? '';
      const b = this.backups.get(name);
      content = b ? { size: b.size, data: b.data } : undefined;
    }
    this.produce(d, content, after);
    return 'started';
  }

  private produce(d: SimDataSource, content: SimContent | undefined, after: (ms: number, fn: () => void) => void): void {
    d.state = 'starting';
    after(10, () => {
      if (!content) {
        Object.assign(d, { state: 'failed', message: 'source not found (404)' });
        return;
      }
      Object.assign(d, { state: 'in-progress', size: content.size, progress: 50 });
      after(this.transferMs, () => {
        const sum = sha512(content.data);
        if (d.launch.checksum && d.launch.checksum !== sum) {
          Object.assign(d, { state: 'failed', message: `the expected checksum ${d.launch.checksum} doesn't match the file actual checksum ${sum}` });
        } else Object.assign(d, { state: 'ready-for-transfer', progress: 100, checksum: sum });
      });
    });
  }

  /** Uploads content to a data source waiting in `pending`. */
  upload(name: string, data: string): void {
    const d = this.dataSources.get(name);
    if (!d || d.state !== 'pending') throw new Error(`data source ${name} is not waiting for an upload`);
    this.produce(d, { size: data.length, data }, (ms, fn) => setTimeout(fn, ms).unref());
  }

  async deleteDataSource(name: string): Promise<void> {
    const d = this.dataSources.get(name);
    if (!d) return;
    for (const t of d.timers) clearTimeout(t);
    this.dataSources.delete(name);
  }

  dataSourceClient(address: string): DataSourceApi {
    const get = async (): Promise<DataSourceFileInfo> => {
      const d = [...this.dataSources.values()].find((x) => x.address === address);
      if (!d) throw new Error(`connect ECONNREFUSED ${address}`);
      return {
        sourceType: '',
        parameters: {},
        name: '',
        diskUUID: '',
        expectedChecksum: '',
        filePath: '',
        uuid: '',
        size: d.size,
        virtualSize: 0,
        realSize: 0,
        // the simulation's states are the file machine's
        state: d.state as FileState,
        progress: d.progress,
        processedSize: 0,
        modificationTime: '',
        currentChecksum: d.checksum,
        message: d.message,
        sendingReference: 0,
      };
    };
    return {
      get,
      waitForChange: async (state, { waitSeconds, signal }) => {
        this.dataSourceWaitCalls.asked++;
        if (!this.dataSourceWaits) {
          await get();
          return undefined;
        }
        const until = Date.now() + waitSeconds * 1000;
        for (;;) {
          // a gone data source refuses the connection, as a real one does
          const info = await get();
          if (info.state !== state) this.dataSourceWaitCalls.changed++;
          if (info.state !== state || Date.now() >= until || signal?.aborted) return info;
          await new Promise((r) => setTimeout(r, 5).unref());
        }
      },
    };
  }

  // ------------------------------------------------------------------ backup target

  readonly backupTarget: BackupTargetApi = {
    listBackingImages: async () => [...this.backups.keys()],
    backingImageURL: (target, bi) => `${target}?backingImage=${bi}`,
    inspectBackingImage: async (url) => {
      const name = new URL(url).searchParams.get('backingImage') ?? '';
      const b = this.backups.get(name);
      if (!b) throw new Error(`backup ${url} not found`);
      return { name, url, size: b.size, checksum: b.checksum, labels: {}, compressionMethod: 'lz4', secret: '', secretNamespace: '', createdAt: b.createdAt };
    },
    deleteBackingImage: async (url) => {
      this.backups.delete(new URL(url).searchParams.get('backingImage') ?? '');
    },
  };
}
