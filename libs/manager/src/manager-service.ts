import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import {
  status,
  type sendUnaryData,
  type ServerUnaryCall,
  type ServerWritableStream,
  type UntypedHandleCall,
} from '@grpc/grpc-js';
import {
  Empty,
  ManagerClient,
  MANAGER_API_MIN_VERSION,
  MANAGER_API_VERSION,
  grpcError,
  type BackingImageManagerServiceServer,
  type BackingImageResponse,
  type BackupCreateRequest,
  type BackupStatusRequest,
  type BackupStatusResponse,
  type DeleteRequest,
  type FetchRequest,
  type GetRequest,
  type ListResponse,
  type PrepareDownloadRequest,
  type PrepareDownloadResponse,
  type SendRequest,
  type SyncRequest,
  type VersionResponse,
} from '@bis/bimrpc';
import { FileState } from '@bis/state-machine';
import { confineDiskPath, isDiskPathError, normalizeRoot, resolveDiskPath, type DiskFileKind } from '@bis/disk-path';
import {
  PortAllocator,
  SyncFileNotFoundError,
  SyncInvalidArgumentError,
  SyncService,
  backingImageNameFromPath,
  askHintOf,
  errorMessage,
  isSendingLimitRefusal,
  refusalWithHint,
  removeFileSet,
  sendingLimitRefusal,
} from '@bis/sync-service';
import { toBackingImageResponse } from './convert.js';
import { DataSourceClient } from '@bis/data-source-api';
import { BackupTracker, type BackupRunner } from './backups.js';

export interface ManagerServiceOptions {
  diskPath: string;
  diskUUID: string;
  sync: SyncService;
  ports: PortAllocator;
  /** `host:port` of this process's sync service as peers and longhorn-manager reach it (PrepareDownload). */
  syncAddress: string;
  /** IP peers use to reach this manager's receivers (Longhorn: storage-network IP or POD_IP). */
  receiverHost: string;
  /** Minimum interval between two Watch notifications (default 1000 ms). */
  watchIntervalMs?: number;
  /** How long Sync waits for the peer's file to leave `pending` (Longhorn: 300 s). */
  syncPendingTimeoutMs?: number;
  /** Runs backups (BackupCreate / BackupStatus); without it they fail with FAILED_PRECONDITION. */
  backup?: BackupRunner;
  version?: { version: string; gitCommit: string; buildDate: string };
  /**
   * Token this manager sends on its own internal calls (to peer managers and data sources). The gRPC server checks
   * callers with `withInternalAuth` from `@bis/bimrpc`.
   */
  internalToken?: string;
  /**
   * This manager's gRPC address as peers reach it (`host:port`). Given (here or with `setAddress` once the server is
   * bound), the manager names itself when it asks a peer to send (`SendRequest.from_manager_address`), so a busy
   * sender can point it to the copy it already sends to, which forwards.
   */
  address?: string;
  log?: (message: string) => void;
}

type Unary<Req, Res> = (call: ServerUnaryCall<Req, Res>, cb: sendUnaryData<Res>) => void;

class RpcError extends Error {
  constructor(
    readonly code: status,
    message: string,
  ) {
    super(message);
  }
}

const invalid = (msg = 'missing required argument') => new RpcError(status.INVALID_ARGUMENT, msg);

function unary<Req, Res>(fn: (req: Req) => Promise<Res>): Unary<Req, Res> {
  return (call, cb) => {
    fn(call.request).then(
      (res) => cb(null, res),
      (err: unknown) => {
        // a refused name, uuid or path (`@bis/disk-path`), or a request the sync service can never fulfil, is the caller's error
        const code =
          err instanceof RpcError
            ? err.code
            : isDiskPathError(err) || err instanceof SyncInvalidArgumentError
              ? status.INVALID_ARGUMENT
              : status.UNKNOWN;
        cb(grpcError(code, errorMessage(err)));
      },
    );
  };
}

/** How many busy senders' pointers one receive follows (a chain of 8 copies needs 7). */
const MAX_HINT_HOPS = 32;

/**
 * `bimrpc.BackingImageManagerService` over an in-process sync service: one per disk. Files are addressed as
 * `<disk>/backing-images/<name>-<uuid>/backing`.
 */
/** The senders a receive asks in turn, first the one asked next; a new Sync for the same copy replaces them. */
interface Asking {
  queue: string[];
  chosenAgain: boolean;
}

