import { EventEmitter } from 'node:events';
import type { InternalAuth } from '@bis/internal-auth';
import { createReadStream, openSync, promises as fsp } from 'node:fs';
import path from 'node:path';
import type { Readable } from 'node:stream';
import { FileEvent, FileState } from '@bis/state-machine';
import {
  ChecksumFormatError,
  ChecksumMismatchError,
  assertChecksumMatches,
  parseExpectedChecksum,
  type EncryptionOperation,
  type ExpectedChecksum,
  type FileSourceProvider,
  type ProgressSink,
  type SourceResult,
} from '@bis/file-sources/core';
import { readSyncingFileConfig, writeSyncingFileConfig } from './backing-cfg.js';
import { SyncFileNotFoundError, SyncInvalidArgumentError, SyncServiceError, describeFileError, errorMessage } from './errors.js';
import { hashFile, readVirtualSize, removeEmptyDir, removeFile, statFile, statFileIfExists } from './file-util.js';
import { DEFAULT_DISK_PATH, backingImageNameFromPath, cfgPathOf, tmpPathOf } from './layout.js';
import { SyncingFile, type DataEngine, type FileInfo } from './syncing-file.js';
import type { SendFileOptions } from './ssync/sender.js';
import type { SsyncReceiver } from './ssync/receiver.js';
import type { Sha512Chain } from '@bis/sha512-chain';
import { chainPathOf, removeChainFile, removeFileSet } from './chain-path.js';
import { loadBlockMapping, loadChainFile, loadQemuImg, loadSha512Chain, loadSsyncReceiver, loadSsyncSender } from './lazy-modules.js';
import type { FileLayoutProvider, HolePuncher } from './ssync/layout.js';
import { READ_NOFOLLOW, WRITE_NOFOLLOW, assertNoEscapingLinks, normalizeRoot, resolveDiskPath, type DiskFileKind } from '@bis/disk-path';
import {
  ChainVerifyingStream,
  ChecksumVerifyingStream,
  CorruptionError,
  TokenBucket,
  asCorruption,
  hashFileThrottled,
  systemClock,
  verifyFileThrottled,
  type ScrubClock,
} from './integrity.js';

export const SENDING_LIMIT = 3;
/**
 * Sends of a copy still being received (forwarding its verified segments, see {@link SyncService.sendToPeer}): one,
 * so that a chain of copies each sends at its link's full rate instead of sharing it.
 */
export const FORWARDING_LIMIT = 1;
/** How long a send request waits for a copy being received to know its SHA-512 chain before it is refused as busy. */
const FORWARD_WAIT_MS = 10_000;

/** How a sender refuses a send beyond its limit (Longhorn's words; a receiving manager asks again when it sees them). */
const SENDING_LIMIT_REFUSAL = 'reaches to the simultaneous sending limit';

/** Whether an error message is a sender's refusal because it already sends the file to as many peers as it may. */
export function isSendingLimitRefusal(message: string): boolean {
  return message.includes(SENDING_LIMIT_REFUSAL);
}

const ASK_HINT = /; ask the peer manager (\S+), which receives it from here$/;

/**
 * A sending-limit refusal that names the manager to ask instead: the copy this one sends to, which forwards what it
 * receives (our extension of the refusal's words; a Longhorn receiver reads only the limit words).
 */
export function refusalWithHint(message: string, managerAddress: string): string {
  return `${message}; ask the peer manager ${managerAddress}, which receives it from here`;
}

/** The manager a sending-limit refusal names to ask instead ({@link refusalWithHint}), if any. */
export function askHintOf(message: string): string | undefined {
  return ASK_HINT.exec(message.trim())?.[1];
}

/** A refusal because the copy sends to as many peers as it may, in Longhorn's words. */
export function sendingLimitRefusal(filePath: string, limit: number): string {
  return `syncing file ${filePath} ${SENDING_LIMIT_REFUSAL} ${limit}`;
}

const FAILURE_PREFIX = 'failed to process sync file: ';

export interface SyncServiceOptions {
  /** Disk the service works on (clone sources live under `<disk>/backing-images`). Default `/data/`. */
  diskPath?: string;
  /** Producers for downloadFromURL / upload / restoreFromBackupURL / cloneFromBackingImage. */
  sources?: FileSourceProvider;
  /** Data/hole layout of a file, for the peer sender (default: `@bis/block-mapping` getFileLayout). */
  layout?: FileLayoutProvider;
  /** Hole punching, for a peer receiver writing into an existing file. */
  punchHole?: HolePuncher;
  /** Address the peer receivers listen on (default all interfaces). */
  receiverHost?: string;
  /** How often ready files are checked for changes on disk (default 2000 ms; 0 = never). */
  monitorIntervalMs?: number;
  /** A started file must see its first byte within this time (Longhorn: 60 s). */
  beginTimeoutMs?: number;
  /** A peer receiver fails after this long without a request or data from its sender (default 30 s; Longhorn: 300 s without a request). */
  receiverIdleTimeoutMs?: number;
  /** The slowest sender rate (bytes/s) a peer receiver takes as progress (default 1 MiB/s; see `minSenderRate`). */
  receiverMinSenderRate?: number;
  /** Concurrent sends per file (Longhorn: 3). */
  sendingLimit?: number;
  /**
   * Offer the file's SHA-512 chain to the peer receiver before sending (default true; our extension, a Longhorn
   * receiver answers 404 and the send goes on as before). False sends exactly like Longhorn's sender.
   */
  sendChain?: boolean;
  /** Tuning of the peer sender. */
  sender?: Partial<Pick<SendFileOptions, 'workers' | 'chunkSize' | 'attempts' | 'openTimeoutMs' | 'requestTimeoutMs'>>;
  /**
   * Authentication of internal calls: peer receivers refuse senders without the token, and this service's sends carry
   * it. The `/v1/files` HTTP routes are checked by `startSyncServer` (given the same value).
   */
  internalAuth?: InternalAuth;
  /** Background scrub of ready files (off when absent or `intervalMs` is 0). */
  scrub?: ScrubOptions;
  /** Diagnostics sink. */
  log?: (message: string) => void;
}

export interface ScrubOptions {
  /** Every ready file is re-verified once per interval (0 = never). */
  intervalMs: number;
  /** Bytes per second read by the scrub on this disk (the token bucket's rate). */
  bandwidthBytesPerSecond: number;
  /** How often due files are looked for (default min(interval, 60 s)). */
  pollMs?: number;
  /** Time of the bandwidth cap (default the system's). */
  clock?: ScrubClock;
  /** Wall-clock time of scrub records, ms since the epoch (default Date.now). */
  wallClock?: () => number;
  /** Where scrub records survive restarts (default `<disk>/backing-image-scrub.json`). */
  statePath?: string;
}

/** One disk's scrub, as the manager reports it. */
export interface DiskScrubStatus {
  /** RFC 3339 time the last pass ended; '' before the first. */
  lastScrubTime: string;
  /** `ok`, `corrupted` (a copy failed verification), `error` (a copy could not be read), '' before the first. */
  lastScrubResult: '' | 'ok' | 'corrupted' | 'error';
  /** What the last pass found (the corrupt copies and their segment). */
  lastScrubMessage: string;
  /** Copies verified by the last pass. */
  lastScrubFiles: number;
  /** The copy being scrubbed now ('' when idle). */
  scrubbing: string;
}

/** What one file's scrub found. */
export interface FileScrubResult {
  filePath: string;
  result: 'ok' | 'corrupted' | 'error' | 'skipped';
  message: string;
  bytesRead: number;
}

interface ScrubRecord {
  /** ms since the epoch of the last scrub that ended (ok or corrupted), or when the file was first seen. */
  at: number;
  result: string;
}

export interface LaunchParams {
  filePath: string;
  uuid: string;
  diskUUID?: string;
  expectedChecksum?: string;
  dataEngine?: DataEngine;
}

