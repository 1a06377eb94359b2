import type { Readable } from 'node:stream';
import type { Sha512Chain } from '@bis/sha512-chain';

/** Where a source reports how far it got. */
export interface ProgressSink {
  /** Total bytes when known; -1 when unknown (e.g. a download without Content-Length). */
  setSize(size: number): void;
  /** Absolute number of bytes processed so far. */
  updateProgress(processed: number): void;
  /**
   * Says why the source waits while it is still working, e.g. `origin answered HTTP 500; attempt 3 of 6 failed, next
   * attempt at <RFC 3339>`: the file's status message until the next progress or the end.
   */
  note?(message: string): void;
}

export type ImageFormat = 'raw' | 'qcow2';

/** What a source learnt while streaming a file into place. */
export interface SourceResult {
  /** Bytes in the destination file (after zero-padding to a multiple of 512, if any). */
  size: number;
  /** SHA-512 (lowercase hex) of exactly the destination file's bytes, computed while streaming. */
  sha512: string;
  /** qcow2 virtual size, or the file size for raw images. */
  virtualSize: number;
  format: ImageFormat;
  /**
   * True when the source itself checked the request's expected checksum, against the image as received or as stored
   * (they differ only by the zero-padding to a multiple of 512 bytes); the caller need not check it again.
   */
  expectedChecksumVerified?: boolean;
  /** Set when the image was zero-padded to a multiple of 512 bytes: its size and SHA-512 as received (before it). */
  unpadded?: { size: number; sha512: string };
  /**
   * The SHA-512 chain of the destination file (its `checksum` is `sha512`), recorded in the pass that wrote it, so
   * that the file can be sent and verified segment by segment without being hashed again.
   */
  chain?: Sha512Chain;
}

export interface SourceRequestBase {
  /** Destination file (the `.tmp` file of a sync record). Created or truncated by the source. */
  dest: string;
  signal: AbortSignal;
  sink: ProgressSink;
  /** Expected checksum as given by the user (bare SHA-512 hex or `sha256:`/`sha1:`/`md5:` prefixed); '' = none. */
  expectedChecksum?: string;
}

/** A failed download attempt that is tried again. */
export interface DownloadRetry {
  /** Consecutive failed attempts so far (1 for the first failure). */
  attempt: number;
  /** Attempts allowed before the download fails. */
  limit: number;
  /** Why the attempt failed. */
  error: string;
  /** When the next attempt starts. */
  retryInMs: number;
}

export interface DownloadRequest extends SourceRequestBase {
  url: string;
  /** Told of every failed attempt that is tried again (the download's log). */
  onRetry?: (retry: DownloadRetry) => void;
}

export interface UploadRequest extends SourceRequestBase {
  /** The bytes of the upload (the multipart `chunk` part, or a raw body). */
  body: Readable;
  /** Declared size; the upload fails when fewer or more bytes arrive. */
  size: number;
  /** Byte offset at which `body` starts (resumable uploads); 0 for a whole upload. */
  offset?: number;
}

export interface RestoreRequest extends SourceRequestBase {
  backupUrl: string;
  concurrentLimit: number;
  /** Backup-target credential, passed per call (never through process environment). */
  credential: Record<string, string>;
}

export type EncryptionOperation = 'ignore' | 'encrypt' | 'decrypt';

export interface CloneRequest extends SourceRequestBase {
  /** Path of the ready source backing file. */
  sourcePath: string;
  encryption: EncryptionOperation;
  credential: Record<string, string>;
}

/**
 * The sources a sync service can launch. The sync service receives an implementation from its composition root
 * (the app), so it does not depend on how a source works.
 */
export interface FileSourceProvider {
  download(req: DownloadRequest): Promise<SourceResult>;
  upload(req: UploadRequest): Promise<SourceResult>;
  restore(req: RestoreRequest): Promise<SourceResult>;
  clone(req: CloneRequest): Promise<SourceResult>;
}
