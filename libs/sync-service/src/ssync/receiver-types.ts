import type { ReceiverServerKind } from './paths.js';
import type { Sha512Chain } from '@bis/sha512-chain';
import type { InternalAuth } from '@bis/internal-auth';
import type { HolePuncher } from './layout.js';
import type { ReceivedHashStats } from './received-hasher.js';

export interface SsyncReceiverOptions {
  /** Port to listen on (0 = any free port, for tests). */
  port: number;
  /** Address to listen on; default all interfaces like Longhorn. */
  host?: string;
  /** Target file (the record's `.tmp` file). */
  filePath: string;
  /** Expected file size; the sender's `open` must announce the same size (0 = accept the sender's). */
  size: number;
  signal?: AbortSignal;
  /**
   * Stall timeout: fail when the sender sends nothing for this long while the receiver waits for it — no request,
   * and no piece of a request's body (a piece is up to one slab, 2 MiB: a sender slower than 2 MiB per timeout counts
   * as stalled). Time the receiver itself is busy (writing, verifying, syncing to disk) does not count. Default 30 s
   * (Longhorn: 300 s without a request).
   */
  idleTimeoutMs?: number;
  /**
   * A request whose connection closed in the middle of its body means the sender is gone (killed, or its host lost):
   * the receive fails when no new request follows within this long. Default 2 s.
   */
  senderGoneTimeoutMs?: number;
  /**
   * A verification or write that fails after its request was answered fails the receive; the port then stays open
   * until a request of the sender has been answered with that failure, or for this long (default 10 s), so the sender
   * learns why (and checks its own copy) instead of finding the port closed. A sender that never comes back (it is gone)
   * delays the failure by that much; the stall timeout is longer.
   */
  fatalLingerMs?: number;
  /**
   * The slowest sender rate (bytes/s) still taken as progress (default 1 MiB/s). While the receiver reads a piece of
   * `n` bytes of a body from the sender, the stall timeout is `max(idleTimeoutMs, n / minSenderRate)`: a large piece
   * on a slow link is not mistaken for a stall.
   */
  minSenderRate?: number;
  /** Called with the number of data bytes written so far. */
  onProgress?: (dataBytes: number) => void;
  /** Used for `sendHole` when the target existed before (a fresh target is already sparse after truncation). */
  punchHole?: HolePuncher;
  /**
   * Compute the SHA-512 of the received file while receiving (in file order, on a worker thread; holes hashed from
   * zeros without reading them). The result then carries `sha512`. Default false.
   */
  computeChecksum?: boolean;
  /** Receive buffer size: bodies are written to the file in positioned writes of up to this many bytes (2 MiB). */
  slabSize?: number;
  /**
   * Accept a sender's SHA-512 chain (`POST sha512Chain`, our extension) and verify the file against it segment by
   * segment in parallel, instead of hashing it sequentially. Default: when the chain addon is available. When false,
   * the route answers 404 like Longhorn's receiver.
   */
  acceptChain?: boolean;
  /**
   * Write whole 4 KiB-aligned pieces with `O_DIRECT` (no copy into the page cache, nothing left for the `fsync` at
   * close), like Longhorn's receiver. Default true; where the filesystem has no direct I/O (tmpfs) or a piece is not
   * aligned, writes are buffered.
   */
  directIO?: boolean;
  /** A request head must arrive within this long (60 s), else 408 and the connection closes. */
  headerTimeoutMs?: number;
  /** Who may send: requests without the token are refused with 401 (see `@bis/internal-auth`). */
  auth?: InternalAuth;
  /**
   * The HTTP server: `own` (reads bodies straight into the slabs) or `node-http` (Node's `http`, copying). Default:
   * `BIS_SSYNC_RECEIVER_SERVER`, else `own` (see paths.ts).
   */
  httpServer?: ReceiverServerKind;
}

export interface SsyncReceiveResult {
  size: number;
  dataBytes: number;
  holeBytes: number;
  /** SHA-512 (hex) of the whole received file, when `computeChecksum` was set. */
  sha512?: string;
  /** How the checksum was computed (when `computeChecksum` was set and no chain was accepted). */
  hashStats?: ReceivedHashStats;
  /**
   * The SHA-512 chain of the received file: the sender's, with every segment verified against the received bytes
   * (then `sha512` is the checksum computed from the verified links), or the one recorded by the sequential hash.
   */
  chain?: Sha512Chain;
  /** With an accepted chain: bytes verified from request bodies in flight, hole segments, and segments read back. */
  chainStats?: ReceivedChainStats;
  /** Data bytes written with direct I/O (`directIO`) and through the page cache. */
  writeStats: { directBytes: number; bufferedBytes: number };
  /** Milliseconds from `open` to `close`, and from `close` until the checksum was final. */
  timings: { receiveMs: number; checksumTailMs: number };
}

export interface ReceivedChainStats {
  segments: number;
  /** Segments verified from the request body while it was written. */
  inFlight: number;
  /** Segments verified as zeros from a `sendHole`. */
  holes: number;
  /** Segments verified by reading them back from the file at close (pieces, overlaps, unaligned requests). */
  readBack: number;
}