export interface FetchParams extends LaunchParams {
  srcFilePath: string;
  size: number;
}
export interface DownloadFromURLParams extends LaunchParams {
  url: string;
}
export interface UploadParams extends LaunchParams {
  size: number;
  body: Readable;
}
export interface ReceiveFromPeerParams extends LaunchParams {
  size: number;
  port: number;
  fileType?: string;
}
export interface RestoreFromBackupURLParams extends LaunchParams {
  backupUrl: string;
  concurrentLimit: number;
  credential?: Record<string, string>;
}
export interface CloneFromBackingImageParams extends LaunchParams {
  backingImage: string;
  backingImageUUID: string;
  encryption: string;
  credential?: Record<string, string>;
}

/** What a finished action hands to the common epilogue. */
interface WorkResult {
  size: number;
  sha512?: string;
  /** The SHA-512 chain recorded with `sha512` (stored as `<file>.sha512chain`). */
  chain?: Sha512Chain;
  virtualSize?: number;
  /** The source already compared the expected checksum. */
  expectedVerified?: boolean;
  /** Trust `<path>.cfg` when its mtime matches (a fetched file keeps its data source's cfg). */
  trustCfg?: boolean;
  /** The image as made before it was zero-padded to a multiple of 512 bytes (a restore of an unaligned backup). */
  unpadded?: { size: number; sha512: string };
}

type Work = (f: SyncingFile, sink: ProgressSink) => Promise<WorkResult>;

export interface SyncServiceEvents {
  change: [filePath: string];
  /** A scrub pass ended (the disk's new scrub status). */
  scrub: [status: DiskScrubStatus];
}

export interface DownloadHandle {
  size: number;
  fileName: string;
  open(): Readable;
}

function requireMultipleOf512(size: number, what = 'file'): void {
  if (!Number.isSafeInteger(size) || size <= 0 || size % 512 !== 0) {
    throw new SyncInvalidArgumentError(
      `the ${what} size ${size} should be a multiple of 512 bytes since Longhorn uses directIO by default`,
    );
  }
}

/**
 * The registry of files of one process (manager daemon or data source), keyed by absolute path. Every action
 * creates a record in `pending`, reuses a valid existing file or cleans the place, does its work into `<path>.tmp`,
 * then hashes (or takes the source's hash), checks size and expected checksum, renames into place and writes
 * `<path>.cfg`. States change only through the record's FileLifecycle.
 */
export class SyncService extends EventEmitter<SyncServiceEvents> {
  readonly diskPath: string;
  /** The disk root every file path is confined to (`diskPath` normalised). */
  readonly #root: string;
  readonly #files = new Map<string, SyncingFile>();
  readonly #opts: SyncServiceOptions;
  readonly #verifying = new Set<string>();
  readonly #chainJobs = new Map<SyncingFile, ChainJob>();
  /** Receives from a peer that are running, by file path. */
  readonly #receivers = new Map<string, SsyncReceiver>();
  /** Raw receives from a peer (whose file is stored as received): their verified segments may be forwarded. */
  readonly #forwardable = new Set<string>();
  #monitor: NodeJS.Timeout | undefined;
  #closed = false;
  readonly #closing = new AbortController();
  readonly #onUseChecks = new Map<SyncingFile, Promise<void>>();
  #scrubBucket: TokenBucket | undefined;
  #scrubTimer: NodeJS.Timeout | undefined;
  #scrubRecords: Record<string, ScrubRecord> | undefined;
  #scrubPass: Promise<FileScrubResult[]> | undefined;
  #scrubStatus: DiskScrubStatus = { lastScrubTime: '', lastScrubResult: '', lastScrubMessage: '', lastScrubFiles: 0, scrubbing: '' };

  constructor(opts: SyncServiceOptions = {}) {
    super();
    this.#opts = opts;
    this.diskPath = opts.diskPath ?? DEFAULT_DISK_PATH;
    this.#root = normalizeRoot(this.diskPath);
    const every = opts.monitorIntervalMs ?? 2000;
    if (every > 0) {
      // checkReadyFiles() never rejects (Promise.allSettled); the timer only starts it.
      this.#monitor = setInterval(() => void this.checkReadyFiles(), every);
      this.#monitor.unref();
    }
    const scrub = opts.scrub;
    if (scrub && scrub.bandwidthBytesPerSecond > 0) {
      // a burst of one 2 MiB segment: the scrub reads a segment at a time
      this.#scrubBucket = new TokenBucket(scrub.bandwidthBytesPerSecond, 2 << 20, scrub.clock ?? systemClock);
      if (scrub.intervalMs > 0) this.#scheduleScrub();
    }
  }

