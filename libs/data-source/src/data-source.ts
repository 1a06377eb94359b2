import { createReadStream } from 'node:fs';
import { mkdir, rm, stat } from 'node:fs/promises';
import { once } from 'node:events';
import path from 'node:path';
import { PassThrough, type Readable } from 'node:stream';
import type { InternalAuth } from '@bis/internal-auth';
import { FILE_MACHINE, FileEvent, FileState, transition } from '@bis/state-machine';
import type { DataSourceFileInfo } from '@bis/data-source-api/contract';
import { assertNoEscapingLinks, resolveDiskPath } from '@bis/disk-path';
import { SyncFileNotFoundError, type FileInfo, type SyncService } from '@bis/sync-service/service';
import { imageSizeLimit, SizeLimitError, type SizeLimitPolicy } from '@bis/file-sources/core';
import { DEFAULT_EXPORT_RECEIVER_PORT, exportType, type DataSourceConfig } from './config.js';

/** What `GET /v1/file` answers: Longhorn's `api.DataSourceInfo`, defined by the API's contract. */
export type DataSourceInfo = DataSourceFileInfo;

export interface DataSourceOptions {
  config: DataSourceConfig;
  /** The disk (Longhorn mounts it at `/data/`); the work file is `<disk>/tmp/<name>-<uuid>`. */
  diskPath: string;
  diskUUID: string;
  sync: SyncService;
  /** Processing must begin within this time (Longhorn: 60 s). */
  beginTimeoutMs?: number;
  /** Port of the export-from-volume receiver (Longhorn: 8002). */
  exportReceiverPort?: number;
  /** Address the export receiver listens on (default all interfaces, like Longhorn). */
  receiverHost?: string;
  /** Starts the replica's export towards our receiver (gRPC VolumeExport in Longhorn); optional. */
  requestVolumeExport?: (p: { senderAddress: string; snapshotName: string; port: number }) => Promise<void>;
  /** Who may send to the qcow2 export receiver (the raw export receiver is the sync service's, checked by it). */
  internalAuth?: InternalAuth;
  log?: (message: string) => void;
  /**
   * Bounds an upload's declared size (refused with 413 before the body is read) and an export's volume size (the
   * data source fails before its receiver listens): the disk's free space less its reserve, at most the
   * `backing-image-max-size` setting. Must match what the file sources enforce on the bytes.
   */
  sizeLimit?: SizeLimitPolicy;
}

/** Where a qcow2 export is before the sync service has its result. */
type ExportPhase = { state: FileState; progress: number; processed: number };

export class DataSourceError extends Error {
  override readonly name = 'DataSourceError';
  constructor(
    message: string,
    readonly statusCode = 500,
  ) {
    super(message);
  }
}

export const BEGIN_TIMEOUT_MESSAGE = 'timeout waiting for the datasource file processing begin';

/** State of a resumable upload: one long-lived body stream fed by successive requests. */
interface ResumableUpload {
  size: number;
  offset: number;
  body: PassThrough;
  busy: boolean;
  done: Promise<void>;
}

/**
 * The data source: prepares one file in `<disk>/tmp/<name>-<uuid>` through its sync service, reports it as
 * `ready-for-transfer`, and after `transfer` forgets it (the manager takes it over) and reports `ready`.
 */