export class ManagerService {
  readonly #o: ManagerServiceOptions;
  readonly #subscribers = new Set<{ call: ServerWritableStream<Empty, Empty>; blocked: boolean; missed: boolean }>();
  #dirty = false;
  #lastNotify = 0;
  #notifyTimer: NodeJS.Timeout | undefined;
  readonly #backups: BackupTracker;
  /** Callers of `#nextChange`, per file path (one listener on the sync service serves them all). */
  readonly #changeWaiters = new Map<string, Set<() => void>>();
  /** The peer manager each file being synced comes from (`senderManagerAddress` of its status), until the receive ends. */
  readonly #senders = new Map<string, string>();
  /** The senders each receive still asks, until one takes it (a new Sync replaces them). */
  readonly #askers = new Map<string, Asking>();
  /** Per file: the manager this one sends it to at that manager's request, while that send runs (the way to the tail of its chain). */
  readonly #lastReceivers = new Map<string, { address: string }>();
  #address: string;
  readonly #onChange = (filePath: string) => {
    this.#scheduleNotify();
    const waiters = this.#changeWaiters.get(filePath);
    if (waiters) {
      this.#changeWaiters.delete(filePath);
      for (const wake of waiters) wake();
    }
  };
  readonly #background = new Set<Promise<void>>();
  readonly #stop = new AbortController();

  readonly #root: string;

  constructor(opts: ManagerServiceOptions) {
    this.#o = opts;
    this.#address = opts.address ?? '';
    this.#root = normalizeRoot(opts.diskPath);
    this.#backups = new BackupTracker();
    opts.sync.on('change', this.#onChange);
  }

  /**
   * `<disk>/backing-images/<name>-<uuid>/backing` (or the entry's directory, or `<disk>/tmp/<name>-<uuid>`) through
   * `@bis/disk-path`: a name breaking Longhorn's name rule, a bad uuid, `..`, `/` or NUL is refused (DiskPathError →
   * INVALID_ARGUMENT) before anything is looked up.
   */
  #path(name: string, uuid: string, kind: DiskFileKind = 'backing-file'): string {
    return resolveDiskPath({ root: this.#root, kind, name, uuid }).path;
  }

  /** {@link #path} plus the symlink check, for the RPCs that create, change or remove files. */
  async #confined(name: string, uuid: string, kind: DiskFileKind = 'backing-file'): Promise<string> {
    return (await confineDiskPath({ root: this.#root, kind, name, uuid })).path;
  }

  #log(m: string): void {
    this.#o.log?.(m);
  }

  #track(p: Promise<void>): void {
    this.#background.add(p);
    // Both outcomes handled: a failure is logged (the file's own state already shows it).
    void p.then(
      () => this.#background.delete(p),
      (err: unknown) => {
        this.#background.delete(p);
        this.#log(`background work failed: ${errorMessage(err)}`);
      },
    );
  }

  // --------------------------------------------------------------- watch

  #scheduleNotify(): void {
    this.#dirty = true;
    if (this.#notifyTimer) return;
    const every = this.#o.watchIntervalMs ?? 1000;
    const wait = Math.max(0, this.#lastNotify + every - Date.now());
    this.#notifyTimer = setTimeout(() => {
      this.#notifyTimer = undefined;
      if (!this.#dirty) return;
      this.#dirty = false;
      this.#lastNotify = Date.now();
      for (const s of this.#subscribers) this.#notifyOne(s);
    }, wait);
    this.#notifyTimer.unref();
  }

  /** A subscriber whose socket is full is never waited for: it gets one coalesced notification on 'drain'. */
  #notifyOne(s: { call: ServerWritableStream<Empty, Empty>; blocked: boolean; missed: boolean }): void {
    if (s.blocked) {
      s.missed = true;
      return;
    }
    const ok = s.call.write({});
    if (!ok) {
      s.blocked = true;
      s.call.once('drain', () => {
        s.blocked = false;
        if (s.missed) {
          s.missed = false;
          this.#notifyOne(s);
        }
      });
    }
  }

  #watch(call: ServerWritableStream<Empty, Empty>): void {
    const s = { call, blocked: false, missed: false };
    this.#subscribers.add(s);
    const drop = () => this.#subscribers.delete(s);
    call.on('cancelled', drop);
    call.on('close', drop);
    call.on('error', drop);
  }

  // --------------------------------------------------------------- RPCs

  async get(req: GetRequest): Promise<BackingImageResponse> {
    if (!req.name || !req.uuid) throw invalid();
    try {
      const filePath = await this.#confined(req.name, req.uuid);
      return toBackingImageResponse(this.#o.sync.get(filePath), this.#senders.get(filePath));
    } catch (err) {
      if (err instanceof SyncFileNotFoundError) {
        throw new RpcError(status.NOT_FOUND, `cannot find backing image ${req.name}(${req.uuid})`);
      }
      throw err;
    }
  }

  async list(): Promise<ListResponse> {
    const backingImages: ListResponse['backingImages'] = {};
    const root = path.join(this.#root, 'backing-images');
    for (const info of Object.values(this.#o.sync.list())) {
      if (path.dirname(path.dirname(info.filePath)) !== root) continue;
      backingImages[backingImageNameFromPath(info.filePath, info.uuid)] = toBackingImageResponse(info, this.#senders.get(info.filePath));
    }
    // our extension (a new optional field of ListResponse): the disk's background scrub
    return { backingImages, diskScrub: this.#o.sync.scrubStatus() };
  }

  async delete(req: DeleteRequest): Promise<Empty> {
    if (!req.name || !req.uuid) throw invalid();
    // every path is confined before anything is removed
    const filePath = await this.#confined(req.name, req.uuid);
    const entryDir = await this.#confined(req.name, req.uuid, 'backing-dir');
    const dataSourceFile = await this.#confined(req.name, req.uuid, 'data-source-file');
    let failure: unknown;
    this.#lastReceivers.delete(filePath);
    try {
      await this.#o.sync.delete(filePath);
    } catch (err) {
      failure = err;
    }
    // Always, like Longhorn: remove the directory and the data source's leftovers in <disk>/tmp. FIX: Longhorn removes
    // only `<disk>/tmp/<name>-<uuid>.tmp`; an image deleted while its data source was ready-for-transfer (the file not
    // yet fetched) left `<disk>/tmp/<name>-<uuid>` and its `.cfg` there for good. The whole set goes here.
    await fsp.rm(entryDir, { recursive: true, force: true });
    await removeFileSet(dataSourceFile);
    if (failure) throw failure;
    return {};
  }

  async fetch(req: FetchRequest): Promise<BackingImageResponse> {
    const spec = req.spec;
    if (!spec) throw invalid('missing required argument: spec');
    if (!spec.name || !spec.uuid) throw invalid();
    const dst = await this.#confined(spec.name, spec.uuid);
    let src = dst;
    if (req.dataSourceAddress) {
      const want = await this.#confined(spec.name, spec.uuid, 'data-source-file');
      const dsClient = new DataSourceClient(req.dataSourceAddress, { token: this.#o.internalToken });
      const ds = await dsClient.get();
      if (ds.filePath !== want || ds.uuid !== spec.uuid || (ds.state !== 'ready' && ds.state !== 'ready-for-transfer')) {
        throw new RpcError(
          status.FAILED_PRECONDITION,
          `invalid data source file ${ds.filePath} for fetch, uuid ${ds.uuid}, state ${ds.state}`,
        );
      }
      await dsClient.transfer();
      src = want;
    }
    await this.#o.sync.fetch({
      srcFilePath: src,
      filePath: dst,
      uuid: spec.uuid,
      diskUUID: this.#o.diskUUID,
      expectedChecksum: spec.checksum,
      size: spec.size,
    });
    return toBackingImageResponse(this.#o.sync.get(dst));
  }

  async sync(req: SyncRequest): Promise<BackingImageResponse> {
    const spec = req.spec;
    if (!spec) throw invalid('missing required argument: spec');
    if (!spec.name || !spec.uuid || !req.fromAddress) throw invalid();
    if (!(spec.size > 0)) throw invalid(`invalid size ${spec.size} for syncing backing image ${spec.name}`);
    const filePath = await this.#confined(spec.name, spec.uuid);
    const senderList = [...new Set([req.fromAddress, ...(req.alternativeFromAddresses ?? []).filter((a) => a)])];
    // A copy whose receive still waits for a sender to take it (every one asked is at its sending limit): a Sync from
    // the controller, which chose again, gives it the new senders to ask (Longhorn answered "already exists").
    const asking = this.#askers.get(filePath);
    if (asking && this.#o.sync.has(filePath) && this.#o.sync.get(filePath).uuid === spec.uuid && this.#waitingForSender(filePath)) {
      asking.queue = senderList;
      asking.chosenAgain = true;
      this.#senders.set(filePath, req.fromAddress);
      this.#log(`${filePath}: still waiting for a peer to send it; asking ${req.fromAddress} now (chosen again by the controller)`);
      return toBackingImageResponse(this.#o.sync.get(filePath), req.fromAddress);
    }
    const port = this.#o.ports.allocate();
    try {
      await this.#o.sync.receiveFromPeer({
        filePath,
        uuid: spec.uuid,
        diskUUID: this.#o.diskUUID,
        expectedChecksum: spec.checksum,
        size: spec.size,
        port,
      });
    } catch (err) {
      this.#o.ports.release(port);
      throw err;
    }
    const work = this.#o.sync.workOf(filePath) ?? Promise.resolve();
    // The sender shows in the file's status while it is received (other controllers count a sender's receivers by it).
    this.#senders.set(filePath, req.fromAddress);
    // The port is released exactly once, after the receiver's server is closed (the work settles after that).
    this.#track(
      work.finally(() => {
        this.#o.ports.release(port);
        this.#senders.delete(filePath);
      }),
    );
    const own: Asking = { queue: senderList, chosenAgain: false };
    this.#askers.set(filePath, own);
    this.#track(
      this.#askPeerToSend(spec.name, spec.uuid, filePath, own, port).finally(() => {
        if (this.#askers.get(filePath) === own) this.#askers.delete(filePath);
      }),
    );
    return toBackingImageResponse(this.#o.sync.get(filePath), req.fromAddress);
  }

  /**
   * Asks the first of `senders` (the one the controller chose) to send, and on a refusal for its sending limit the
   * others in turn (`SyncRequest.alternative_from_addresses`); after a round in which every one refused, asks again
   * with a growing pause. A peer that refuses for another reason is not asked again; when none is left, the receive
   * fails with the last refusal.
   */
  async #askPeerToSend(name: string, uuid: string, filePath: string, asking: Asking, port: number): Promise<void> {
    const deadline = Date.now() + (this.#o.syncPendingTimeoutMs ?? 300_000);
    for (;;) {
      if (!this.#o.sync.has(filePath) || this.#stop.signal.aborted) return;
      const st = this.#o.sync.get(filePath).state;
      if (st === FileState.Ready || st === FileState.Failed) return;
      if (st !== FileState.Pending) break;
      if (Date.now() > deadline) {
        this.#o.sync.cancel(filePath, 'sync file is still pending after waiting for the peer transfer');
        return;
      }
      await this.#nextChange(filePath, 100);
    }
    const clients = new Map<string, ManagerClient>();
    const clientOf = (address: string): ManagerClient => {
      let c = clients.get(address);
      if (!c) clients.set(address, (c = new ManagerClient(address, { token: this.#o.internalToken })));
      return c;
    };
    let first = asking.queue[0];
    /** Peers that could not send (not followed when a busy sender points to them), and senders asked without a name. */
    const dropped = new Set<string>();
    const noHints = new Set<string>();
    let hops = 0;
    try {
      for (let waitMs = 250, told = false, refusedInRound = 0; ; ) {
        if (asking.chosenAgain) {
          // a new Sync named other senders: start a round with them
          asking.chosenAgain = false;
          first = asking.queue[0];
          waitMs = 250;
          refusedInRound = 0;
        }
        const queue = asking.queue;
        const from = queue[0]!;
        try {
          // named, so that a busy sender can point this one to the copy it sends to (unless its pointers led nowhere)
          const self = this.#address && !noHints.has(from) ? this.#address : '';
          await clientOf(from).send(name, uuid, `${this.#o.receiverHost}:${port}`, self);
          if (this.#senders.has(filePath)) this.#senders.set(filePath, from);
          if (from !== first) this.#log(`${filePath}: the peer manager ${from} sends this file (the first choice, ${first}, could not)`);
          return;
        } catch (err) {
          const details = (err as { details?: string }).details ?? errorMessage(err);
          // The sender is at its limit of simultaneous sends (Longhorn's 3; its words, so a Longhorn sender is
          // understood too). That is no failure of this copy: the controller chose the sender from a status up to a
          // List old, and a slot frees when one of its sends ends. Ask the other senders named, then again while the
          // receiver waits for its first byte (the sync service fails it after its begin timeout); failing it here
          // would hold the copy back for the whole file backoff (60 s).
          if (isSendingLimitRefusal(details) && this.#waitingForSender(filePath)) {
            // A sender that forwards: it points to the copy it sends to, which forwards what it receives (a chain).
            // Followed at once while the pointers are new; a pointer back to this manager, to a peer that could not
            // send, or a walk longer than the queue allows makes this one ask that sender again without naming itself.
            const hint = askHintOf(details);
            if (hint) {
              if (hint !== this.#address && !dropped.has(hint) && hops < MAX_HINT_HOPS) {
                hops++;
                const at = queue.indexOf(hint);
                if (at >= 0) queue.splice(at, 1);
                queue.unshift(hint);
                if (Date.now() <= deadline) this.#o.sync.keepReceiverWaiting(filePath);
                continue;
              }
              noHints.add(from);
              continue;
            }
            if (!told) {
              const others = queue.length > 1 ? `; asking the ${queue.length - 1} other peer(s) named, then` : ';';
              this.#log(`${filePath}: the peer manager ${from} is sending this file to as many peers as it may (${details})${others} asking again as a send ends`);
            }
            told = true;
            // The sender answered: the receive's stall timeout (30 s by default) starts again, else a receiver waiting
            // its turn behind three long sends failed as if its sender were gone. Until the pending deadline only.
            if (Date.now() <= deadline) this.#o.sync.keepReceiverWaiting(filePath);
            queue.push(queue.shift()!);
            if (++refusedInRound >= queue.length) {
              refusedInRound = 0;
              await sleep(waitMs, undefined, { signal: this.#stop.signal }).catch(() => undefined); // stopped: the loop ends below
              waitMs = Math.min(waitMs * 2, 2000);
            }
            if (this.#waitingForSender(filePath)) continue;
            return;
          }
          const msg = `failed to ask the peer manager ${from} to send: ${details}`;
          this.#log(`${filePath}: ${msg}`);
          // An alternative that cannot send (its copy went away, say) is dropped; the last one left fails the receive.
          dropped.add(from);
          queue.shift();
          if ((queue.length > 0 || asking.chosenAgain) && this.#waitingForSender(filePath)) continue;
          this.#o.sync.cancel(filePath, msg);
          return;
        }
      }
    } finally {
      for (const c of clients.values()) c.close();
    }
  }

  /** Whether the receive of `filePath` still waits for its sender to begin (not stopped, cancelled or failed). */
  #waitingForSender(filePath: string): boolean {
    if (this.#stop.signal.aborted || !this.#o.sync.has(filePath)) return false;
    const st = this.#o.sync.get(filePath).state;
    return st === FileState.Pending || st === FileState.Starting;
  }

  /** Resolves at the next change of `filePath`'s record, or after `maxMs` at the latest. */
  #nextChange(filePath: string, maxMs: number): Promise<void> {
    return new Promise<void>((resolve) => {
      const waiters = this.#changeWaiters.get(filePath) ?? new Set<() => void>();
      this.#changeWaiters.set(filePath, waiters);
      const wake = () => {
        clearTimeout(timer);
        waiters.delete(wake);
        if (waiters.size === 0 && this.#changeWaiters.get(filePath) === waiters) this.#changeWaiters.delete(filePath);
        resolve();
      };
      const timer = setTimeout(wake, maxMs);
      waiters.add(wake);
    });
  }

  /** This manager's gRPC address as peers reach it (see {@link ManagerServiceOptions.address}). */
  setAddress(address: string): void {
    this.#address = address;
  }

  /**
   * Starts a send to a peer's receiver. A receiving manager that names itself (`from_manager_address`, our extension)
   * is a manager of this system, whose copy forwards what it receives: while this copy sends already, such a request
   * is refused as busy and pointed to the manager this copy sends to (`… ; ask the peer manager <address>, which
   * receives it from here`), so that copies asked for at once form a chain, each link at its full rate, instead of
   * sharing this copy's link. A request without it (Longhorn's) gets Longhorn's behaviour (up to 3 sends at once).
   */
  async send(req: SendRequest): Promise<Empty> {
    if (!req.name || !req.uuid || !req.toAddress) throw invalid();
    const filePath = await this.#confined(req.name, req.uuid);
    const requester = req.fromManagerAddress ?? '';
    const tail = this.#lastReceivers.get(filePath);
    // where a named requester is pointed while this copy sends (not to itself)
    const pointTo = requester && tail && tail.address !== requester ? tail.address : undefined;
    const sending = this.#o.sync.has(filePath) ? this.#o.sync.get(filePath).sendingReference : 0;
    if (pointTo && sending > 0) throw new RpcError(status.UNKNOWN, refusalWithHint(sendingLimitRefusal(filePath, sending), pointTo));
    // the pointer lasts while this send runs (a copy that is no longer sent to is no tail)
    const pointer = requester ? { address: requester } : undefined;
    const forget = () => {
      if (pointer && this.#lastReceivers.get(filePath) === pointer) this.#lastReceivers.delete(filePath);
    };
    if (pointer) this.#lastReceivers.set(filePath, pointer);
    try {
      await this.#o.sync.sendToPeer(filePath, req.toAddress, forget);
    } catch (err) {
      forget();
      if (pointer && tail) this.#lastReceivers.set(filePath, tail);
      // requests that arrived together, before this copy's send began, are pointed the same way when refused
      const message = errorMessage(err);
      if (pointTo && isSendingLimitRefusal(message)) throw new RpcError(status.UNKNOWN, refusalWithHint(message, pointTo));
      throw err;
    }
    return {};
  }

  async prepareDownload(req: PrepareDownloadRequest): Promise<PrepareDownloadResponse> {
    if (!req.name || !req.uuid) throw invalid();
    const r = await this.get(req);
    const state = r.status?.state ?? '';
    if (state !== FileState.Ready) {
      throw new RpcError(status.FAILED_PRECONDITION, `invalid backing image state ${state} for the download`);
    }
    if (!this.#o.syncAddress) throw new RpcError(status.INTERNAL, 'cannot build the sync service address for the download');
    return { srcFilePath: this.#path(req.name, req.uuid), address: this.#o.syncAddress };
  }

  async versionGet(): Promise<VersionResponse> {
    const v = this.#o.version ?? { version: '', gitCommit: '', buildDate: '' };
    return {
      ...v,
      backingImageManagerApiVersion: MANAGER_API_VERSION,
      backingImageManagerApiMinVersion: MANAGER_API_MIN_VERSION,
    };
  }

  async backupCreate(req: BackupCreateRequest): Promise<Empty> {
    const runner = this.#o.backup;
    if (!runner) throw new RpcError(status.FAILED_PRECONDITION, 'backups are not configured on this manager');
    if (!req.name || !req.uuid) throw invalid();
    const filePath = await this.#confined(req.name, req.uuid);
    let info;
    try {
      info = this.#o.sync.get(filePath);
    } catch {
      throw new RpcError(status.NOT_FOUND, `cannot find backing image ${req.name}(${req.uuid})`);
    }
    if (info.state !== FileState.Ready) {
      throw new RpcError(status.FAILED_PRECONDITION, `invalid backing image state ${info.state} for the backup`);
    }
    await this.#backups.start(runner, req, filePath, info.currentChecksum);
    return {};
  }

  async backupStatus(req: BackupStatusRequest): Promise<BackupStatusResponse> {
    if (!req.name) throw new RpcError(status.INVALID_ARGUMENT, 'empty backing image name for getting backup backing image status');
    const s = this.#backups.status(req.name);
    if (!s) throw new RpcError(status.NOT_FOUND, `failed to get backup status ${req.name}: backup backing image not found ${req.name}`);
    return s;
  }

  /** The grpc-js implementation object. */
  implementation(): BackingImageManagerServiceServer {
    const impl: BackingImageManagerServiceServer = {
      get: unary((r: GetRequest) => this.get(r)),
      list: unary(() => this.list()),
      delete: unary((r: DeleteRequest) => this.delete(r)),
      fetch: unary((r: FetchRequest) => this.fetch(r)),
      sync: unary((r: SyncRequest) => this.sync(r)),
      send: unary((r: SendRequest) => this.send(r)),
      prepareDownload: unary((r: PrepareDownloadRequest) => this.prepareDownload(r)),
      versionGet: unary(() => this.versionGet()),
      backupCreate: unary((r: BackupCreateRequest) => this.backupCreate(r)),
      backupStatus: unary((r: BackupStatusRequest) => this.backupStatus(r)),
      watch: (call: ServerWritableStream<Empty, Empty>) => this.#watch(call),
    };
    return impl as BackingImageManagerServiceServer & Record<string, UntypedHandleCall>;
  }

  /** Stops notifications and background Sync helpers, ends Watch streams and cancels backups. */
  async close(): Promise<void> {
    this.#stop.abort();
    this.#o.sync.off('change', this.#onChange);
    if (this.#notifyTimer) clearTimeout(this.#notifyTimer);
    for (const s of this.#subscribers) s.call.end();
    this.#subscribers.clear();
    this.#backups.cancelAll();
    await Promise.allSettled([...this.#background]);
  }
}