  #log(message: string): void {
    this.#opts.log?.(message);
  }

  #changed(f: SyncingFile): void {
    this.emit('change', f.filePath);
  }

  // ---------------------------------------------------------------- queries

  list(): Record<string, FileInfo> {
    const out: Record<string, FileInfo> = {};
    for (const [p, f] of this.#files) out[p] = f.info();
    return out;
  }

  get(filePath: string): FileInfo {
    return this.#record(this.#confineId(filePath)).info();
  }

  has(filePath: string): boolean {
    return this.#files.has(filePath);
  }

  /** Resolves when no work runs on the file any more (for tests and shutdown). */
  async settled(filePath: string): Promise<void> {
    await this.#files.get(filePath)?.task;
  }

  /**
   * The peer asked to send `filePath` answered that it is busy (at its limit of simultaneous sends) and will be asked
   * again: the receive's stall timeout starts again, so a receiver waiting its turn is not failed as if the sender were
   * gone. Returns whether a receive of that file waits for its sender.
   */
  keepReceiverWaiting(filePath: string): boolean {
    const r = this.#receivers.get(filePath);
    r?.keepWaiting();
    return r !== undefined;
  }

  /**
   * The record's launch work (prepare, action, finish) as a promise that settles when it is over, even if the record
   * is deleted meanwhile; undefined for an unknown path. A peer receive's port is free once it settled.
   */
  workOf(filePath: string): Promise<void> | undefined {
    return this.#files.get(filePath)?.task;
  }

  /** Cancels the work on a file; the record fails with `reason` (no-op for an unknown or finished file). */
  cancel(filePath: string, reason: string): void {
    const f = this.#files.get(filePath);
    if (!f || f.state === FileState.Ready || f.state === FileState.Failed) return;
    f.controller.abort(new SyncServiceError(reason));
  }

  /**
   * Confines a launch's file path parameter to the disk (`@bis/disk-path`): absolute, inside the disk root, a file of
   * Longhorn's layout whose entry is `<name>-<uuid>` for this uuid, and no symbolic link leading out of the root.
   * Throws a `DiskPathError` (HTTP 400) before anything is created, changed or removed.
   */
  async #confine(filePath: string, uuid: string, parameter: string, kind: DiskFileKind | 'any' = 'any'): Promise<string> {
    const r = resolveDiskPath({ root: this.#root, kind, filePath, uuid, parameters: { filePath: parameter } });
    await assertNoEscapingLinks(this.#root, r.path, parameter);
    return r.path;
  }

  /**
   * A `/v1/files/{id}` path as the HTTP routes check it before any action: confined to the disk's layout, and no
   * symbolic link leading out of the root (a `DiskPathError`, HTTP 400, otherwise).
   */
  async confineFileId(filePath: string): Promise<string> {
    const p = this.#confineId(filePath);
    await assertNoEscapingLinks(this.#root, p, 'file id');
    return p;
  }

  /** A `/v1/files/{id}` path: lexically confined to the disk's layout (records only exist for confined paths). */
  #confineId(filePath: string): string {
    return resolveDiskPath({ root: this.#root, kind: 'any', filePath, parameters: { filePath: 'file id' } }).path;
  }

  #record(filePath: string): SyncingFile {
    const f = this.#files.get(filePath);
    if (!f) throw new SyncFileNotFoundError(filePath);
    return f;
  }

  // ---------------------------------------------------------------- launch actions

  /** Longhorn `fetch`: take over `srcFilePath` (a data-source result), or re-adopt the file when src == dst. */
  async fetch(p: FetchParams): Promise<void> {
    if (!p.srcFilePath || !p.filePath || !p.uuid || !p.diskUUID) {
      throw new SyncServiceError('no srcFilePath/dstFilePath/uuid/diskUUID for existing file fetch');
    }
    requireMultipleOf512(p.size);
    p = {
      ...p,
      filePath: await this.#confine(p.filePath, p.uuid, 'dst-file-path'),
      srcFilePath: await this.#confine(p.srcFilePath, p.uuid, 'src-file-path'),
    };
    if (p.srcFilePath === p.filePath) {
      this.#launch(p, p.size, 'reuse-only', async () => {
        throw new SyncServiceError('unreachable: reuse-only fetch has no work');
      });
      return;
    }
    this.#launch(p, p.size, 'reuse-or-replace', async (f, sink) => {
      const src = p.srcFilePath;
      try {
        const st = await fsp.stat(src).catch((err: NodeJS.ErrnoException) => {
          if (err.code === 'ENOENT') throw new SyncServiceError(`source file ${src} does not exist`);
          throw err;
        });
        if (!st.isFile()) throw new SyncServiceError(`invalid source file ${src}: it is not a regular file`);
        await fsp.rename(src, tmpPathOf(f.filePath));
        await fsp.rename(cfgPathOf(src), cfgPathOf(f.filePath)).catch((err: NodeJS.ErrnoException) => {
          if (err.code !== 'ENOENT') throw err;
        });
        // a chain stored beside the source is bound to its size, mtime and checksum; it is used only if they match
        await fsp.rename(chainPathOf(src), chainPathOf(f.filePath)).catch((err: NodeJS.ErrnoException) => {
          if (err.code !== 'ENOENT') throw err;
        });
        sink.updateProgress(st.size);
        return { size: st.size, trustCfg: true };
      } finally {
        await removeFile(src);
        await removeFile(cfgPathOf(src));
        await removeChainFile(src);
      }
    });
  }

  async downloadFromURL(p: DownloadFromURLParams): Promise<void> {
    if (!p.filePath || !p.uuid || !p.url) throw new SyncServiceError('no file path, uuid or url for downloading from URL');
    p = { ...p, filePath: await this.#confine(p.filePath, p.uuid, 'file-path') };
    const sources = this.#sources();
    this.#launch(p, 0, 'reuse-or-replace', async (f, sink) =>
      fromSource(
        await sources.download({
          url: p.url,
          dest: tmpPathOf(f.filePath),
          signal: f.signal,
          sink,
          expectedChecksum: f.expectedChecksum,
          onRetry: (r) => {
            // the data source's status says so, and the controller logs it as a warning naming the image and disk
            f.notice = `download attempt ${r.attempt} of ${r.limit + 1} failed, retrying in ${Math.round(r.retryInMs / 100) / 10} s: ${r.error}`;
            this.#log(`${f.filePath}: ${f.notice}`);
            this.#changed(f);
          },
        }),
      ),
    );
  }

  /** Synchronous like Longhorn's: resolves when the bytes are in and the file is finished (or failed). */
  async upload(p: UploadParams): Promise<void> {
    if (!p.filePath || !p.uuid) throw new SyncServiceError('no file path or uuid for uploading');
    requireMultipleOf512(p.size, 'uploaded file');
    p = { ...p, filePath: await this.#confine(p.filePath, p.uuid, 'file-path') };
    const sources = this.#sources();
    const f = this.#launch(p, p.size, 'reuse-or-replace', async (rec, sink) =>
      fromSource(
        await sources.upload({
          body: p.body,
          size: p.size,
          dest: tmpPathOf(rec.filePath),
          signal: rec.signal,
          sink,
          expectedChecksum: rec.expectedChecksum,
        }),
      ),
    );
    await f.task;
    if (f.state === FileState.Failed) throw new SyncServiceError(f.lifecycle.message);
  }

  async receiveFromPeer(p: ReceiveFromPeerParams): Promise<void> {
    if (!p.filePath || !p.uuid) throw new SyncServiceError('no file path or uuid for receiving from peer');
    const fileType = p.fileType ?? '';
    if (fileType !== '' && fileType !== 'raw' && fileType !== 'qcow2') {
      throw new SyncServiceError(`invalid file type "${fileType}" for receiving: must be raw or qcow2`);
    }
    requireMultipleOf512(p.size);
    if (!Number.isSafeInteger(p.port) || p.port < 0 || p.port > 65535) {
      throw new SyncServiceError(`invalid port ${p.port} for receiving`);
    }
    p = { ...p, filePath: await this.#confine(p.filePath, p.uuid, 'file-path') };
    const rec = this.#launch(p, p.size, 'reuse-or-replace', async (f, sink) => {
      const receiver = await (await loadSsyncReceiver()).startSsyncReceiver({
        port: p.port,
        host: this.#opts.receiverHost,
        filePath: tmpPathOf(f.filePath),
        size: p.size,
        signal: f.signal,
        idleTimeoutMs: this.#opts.receiverIdleTimeoutMs,
        minSenderRate: this.#opts.receiverMinSenderRate,
        punchHole: this.#opts.punchHole ?? (await loadBlockMapping()).punchHole,
        onProgress: (n) => sink.updateProgress(n),
        // the SHA-512 is computed in file order while receiving, so the file is not read again to verify it
        computeChecksum: true,
        auth: this.#opts.internalAuth,
      });
      this.#receivers.set(f.filePath, receiver);
      this.#changed(f); // a forwarding send may wait for the receiver
      try {
        const r = await receiver.done;
        // holes are not counted while receiving: the file is complete now
        sink.updateProgress(r.size);
        const s = r.hashStats;
        const c = r.chainStats;
        this.#log(
          `received ${f.filePath}: ${r.dataBytes} data bytes, ${r.holeBytes} hole bytes in ${Math.round(r.timings.receiveMs)} ms; ` +
            `checksum final ${Math.round(r.timings.checksumTailMs)} ms after close` +
            (s ? ` (in order ${s.inOrderBytes}, holes ${s.holeBytes}, read back ${s.readBackBytes}, post-pass ${s.postPassBytes} bytes)` : '') +
            (c ? ` (SHA-512 chain: ${c.segments} segments, in flight ${c.inFlight}, holes ${c.holes}, read back ${c.readBack})` : ''),
        );
        if (fileType !== 'qcow2') return { size: r.size, sha512: r.sha512, chain: r.chain };
        return await this.#convertReceivedToQcow2(f, sink, r.size);
      } finally {
        if (this.#receivers.get(f.filePath) === receiver) this.#receivers.delete(f.filePath);
        await receiver.closed;
      }
    });
    if (fileType !== 'qcow2') {
      this.#forwardable.add(rec.filePath);
      void rec.task.finally(() => {
        if (this.#files.get(rec.filePath) === rec || !this.#files.has(rec.filePath)) this.#forwardable.delete(rec.filePath);
      });
    }
  }

  /**
   * `file-type=qcow2`: the peer sent raw bytes; convert them (`qemu-img convert -f raw -O qcow2`, no fixed time
   * limit, cancellable) into `<tmp>.qcow2tmp` and put that in place of `<tmp>`. The stored file is the qcow2 image, so
   * its size becomes the record's size and its SHA-512 is computed from the converted file.
   */
  async #convertReceivedToQcow2(f: SyncingFile, sink: ProgressSink, rawSize: number): Promise<WorkResult> {
    const tmp = tmpPathOf(f.filePath);
    const scratch = `${tmp}.qcow2tmp`;
    try {
      await (await loadQemuImg()).convertRawToQcow2({ source: tmp, dest: scratch, signal: f.signal });
      await fsp.rename(scratch, tmp);
    } finally {
      await removeFile(scratch);
    }
    const st = await statFile(tmp);
    sink.setSize(st.size);
    sink.updateProgress(st.size);
    const { sha512, chain } = await (await loadChainFile()).hashFileRecordingChain(tmp, { signal: f.signal });
    this.#log(`converted the received ${rawSize}-byte raw image ${f.filePath} to qcow2 (${st.size} bytes)`);
    return { size: st.size, sha512, chain, virtualSize: rawSize };
  }

  async restoreFromBackupURL(p: RestoreFromBackupURLParams): Promise<void> {
    if (!p.filePath || !p.uuid || !p.backupUrl) {
      throw new SyncServiceError('no file path, uuid or backup URL for restoring from backup');
    }
    if (!Number.isSafeInteger(p.concurrentLimit) || p.concurrentLimit < 1) {
      throw new SyncServiceError(`invalid concurrent limit ${p.concurrentLimit}: must be at least 1`);
    }
    p = { ...p, filePath: await this.#confine(p.filePath, p.uuid, 'file-path') };
    const sources = this.#sources();
    this.#launch(p, 0, 'reuse-or-replace', async (f, sink) =>
      fromSource(
        await sources.restore({
          backupUrl: p.backupUrl,
          concurrentLimit: p.concurrentLimit,
          credential: p.credential ?? {},
          dest: tmpPathOf(f.filePath),
          signal: f.signal,
          sink,
          expectedChecksum: f.expectedChecksum,
        }),
      ),
    );
  }

  async cloneFromBackingImage(p: CloneFromBackingImageParams): Promise<void> {
    if (!p.backingImage || !p.backingImageUUID || !p.encryption || !p.filePath || !p.uuid) {
      throw new SyncServiceError('no backing image, backing image uuid, encryption, file path or uuid for cloning');
    }
    if (!['ignore', 'encrypt', 'decrypt'].includes(p.encryption)) {
      throw new SyncServiceError(`invalid encryption operation "${p.encryption}": must be ignore, encrypt or decrypt`);
    }
    p = { ...p, filePath: await this.#confine(p.filePath, p.uuid, 'file-path') };
    const source = resolveDiskPath({
      root: this.#root,
      kind: 'backing-file',
      name: p.backingImage,
      uuid: p.backingImageUUID,
      parameters: { name: 'backing-image', uuid: 'backing-image-uuid' },
    });
    await assertNoEscapingLinks(this.#root, source.path, 'backing-image');
    const sourcePath = source.path;
    const sources = this.#sources();
    this.#launch(p, 0, 'reuse-or-replace', async (f, sink) =>
      fromSource(
        await sources.clone({
          sourcePath,
          encryption: p.encryption as EncryptionOperation,
          credential: p.credential ?? {},
          dest: tmpPathOf(f.filePath),
          signal: f.signal,
          sink,
          expectedChecksum: f.expectedChecksum,
        }),
      ),
    );
  }

  #sources(): FileSourceProvider {
    if (!this.#opts.sources) throw new SyncServiceError('this sync service has no file sources configured');
    return this.#opts.sources;
  }

  // ---------------------------------------------------------------- other actions

  /**
   * Starts sending a ready file (or forwarding one being received) to a peer receiver; resolves once the send started.
   * `onEnd` is called once when that send has ended, however it ended.
   */
  async sendToPeer(filePath: string, toAddress: string, onEnd?: () => void): Promise<void> {
    filePath = this.#confineId(filePath);
    const f = this.#files.get(filePath);
    if (!f) throw new SyncServiceError(`can not find sync file ${filePath} for sending`);
    if (!toAddress) throw new SyncServiceError(`no to-address for sending sync file ${filePath}`);
    if (f.state !== FileState.Ready && this.#forwardable.has(filePath) && RECEIVING.has(f.state)) {
      return this.#forwardToPeer(f, toAddress, onEnd);
    }
    const limit = this.#opts.sendingLimit ?? SENDING_LIMIT;
    if (f.sendingReference >= limit) {
      throw new SyncServiceError(sendingLimitRefusal(filePath, limit));
    }
    await this.#checkReady(f);
    if (f.state !== FileState.Ready) throw new SyncServiceError(`invalid state ${f.state} for file sending`);
    const layout = this.#opts.layout ?? (async (p: string) => (await loadBlockMapping()).getFileLayout(p));
    if (f.sendingReference >= limit) {
      throw new SyncServiceError(sendingLimitRefusal(filePath, limit));
    }
    f.sendingReference++;
    this.#changed(f);
    const useChain = this.#opts.sendChain ?? true;
    // The send's outcome is recorded on the file (state, message, log) inside.
    void (async () => {
      let chain: Sha512Chain | undefined;
      if (useChain) {
        chain = await this.#chainForSend(f).catch((err: unknown) => {
          if (f.signal.aborted) throw err;
          this.#log(`${filePath}: no SHA-512 chain for sending (${errorMessage(err)}); sending without one`);
          return undefined;
        });
      }
      return (await loadSsyncSender()).sendFile({
        ...this.#opts.sender,
        path: filePath,
        toAddress,
        layout,
        signal: f.signal,
        chain,
        token: this.#opts.internalAuth?.token,
      });
    })()
      .then(
        (r) => this.#log(`sent ${filePath} to ${toAddress}: ${r.dataBytes} data bytes, ${r.holeBytes} hole bytes`),
        (err: unknown) => {
          const message = errorMessage(err);
          this.#log(`failed to send ${filePath} to ${toAddress}: ${message}`);
          // The receiver found the bytes do not match the chain (or the checksum), or it dropped the connection in the
          // middle of a body (what a receiver that has failed the transfer does; the mismatch answer is then never
          // read): check this copy itself. #verifyAfterUse() runs once at a time per copy, records its outcome on the
          // file, and nothing waits for it.
          if (SEND_FAILURE_TO_VERIFY.test(message) && !f.signal.aborted) void this.#verifyAfterUse(f, 'send');
        },
      )
      .finally(() => {
        f.sendingReference--;
        this.#changed(f);
        onEnd?.();
      });
  }

  /**
   * Sends a copy that is still being received from a peer on to another receiver (pipelined distribution, like
   * Kraken's and Dragonfly's piece-level P2P): each segment goes out once it is in this copy's file and verified
   * against the SHA-512 chain the copy is received with, so a chain of copies fills at the speed of one transfer. The
   * receiver verifies every segment against the same chain and the file's checksum, as from a ready copy. Refused as
   * busy (the sending-limit words, so the receiving manager asks again or another sender) while this copy does not
   * know its chain yet, and beyond {@link FORWARDING_LIMIT} sends; refused for good when it is received without a chain.
   */
  async #forwardToPeer(f: SyncingFile, toAddress: string, onEnd?: () => void): Promise<void> {
    const filePath = f.filePath;
    const busy = (why: string) => new SyncServiceError(`syncing file ${filePath} ${why}: it ${SENDING_LIMIT_REFUSAL} ${FORWARDING_LIMIT} while it is received`);
    if (f.sendingReference >= FORWARDING_LIMIT) throw busy('forwards to another peer already');
    const deadline = Date.now() + FORWARD_WAIT_MS;
    let receiver = this.#receivers.get(filePath);
    while (!receiver && RECEIVING.has(f.state) && this.#files.get(filePath) === f && Date.now() < deadline) {
      await this.#nextChange(filePath, deadline - Date.now());
      receiver = this.#receivers.get(filePath);
    }
    if (!receiver || !RECEIVING.has(f.state)) {
      if (f.state === FileState.Ready) return this.sendToPeer(filePath, toAddress, onEnd);
      throw busy('has not started receiving yet');
    }
    let timer: NodeJS.Timeout | undefined;
    const chain = await Promise.race([
      receiver.forwardable.chain,
      new Promise<'waiting'>((resolve) => (timer = setTimeout(() => resolve('waiting'), Math.max(0, deadline - Date.now())))),
    ])
      .catch((err: unknown) => {
        throw new SyncServiceError(`cannot forward ${filePath}: its receive failed: ${errorMessage(err)}`);
      })
      .finally(() => clearTimeout(timer));
    if (chain === 'waiting') throw busy('does not know its SHA-512 chain yet');
    if (!chain) throw new SyncServiceError(`cannot forward ${filePath} before it is complete: it is received without a SHA-512 chain`);
    if (f.sendingReference >= FORWARDING_LIMIT) throw busy('forwards to another peer already');
    // taken before the next wait, so that requests arriving together cannot all pass the check above
    f.sendingReference++;
    this.#changed(f);
    let file: fsp.FileHandle;
    try {
      file = await fsp.open(tmpPathOf(filePath), 'r');
    } catch (err) {
      f.sendingReference--;
      this.#changed(f);
      // the receive completed meanwhile (its file is in place): send it as a ready copy
      if (f.state === FileState.Ready) return this.sendToPeer(filePath, toAddress, onEnd);
      throw new SyncServiceError(`cannot forward ${filePath}: ${errorMessage(err)}`);
    }
    this.#log(`forwarding ${filePath} to ${toAddress} while it is received (segment by segment as each is verified)`);
    const source = receiver.forwardable;
    void (async () =>
      (await loadSsyncSender()).sendFile({
        ...this.#opts.sender,
        path: filePath,
        toAddress,
        layout: () => Promise.reject(new Error('a forwarding send has no layout')),
        signal: f.signal,
        chain,
        token: this.#opts.internalAuth?.token,
        forward: { file, size: chain.size, segmentFinal: (i) => source.segmentFinal(i), holesIn: (b, e) => source.holesIn(b, e) },
      }))()
      .then(
        (r) => this.#log(`forwarded ${filePath} to ${toAddress}: ${r.dataBytes} data bytes, ${r.holeBytes} hole bytes`),
        (err: unknown) => this.#log(`failed to forward ${filePath} to ${toAddress}: ${errorMessage(err)}`),
      )
      .finally(() => {
        void file.close().catch(() => undefined); // read-only: nothing to lose
        f.sendingReference--;
        this.#changed(f);
        onEnd?.();
      });
  }

  /** Resolves at the next change of `filePath`'s record, or after `maxMs` at the latest. */
  #nextChange(filePath: string, maxMs: number): Promise<void> {
    return new Promise<void>((resolve) => {
      const onChange = (p: string) => {
        if (p === filePath) done();
      };
      const done = () => {
        clearTimeout(timer);
        this.off('change', onChange);
        resolve();
      };
      const timer = setTimeout(done, Math.max(0, maxMs));
      this.on('change', onChange);
    });
  }

  /** A ready file's bytes for the download endpoint. */
  async openDownload(filePath: string): Promise<DownloadHandle> {
    filePath = this.#confineId(filePath);
    const f = this.#files.get(filePath);
    if (!f) throw new SyncServiceError(`nil sync file ${filePath}`);
    await this.#checkReady(f);
    if (f.state !== FileState.Ready) {
      throw new SyncServiceError(`cannot get the reader for a non-ready file, current state ${f.state}`);
    }
    const st = await statFile(filePath);
    const dir = path.basename(path.dirname(filePath));
    const name = dir.endsWith(`-${f.uuid}`) ? dir.slice(0, -(f.uuid.length + 1)) : dir;
    // verify while streaming: segment by segment against the chain, else the whole checksum before the last chunk
    const chain = await this.#boundChain(f, st.size);
    const checksum = f.currentChecksum;
    const onCorrupt = (err: CorruptionError): void => this.#foundCorrupted(f, 'download', err);
    const open = (): Readable => {
      // O_NOFOLLOW: a ready file replaced by a symbolic link is never served in its target's place
      const src = createReadStream(filePath, { fd: openSync(filePath, READ_NOFOLLOW), highWaterMark: 1 << 20 });
      if (!chain && !checksum) return src;
      const check = chain ? new ChainVerifyingStream(chain, onCorrupt) : new ChecksumVerifyingStream(checksum, onCorrupt);
      src.on('error', (e) => check.destroy(e));
      check.on('close', () => src.destroy());
      return src.pipe(check);
    };
    return { size: st.size, fileName: name, open };
  }

  /** Drops the record, cancels its work and removes `<path>`, `<path>.tmp`, `<path>.cfg`. No-op for an unknown path. */
  async delete(filePath: string): Promise<void> {
    filePath = this.#confineId(filePath);
    const f = this.#files.get(filePath);
    if (!f) return;
    this.#files.delete(filePath);
    f.controller.abort(new SyncServiceError('the file was deleted'));
    await f.task;
    await removeFileSet(filePath);
    this.#changed(f);
  }

  /** Drops the record and keeps finished files (work still running is cancelled and its `.tmp` removed). */
  async forget(filePath: string): Promise<void> {
    filePath = this.#confineId(filePath);
    const f = this.#files.get(filePath);
    if (!f) return;
    this.#files.delete(filePath);
    if (f.state !== FileState.Ready) f.controller.abort(new SyncServiceError('the file was forgotten'));
    await f.task;
    this.#changed(f);
  }

  /** Cancels all work (temporary files are removed; finished files stay) and stops the monitor. */
  async close(): Promise<void> {
    this.#closed = true;
    if (this.#monitor) clearInterval(this.#monitor);
    if (this.#scrubTimer) clearTimeout(this.#scrubTimer);
    this.#closing.abort(new SyncServiceError('the sync service is shutting down'));
    const files = [...this.#files.values()];
    for (const f of files) f.controller.abort(new SyncServiceError('the sync service is shutting down'));
    await Promise.allSettled([...files.map((f) => f.task), this.#scrubPass, ...this.#onUseChecks.values()]);
  }

  // ---------------------------------------------------------------- the pipeline

  #launch(p: LaunchParams, size: number, mode: 'reuse-only' | 'reuse-or-replace', work: Work): SyncingFile {
    if (this.#closed) throw new SyncServiceError('the sync service is shutting down');
    let expected: ExpectedChecksum | undefined;
    try {
      expected = parseExpectedChecksum(p.expectedChecksum);
    } catch (err) {
      if (err instanceof ChecksumFormatError) throw new SyncServiceError(err.message);
      throw err;
    }
    if (this.#files.has(p.filePath)) throw new SyncServiceError(`file ${p.filePath} already exists`);
    for (const other of this.#files.values()) {
      if (other.uuid === p.uuid) throw new SyncServiceError(`file ${p.filePath} with uuid ${p.uuid} already exists`);
    }
    const f = new SyncingFile(p.filePath, p.uuid, p.diskUUID ?? '', expected?.text ?? '', expected, size, p.dataEngine ?? 'v1');
    f.lifecycle.onTransition(() => this.#changed(f));
    this.#files.set(p.filePath, f);
    this.#changed(f);
    f.task = this.#run(f, mode, work);
    return f;
  }

  async #run(f: SyncingFile, mode: 'reuse-only' | 'reuse-or-replace', work: Work): Promise<void> {
    let watchdog: NodeJS.Timeout | undefined;
    try {
      const reuseFailure = await this.#tryReuse(f);
      if (reuseFailure === undefined) return;
      if (mode === 'reuse-only') {
        throw new SyncServiceError(`syncing file should be directly reused but failed: ${reuseFailure}`);
      }
      await fsp.rm(cfgPathOf(f.filePath), { force: true });
      await removeChainFile(f.filePath);
      await fsp.mkdir(path.dirname(f.filePath), { recursive: true });
      await fsp.rm(tmpPathOf(f.filePath), { force: true });
      await fsp.rm(f.filePath, { force: true });
      f.signal.throwIfAborted();
      f.lifecycle.fire(FileEvent.Prepared);
      const beginMs = this.#opts.beginTimeoutMs ?? 60_000;
      watchdog = setTimeout(() => {
        if (f.state === FileState.Starting) {
          const secs = Math.round(beginMs / 1000);
          this.#fail(f, new SyncServiceError(`failed to wait for processing begin in ${secs} seconds, current state starting`));
          f.controller.abort(new SyncServiceError('processing did not begin in time'));
        }
      }, beginMs);
      watchdog.unref();
      const sink: ProgressSink = {
        setSize: (n) => {
          if (f.lifecycle.size <= 0 || n > 0) f.lifecycle.setSize(n);
          this.#changed(f);
        },
        updateProgress: (n) => {
          if (f.lifecycle.updateProgress(n)) this.#changed(f);
        },
        note: (m) => {
          if (f.lifecycle.note(m)) this.#changed(f);
        },
      };
      const result = await work(f, sink);
      clearTimeout(watchdog);
      f.signal.throwIfAborted();
      await this.#finish(f, result);
    } catch (err) {
      const reason: unknown = f.signal.aborted ? f.signal.reason : err;
      this.#fail(f, reason);
      await removeFile(tmpPathOf(f.filePath)).catch((e: unknown) =>
        this.#log(`${f.filePath}: cannot remove the temporary file after the failure: ${errorMessage(e)}`),
      );
      // A file that failed because the service shuts down is never listed again (nothing of it is on the disk), so no
      // Delete will come for it: its directory goes too if this attempt left it empty (a manager stopped while one of
      // its syncs was starting left `backing-images/<name>-<uuid>/` behind).
      if (this.#closed) {
        await removeEmptyDir(path.dirname(f.filePath)).catch((e: unknown) => this.#log(`${f.filePath}: cannot remove its empty directory after the failure: ${errorMessage(e)}`));
      }
    } finally {
      if (watchdog) clearTimeout(watchdog);
    }
  }

  /** Reuse check of the pending phase: resolves undefined when the existing file was adopted, else the reason. */
  async #tryReuse(f: SyncingFile): Promise<string | undefined> {
    const st = await statFileIfExists(f.filePath);
    if (!st) return `there is no existing file ${f.filePath}`;
    if (!st.isFile) return `${f.filePath} is not a regular file`;
    const size = f.lifecycle.size;
    if (size > 0 && st.size !== size) return `the existing file size ${st.size} does not match the expected size ${size}`;
    // An unreadable config only means no recorded checksum: the file is hashed instead.
    const cfg = await readSyncingFileConfig(cfgPathOf(f.filePath)).catch(() => undefined);
    let checksum = '';
    const expected = f.expected;
    if (cfg && cfg.currentChecksum && cfg.modificationTime === st.modificationTime) {
      if (!expected || expected.algorithm === 'sha512' || cfg.expectedChecksum === f.expectedChecksum) {
        checksum = cfg.currentChecksum;
      }
    }
    let chain: Sha512Chain | undefined;
    if (!checksum && (!expected || expected.algorithm === 'sha512')) {
      // the mtime changed (a copy, a touch, a restore): a stored chain of the same size lets the file be verified in
      // parallel; the checksum is what the verification computes, so the chain needs no trust
      const verified = await this.#verifyAgainstStoredChain(f, st.size);
      if (verified) ({ checksum, chain } = verified);
    }
    if (!checksum) {
      try {
        ({ sha512: checksum, chain } = await (await loadChainFile()).hashFileRecordingChain(f.filePath, { signal: f.signal, expected }));
      } catch (err) {
        if (err instanceof ChecksumMismatchError) {
          return `file expected checksum ${err.expected} doesn't match the existing file checksum ${err.actual}`;
        }
        throw err;
      }
    }
    // Longhorn skips this comparison when the checksum comes from a matching .cfg (quirk §10-5); we never do.
    if (expected?.algorithm === 'sha512' && expected.value !== checksum) {
      return `file expected checksum ${expected.value} doesn't match the existing file checksum ${checksum}`;
    }
    const after = await statFile(f.filePath);
    if (after.modificationTime !== st.modificationTime) return `the existing file was modified while being checked`;
    f.signal.throwIfAborted();
    await this.#adopt(f, after, checksum, undefined, chain);
    f.lifecycle.setSize(after.size);
    f.lifecycle.fire(FileEvent.ReuseSucceeded);
    return undefined;
  }

  /**
   * Takes `checksum` as the file's current checksum and writes `<file>.cfg`; a chain recorded with it is stored as
   * `<file>.sha512chain`, bound to the same size, modification time and checksum.
   */
  async #adopt(
    f: SyncingFile,
    st: { size: number; modificationTime: string; realSize: number },
    checksum: string,
    virtualSize?: number,
    chain?: Sha512Chain,
  ): Promise<void> {
    f.currentChecksum = checksum;
    f.modificationTime = st.modificationTime;
    f.realSize = st.realSize;
    f.virtualSize = virtualSize ?? (await readVirtualSize(f.filePath, st.size));
    await writeSyncingFileConfig(cfgPathOf(f.filePath), {
      name: f.filePath,
      uuid: f.uuid,
      size: st.size,
      virtualSize: f.virtualSize,
      realSize: f.realSize,
      expectedChecksum: f.expectedChecksum,
      currentChecksum: checksum,
      modificationTime: st.modificationTime,
    });
    if (chain && chain.checksum === checksum && chain.size === st.size) {
      await (await loadChainFile()).writeChainFile(f.filePath, chain, st.modificationTime).catch((err: unknown) =>
        this.#log(`${f.filePath}: could not store the SHA-512 chain: ${errorMessage(err)}`),
      );
    }
  }

  async #finish(f: SyncingFile, r: WorkResult): Promise<void> {
    const tmp = tmpPathOf(f.filePath);
    f.lifecycle.updateProgress(r.size);
    const size = f.lifecycle.size;
    if (size > 0 && r.size !== size) {
      throw new SyncServiceError(`processed data size ${r.size} does not match the expected file size ${size}`);
    }
    const st = await statFile(tmp);
    if (size > 0 && st.size !== size) {
      throw new SyncServiceError(`processed data size ${st.size} does not match the expected file size ${size}`);
    }
    let checksum = r.sha512 ?? '';
    let chain = r.sha512 !== undefined && r.chain?.checksum === r.sha512 ? r.chain : undefined;
    let verified = r.expectedVerified === true;
    if (!checksum && r.trustCfg) {
      // An unreadable config only means no recorded checksum: the file is hashed instead.
      const cfg = await readSyncingFileConfig(cfgPathOf(f.filePath)).catch(() => undefined);
      if (cfg && cfg.currentChecksum && cfg.modificationTime === st.modificationTime) checksum = cfg.currentChecksum;
      if (cfg && checksum && f.expected && f.expected.algorithm !== 'sha512' && cfg.expectedChecksum === f.expectedChecksum) {
        verified = true;
      }
    }
    if (!checksum) {
      ({ sha512: checksum, chain } = await (await loadChainFile()).hashFileRecordingChain(tmp, { signal: f.signal, expected: f.expected }));
      verified = true;
    }
    if (f.expected && !verified) {
      if (f.expected.algorithm === 'sha512') assertChecksumMatches(f.expected, checksum);
      else await hashFile(tmp, { signal: f.signal, expected: f.expected });
    }
    const after = await statFile(tmp);
    if (after.modificationTime !== st.modificationTime) {
      throw new SyncServiceError(`tmp file ${tmp} has been modified while calculating checksum`);
    }
    f.signal.throwIfAborted();
    await fsp.rename(tmp, f.filePath);
    await this.#adopt(f, after, checksum, r.virtualSize, chain);
    if (r.unpadded) {
      f.unpadded = { size: r.unpadded.size, sha512: r.unpadded.sha512 };
      this.#log(`${f.filePath}: ${paddedText(f.unpadded, after.size, checksum)}`);
    }
    f.lifecycle.fire(FileEvent.Processed);
  }

  /**
   * The checksum of a ready file whose modification time changed. With a stored chain of the same size and checksum
   * the file is verified against it in parallel (sound whatever the chain's mtime: a changed byte breaks a link, and
   * the checksum is computed, not trusted); otherwise one sequential pass that also records a new chain.
   */
  async #recheck(f: SyncingFile, size: number): Promise<{ checksum: string; chain?: Sha512Chain }> {
    const verified = await this.#verifyAgainstStoredChain(f, size, f.currentChecksum);
    if (verified) return verified;
    const { sha512, chain } = await (await loadChainFile()).hashFileRecordingChain(f.filePath, { signal: f.signal });
    return { checksum: sha512, chain };
  }

  /**
   * Verifies the file in parallel against its stored chain when there is one of `size` bytes (and of `checksum`, when
   * given); undefined when there is none, the addon is missing, or the file does not verify (then re-hash it).
   */
  async #verifyAgainstStoredChain(f: SyncingFile, size: number, checksum?: string): Promise<{ checksum: string; chain: Sha512Chain } | undefined> {
    if (!(await loadSha512Chain()).nativeSha512ChainAvailable()) return undefined;
    const stored = await (await loadChainFile()).readStoredChain(f.filePath);
    if (!stored || stored.chain.size !== size || (checksum !== undefined && stored.chain.checksum !== checksum)) return undefined;
    try {
      const computed = await (await loadSha512Chain()).verifyFileChain(f.filePath, stored.chain, { signal: f.signal });
      this.#log(`${f.filePath}: re-verified in parallel against its stored SHA-512 chain`);
      return { checksum: computed, chain: stored.chain };
    } catch (err) {
      if (f.signal.aborted) throw err;
      this.#log(`${f.filePath}: the stored SHA-512 chain does not verify (${errorMessage(err)}); re-hashing the file`);
      return undefined;
    }
  }

  /**
   * The chain of a ready file for a send: the stored one when it is bound to the file's size, modification time and
   * checksum; else computed once (one pass, shared by concurrent sends) and stored. Undefined when the addon is not
   * available or the file changed meanwhile: the send then proceeds without a chain.
   */
  async #chainForSend(f: SyncingFile): Promise<Sha512Chain | undefined> {
    if (!(await loadSha512Chain()).nativeSha512ChainAvailable()) return undefined;
    const st = await statFile(f.filePath);
    const binding = { size: st.size, modificationTime: f.modificationTime, checksum: f.currentChecksum };
    if (st.modificationTime !== f.modificationTime) return undefined;
    const stored = await (await loadChainFile()).readChainFile(f.filePath, binding);
    if (stored) return stored;
    let job = this.#chainJobs.get(f);
    if (!job) {
      job = (async () => {
        const chain = await (await loadSha512Chain()).computeFileChain(f.filePath, { signal: f.signal });
        const after = await statFile(f.filePath);
        if (chain.checksum !== f.currentChecksum || after.modificationTime !== f.modificationTime || chain.size !== after.size) {
          this.#log(`${f.filePath}: the file changed while its SHA-512 chain was computed; sending without a chain`);
          return undefined;
        }
        await (await loadChainFile()).writeChainFile(f.filePath, chain, after.modificationTime);
        this.#log(`${f.filePath}: computed and stored its SHA-512 chain`);
        return chain;
      })().finally(() => this.#chainJobs.delete(f));
      this.#chainJobs.set(f, job);
    }
    return job;
  }

  #fail(f: SyncingFile, err: unknown): void {
    if (f.state === FileState.Ready || f.state === FileState.Failed) return;
    const message = FAILURE_PREFIX + describeFileError(err, { filePath: f.filePath, imageName: backingImageNameFromPath(f.filePath, f.uuid) });
    if (f.lifecycle.tryFire(FileEvent.Fail, message)) this.#log(`${f.filePath}: ${message}${message.endsWith(errorMessage(err)) ? '' : ` [${errorMessage(err)}]`}`);
  }

  // ---------------------------------------------------------------- integrity: scrub and verify on use

  /**
   * A ready copy's bytes do not match its chain or checksum: the copy becomes `failed` (`found-corrupted`) with
   * `<context>: <what>` as its message, its sends are cancelled, and its `backing.cfg` is removed so that a restart
   * re-hashes the file instead of trusting it again.
   */
  #foundCorrupted(f: SyncingFile, context: string, err: CorruptionError): void {
    if (this.#files.get(f.filePath) !== f) return;
    const message = `${context}: ${err.message}`;
    if (!f.lifecycle.tryFire(FileEvent.FoundCorrupted, message)) return;
    this.#log(`${f.filePath}: the copy is corrupted, marked failed: ${message}`);
    f.controller.abort(new SyncServiceError(message));
    // Not awaited: marking the copy failed does not wait for the disk; a removal that fails is logged.
    void removeFile(cfgPathOf(f.filePath)).catch((e: unknown) =>
      this.#log(`${f.filePath}: cannot remove the config of the corrupted copy: ${errorMessage(e)}`),
    );
  }

  /** The stored chain of a ready file when it is bound to its size, modification time and checksum. */
  async #boundChain(f: SyncingFile, size: number): Promise<Sha512Chain | undefined> {
    if (!(await loadSha512Chain()).nativeSha512ChainAvailable()) return undefined;
    return (await loadChainFile()).readChainFile(f.filePath, { size, modificationTime: f.modificationTime, checksum: f.currentChecksum });
  }

  /**
   * Verifies one ready copy against its chain (or, without one, its checksum). `bucket` throttles the reads (the
   * scrub); undefined reads at full speed (verify on use). A mismatch marks the copy failed. A copy that changed on
   * disk meanwhile (its mtime moved) is left to the monitor's re-check.
   */
  async #verifyCopy(f: SyncingFile, context: string, bucket: TokenBucket | undefined, signal: AbortSignal): Promise<FileScrubResult> {
    const res = (result: FileScrubResult['result'], message: string, bytesRead = 0): FileScrubResult => ({ filePath: f.filePath, result, message, bytesRead });
    if (f.state !== FileState.Ready) return res('skipped', `the copy is ${f.state}`);
    const st = await statFileIfExists(f.filePath);
    if (!st || st.modificationTime !== f.modificationTime) return res('skipped', 'the copy changed on disk; the monitor re-checks it');
    let bytesRead = 0;
    const opts = { bucket, signal: AbortSignal.any([signal, f.signal]), onRead: (n: number) => void (bytesRead = n) };
    try {
      const chain = await this.#boundChain(f, st.size);
      if (chain) {
        await verifyFileThrottled(f.filePath, chain, opts);
      } else {
        const { sha512, chain: recorded } = await hashFileThrottled(f.filePath, opts);
        if (sha512 !== f.currentChecksum) {
          throw new CorruptionError(`SHA-512 mismatch: the copy hashes to ${sha512}, its checksum is ${f.currentChecksum}`);
        }
        if (recorded) {
          // The copy is verified either way; without a recorded chain the next check hashes it again.
          await (await loadChainFile())
            .writeChainFile(f.filePath, recorded, st.modificationTime)
            .catch((e: unknown) => this.#log(`${f.filePath}: cannot record the SHA-512 chain: ${errorMessage(e)}`));
        }
      }
    } catch (err) {
      // A file that cannot be stat'ed any more counts as changed.
      const after = await statFileIfExists(f.filePath).catch(() => undefined);
      if (after?.modificationTime !== st.modificationTime) return res('skipped', 'the copy changed on disk while it was verified', bytesRead);
      const c = asCorruption(err);
      if (c) {
        this.#foundCorrupted(f, context, c);
        return res('corrupted', `${context}: ${c.message}`, bytesRead);
      }
      if (opts.signal.aborted) return res('skipped', 'cancelled', bytesRead);
      return res('error', `${context}: cannot verify the copy: ${errorMessage(err)}`, bytesRead);
    }
    // A file that cannot be stat'ed any more counts as changed.
    const after = await statFileIfExists(f.filePath).catch(() => undefined);
    if (after?.modificationTime !== st.modificationTime) return res('skipped', 'the copy changed on disk while it was verified', bytesRead);
    return res('ok', '', bytesRead);
  }

  /**
   * Verify on use: a peer reported that the bytes this service sent do not match; re-verify the copy at full speed
   * (once at a time per copy). A bad copy is marked failed and stops serving.
   */
  #verifyAfterUse(f: SyncingFile, context: string): Promise<void> {
    let p = this.#onUseChecks.get(f);
    if (!p) {
      p = this.#verifyCopy(f, context, undefined, this.#closing.signal)
        .then((r) => {
          if (r.result === 'ok') this.#log(`${f.filePath}: re-verified after a ${context} mismatch: the copy is intact`);
          else if (r.result !== 'corrupted') this.#log(`${f.filePath}: re-verification after a ${context} mismatch: ${r.result} (${r.message})`);
        })
        .finally(() => this.#onUseChecks.delete(f));
      this.#onUseChecks.set(f, p);
    }
    return p;
  }

  /** Resolves when every verification started by a use of the files (a failed send) has ended. */
  async verificationsSettled(): Promise<void> {
    await Promise.allSettled([...this.#onUseChecks.values()]);
  }

  /** The disk's scrub status (last pass, its result, the copy being scrubbed). */
  scrubStatus(): DiskScrubStatus {
    return { ...this.#scrubStatus };
  }

  #scheduleScrub(): void {
    const scrub = this.#opts.scrub!;
    const poll = scrub.pollMs ?? Math.min(scrub.intervalMs, 60_000);
    this.#scrubTimer = setTimeout(() => {
      // Failures are logged just below; the next scrub is scheduled either way.
      void this.#runScrub(false)
        .catch((err: unknown) => this.#log(`scrub failed: ${errorMessage(err)}`))
        .finally(() => {
          if (!this.#closed) this.#scheduleScrub();
        });
    }, poll);
    this.#scrubTimer.unref();
  }

  /**
   * Scrubs now: every ready copy (`all`) or only those whose last scrub is older than the interval, one at a time,
   * at the bandwidth cap. Resolves with what each copy gave. A pass already running is waited for, then this one runs.
   */
  async scrubNow(all = true): Promise<FileScrubResult[]> {
    return this.#runScrub(all);
  }

  async #runScrub(all: boolean): Promise<FileScrubResult[]> {
    while (this.#scrubPass) await this.#scrubPass.catch(() => undefined); // the earlier pass's failure belongs to its own caller
    const pass = this.#scrubOnce(all).finally(() => {
      if (this.#scrubPass === pass) this.#scrubPass = undefined;
    });
    this.#scrubPass = pass;
    return pass;
  }

  #scrubStatePath(): string {
    return this.#opts.scrub?.statePath ?? path.join(this.diskPath, 'backing-image-scrub.json');
  }

  async #loadScrubRecords(): Promise<Record<string, ScrubRecord>> {
    if (this.#scrubRecords) return this.#scrubRecords;
    let records: Record<string, ScrubRecord> = {};
    try {
      const parsed: unknown = JSON.parse(await fsp.readFile(this.#scrubStatePath(), 'utf8'));
      if (parsed && typeof parsed === 'object') {
        const o = parsed as { files?: Record<string, ScrubRecord>; status?: DiskScrubStatus };
        if (o.files && typeof o.files === 'object') records = o.files;
        if (o.status && typeof o.status === 'object') this.#scrubStatus = { ...this.#scrubStatus, ...o.status, scrubbing: '' };
      }
    } catch {
      // no records yet (or unreadable): every copy starts its interval now
    }
    return (this.#scrubRecords = records);
  }

  async #saveScrubRecords(): Promise<void> {
    const target = this.#scrubStatePath();
    const tmp = `${target}.tmp`;
    const status = { ...this.#scrubStatus, scrubbing: '' };
    // O_NOFOLLOW: a link planted at the predictable temporary name is refused, not written through
    await fsp.writeFile(tmp, JSON.stringify({ files: this.#scrubRecords ?? {}, status }), { flag: WRITE_NOFOLLOW });
    await fsp.rename(tmp, target);
  }

  async #scrubOnce(all: boolean): Promise<FileScrubResult[]> {
    const scrub = this.#opts.scrub;
    const now = scrub?.wallClock ?? Date.now;
    const interval = scrub?.intervalMs ?? 0;
    const records = await this.#loadScrubRecords();
    const ready = [...this.#files.values()].filter((f) => f.state === FileState.Ready);
    let dirty = false;
    for (const key of Object.keys(records)) {
      if (!this.#files.has(key)) {
        delete records[key];
        dirty = true;
      }
    }
    const due: SyncingFile[] = [];
    for (const f of ready) {
      const r = records[f.filePath];
      if (!r) {
        // first seen: it was hashed when it became ready (or is a re-adopted copy); its interval starts now
        records[f.filePath] = { at: now(), result: '' };
        dirty = true;
        if (all) due.push(f);
      } else if (all || now() - r.at >= interval) {
        due.push(f);
      }
    }
    due.sort((a, b) => (records[a.filePath]?.at ?? 0) - (records[b.filePath]?.at ?? 0));
    const results: FileScrubResult[] = [];
    for (const f of due) {
      if (this.#closed) break;
      this.#scrubStatus.scrubbing = f.filePath;
      const r = await this.#verifyCopy(f, 'scrub', this.#scrubBucket, this.#closing.signal);
      this.#scrubStatus.scrubbing = '';
      results.push(r);
      if (r.result === 'ok' || r.result === 'corrupted') {
        records[f.filePath] = { at: now(), result: r.result };
        dirty = true;
      }
      this.#log(`scrub ${f.filePath}: ${r.result}${r.message ? ` (${r.message})` : ''}, ${r.bytesRead} bytes read`);
    }
    const done = results.filter((r) => r.result !== 'skipped');
    if (done.length > 0) {
      const bad = done.filter((r) => r.result === 'corrupted');
      const errors = done.filter((r) => r.result === 'error');
      this.#scrubStatus = {
        lastScrubTime: new Date(now()).toISOString(),
        lastScrubResult: bad.length > 0 ? 'corrupted' : errors.length > 0 ? 'error' : 'ok',
        lastScrubMessage: [...bad, ...errors].map((r) => `${r.filePath}: ${r.message}`).join('; '),
        lastScrubFiles: done.length,
        scrubbing: '',
      };
      this.emit('scrub', this.scrubStatus());
      dirty = true;
    }
    if (dirty && !this.#closed) {
      await this.#saveScrubRecords().catch((err: unknown) => this.#log(`cannot store the scrub records: ${errorMessage(err)}`));
    }
    return results;
  }

  // ---------------------------------------------------------------- ready-file monitor

  /** Checks every ready file against the disk once; a changed or vanished file is re-verified. */
  async checkReadyFiles(): Promise<void> {
    await Promise.allSettled([...this.#files.values()].map((f) => this.#checkReady(f)));
  }

  async #checkReady(f: SyncingFile): Promise<void> {
    if (f.state !== FileState.Ready || this.#verifying.has(f.filePath)) return;
    const st = await statFileIfExists(f.filePath).catch(() => undefined); // a file that cannot be stat'ed is re-verified below, which reports what is wrong
    if (f.state !== FileState.Ready || this.#verifying.has(f.filePath) || this.#files.get(f.filePath) !== f) return;
    if (st && st.modificationTime === f.modificationTime) return;
    this.#verifying.add(f.filePath);
    const p = this.#reverify(f, st?.modificationTime).finally(() => this.#verifying.delete(f.filePath));
    f.task = f.task.then(() => p);
    await p;
  }

  async #reverify(f: SyncingFile, mtime: string | undefined): Promise<void> {
    if (mtime === undefined) {
      f.lifecycle.fire(FileEvent.Modified, `ready file ${f.filePath} vanished from the disk`);
      this.#fail(f, new SyncServiceError(`ready file ${f.filePath} vanished from the disk`));
      return;
    }
    f.lifecycle.fire(FileEvent.Modified, `ready file is suddenly modified at ${mtime}, need to re-check the checksum`);
    try {
      const st = await statFile(f.filePath);
      const { checksum, chain } = await this.#recheck(f, st.size);
      if (checksum !== f.currentChecksum) {
        throw new SyncServiceError(
          `ready file ${f.filePath} was modified on disk: its checksum changed from ${f.currentChecksum} to ${checksum}`,
        );
      }
      const after = await statFile(f.filePath);
      if (after.modificationTime !== st.modificationTime) {
        throw new SyncServiceError(`ready file ${f.filePath} kept changing while its checksum was re-checked`);
      }
      await this.#adopt(f, after, checksum, f.virtualSize, chain);
      f.lifecycle.fire(FileEvent.Verified);
    } catch (err) {
      this.#fail(f, f.signal.aborted ? f.signal.reason : err);
    }
  }
}

/** The lazy computation of a ready file's chain for sending: one per file at a time, shared by concurrent sends. */
type ChainJob = Promise<Sha512Chain | undefined>;

/** The states of a copy being received (a forwarding send may start in any of them). */
const RECEIVING = new Set<string>([FileState.Pending, FileState.Starting, FileState.InProgress]);

/** Send failures after which the sender re-verifies its own copy (see `sendToPeer`). */
const SEND_FAILURE_TO_VERIFY = /mismatch|does not match|doesn't match|ECONNRESET|EPIPE|socket hang up/i;

function fromSource(r: SourceResult): WorkResult {
  // the chain recorded (or verified) in the pass that made the file: stored with it, so a send starts at once
  return {
    size: r.size,
    sha512: r.sha512,
    virtualSize: r.virtualSize,
    expectedVerified: r.expectedChecksumVerified === true,
    ...(r.chain ? { chain: r.chain } : {}),
    ...(r.unpadded ? { unpadded: r.unpadded } : {}),
  };
}

/** Both checksums of a zero-padded image, as users read them. */
export function paddedText(unpadded: { size: number; sha512: string }, size: number, sha512: string): string {
  return `restored image was ${unpadded.size} bytes (SHA-512 ${unpadded.sha512}), zero-padded to ${size} bytes (SHA-512 ${sha512})`;
}