export class DataSource {
  readonly filePath: string;
  readonly #o: DataSourceOptions;
  #frozenInfo: DataSourceInfo | undefined;
  #transferred = false;
  #watchdog: NodeJS.Timeout | undefined;
  #resumable: ResumableUpload | undefined;
  #wholeUpload = false;
  /** A qcow2 export before its result is handed to the sync service: receive raw, then convert. */
  #exportPhaseInfo: ExportPhase | undefined;
  readonly #exportAbort = new AbortController();
  #exportWork: Promise<void> | undefined;
  /** Those waiting for the file's state to change ({@link whenStateIsNot}): each checks the state when called. */
  readonly #waiters = new Set<() => void>();
  #closed = false;
  readonly #onSyncChange = (filePath: string): void => {
    if (filePath === this.filePath) this.#notify();
  };

  constructor(o: DataSourceOptions) {
    this.#o = o;
    // `<disk>/tmp/<name>-<uuid>` through @bis/disk-path: a name or uuid that breaks the rules throws DiskPathError
    this.filePath = resolveDiskPath({ root: o.diskPath, kind: 'data-source-file', name: o.config.name, uuid: o.config.uuid }).path;
  }

  get config(): DataSourceConfig {
    return this.#o.config;
  }

  /** Creates `<disk>/tmp`, launches the source and starts the begin watchdog. */
  async start(): Promise<void> {
    const { config: c, sync } = this.#o;
    // a `<disk>/tmp` (or file) that is a link leading out of the disk is refused before anything is created
    await assertNoEscapingLinks(this.#o.diskPath, this.filePath, 'name');
    await mkdir(path.dirname(this.filePath), { recursive: true });
    const base = {
      filePath: this.filePath,
      uuid: c.uuid,
      diskUUID: this.#o.diskUUID,
      expectedChecksum: c.checksum,
      dataEngine: (c.parameters['data-engine'] || 'v1') as 'v1' | 'v2',
    };
    switch (c.sourceType) {
      case 'download':
        await sync.downloadFromURL({ ...base, url: c.parameters['url']! });
        break;
      case 'upload':
        break;
      case 'restore':
        await sync.restoreFromBackupURL({
          ...base,
          backupUrl: c.parameters['backup-url']!,
          concurrentLimit: Number(c.parameters['concurrent-limit']),
          credential: c.credential,
        });
        break;
      case 'clone':
        await sync.cloneFromBackingImage({
          ...base,
          backingImage: c.parameters['backing-image']!,
          backingImageUUID: c.parameters['backing-image-uuid']!,
          encryption: c.parameters['encryption']!,
          credential: c.credential,
        });
        break;
      case 'export-from-volume': {
        const port = this.#o.exportReceiverPort ?? DEFAULT_EXPORT_RECEIVER_PORT;
        const size = Number(c.parameters['volume-size']);
        // The receiver writes exactly volume-size bytes (its open refuses any other size): that size is bounded like
        // an upload's declared size, before a receiver listens or the replica is asked to send.
        const limit = await imageSizeLimit(this.filePath, this.#o.sizeLimit);
        if (size > limit.bytes) {
          const message = SizeLimitError.declared(limit, "the volume's size", size).message;
          this.#frozen = { ...this.#local(), state: transition(FILE_MACHINE, FileState.New, FileEvent.Fail, this.#subject), size, virtualSize: size, message };
          this.#o.log?.(`export-from-volume refused: ${message}`);
          return;
        }
        if (exportType(c.parameters) === 'qcow2') {
          this.#exportPhase = { state: transition(FILE_MACHINE, FileState.New, FileEvent.Prepared, this.#subject), progress: 0, processed: 0 };
          this.#exportWork = this.#exportQcow2(port, size);
        } else {
          await sync.receiveFromPeer({ ...base, size, port, fileType: 'raw' });
        }
        const req = this.#o.requestVolumeExport;
        if (req) {
          req({ senderAddress: c.parameters['sender-address']!, snapshotName: c.parameters['snapshot-name']!, port }).catch(
            (e: Error) => this.#o.log?.(`volume export request failed: ${e.message}`),
          );
        }
        break;
      }
    }
    this.#startWatchdog();
  }

  /**
   * export-type qcow2: the ssync receiver writes the raw volume into `<file>.export-raw`, `qemu-img convert` turns it
   * into `<file>.export-qcow2` (no fixed time limit, cancellable), and that file is streamed into the sync service
   * (hash, qcow2 header check and write in one pass) as the data source's file. Scratch files are removed on every
   * path. Progress: receiving 0–80 %, converting 80–95 %, then the sync service's own progress.
   */
  async #exportQcow2(port: number, size: number): Promise<void> {
    const raw = `${this.filePath}.export-raw`;
    const qcow2 = `${this.filePath}.export-qcow2`;
    const signal = this.#exportAbort.signal;
    // bytes received or converted: the export phase moves on (starting → in-progress)
    const phase = (progress: number, processed: number): void => {
      const ex = this.#exportPhase;
      if (!ex) return;
      this.#exportPhase = { state: transition(FILE_MACHINE, ex.state, FileEvent.Progress, this.#subject), progress: Math.floor(progress), processed };
    };
    try {
      // the peer receiver is loaded only by an export data source
      const { startSsyncReceiver } = await import('@bis/sync-service/ssync-receiver');
      const receiver = await startSsyncReceiver({
        port,
        host: this.#o.receiverHost,
        filePath: raw,
        size,
        signal,
        auth: this.#o.internalAuth,
        onProgress: (n) => phase((n / size) * 80, n),
      });
      try {
        await receiver.done;
      } finally {
        await receiver.closed;
      }
      phase(80, size);
      const { convertRawToQcow2 } = await import('@bis/file-sources/qemu-img');
      await convertRawToQcow2({ source: raw, dest: qcow2, signal, onProgress: (p) => phase(80 + p * 0.15, size) });
      await rm(raw, { force: true });
      const { size: qcow2Size } = await stat(qcow2);
      this.#exportPhase = undefined; // from here on the sync record reports the state
      await this.#o.sync.upload(this.#uploadParams(qcow2Size, createReadStream(qcow2, { highWaterMark: 1 << 20 })));
    } catch (e) {
      const ex = this.#exportPhase;
      if (ex && !this.#frozen) {
        const message = signal.aborted ? 'the export was cancelled' : `failed to export the volume as qcow2: ${(e as Error).message}`;
        this.#frozen = { ...this.#local(), state: transition(FILE_MACHINE, ex.state, FileEvent.Fail, this.#subject), message };
        this.#exportPhase = undefined;
      }
      this.#o.log?.(`export-from-volume (qcow2) failed: ${(e as Error).message}`);
    } finally {
      await rm(raw, { force: true });
      await rm(qcow2, { force: true });
    }
  }

  #startWatchdog(): void {
    const limit = this.#o.beginTimeoutMs ?? 60_000;
    const started = Date.now();
    this.#watchdog = setInterval(() => {
      const state = this.#current().state;
      if (state !== '' && state !== FileState.Pending && state !== FileState.Starting) {
        this.#stopWatchdog();
        return;
      }
      if (Date.now() - started >= limit) {
        this.#stopWatchdog();
        const cur = this.#current();
        this.#frozen = { ...cur, state: transition(FILE_MACHINE, cur.state, FileEvent.Fail, this.#subject), message: BEGIN_TIMEOUT_MESSAGE };
        this.#resumable?.body.destroy(new Error(BEGIN_TIMEOUT_MESSAGE));
        this.#exportAbort.abort(new Error(BEGIN_TIMEOUT_MESSAGE));
        // Best effort: the file is already marked failed, and that failure is what is reported.
        this.#o.sync.delete(this.filePath).catch(() => undefined);
      }
    }, Math.min(1000, Math.max(10, limit / 10)));
    this.#watchdog.unref();
  }

  #stopWatchdog(): void {
    if (this.#watchdog) clearInterval(this.#watchdog);
    this.#watchdog = undefined;
  }

  get #subject(): string {
    return `data source ${this.#o.config.name}`;
  }

  /** The data source's own fields of its file info (the state comes from the export phase, or the sync record). */
  #local(): Omit<DataSourceInfo, 'state'> {
    const c = this.#o.config;
    return {
      sourceType: c.sourceType,
      parameters: c.parameters,
      name: c.name,
      diskUUID: this.#o.diskUUID,
      expectedChecksum: c.checksum,
      filePath: this.filePath,
      uuid: c.uuid,
      size: 0,
      virtualSize: 0,
      realSize: 0,
      progress: 0,
      processedSize: 0,
      modificationTime: '',
      currentChecksum: '',
      message: '',
      sendingReference: 0,
    };
  }

  #current(): DataSourceInfo {
    if (this.#frozen) return this.#frozen;
    const c = this.#o.config;
    const ex = this.#exportPhase;
    if (ex) {
      const size = Number(c.parameters['volume-size']);
      // the export phase is the data source's own record of the file: its state is reported as it is
      return { ...this.#local(), state: transition(FILE_MACHINE, ex.state, { reported: ex.state }, this.#subject), size, virtualSize: size, progress: ex.progress, processedSize: ex.processed };
    }
    let f: FileInfo;
    try {
      f = this.#o.sync.get(this.filePath);
    } catch (e) {
      if (e instanceof SyncFileNotFoundError) {
        // nothing processed yet: an upload data source waits for the upload (pending), the others have not begun ("")
        const event = c.sourceType === 'upload' ? FileEvent.AwaitUpload : FileEvent.Retried;
        return { ...this.#local(), state: transition(FILE_MACHINE, FileState.New, event, this.#subject) };
      }
      throw e;
    }
    const { sourceType, parameters, name } = this.#local();
    return {
      sourceType,
      parameters,
      name,
      ...f,
      // the sync service reports the file; a ready file of a data source waits for a manager to take it over
      state: transition(FILE_MACHINE, f.state, { reported: f.state === FileState.Ready ? FileState.ReadyForTransfer : f.state }, this.#subject),
    };
  }

  /** `GET /v1/file`. */
  info(): DataSourceInfo {
    return this.#current();
  }

  /** The file's own record once it no longer follows the sync service (failed here, or transferred). */
  get #frozen(): DataSourceInfo | undefined {
    return this.#frozenInfo;
  }
  set #frozen(info: DataSourceInfo | undefined) {
    this.#frozenInfo = info;
    this.#notify();
  }

  get #exportPhase(): ExportPhase | undefined {
    return this.#exportPhaseInfo;
  }
  set #exportPhase(phase: ExportPhase | undefined) {
    this.#exportPhaseInfo = phase;
    this.#notify();
  }

  /** Wakes the waits for a change of state (the setters above and the sync service's changes call it). */
  #notify(): void {
    for (const check of [...this.#waiters]) check();
  }

  /**
   * Resolves once the file's state is not `state` (at once when it already is not), when the data source closes, or
   * when `signal` aborts: what `GET /v1/file?waitWhile=<state>&wait=<seconds>` waits for before it answers, so that
   * the controller sees each state the moment it is reached instead of at its next poll.
   */
  whenStateIsNot(state: FileState, signal: AbortSignal): Promise<void> {
    const differs = (): boolean => {
      if (this.#closed) return true;
      try {
        return this.#current().state !== state;
      } catch {
        return true; // the answer reports the error at once
      }
    };
    if (signal.aborted || differs()) return Promise.resolve();
    return new Promise<void>((resolve) => {
      const done = (): void => {
        this.#waiters.delete(check);
        signal.removeEventListener('abort', done);
        if (this.#waiters.size === 0) this.#o.sync.off('change', this.#onSyncChange);
        resolve();
      };
      const check = (): void => {
        if (differs()) done();
      };
      // one listener on the sync service, whatever the number of waiters
      if (this.#waiters.size === 0) this.#o.sync.on('change', this.#onSyncChange);
      this.#waiters.add(check);
      signal.addEventListener('abort', done, { once: true });
    });
  }

  /** `POST /v1/file?action=transfer`: the manager takes the file over. */
  async transfer(): Promise<void> {
    // a transfer already done, or under way (a repeated call)
    if (this.#transferred || this.#frozen?.state === FileState.Ready) return;
    const info = this.#current();
    if (info.state !== FileState.ReadyForTransfer) {
      throw new DataSourceError(
        `datasource file current state is ${info.state} rather than ${FileState.ReadyForTransfer}, cannot do transfer`,
      );
    }
    // Reported as transferred before the sync record is forgotten: between the two, the file would look not begun.
    this.#frozen = { ...info, state: transition(FILE_MACHINE, info.state, FileEvent.Transferred, this.#subject) };
    try {
      await this.#o.sync.forget(this.filePath);
    } catch (e) {
      this.#frozen = undefined;
      throw e;
    }
    this.#transferred = true;
  }

  #requireUpload(): void {
    const t = this.#o.config.sourceType;
    if (t !== 'upload') throw new DataSourceError(`cannot do upload since data source type is ${t} rather than upload`, 400);
    if (this.#frozen) throw new DataSourceError(`cannot upload: the data source file is ${this.#frozen.state}`, 409);
  }

  #uploadParams(size: number, body: Readable) {
    const c = this.#o.config;
    return {
      filePath: this.filePath,
      uuid: c.uuid,
      diskUUID: '',
      expectedChecksum: c.checksum,
      dataEngine: (c.parameters['data-engine'] || 'v1') as 'v1' | 'v2',
      size,
      body,
    };
  }

  /**
   * Refuses (413) a declared upload size above the limit, before any byte of the body is read. A caller that has not
   * read the body yet (the route) checks this first; `upload`/`uploadPart` check it again.
   */
  async checkDeclaredSize(size: number): Promise<void> {
    const limit = await imageSizeLimit(this.filePath, this.#o.sizeLimit);
    if (size > limit.bytes) {
      throw new DataSourceError(`the upload's declared size of ${size} bytes is larger than the limit of ${limit.bytes} bytes (${limit.why})`, 413);
    }
  }

  /** `POST /v1/file?action=upload&size=N`: a whole upload (Longhorn's). Resolves when the file is finished. */
  async upload(size: number, body: Readable): Promise<void> {
    this.#requireUpload();
    if (this.#resumable || this.#wholeUpload) throw new DataSourceError('an upload is already in progress', 409);
    await this.checkDeclaredSize(size);
    this.#wholeUpload = true;
    try {
      await this.#o.sync.upload(this.#uploadParams(size, body));
    } finally {
      this.#wholeUpload = false;
    }
  }

  /** Resumable upload: how many bytes have been accepted so far. */
  uploadOffset(): { size: number; offset: number } {
    this.#requireUpload();
    const r = this.#resumable;
    return r ? { size: r.size, offset: r.offset } : { size: 0, offset: 0 };
  }

  /**
   * Resumable upload: appends `body` at `offset` (which must equal the current offset). A dropped request keeps
   * what was accepted; the client asks for the offset and continues. Resolves with the new offset; the call that
   * completes the declared size resolves when the file is finished.
   */
  async uploadPart(size: number, offset: number, body: Readable): Promise<{ size: number; offset: number }> {
    this.#requireUpload();
    if (this.#wholeUpload) throw new DataSourceError('a whole-file upload is already in progress', 409);
    let r = this.#resumable;
    if (!r) {
      if (offset !== 0) throw new DataSourceError(`no upload in progress: the first part must start at offset 0, not ${offset}`, 409);
      await this.checkDeclaredSize(size);
      if (this.#resumable) throw new DataSourceError('another request is uploading to this file', 409);
      const pt = new PassThrough({ highWaterMark: 1 << 20 });
      const done = this.#o.sync.upload(this.#uploadParams(size, pt));
      done.catch(() => undefined); // awaited by the upload requests that feed it; this only keeps it from being unhandled meanwhile
      r = this.#resumable = { size, offset: 0, body: pt, busy: false, done };
    }
    if (size !== r.size) throw new DataSourceError(`the upload size ${size} differs from the size ${r.size} given first`, 409);
    if (offset !== r.offset) throw new DataSourceError(`upload offset mismatch: the next byte expected is ${r.offset}, not ${offset}`, 409);
    if (r.busy) throw new DataSourceError('another request is uploading to this file', 409);
    r.busy = true;
    try {
      for await (const chunk of body as AsyncIterable<Buffer>) {
        if (r.offset + chunk.length > r.size) {
          throw new DataSourceError(`the upload has more bytes than the declared size ${r.size}`, 400);
        }
        r.offset += chunk.length;
        if (!r.body.write(chunk)) await Promise.race([once(r.body, 'drain'), r.done]);
      }
    } catch (e) {
      if (e instanceof DataSourceError) {
        r.body.destroy(e);
        throw e;
      }
      // A dropped connection: keep what was accepted; the client resumes at r.offset.
      return { size: r.size, offset: r.offset };
    } finally {
      r.busy = false;
    }
    if (r.offset === r.size) {
      r.body.end();
      await r.done;
    }
    return { size: r.size, offset: r.offset };
  }

  /** Stops the watchdog; cancels an unfinished file (its partial file is removed). */
  async close(): Promise<void> {
    this.#closed = true;
    this.#notify();
    this.#stopWatchdog();
    this.#exportAbort.abort(new Error('the data source is shutting down'));
    await this.#exportWork;
    this.#resumable?.body.destroy(new Error('the data source is shutting down'));
    if (!this.#transferred) {
      const state = this.#current().state;
      // Best effort while shutting down: the data source goes away either way.
      if (state !== FileState.ReadyForTransfer && state !== FileState.Ready) await this.#o.sync.delete(this.filePath).catch(() => undefined);
    }
  }
}
